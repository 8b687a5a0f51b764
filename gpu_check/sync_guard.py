"""Run one of the five scripts as a user runs it, its scoring pass and update under torch's CUDA sync detector.

    python gpu_check/sync_guard.py --report syncs.json grpo_base.py --rollout hf --steps 2   # the script's flags

The script is imported (its `__main__` block stays out) and its `main` run with `old_logprobs` and `update`
wrapped by name, nothing in it edited. Each sync warning is attributed (`classify`) and each micro-batch's layout
counted. "warn", not "error": a library's sync would stop the run at the first and hide the rest. Without CUDA,
benchmarks/host_syncs.py's patches catch the calls instead. The JSON report is written even when the script fails.
"""

import collections
import contextlib
import functools
import importlib.util
import json
import sys
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.host_syncs import patch  # noqa: E402
from common.cli import parse_args  # noqa: E402
from common.run_flags import RunFlags  # noqa: E402

SYNC_MESSAGE = "called a synchronizing CUDA operation"
# (file in the repository, function): the host reads docs/SCALING.md "Host syncs" counts as intended.
INTENDED = {("common/trainer.py", "optimizer_step"), ("common/batching.py", "rows_with_loss")}
WRAPPED = ("old_logprobs", "update")
LAYOUTS = {"SharedPrefix": "shared", "Packed": "packed"}  # common.batching's layout classes; "padded" is a string


def _where(frame: traceback.FrameSummary) -> tuple[str, bool]:
    """A frame's place as "path:function:line" (relative to the repository when in it), and whether it is ours."""
    path = Path(frame.filename)
    ours = path.is_relative_to(ROOT) and "site-packages" not in path.parts
    shown = str(path.relative_to(ROOT)) if ours else "/".join(path.parts[-2:])
    return f"{shown}:{frame.name}:{frame.lineno}", ours


def _in_torch(frame: traceback.FrameSummary) -> bool:
    """torch's frames and the detector's own (warnings, this file, the CPU stand-in's patches)."""
    name = frame.filename
    return "/torch/" in name or name.endswith(("warnings.py", "host_syncs.py")) or name == __file__


def classify(stack: list[traceback.FrameSummary]) -> tuple[str, str]:
    """(kind, where) of a sync whose warning was issued with this Python stack (outermost first). Kinds: intended
    (inside INTENDED), library (the innermost frame outside torch is an installed package's), ours (it is this
    repository's: a sync the code promises not to make), backward (replayed by autograd at a `backward` call)."""
    for frame in reversed(stack):
        path = Path(frame.filename)
        if path.is_relative_to(ROOT) and (str(path.relative_to(ROOT)), frame.name) in INTENDED:
            return "intended", _where(frame)[0]
    outside = [i for i, f in enumerate(stack) if not _in_torch(f)]
    if not outside:
        return "library", "?"
    # Autograd replays its engine's warnings at the call that ran backward: no frame below it says which kernel.
    engine = [i for i, f in enumerate(stack) if "/torch/autograd/" in f.filename and "backward" in f.name]
    where, ours = _where(stack[outside[-1]])
    if engine and engine[-1] > outside[-1]:
        return "backward", where
    return ("ours" if ours else "library"), where


