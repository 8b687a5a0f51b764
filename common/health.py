"""Run-health checks: a run that has diverged or cannot learn says so instead of training on.

- `NonFiniteGuard`: an optimiser step whose loss or gradient norm is not finite is
  not applied; several in a row stop the run with a one-line error.
- `SignalWatch`: warns when every group's rewards have been equal for a while
  (every advantage 0: nothing is learned), naming the likely causes.
"""

import math


class NonFiniteGuard:
    """Decides, per optimiser step, whether its update may be applied.

    `check` must see the same numbers on every rank (a global loss and the global
    gradient norm), so that every rank skips the same steps.
    """

    def __init__(self, patience: int):
        self.patience = patience  # consecutive non-finite steps that stop the run (0: never stop)
        self.in_a_row = 0
        self.skipped = 0  # over the run

    def check(self, step: int, loss: float, grad_norm, lr: float) -> bool:
        """True if the update is finite and may be applied; False to skip it (counted).
        grad_norm None (DeepSpeed, which clips and steps inside its own engine): the loss decides."""
        grad_norm = 0.0 if grad_norm is None else float(grad_norm)
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.skipped += 1
        if self.patience and self.in_a_row >= self.patience:
            raise SystemExit(
                f"error: step {step}: loss {loss:.4g} or gradient norm {grad_norm:.4g} was not finite for "
                f"{self.in_a_row} optimiser steps in a row (none applied): the run has diverged. Likely causes: "
                f"a learning rate too high for this model (--lr {lr:g}), --grad_clip 0, or bf16 overflow "
                "(--precision fp32); resume from the last checkpoint with a lower --lr"
            )
        return False


class SignalWatch:
    """Warns (once, then every `every` steps) while all groups have had equal rewards for `every` steps."""

    def __init__(self, every: int, say=print):
        self.every = every
        self.say = say
        self.flat_steps = 0

    def update(self, step: int, zero_adv_group_frac: float, truncated_frac: float) -> None:
        self.flat_steps = self.flat_steps + 1 if zero_adv_group_frac >= 1.0 else 0
        if self.every and self.flat_steps and self.flat_steps % self.every == 0:
            self.say(
                f"warning: step {step}: for {self.flat_steps} steps every group's rewards were all equal, so every "
                f"advantage is 0 and nothing is learned. Likely causes: a sampling temperature too low for "
                f"completions to differ (--temperature), completions cut before the answer (--max_completion_len; "
                f"{truncated_frac:.0%} truncated this step), or a reward that cannot vary on this data (--rewards, "
                "the answers' format)"
            )
