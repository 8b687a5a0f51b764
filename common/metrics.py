"""What a run records and watches: metrics.jsonl and samples.jsonl, the progress bar and console lines, phase
timings, the machine; and its health: bad updates skipped (`UpdateGuard`), flat rewards warned (`SignalWatch`,
`ScoreWatch`), SIGTERM / Ctrl-C turned into a saved stop (`StopSignal`), an unsynced engine warned; and the
figures summed or reduced over ranks (`global_sum`, `reduce_metrics`)."""

import json
import logging
import math
import os
import platform
import resource
import signal
import statistics
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm import tqdm


class RunLogger:
    """Writes metrics.jsonl and samples.jsonl and drives the progress bar; silent unless enabled (rank 0)."""

    # Figures shown next to the progress bar and in the --log_every lines.
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
        flags: dict | None = None,
        project: str = "grpo-zoo",
        run_name: str | None = None,
        log_every: int = 0,
        log_samples: int = 4,
    ):
        """`trackers`: an Accelerator with `log_with` (--report_to) that gets every row too; metrics.jsonl stays
        the source of truth for plots and resume."""
        self.enabled = enabled
        self.trackers = trackers if enabled else None
        self.log_every, self.log_samples_n = log_every, log_samples
        if not enabled:
            return
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.trackers is not None:
            config = {k: v for k, v in (flags or {}).items() if isinstance(v, (int, float, str, bool))}
            name = run_name or self.run_dir.resolve().name
            init = {"wandb": {"name": name, "dir": str(self.run_dir)}, "trackio": {"name": name}}
            self.trackers.init_trackers(project, config, init_kwargs=init)
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
        shown = {name: f"{row[k]:.3g}" for k, name in self.SHOWN.items() if isinstance(row.get(k), float)}
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1 if advance else 0)
        if advance and self.log_every and step % self.log_every == 0:
            self.write(f"step {step}: " + ", ".join(f"{name} {v}" for name, v in shown.items()))

    def eval_line(self, step: int, summary: dict) -> None:
        """One console line when an evaluation ends: pass@1 per benchmark and overall."""
        if not self.enabled:
            return
        scores = {
            k.split("/")[1]: v for k, v in summary.items() if k.endswith("/pass@1") and not k.startswith("eval/mean")
        }
        self.write(f"eval at step {step}: pass@1 " + ", ".join(f"{name} {v:.3f}" for name, v in scores.items()))

    def write(self, line: str) -> None:
        """A console line that does not break the progress bar (rank 0 only)."""
        if self.enabled:
            self.bar.write(line)

    def log_samples(self, step: int, columns, decode) -> None:
        """--log_samples completions in samples.jsonl, spread over the groups (each group's first, then second...).
        `columns`: (dataset rows, texts, rewards, advantages), a group's completions sharing one row object."""
        if not self.enabled or not self.log_samples_n or not columns:
            return
        rows, texts, rewards, advantages = columns
        place = [0] * len(texts)  # each completion's place in its group
        for i in range(1, len(texts)):
            place[i] = place[i - 1] + 1 if rows[i] is rows[i - 1] else 0
        picked = sorted(sorted(range(len(texts)), key=place.__getitem__)[: self.log_samples_n])
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for i in picked:
                sample = {
                    "prompt": decode(rows[i]["prompt_ids"]),
                    "completion": texts[i],
                    "reward": rewards[i],
                    "advantage": advantages[i].mean(),
                }
                f.write(json.dumps({"step": step, **{k: _plain(v) for k, v in sample.items()}}) + "\n")

    def abort(self) -> None:
        """An error ends the run: finish the progress bar's line, keep the log."""
        if self.enabled:
            self.bar.close()
            self.file.close()

    def close(self, last: dict | None = None, stopped: str | None = None) -> None:
        """Close the log; print the closing line: the last figures and the model, or (`stopped`) how to resume."""
        if not self.enabled:
            return
        self.bar.close()
        self.file.close()
        if stopped:
            print(stopped, flush=True)
            return
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
        with torch.profiler.record_function(phase):  # a range a profiler groups the phase's ops by
            yield
        if self.sync:
            self.sync()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