class SyncLog:
    """Host syncs seen inside `watch(phase)` blocks, counted per (phase, kind, where); without CUDA, by
    benchmarks/host_syncs.py's patches (which also catch reads of host tensors: an upper bound)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.counts: collections.Counter = collections.Counter()
        self.layouts: collections.Counter = collections.Counter()  # micro-batches per (phase, layout)
        self.phase: str | None = None  # the CPU stand-in records inside a `watch` block only
        self.patched = False

    def _patch(self) -> None:
        """The CPU stand-in, installed at the first `watch`, after the models have loaded: a patched `torch.tensor`
        during transformers' loading on the meta device leaves buffers unset (the demo model then samples noise)."""
        if not self.cuda and not self.patched:
            patch(on_sync=self._host_read)
            self.patched = True

    def _host_read(self) -> None:
        if self.phase is not None:
            self.seen(self.phase, traceback.extract_stack()[:-2])

    def seen(self, phase: str, stack: list[traceback.FrameSummary]) -> None:
        self.counts[(phase, *classify(stack))] += 1

    @contextlib.contextmanager
    def watch(self, phase: str):
        """torch's detector in "warn" mode for the block (CUDA only); its warnings recorded here, not printed."""
        self._patch()
        with warnings.catch_warnings():  # restores the filters and showwarning afterwards
            warnings.filterwarnings("always", message=SYNC_MESSAGE)
            shown = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                if SYNC_MESSAGE in str(message):
                    self.seen(phase, traceback.extract_stack()[:-1])
                else:
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            if self.cuda:
                torch.cuda.set_sync_debug_mode("warn")
            self.phase = phase
            try:
                yield
            finally:
                self.phase = None
                if self.cuda:
                    torch.cuda.set_sync_debug_mode("default")

    def record(self) -> dict:
        rows = [{"phase": p, "kind": k, "where": w, "count": n} for (p, k, w), n in sorted(self.counts.items())]
        kinds = collections.Counter()
        for r in rows:
            kinds[r["kind"]] += r["count"]
        detector = "torch.cuda.set_sync_debug_mode('warn')" if self.cuda else "benchmarks/host_syncs.py's patches (CPU)"
        layouts: dict = {}
        for (phase, layout), n in sorted(self.layouts.items()):
            layouts.setdefault(phase, {})[layout] = n
        return {"detector": detector, "syncs": rows, "by_kind": dict(kinds), "layouts": layouts}


def load_script(path: Path):
    """The script as a module named after its file, its `__main__` blocks not run."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # what pickling its functions (the verifier's processes) looks up
    spec.loader.exec_module(module)
    return module


def guard(module, log: SyncLog) -> list[str]:
    """Wrap the module's `old_logprobs` and `update` (those it has) in `log.watch`, and `select` where every pass
    cuts its micro-batches (`common.trainer.Trainer.micro_batches`) to count the layouts they ran in (`select` may
    fall back from the asked one); returns the names wrapped."""
    import common.trainer

    select = common.trainer.select

    @functools.wraps(select)
    def counted(*a, **k):
        mb = select(*a, **k)
        if log.phase is not None:
            log.layouts[(log.phase, LAYOUTS.get(type(mb["layout"]).__name__, mb["layout"]))] += 1
        return mb

    common.trainer.select = counted
    wrapped = []
    for name in WRAPPED:
        fn = getattr(module, name, None)
        if fn is None:
            continue

        @functools.wraps(fn)
        def watched(*a, __fn=fn, __name=name, **k):
            with log.watch(__name):
                return __fn(*a, **k)

        setattr(module, name, watched)
        wrapped.append(name)
    return wrapped


def run(report: Path, script: Path, argv: list[str]) -> int:
    """Run `script` with `argv` as its flags under the guard; write the report; the script's exit status."""
    log, status, error = SyncLog(torch.cuda.is_available()), 0, None
    wrapped: list[str] = []
    try:
        module = load_script(script)
        wrapped = guard(module, log)
        cli = parse_args(module.Args, RunFlags, argv=argv, description=module.__doc__)
        if hasattr(module, "validate"):
            module.validate(*cli)
        module.main(*cli)
    except SystemExit as e:  # a refused flag, or a run stopped by a signal
        status = e.code if isinstance(e.code, int) else 1
        error = None if status == 0 else f"SystemExit: {e.code}"
    except BaseException as e:  # noqa: BLE001 - reported, then the status says it failed
        status, error = 1, "".join(traceback.format_exception(e)[-6:])
        traceback.print_exc()
    report.write_text(json.dumps(log.record() | {"wrapped": wrapped, "status": status, "error": error}, indent=1))
    return status


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--report":
        raise SystemExit("usage: python gpu_check/sync_guard.py --report REPORT.json SCRIPT.py [its flags ...]")
    raise SystemExit(run(Path(args[1]), Path(args[2]).resolve(), args[3:]))
