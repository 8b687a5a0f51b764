"""The learning-rate schedule: a linear warm-up, then constant, cosine or linear decay (`lr_lambda`), counted
in optimiser steps; and this run's --lr as its base after a resume (`set_base_lr`)."""

import math
from collections.abc import Callable


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The learning-rate multiplier at optimiser step s: a linear warm-up over `warmup_steps`, then
    constant, or decaying to 0 at `total_steps` along a cosine or a line."""

    def factor(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return factor


def set_base_lr(optimizer, scheduler, lrs: list[float]) -> None:
    """After a resume, this run's --lr is the base of the schedule (the checkpoint stored the old one)."""
    scheduler.base_lrs = list(lrs)
    for group, lr, schedule in zip(optimizer.param_groups, lrs, scheduler.lr_lambdas):
        group["initial_lr"] = lr
        group["lr"] = lr * schedule(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