# Library log lines that need no action here (why each is expected: its comment); warnings that call for
# action (a KV cache too small, a failed load) still show.
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
    "Setting accelerator to CPU",  # DeepSpeed, imported by a library on a machine without a GPU: expected
    "does not officially support disabling chunked prefill",  # vLLM on CPU: whole prompts, for per-prompt seeds
    # vLLM in bf16 reading an fp32 checkpoint (the demo models, SmolLM2): the narrowing --precision asked for
    "with dtype torch.float32 into parameter with dtype torch.bfloat16",
)


class BenignFilter(logging.Filter):
    """Drops BENIGN lines (also named by configs/vllm_logging.json, vLLM's logging config here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(b in message for b in BENIGN)


def quiet_libraries() -> None:
    """Filter BENIGN lines from Python's last-resort handler (accelerate, vLLM at import), DeepSpeed's logger and,
    through configs/vllm_logging.json, vLLM's (a user's VLLM_LOGGING_CONFIG_PATH wins); transformers' bars off."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op.* is deprecated")
    os.environ.setdefault(
        "VLLM_LOGGING_CONFIG_PATH", str(Path(__file__).parent.parent / "configs" / "vllm_logging.json")
    )
    for target in (logging.getLogger("DeepSpeed"), logging.lastResort):  # DeepSpeed has a handler of its own
        if target is not None and not any(isinstance(f, BenignFilter) for f in target.filters):
            target.addFilter(BenignFilter())


# The machine, recorded in run_config.json: a CPU run's figures round by its kernels and thread count.
# CPU flags (/proc/cpuinfo) of the units that compute bfloat16: AVX-512 BF16 dot products, AMX tiles.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_info(cpuinfo: str) -> tuple[str, list[str]]:
    """(the CPU's model name, its bf16 units among BF16_FLAGS) from the text of /proc/cpuinfo."""
    model, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags |= set(value.split())
    return model, [f for f in BF16_FLAGS if f in flags]


def describe_machine(threads: int, gpu: str | None = None) -> dict:
    """CPU model and bf16 units, cores, compute threads, the 1-minute load average (were the cores shared?), GPU."""
    try:
        with open("/proc/cpuinfo") as f:
            model, bf16 = cpu_info(f.read())
    except OSError:
        model, bf16 = platform.processor() or platform.machine(), []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": model, "bf16_units": bf16, "cores": os.cpu_count(), "threads": threads, "load_1min": load} | (
        {"gpu": gpu} if gpu else {}
    )


SPIKE_WINDOW = 50  # gradient norms the spike rule takes its median over
SPIKE_MIN_HISTORY = 10  # ... and how many it needs before it judges


class UpdateGuard:
    """Whether each optimiser step's update may be applied: not when its loss or gradient norm is not finite or
    spikes; `patience` non-finite in a row stop the run. `check` needs global numbers, so every rank skips alike."""

    def __init__(self, patience: int, spike_factor: float = 0.0, say: Callable[[str], None] = print):
        self.patience = patience  # consecutive non-finite steps that stop the run (0: never stop)
        self.spike_factor = spike_factor  # skip when grad_norm > spike_factor * recent median (0: off)
        self.say = say
        self.in_a_row = 0
        self.norms: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self.checkpoint_hint: Callable[[], int | None] = lambda: None  # the newest saved step, for the advice

    def check(self, step: int, loss: float, grad_norm: float, lr: float) -> bool:
        """True if the update may be applied; False to skip it. A NaN grad_norm with a finite loss
        (DeepSpeed, which clips and steps inside its own engine and reports no norm) passes."""
        finite = math.isfinite(loss) and (math.isfinite(grad_norm) or math.isnan(grad_norm))
        if not finite:
            self.in_a_row += 1
            if self.patience and self.in_a_row >= self.patience:
                raise SystemExit(self._diverged(step, loss, grad_norm, lr))
            return False
        self.in_a_row = 0
        if math.isnan(grad_norm):
            return True
        spike = (
            self.spike_factor > 0
            and len(self.norms) >= SPIKE_MIN_HISTORY
            and grad_norm > self.spike_factor * statistics.median(self.norms)
        )
        if spike:
            self.say(
                f"step {step}: gradient norm {grad_norm:.4g} is over {self.spike_factor:g}x the median of the last "
                f"{len(self.norms)} ({statistics.median(self.norms):.4g}): update skipped (--grad_spike_factor)"
            )
        self.norms.append(grad_norm)  # a real shift in scale raises the median, and passes after a while
        return not spike

    def _diverged(self, step: int, loss: float, grad_norm: float, lr: float) -> str:
        saved = self.checkpoint_hint()
        how = (
            f"to go on from checkpoint-{saved} (the newest, saved before the first skipped update) with a lower "
            "learning rate, run the same command with --resume --lr <lower>"
            if saved
            else "start over with a lower learning rate: the same command with --overwrite --lr <lower>"
        )
        return (
            f"error: step {step}: loss {loss:.4g} or gradient norm {grad_norm:.4g} was not finite for {self.in_a_row} "
            f"optimiser steps in a row (none applied): the run has diverged. Likely causes: a learning rate too high "
            f"for this model (--lr {lr:g}), or bf16 overflow (--precision fp32); {how}"
        )


