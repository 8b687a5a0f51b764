"""What a run shows: one JSON line per step in the run directory, a tqdm bar and our own lines on the console.

The libraries' notices that a user of these scripts cannot act on (vLLM's CPU
build notes, a chat-template warm-up that cannot apply to an engine we feed token
ids, accelerate's note on tied weights, progress bars under ours) are filtered;
their warnings that call for action (a KV cache too small, a failed load) still show.
"""

import json
import logging
import math
import os
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

# Library log lines that need no action here: the reason each is expected is in the comment.
BENIGN = (
    "The global random seed is set to",  # vLLM: we seed it ourselves
    "Enforce eager set",  # vLLM on CPU: we ask for eager mode (torch.compile's warm-up costs a minute)
    "Inductor compilation was disabled",
    "Triton is not installed",  # vLLM's CPU build
    "Triton is installed, but doesn't include CPU backend",
    "Reset SSM cache type",
    "Model Runner V2 requires Triton",
    "is not found in LD_PRELOAD",  # vLLM CPU performance tips (tcmalloc, iomp)
    "CPU backend doesn't allow to use `torch.set_num_threads`",
    "Chat template warmup failed",  # vLLM's engine gets token ids: it has no tokenizer to warm up
    "Using None for EOS token id because tokenizer is not initialized",  # stop tokens are passed per request
    "Removed shared tensor",  # accelerate: tied embeddings are saved once, as intended
)


class BenignFilter(logging.Filter):
    """Drops BENIGN lines (also named by configs/vllm_logging.json, vLLM's logging config here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(b in message for b in BENIGN)


def quiet_libraries() -> None:
    """Filter BENIGN lines from Python's last-resort handler (which prints for libraries that set up
    none: accelerate, vLLM at import) and, through configs/vllm_logging.json, from vLLM's own handler
    (set up when an engine starts); silence deprecation notices libraries raise about their own
    dependencies; turn transformers' progress bars off. A user's VLLM_LOGGING_CONFIG_PATH wins."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op.* is deprecated")
    os.environ.setdefault(
        "VLLM_LOGGING_CONFIG_PATH", str(Path(__file__).parent.parent / "configs" / "vllm_logging.json")
    )
    handler = logging.lastResort
    if handler is not None and not any(isinstance(f, BenignFilter) for f in handler.filters):
        handler.addFilter(BenignFilter())


class RunLogger:
    """Writes `metrics.jsonl` under run_dir (the flags: common/run_dir.py); silent when not enabled (non-zero ranks)."""

    # Figures shown next to the progress bar.
    SHOWN = {
        "train/reward": "reward",
        "train/accuracy": "acc",
        "train/response_len": "len",
        "train/entropy": "entropy",
        "time/step_s": "s/step",
    }

    def __init__(
        self,
        run_dir: str | Path,
        total_steps: int,
        enabled: bool = True,
        initial_step: int = 0,
        trackers=None,
        flags=None,
    ):
        """`trackers`: an Accelerator built with `log_with` (`--report_to`): every row goes to its trackers
        too (metrics.jsonl stays the source of truth for plots and resume); `flags` are their run config."""
        self.enabled = enabled
        self.trackers = trackers if enabled else None
        if not enabled:
            return
        if self.trackers is not None:
            config = {k: v for k, v in (flags or {}).items() if isinstance(v, (int, float, str, bool))}
            name = Path(run_dir).resolve().name
            self.trackers.init_trackers("grpo-zoo", config, init_kwargs={"wandb": {"name": name, "dir": str(run_dir)}})
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(self.run_dir / "metrics.jsonl", "a")
        self.bar = tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True, desc=self.run_dir.name)

    def log(self, step: int, metrics: dict, advance: bool = True) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.trackers is not None:
            self.trackers.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}, step=step)
        self.bar.set_postfix(
            {name: f"{row[k]:.3g}" for k, name in self.SHOWN.items() if isinstance(row.get(k), float)}, refresh=False
        )
        self.bar.update(1 if advance else 0)

    def write(self, line: str) -> None:
        """A console line that does not break the progress bar (rank 0 only)."""
        if self.enabled:
            self.bar.write(line)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        """A few of the step's completions (prompt, completion, reward, advantage) in samples.jsonl."""
        if not self.enabled or not samples:
            return
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for sample in samples:
                f.write(json.dumps({"step": step, **{k: _plain(v) for k, v in sample.items()}}) + "\n")

    def close(self, last: dict | None = None) -> None:
        """Close the log; print one summary line: the last step's figures and where the final model is."""
        if not self.enabled:
            return
        self.bar.close()
        self.file.close()
        if self.trackers is not None:
            self.trackers.end_training()
        figures = {k: (last or {}).get(k) for k in ("train/reward", "train/accuracy", "eval/overall/pass@1")}
        shown = ", ".join(f"{k.split('/', 1)[1]} {v:.3f}" for k, v in figures.items() if isinstance(v, (int, float)))
        where = f"; model: {self.run_dir / 'model'}" if (self.run_dir / "model").is_dir() else ""
        print(
            f"done: {self.run_dir / 'metrics.jsonl'}{' (last step: ' + shown + ')' if shown else ''}{where}", flush=True
        )


def _plain(v):
    """Tensors and numpy scalars -> JSON numbers; NaN/inf -> null (JSON has neither)."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class PhaseTimer:
    """Wall-clock seconds per phase of a step: `with timer("rollout"): ...`."""

    def __init__(self, sync=None):
        self.seconds: dict[str, float] = {}
        self.sync = sync  # e.g. torch.cuda.synchronize, so GPU work is charged to its phase

    @contextmanager
    def __call__(self, phase: str):
        if self.sync:
            self.sync()
        start = time.perf_counter()
        yield
        if self.sync:
            self.sync()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
