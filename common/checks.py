"""Everything a run checks before any model loads, each failure one line: the launch, the reward terms, the run
directory (locked by rank 0), the model's path and context, the data, your --reward_fn (called as training calls
it, on stand-ins for a few of the dataset's rows), the step count, the benchmarks, and the reward terms against
the prompt's answer format (`check_launch_and_rewards`, `check_before_loading` -> `Prepared`, `check_prompt_format`)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from common.cli import clear_errors, require
from common.run_flags import RunFlags, check_batch_split, launch_world


def check_launch_and_rewards(
    rewards: str, reward_fn: str | None, prompts_per_step: int, group_size: int
) -> tuple[list[str], list]:
    """The checks that need nothing but the flags and the launch: the process count (accelerate sets
    WORLD_SIZE before any process starts), the reward terms, and each --reward_fn loaded (it is called on a few
    of the dataset's rows once they load: `check_before_loading`). Returns (the reward terms, the custom reward
    functions)."""
    from common.distributed import check_launch
    from common.rewards import REWARD_FUNCS, load_reward_fn

    check_launch(dict(os.environ), sys.argv)
    world_env = launch_world()
    check_batch_split(prompts_per_step, group_size, 1, world_env)  # the scripts' validate checks --num_minibatches
    terms = rewards.split(",")
    unknown = set(terms) - set(REWARD_FUNCS)
    require(
        not unknown,
        f"--rewards: unknown term(s) {sorted(unknown)}; choose from {sorted(REWARD_FUNCS)}, or add your own with --reward_fn",
    )
    with clear_errors("--reward_fn"):
        custom = [load_reward_fn(spec) for spec in (reward_fn or "").split(",") if spec]
    return terms, custom


def probe_reward_fns(spec, rows: list[dict], tokenizer, say) -> None:
    """Each --reward_fn called as training calls it, on stand-ins for a few of the loaded `rows` and their columns
    (`common.rewards.probe_reward_fn`): one that fails in training fails here, before any model loads, with its own
    error. `load_reward_fn` gives the same function objects `check_launch_and_rewards` returned."""
    from common.rewards import load_reward_fn, probe_reward_fn

    per_step = spec.prompts_per_step // launch_world() * spec.group_size
    with clear_errors("--reward_fn"):
        for name in filter(None, (spec.reward_fn or "").split(",")):
            probe_reward_fn(load_reward_fn(name), rows, tokenizer.decode, per_step, say)


def check_prompt_format(terms: list[str], prompt_ids: list[int], tokenizer, template: str, few_shot: int,
                        stop: str | None, say, evaluates: bool = False) -> list[str]:  # fmt: skip
    """Before any model loads: a reward term that reads an answer format the prompt asks against is refused, one
    it does not ask for is warned (`common.rewards.format_mismatch`, on a prompt as rendered, worked examples
    included); `evaluates`: the evaluation during training, which reads \\boxed{}, is warned of either.
    Returns the stop strings (--stop's and the few-shot format's own), saying the implied one."""
    from common.prompts import stop_strings
    from common.rewards import format_mismatch

    prompt = tokenizer.decode(prompt_ids)
    found = format_mismatch(terms, prompt, template)
    if found and found[0] == "error":
        require(False, found[1])
    if found:
        say(found[1])
    if evaluates and (found := format_mismatch(["accuracy"], prompt, template, who="--eval_steps' evaluation")):
        say(found[1] if found[0] == "warning" else f"warning: {found[1]}")
    with clear_errors("--stop"):
        stops, line = stop_strings(stop, template, few_shot)
    if line:
        say(line)
    return stops


@dataclass
class Prepared:
    """What `check_before_loading` found: everything a run needs that no model has to load for."""

    run_dir: Path
    lock: object  # common.run_dir.RunLock, held by rank 0
    is_main: bool
    model_path: str
    tokenizer: object
    rows: list[dict]  # the training prompts
    opens_think: bool  # the template's prompt ends inside <think>
    total_steps: int
    eval_sets: dict


def check_before_loading(script: str, spec, run: RunFlags, values: dict, resumable: set[str]) -> Prepared:
    """Everything about `spec` (`common.session.TrainSpec`) that can be checked without a model, each with a
    one-line error: the run directory (locked by rank 0; `values` and `resumable`: the flags and which of them a
    resume may change), the model's path and its context, the data, the step count and the benchmarks."""
    from common.metrics import quiet_libraries
    from common.sampler import count_steps

    quiet_libraries()  # our progress bar and lines; library notices that need no action are filtered
    run_dir, lock, is_main = claim_run_dir(script, run, values, resumable)
    model_path, tokenizer = open_tokenizer(
        spec.model, spec.max_prompt_len + spec.max_completion_len + spec.extra_context, spec.extra_context_flags
    )
    rows, opens_think = load_training_prompts(spec, run, tokenizer, say=print if is_main else lambda _: None)
    probe_reward_fns(spec, rows, tokenizer, say=print if is_main else lambda _: None)
    with clear_errors():
        total_steps, length = count_steps(spec.steps, spec.epochs, len(rows), spec.prompts_per_step)
    if is_main:
        print(f"{script}: {length}, {spec.prompts_per_step} prompts x {spec.group_size} completions a step")
    eval_sets = {}
    if run.eval_steps:  # fail fast, before training
        from common.eval_sets import load_benchmarks

        with clear_errors("--eval_benchmarks"):
            eval_sets = load_benchmarks(run.eval_benchmarks)
    return Prepared(run_dir, lock, is_main, model_path, tokenizer, rows, opens_think, total_steps, eval_sets)