class SignalWatch:
    """Warns (once, then every `every` steps) while all groups have had equal rewards for `every` steps."""

    # The step's figures it reads (every script's step_metrics writes them), reduced over ranks.
    FLAT, TRUNCATED = "train/zero_adv_group_frac", "train/truncated_frac"

    def __init__(self, every: int, say: Callable[[str], None] = print):
        self.every = every
        self.say = say
        self.flat_steps = 0

    def update(self, step: int, metrics: dict) -> None:
        truncated_frac = metrics[self.TRUNCATED]
        self.flat_steps = self.flat_steps + 1 if metrics[self.FLAT] >= 1.0 else 0
        if self.every and self.flat_steps and self.flat_steps % self.every == 0:
            self.say(
                f"warning: step {step}: for {self.flat_steps} steps every group's rewards were all equal, so every "
                f"advantage is 0 and nothing is learned. Likely causes: a sampling temperature too low for "
                f"completions to differ (--temperature), completions cut before the answer (--max_completion_len; "
                f"{truncated_frac:.0%} truncated this step), or a reward that cannot vary on this data (--rewards, "
                "the answers' format)"
            )


class ScoreWatch:
    """Reads each scoring (`common.rewards.Scores`): answers the verifier had no time to check, counted for the
    step's log."""

    def __init__(self, say: Callable[[str], None] = print):
        self.say = say
        self.unchecked = 0

    def saw(self, scores) -> None:
        checked = scores.record.checked
        self.unchecked += len(checked) - sum(checked)

    def take_unchecked(self) -> int:
        """The answers left unchecked since the last call."""
        unchecked, self.unchecked = self.unchecked, 0
        return unchecked

    def warn_unchecked(self, step: int, unchecked: float, budget_s: float | None) -> None:
        """The step's line when answers (`unchecked`, over all ranks) were left unchecked within `budget_s`."""
        if unchecked:
            self.say(
                f"step {step}: {unchecked:.0f} answers were not checked within --reward_time_budget_s={budget_s}; "
                "their groups trained on nothing (raise the budget or --verifier_workers)"
            )


class StopSignal:
    """SIGTERM / SIGINT: noted by the handler; the ranks agree at the step's end (`agree`), save, and stop.
    A second signal re-raises with the default action: the process ends at once."""

    def __init__(self):
        self.received: int | None = None
        self.stopped = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # the second: stop now (no traceback, no save; a half save is removed on resume)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        if int(os.environ.get("RANK", "0")) == 0:  # os.write: safe inside a handler, unlike print
            os.write(
                2,
                f"\n{signal.Signals(signum).name}: stopping after this step, once its checkpoint is saved "
                f"(send it again to stop at once)\n".encode(),
            )

    def agree(self, accelerator) -> bool:
        """Has any rank received a signal? Every rank gets the same answer, so all stop after the same step."""
        flag = float(self.received is not None)
        if accelerator.num_processes > 1:
            flag = accelerator.reduce(torch.tensor(flag, device=accelerator.device), reduction="sum").item()
        self.stopped = self.stopped or flag > 0
        return self.stopped

    @property
    def exit_code(self) -> int:
        return 128 + (self.received or signal.SIGTERM)

    def message(self, saved_step: int | None) -> str | None:
        """The closing line of a stopped run (None if it was not stopped)."""
        if not self.stopped:
            return None
        name = signal.Signals(self.received or signal.SIGTERM).name
        if saved_step is None:
            return f"stopped by {name}: nothing could be saved"
        return f"stopped by {name} after step {saved_step}: saved checkpoint-{saved_step}; to continue, run the same command with --resume"


