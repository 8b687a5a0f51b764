"""Everything a run checks before any model loads, each failure one line: the launch and reward terms
(`check_launch_and_rewards`), the run directory, model, data, --reward_fn, steps and benchmarks
(`check_before_loading` -> `Prepared`), the reward terms against the prompt's answer format (`check_prompt_format`)."""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from common.cli import clear_errors, require
from common.distributed import check_launch
from common.eval_sets import load_benchmarks
from common.math_data import load_prompts
from common.metrics import quiet_libraries
from common.models import check_context_length, hub_error, load_tokenizer, model_to_load, offline_unless_hub_reachable
from common.prompts import stop_strings
from common.rewards import REWARD_FUNCS, format_mismatch, load_reward_fn, probe_reward_fn
from common.run_dir import RunLock, check_run_dir, check_writable
from common.run_flags import RunFlags, check_batch_split, launch_world
from common.sampler import count_steps


def check_launch_and_rewards(
    rewards: str, reward_fn: str | None, prompts_per_step: int, group_size: int
) -> tuple[list[str], list]:
    """The checks that need only the flags and the launch (accelerate sets WORLD_SIZE before any process starts).
    Returns (the reward terms, the loaded --reward_fn functions)."""
    check_launch(dict(os.environ), sys.argv)
    check_batch_split(prompts_per_step, group_size, 1, launch_world())  # the scripts' validate checks --num_minibatches
    terms = rewards.split(",")
    unknown = set(terms) - set(REWARD_FUNCS)
    require(
        not unknown,
        f"--rewards: unknown term(s) {sorted(unknown)}; choose from {sorted(REWARD_FUNCS)}, or add your own with --reward_fn",
    )
    with clear_errors("--reward_fn"):
        custom = [load_reward_fn(spec) for spec in (reward_fn or "").split(",") if spec]
    return terms, custom


def check_prompt_format(terms: list[str], prompt_ids: list[int], tokenizer, template: str, few_shot: int,
                        stop: str | None, say, evaluates: bool = False) -> list[str]:  # fmt: skip
    """A reward term that reads a format the prompt asks against is refused, one it does not ask for warned
    (`common.rewards.format_mismatch`); `evaluates`: the evaluation's \\boxed{} too. Returns the stop strings."""
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
    """Everything about `spec` (`common.session.TrainSpec`) checked without a model (`values` and `resumable`: the
    flags and which of them a resume may change)."""
    quiet_libraries()  # our progress bar and lines; library notices that need no action are filtered
    # --output_dir: writable, locked by rank 0, fit for this run
    run_dir = Path(run.output_dir or f"runs/{script}")
    lock = RunLock(run_dir)
    is_main = int(os.environ.get("RANK", "0")) == 0
    say = print if is_main else lambda _: None
    check_writable(run_dir)
    if is_main:
        lock.acquire()
    check_run_dir(run_dir, values, resumable, run.resume, run.overwrite, script)
    # --model's tokenizer and context; an unreachable hub is not asked again this process
    hub_ok = offline_unless_hub_reachable()
    model_path, _ = model_to_load(spec.model)
    with clear_errors("--model"):
        try:
            tokenizer = load_tokenizer(model_path)
        except OSError:
            if not hub_ok and not Path(model_path).exists():
                raise hub_error("--model", model_path) from None
            raise
        context = spec.max_prompt_len + spec.max_completion_len + spec.extra_context
        check_context_length(model_path, context, "--max_prompt_len + --max_completion_len" + spec.extra_context_flags)
    rows, opens_think = load_prompts(
        spec.dataset, tokenizer, spec.template, spec.max_prompt_len, problem_field=run.problem_field,
        answer_field=run.answer_field, solution_field=run.solution_field, bad_rows=run.bad_rows, say=say,
        few_shot=spec.few_shot, seed=spec.seed,
    )  # fmt: skip
    if spec.check_data is not None:
        spec.check_data(rows)
    # each --reward_fn called as training calls it, on stand-ins for a few rows: one that would fail in training
    # fails here (`common.rewards.probe_reward_fn`)
    per_step = spec.prompts_per_step // launch_world() * spec.group_size
    with clear_errors("--reward_fn"):
        for name in filter(None, (spec.reward_fn or "").split(",")):
            probe_reward_fn(load_reward_fn(name), rows, tokenizer.decode, per_step, say)
    with clear_errors():
        total_steps, length = count_steps(spec.steps, spec.epochs, len(rows), spec.prompts_per_step)
    if is_main:
        print(f"{script}: {length}, {spec.prompts_per_step} prompts x {spec.group_size} completions a step")
    eval_sets = {}
    if run.eval_steps:  # fail fast, before training
        with clear_errors("--eval_benchmarks"):
            eval_sets = load_benchmarks(run.eval_benchmarks)
    return Prepared(run_dir, lock, is_main, model_path, tokenizer, rows, opens_think, total_steps, eval_sets)