def claim_run_dir(script: str, run: RunFlags, values: dict, resumable: set[str]) -> tuple[Path, object, bool]:
    """--output_dir (default runs/<script>), writable, locked by rank 0, and fit for this run (a new one, or
    --resume / --overwrite). Returns (the run directory, its lock, whether this is rank 0)."""
    from common.run_dir import RunLock, check_run_dir, check_writable

    run_dir = Path(run.output_dir or f"runs/{script}")
    lock = RunLock(run_dir)
    is_main = int(os.environ.get("RANK", "0")) == 0
    check_writable(run_dir)
    if is_main:
        lock.acquire()
    check_run_dir(run_dir, values, resumable, run.resume, run.overwrite, script)
    return run_dir, lock, is_main


def open_tokenizer(model: str, context: int, extra_flags: str) -> tuple[str, object]:
    """The path of --model `model` and its tokenizer, its context checked to hold `context` tokens (`extra_flags`:
    the flags beyond --max_prompt_len + --max_completion_len that add to it). The hub, if it cannot be reached,
    is not asked again this process. Returns (model path, tokenizer)."""
    from common.models import (
        check_context_length,
        hub_error,
        load_tokenizer,
        model_to_load,
        offline_unless_hub_reachable,
    )

    hub_ok = offline_unless_hub_reachable()
    model_path, _ = model_to_load(model)
    with clear_errors("--model"):
        try:
            tokenizer = load_tokenizer(model_path)
        except OSError:
            if not hub_ok and not Path(model_path).exists():
                raise hub_error("--model", model_path) from None
            raise
        check_context_length(model_path, context, "--max_prompt_len + --max_completion_len" + extra_flags)
    return model_path, tokenizer


def load_training_prompts(spec, run: RunFlags, tokenizer, say) -> tuple[list[dict], bool]:
    """--dataset's rows as prompts of --template (`common.math_data.load_prompts`), then the script's own check of
    them (`spec.check_data`). Returns (rows, whether the template's prompt ends inside <think>)."""
    from common.math_data import load_prompts

    rows, opens_think = load_prompts(
        spec.dataset, tokenizer, spec.template, spec.max_prompt_len, problem_field=run.problem_field,
        answer_field=run.answer_field, solution_field=run.solution_field, bad_rows=run.bad_rows, say=say,
        few_shot=spec.few_shot, seed=spec.seed,
    )  # fmt: skip
    if spec.check_data is not None:
        spec.check_data(rows)
    return rows, opens_think