# Mean |log p_rollout - log p_old| per token. Numerics alone give 1e-7 to 2e-6 in fp32 (docs/SCALING.md) and
# ~1e-2 in bf16, alike before and after a sync; a sync that missed a Qwen3-MoE's experts (tests/test_moe_sync.py)
# gave 9e-8 before it and 0.009 to 0.1 after; issue 40: 5-7.
ROLLOUT_GAP = "train/rollout_logp_gap"  # every script's step_metrics logs it, reduced over ranks
ROLLOUT_GAP_FACTOR = 10.0  # after the sync, more than this many times the gap before it ...
ROLLOUT_GAP_FLOOR = 1e-3  # ... and above this: 500x fp32's numerics; in bf16 the factor decides


def warn_rollout_gap(step: int, metrics: dict, previous: dict, say: Callable[[str], None] = print) -> None:
    """At step 2 (the first rollout after a sync): warn when the gap passes both bounds against step 1's
    (`previous`). A resumed run is not judged: its engine was synced before its first step."""
    gap, before = metrics.get(ROLLOUT_GAP), previous.get(ROLLOUT_GAP)
    if step != 2 or gap is None or before is None or not math.isfinite(gap) or not math.isfinite(before):
        return
    if gap > max(ROLLOUT_GAP_FACTOR * before, ROLLOUT_GAP_FLOOR):
        say(
            f"warning: after the first weight sync the rollout engine's log-probs differ from the trainer's by "
            f"{gap:.3g} nats/token ({before:.3g} before it): the engine is not sampling the trained weights, and "
            "the run trains on samples of another policy. Likely causes: layers the sync does not reach or that the "
            "engine post-processes after loading (MoE experts, quantized layers: common/vllm_engine.py), or a stale "
            "prefix cache; --rollout hf samples the trained model itself"
        )


# How reduce_metrics combines a metric over ranks (anything else: the mean).
SUM_METRICS = {"time/tokens_per_s", "reward/timeouts", "train/skipped_rows"}
MAX_METRICS = {"time/peak_mem_gb", "train/rollout_logp_gap_p99", "train/rollout_is_ratio_max"}  # the worst rank


def global_sum(accelerator, value):
    """Sum over ranks of a number, or of each value of a dict, in one collective; 0-dim device tensors are read
    in one wait for the device."""
    values = value if isinstance(value, dict) else {"": value}
    if accelerator.num_processes == 1 and not any(torch.is_tensor(v) for v in values.values()):
        out = {k: float(v) for k, v in values.items()}
    else:
        device = accelerator.device
        t = torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=device).detach().reshape(()) for v in values.values()]
        )
        if accelerator.num_processes > 1:
            t = accelerator.reduce(t, reduction="sum")
        out = dict(zip(values, t.tolist()))
    return out if isinstance(value, dict) else out[""]


def reduce_metrics(accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """Each metric over ranks, on every rank: the mean, the sum for SUM_METRICS, the max for MAX_METRICS. A rank's
    NaN (nothing to measure) is left out; all NaN stays NaN."""
    if accelerator.num_processes == 1:
        return metrics
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], device=accelerator.device, dtype=torch.float64)
    gathered = accelerator.gather(t[None]).view(accelerator.num_processes, len(keys))
    out = {}
    for i, k in enumerate(keys):
        column = gathered[:, i][~gathered[:, i].isnan()]
        reduce = torch.sum if k in SUM_METRICS else torch.max if k in MAX_METRICS else torch.mean
        out[k] = reduce(column).item() if column.numel() else float("nan")
    return out


def peak_memory_gb() -> float:
    """Peak memory of this process in GiB: torch's GPU allocations (vLLM's included), or the max RSS on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)
