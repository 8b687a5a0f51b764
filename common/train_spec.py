"""What a run trains, as one frozen record built once from a script's `Args` (`spec_from`).

The flags every script shares are read from `Args` by name (`FROM_ARGS`); what a script decides itself
(its optimiser, how many optimiser steps its update takes, whether a reference model loads, the context
a sequence may grow by, a check of its data) it passes by keyword. `common.session.start_session` takes
the spec and the run's flags (`common.run_flags.RunFlags`); past `spec_from`, nothing in common/ sees `Args`.
"""

from collections.abc import Callable
from dataclasses import dataclass

# The spec's fields a script's Args holds under the same names: what to train, how the schedule runs, the two
# sampling flags of the method that the session's rollout engine and evaluation need, and the rollout correction.
FROM_ARGS = (
    "model", "dataset", "template", "few_shot", "rewards", "reward_fn", "steps", "epochs", "prompts_per_step",
    "max_prompt_len", "max_completion_len", "seed", "lr_schedule", "warmup_steps", "grad_clip", "group_size", "top_p",
    "rollout_correction", "rollout_correction_min", "rollout_correction_max",
)  # fmt: skip


@dataclass(frozen=True)
class TrainSpec:
    model: str  # --model: a hub name, a local path (a run or checkpoint too), 'tiny' or 'smollm2'
    dataset: str
    template: str
    few_shot: int  # K worked examples before each training and evaluation problem
    rewards: str  # comma-separated reward terms
    reward_fn: str | None  # your own terms: module:function or file.py:function, comma-separated
    steps: int
    epochs: float | None  # if set, overrides steps: passes over the dataset
    prompts_per_step: int  # over all ranks
    max_prompt_len: int
    max_completion_len: int
    seed: int
    lr_schedule: str  # after the warm-up: constant, cosine or linear
    warmup_steps: int  # optimiser steps
    grad_clip: float
    group_size: int  # G: completions per prompt
    top_p: float
    rollout_correction: str  # pi_old / pi_rollout weights: a mode of common.rollout_correction.MODES, or auto
    rollout_correction_min: float | None  # its bounds (None: the mode's)
    rollout_correction_max: float | None
    # What the script decides itself (spec_from's keyword arguments).
    optimizer: Callable  # params -> torch optimizer
    optimizer_steps_per_step: int  # the update's; the learning-rate schedule is counted in them
    reference_model: bool  # the initial model, loaded to score against (--beta > 0)
    extra_context: int = 0  # tokens a sequence may grow beyond prompt + completion (EDGE-GRPO's reflections)
    extra_context_flags: str = ""  # the flags that add them, named in errors
    check_data: Callable[[list[dict]], None] | None = None  # called with the dataset's rows before any model loads


def spec_from(args, **own) -> TrainSpec:
    """The spec of a script's `args`: the FROM_ARGS fields read from it by name, and `own`, the fields the
    script decides itself (optimizer, optimizer_steps_per_step, reference_model, and any of the defaulted ones)."""
    return TrainSpec(**{name: getattr(args, name) for name in FROM_ARGS}, **own)
