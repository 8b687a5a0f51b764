"""A training session: everything around the algorithm, set up in one call and driven by a few.

    s = start_session("grpo_base", run, flag_record(args, run), model=..., dataset=..., ...)
    with s:                                     # closes on any exit: the final line, or the error's
        for step in s.steps():                  # stops early, after saving, on SIGTERM / Ctrl-C
            ...                                 # the algorithm: rollout, rewards, pi_old, advantages
            s.optimizer_step(step + 1, sums)    # inside the update: clip, skip a bad update, step
            s.sync_weights()                    # the rollout engine gets the new weights
            s.end_step(step + 1, metrics, timer)  # evaluate, log, save

`start_session` checks everything that can be checked before a model loads (the run directory
and its lock, the model path, the context length, the data), then builds the accelerator, the
policy (and the reference model), the optimiser and its schedule, the prompt sampler, the
rollout engine, the answer verifier, the logger and the health checks, resumes from the newest
good checkpoint when asked, and records the run's flags. The scripts read its fields
(`s.model`, `s.engine`, `s.tokenizer`, ...) and call its methods; they never see a flag of
RunFlags by name, and this module never sees a script's Args.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from common.cli import clear_errors, require
from common.lr_schedule import lr_lambda, set_base_lr
from common.models import Precision, announce_loading, precision_for
from common.run_flags import RunFlags, check_batch_split, launch_world


@dataclass
class Scores:
    """A step's rewards as tensors on the training device, one entry per completion."""

    reward: object  # [N] float: the sum of the reward terms
    accuracy: object  # [N] float: 0/1 correctness
    checked: object  # [N] bool: False where the verifier ran out of time before checking the answer

    def without_unchecked_groups(self, advantages, G: int):
        """`advantages` ([N] or [N, C]) with every group that holds an unchecked answer set to 0: its
        rewards would score that answer wrong, a guess; no advantage is better than a wrong one."""
        keep = self.checked.view(-1, G).all(1).repeat_interleave(G).float()
        return advantages * keep.view(-1, *[1] * (advantages.dim() - 1))


@dataclass
class OptimizerStep:
    loss: float  # the mini-batch's loss, over all ranks
    grad_norm: float  # before clipping (NaN when DeepSpeed clips inside its own step)
    applied: bool  # False: skipped (not finite, or a gradient-norm spike)
    sums: dict  # the micro-batches' sums over all ranks, as floats (the loss summed, not averaged)


class Session:
    """What `start_session` built. Fields: accelerator, device, rank, world, mode (how the model is
    laid out over ranks), model, ref_model, layout (how passes run a micro-batch: `common.batching.select`),
    tokenizer, optimizer, scheduler, engine, verifier, sampler, opens_think, start_step, total_steps,
    logger, run_dir."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    # -- the loop ---------------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind, error, tb) -> None:
        """Normal end: `close()`. An error: the progress bar ends its line first (the error's own line
        must not run on after it), then the engine, the verifier and the lock are let go."""
        if kind is None:
            self.close()
            return
        self.logger.abort()
        for release in (self.verifier.close, self.engine.close, self.lock.release):
            try:
                release()
            except Exception:  # noqa: BLE001 - the error being raised is the one to report
                pass

    def steps(self) -> Iterator[int]:
        """The step indices still to run; ends early once a stop signal has been honoured."""
        for step in range(self.start_step, self.total_steps):
            if self.stop.stopped:
                return
            yield step

    def timer(self):
        from common.metrics import PhaseTimer

        return PhaseTimer(sync=self._cuda_sync)

    def score(self, texts: list[str], rows: list[dict]) -> Scores:
        """Rewards of the step's completions (`rows`: each completion's dataset row)."""
        import torch

        from common.rewards import RewardFnError, compute_rewards, flat_reason, reward_columns

        columns = reward_columns(rows, self.tokenizer.decode) if self.custom_rewards else None
        try:
            r = compute_rewards(
                texts, [row["answer"] for row in rows], self.reward_terms, self.verifier,
                prompt_ends_with_think=self.opens_think, custom=self.custom_rewards, columns=columns,
            )  # fmt: skip
        except RewardFnError as e:
            raise SystemExit(f"error: --reward_fn: {e}") from None
        if not self.scored_once and (why := flat_reason(r, texts, self.group_size)):  # say why at once, not in 10 steps
            self.logger.write(why)
        self.scored_once = True
        self.unchecked += len(r.checked) - sum(r.checked)
        as_tensor = lambda x, dtype: torch.tensor(x, device=self.device, dtype=dtype)
        return Scores(
            as_tensor(r.total, torch.float32), as_tensor(r.accuracy, torch.float32), as_tensor(r.checked, torch.bool)
        )

    def micro_batch_plan(self, batch: dict, rows: list[int]) -> list[list[int]]:
        """The micro-batches (rows of `batch`) of one forward/backward each (`common.batching.micro_batches`);
        when several processes train, every rank runs as many (the most any rank has)."""
        from common.distributed import micro_batch_plan

        return micro_batch_plan(
            self.accelerator, batch, rows, self.micro_batch_size, self.max_tokens_per_micro_batch, self.memory_tokens
        )

    def accumulate(self, last: bool):
        """Context of one micro-batch's forward/backward; gradients are reduced over ranks on the `last`."""
        from common.distributed import micro_batch

        return micro_batch(self.accelerator, self.model, self.mode, last)

    def optimizer_step(self, step: int, local_sums: dict) -> OptimizerStep:
        """Clip the accumulated gradient, then apply the update unless its loss or gradient norm is not
        finite or spikes (`common.health`), step the schedule, and clear the gradients. Every rank
        must call it (the loss is summed over ranks, so all ranks decide alike). `local_sums`: this
        rank's sums over the optimiser step's micro-batches ("loss" and any statistics), numbers or
        0-dim tensors left on the device: they are summed over ranks and read, with the gradient
        norm, in one wait for the device."""
        from common.distributed import global_sum

        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if grad_norm is None:  # DeepSpeed clips in its own step
            grad_norm = math.nan
        elif hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        # The norm is the same on every rank: each rank's share of the sum is norm / world.
        sums = global_sum(self.accelerator, dict(local_sums) | {"grad_norm": grad_norm / self.world})
        grad_norm, loss = sums.pop("grad_norm"), sums["loss"] / self.world
        applied = self.guard.check(step, loss, grad_norm, self.scheduler.get_last_lr()[0])
        if applied:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad()
        self.skipped_this_step |= not applied
        return OptimizerStep(loss, grad_norm, applied, sums)

    def sync_weights(self) -> None:
        """Push the policy's weights into the rollout engine (a no-op for the HF engine)."""
        from common.distributed import state_dict_for_sync

        self.engine.load_weights(state_dict_for_sync(self.accelerator, self.model, self.engine.weight_dtype))

    def evaluate(self) -> tuple[dict, list[dict]]:
        """pass@k of the live policy on --eval_benchmarks, its problems split over the ranks (summary on every rank)."""
        from common.evaluation import evaluate

        return evaluate(
            self.engine, self.tokenizer, self.eval_sets, self.template, self.eval_n, self.eval_temperature,
            self.max_completion_len, self.top_p, seed=self.seed, verifier=self.verifier,
            max_prompt_len=self.max_prompt_len, accelerator=self.accelerator, few_shot=self.few_shot,
            few_shot_pool=self.few_shot_pool,
        )  # fmt: skip

    def end_step(self, step: int, metrics: dict, timer, samples=None) -> None:
        """After the update and the sync: evaluate when due, add the run's own figures (phase times,
        memory, learning rate, unchecked answers), reduce over ranks, log (and `samples`: the step's
        dataset rows, texts, rewards, advantages), warn, save when due; stop after a signal."""
        from common.distributed import peak_memory_gb, reduce_metrics

        step_s = sum(timer.seconds.values())  # the step itself; evaluation is timed on its own
        if self.eval_steps and (step % self.eval_steps == 0 or step == self.total_steps):
            with timer("eval"):
                summary, records = self.evaluate()
            metrics |= summary
            self.logger.eval_line(step, summary)
            if step == self.total_steps and self.is_main:
                from common.evaluation import write_results

                write_results(self.run_dir, summary, records, {"step": step, "benchmarks": self.eval_benchmarks})
        metrics |= {f"time/{k}_s": v for k, v in timer.seconds.items()} | {
            "time/step_s": step_s,
            "time/peak_mem_gb": peak_memory_gb(),
            "reward/timeouts": self.verifier.take_timeouts(),
            "reward/unchecked": self.unchecked,
            "train/lr": self.scheduler.get_last_lr()[0],
        }
        metrics = reduce_metrics(self.accelerator, {k: float(v) for k, v in metrics.items()})
        metrics["train/epoch"] = self.sampler.epoch
        if metrics["reward/unchecked"]:
            self.logger.write(
                f"step {step}: {metrics['reward/unchecked']:.0f} answers were not checked within --reward_time_budget_s="
                f"{self.verifier.budget_s}; their groups trained on nothing (raise the budget or --verifier_workers)"
            )
        self.unchecked = 0
        self.logger.log(step, metrics)
        self.logger.log_samples(step, samples, self.tokenizer.decode)
        self.watch.update(step, metrics["train/zero_adv_group_frac"], metrics["train/truncated_frac"])
        self.stop.agree(self.accelerator)  # every rank stops after the same step
        self._save_if_due(step)
        self.last_metrics = metrics
        self.skipped_this_step = False

    def close(self) -> None:
        """Close the log, the trackers and the verifier; print one closing line (the final figures and
        where the model is, or how to resume a stopped run); exit non-zero if a signal stopped it."""
        from common.checkpoint import ensure_export

        if self.is_main and not self.stop.stopped:
            ensure_export(self.run_dir, self.total_steps)  # a resume of a finished run whose export was cut short
        self.accelerator.wait_for_everyone()  # the last collective: the engine's teardown may end the process group
        self.verifier.close()
        self.engine.close()
        self.accelerator.end_training()  # the trackers' last writes
        self.logger.close(self.last_metrics, stopped=self.stop.message(self.saved_step))
        self.lock.release()
        if self.stop.stopped:
            raise SystemExit(self.stop.exit_code)

    # -- internals ----------------------------------------------------------------

    def _save_if_due(self, step: int) -> None:
        from common.checkpoint import save_checkpoint

        final = step == self.total_steps
        due = (
            final
            or self.stop.stopped
            or (self.save_steps and step % self.save_steps == 0)
            or (self.save_minutes and time.monotonic() - self.last_save >= 60 * self.save_minutes)
        )
        # A step whose update was skipped is not saved on schedule: a diverging run keeps its last
        # checkpoint from before the trouble as its newest (the resume advice points there).
        if not due or (self.skipped_this_step and not (final or self.stop.stopped)):
            return
        saved = save_checkpoint(
            self.accelerator, self.model, self.tokenizer, self.run_dir, step, {"sampler": self.sampler.state_dict()},
            self.keep_last, export=final, mode=self.mode,
        )  # fmt: skip
        if saved is not None:
            self.saved_step, self.last_save = step, time.monotonic()


def start_session(
    script: str, run: RunFlags, flags: tuple[dict, set[str]], *, model: str, dataset: str, template: str, rewards: str,
    reward_fn: str | None, seed: int, steps: int, epochs: float | None, prompts_per_step: int, group_size: int,
    max_prompt_len: int, max_completion_len: int, optimizer: Callable, lr_schedule: str, warmup_steps: int,
    optimizer_steps_per_step: int, grad_clip: float, reference_model: bool, top_p: float = 1.0, extra_context: int = 0,
    extra_context_flags: str = "", check_data: Callable[[list[dict]], None] | None = None, few_shot: int = 0,
) -> Session:  # fmt: skip
    """Set up a run (module docstring). `script`: the script's name (the default --output_dir is
    runs/<script>); `flags`: `common.cli.flag_record(args, run)`, recorded in run_config.json;
    `optimizer`: params -> torch optimizer; `optimizer_steps_per_step`: how many the update takes (the
    learning-rate schedule's length is counted in them); `extra_context`: tokens a sequence may grow beyond
    prompt + completion (EDGE-GRPO's reflections), named by `extra_context_flags` in errors;
    `check_data`: called with the dataset's rows before any model loads (one-line errors); `few_shot`: K worked
    examples from the dataset's solutions before each training and evaluation problem. Its steps are the
    functions below; whether a GPU trains is asked here once and passed down (`precision_for`, `check_memory`)."""
    import torch
    from accelerate.utils import set_seed

    from common.health import SignalWatch, StopSignal, UpdateGuard
    from common.machine import describe_machine
    from common.prompts import pool_of
    from common.sampler import PromptSampler

    values, resumable = flags
    machine = describe_machine(
        torch.get_num_threads(), torch.cuda.get_device_name() if torch.cuda.is_available() else None
    )
    terms, custom = check_launch_and_rewards(rewards, reward_fn, prompts_per_step, group_size)
    pre = check_before_loading(
        script, run, values, resumable, model=model, dataset=dataset, template=template, seed=seed, steps=steps,
        epochs=epochs, prompts_per_step=prompts_per_step, group_size=group_size, few_shot=few_shot,
        context=(max_prompt_len, max_completion_len + extra_context, extra_context_flags), check_data=check_data,
    )  # fmt: skip
    gpu, say0 = torch.cuda.is_available(), print if pre.is_main else lambda _: None
    stop = check_prompt_format(
        terms, pre.rows[0]["prompt_ids"], pre.tokenizer, template, few_shot, run.stop, say0, bool(run.eval_steps)
    )
    from common.batching import device_memory_gib

    precision = precision_for(run.precision, gpu)
    announce_loading(say0, pre.model_path, reference_model, run.rollout, run.precision, gpu)
    accelerator, mode = open_accelerator(
        run, grad_clip, precision, pre.run_dir, pre.model_path, reference_model, device_memory_gib(gpu)
    )
    set_seed(seed + accelerator.process_index)
    policy, ref_model, opt, scheduler, layout, memory_tokens = load_models(
        run, pre.model_path, precision, accelerator, reference_model, optimizer,
        lr_lambda(lr_schedule, warmup_steps, pre.total_steps * optimizer_steps_per_step),
        max_prompt_len + extra_context, max_completion_len, say=say0,
    )  # fmt: skip
    world = accelerator.num_processes
    sampler = PromptSampler(pre.rows, prompts_per_step, seed=seed, rank=accelerator.process_index, world_size=world)
    engine = rollout_engine(
        run, pre.model_path, pre.tokenizer, accelerator.unwrap_model(policy), mode, precision,
        seed=seed + accelerator.process_index, max_prompt_len=max_prompt_len, added_len=max_completion_len + extra_context,
        rows=pre.rows, eval_sets=pre.eval_sets, prompts_per_step=prompts_per_step, group_size=group_size, say=say0,
        stop=stop,
    )  # fmt: skip
    start_step = resume(run.resume, accelerator, pre.run_dir, policy, opt, scheduler, sampler, engine)
    verifier, logger = open_logs(
        run, pre.run_dir, script, values, accelerator, mode, start_step, pre.total_steps, pre.is_main,
        machine | {"precision": precision.record()},
    )  # fmt: skip
    say = logger.write if accelerator.is_main_process else lambda _: None
    session = Session(
        accelerator=accelerator, device=accelerator.device, rank=accelerator.process_index, world=world, mode=mode,
        is_main=accelerator.is_main_process, model=policy, ref_model=ref_model, tokenizer=pre.tokenizer, optimizer=opt,
        scheduler=scheduler, engine=engine, verifier=verifier, sampler=sampler, opens_think=pre.opens_think,
        start_step=start_step, total_steps=pre.total_steps, logger=logger, run_dir=pre.run_dir, lock=pre.lock,
        reward_terms=terms, custom_rewards=custom, guard=UpdateGuard(run.max_nonfinite_steps, run.grad_spike_factor, say=say),
        watch=SignalWatch(run.warn_flat_steps, say=say), stop=StopSignal(), grad_clip=grad_clip,
        micro_batch_size=run.micro_batch_size, layout=layout, memory_tokens=memory_tokens,
        max_tokens_per_micro_batch=run.max_tokens_per_micro_batch, save_steps=run.save_steps, save_minutes=run.save_minutes,
        keep_last=run.keep_last, eval_steps=run.eval_steps, eval_sets=pre.eval_sets, eval_benchmarks=run.eval_benchmarks,
        eval_n=run.eval_n, eval_temperature=run.eval_temperature, template=template, seed=seed, top_p=top_p,
        max_prompt_len=max_prompt_len, max_completion_len=max_completion_len, last_metrics={}, unchecked=0,
        saved_step=start_step or None, last_save=time.monotonic(), skipped_this_step=False,
        _cuda_sync=torch.cuda.synchronize if gpu else None,
        few_shot=few_shot, few_shot_pool=pool_of(pre.rows, few_shot) if few_shot else None,
        group_size=group_size, scored_once=False,
    )  # fmt: skip
    session.guard.checkpoint_hint = lambda: session.saved_step
    if run.eval_steps and run.eval_before and start_step == 0:
        evaluate_before_training(session, run.eval_benchmarks, say)
    return session


def check_launch_and_rewards(
    rewards: str, reward_fn: str | None, prompts_per_step: int, group_size: int
) -> tuple[list[str], list]:
    """The checks that need nothing but the flags and the launch: the process count (accelerate sets
    WORLD_SIZE before any process starts), the reward terms, and each --reward_fn called on a few
    completions now, before any model loads. Returns (the reward terms, the custom reward functions)."""
    from common.distributed import check_launch
    from common.rewards import REWARD_FUNCS, load_reward_fn, probe_reward_fn

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
        per_step = prompts_per_step // world_env * group_size
        say0 = print if int(os.environ.get("RANK", "0")) == 0 else lambda _: None
        custom = [
            probe_reward_fn(load_reward_fn(spec), per_step, say0) for spec in (reward_fn or "").split(",") if spec
        ]
    return terms, custom


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


def check_before_loading(
    script: str, run: RunFlags, values: dict, resumable: set[str], *, model: str, dataset: str, template: str,
    seed: int, steps: int, epochs: float | None, prompts_per_step: int, group_size: int, few_shot: int,
    context: tuple[int, int, str], check_data: Callable[[list[dict]], None] | None,
) -> Prepared:  # fmt: skip
    """Everything that can be checked without a model, each with a one-line error: the run directory (locked
    by rank 0), the model's path and its context (`context`: the prompt's length, the completion's with any
    extra context, and the flags that add to it), the data, the step count and the benchmarks."""
    from common.console import quiet_libraries
    from common.math_data import load_prompts
    from common.models import (
        check_context_length,
        hub_error,
        load_tokenizer,
        model_to_load,
        offline_unless_hub_reachable,
    )
    from common.run_dir import RunLock, check_run_dir, check_writable
    from common.sampler import count_steps

    quiet_libraries()  # our progress bar and lines; library notices that need no action are filtered
    run_dir = Path(run.output_dir or f"runs/{script}")
    lock = RunLock(run_dir)
    is_main = int(os.environ.get("RANK", "0")) == 0
    check_writable(run_dir)
    if is_main:
        lock.acquire()
    check_run_dir(run_dir, values, resumable, run.resume, run.overwrite, script)
    hub_ok = offline_unless_hub_reachable()
    model_path, _ = model_to_load(model)
    prompt_len, completion_len, extra_flags = context
    with clear_errors("--model"):
        try:
            tokenizer = load_tokenizer(model_path)
        except OSError:
            if not hub_ok and not Path(model_path).exists():
                raise hub_error("--model", model_path) from None
            raise
        check_context_length(
            model_path, prompt_len + completion_len, "--max_prompt_len + --max_completion_len" + extra_flags
        )
    rows, opens_think = load_prompts(
        dataset, tokenizer, template, prompt_len, problem_field=run.problem_field, answer_field=run.answer_field,
        solution_field=run.solution_field, bad_rows=run.bad_rows, say=print if is_main else lambda _: None,
        few_shot=few_shot, seed=seed,
    )  # fmt: skip
    if check_data is not None:
        check_data(rows)
    with clear_errors():
        total_steps, length = count_steps(steps, epochs, len(rows), prompts_per_step)
    if is_main:
        print(f"{script}: {length}, {prompts_per_step} prompts x {group_size} completions a step")
    eval_sets = {}
    if run.eval_steps:  # fail fast, before training
        from common.benchmarks import load_benchmarks

        with clear_errors("--eval_benchmarks"):
            eval_sets = load_benchmarks(run.eval_benchmarks)
    return Prepared(run_dir, lock, is_main, model_path, tokenizer, rows, opens_think, total_steps, eval_sets)


def open_accelerator(
    run: RunFlags, grad_clip: float, precision: Precision, run_dir: Path, model_path: str, reference_model: bool,
    device_gib: float | None,
):  # fmt: skip
    """The accelerator and the parallel mode, then the checks that need them, before any weight loads: every
    rank sees the run directory (multi-node), no reference model under ZeRO-3, and the memory preflight on a
    device of `device_gib` GiB (None: CPU, not planned). Returns (accelerator, mode)."""
    from common.distributed import make_accelerator, parallel_mode
    from common.run_dir import check_shared

    accelerator = make_accelerator(precision.mixed, grad_clip, run.micro_batch_size, run.report_to, str(run_dir))
    check_shared(run_dir, accelerator)  # multi-node: every rank sees what rank 0 writes (before minutes of loading)
    mode = parallel_mode(accelerator)  # decided once, from accelerate's state; passed to what depends on it
    require(
        not (reference_model and mode.kind == "zero3"),
        "--beta > 0 under DeepSpeed ZeRO-3: the reference model would be partitioned and never wrapped; "
        "use configs/accelerate/fsdp2.yaml (the reference model is then loaded whole on each GPU) or --beta 0",
    )
    check_memory(run, model_path, mode, reference_model, device_gib)
    return accelerator, mode


def check_memory(run: RunFlags, model_path: str, mode, reference_model: bool, device_gib: float | None):
    """The memory preflight (`common.preflight.preflight_memory`) of this run's flags under `mode`, on a device
    of `device_gib` GiB (None: nothing is planned). Returns the plan (GiB per item) or None."""
    from common.preflight import preflight_memory

    return preflight_memory(  # refuse a plan whose memory cannot fit, before any weight loads
        model_path, mode=mode.kind, world=mode.world, precision=run.precision, reference_model=reference_model,
        vllm_utilization=run.vllm_gpu_memory_utilization if run.rollout == "vllm" else 0.0, total_gib=device_gib,
    )  # fmt: skip


def load_models(
    run: RunFlags, model_path: str, precision: Precision, accelerator, reference_model: bool, optimizer: Callable,
    schedule: Callable[[int], float], prompt_len: int, completion_len: int, say,
) -> tuple:  # fmt: skip
    """The policy (prepared by accelerate with its optimiser), the reference model when asked, the learning-rate
    schedule (`schedule`: the multiplier per optimiser step), the passes' layout and the micro-batch token budget.
    Returns (policy, reference model or None, optimiser, scheduler, layout, memory tokens)."""
    import torch

    from common.batching import micro_batch_tokens, pass_layout, sliding
    from common.distributed import confine_zero3_linear
    from common.models import load_policy, load_reference_model

    policy = load_policy(model_path, precision.policy, run.gradient_checkpointing)
    ref_model = None
    if reference_model:  # only then: all four papers train without it
        ref_model = load_reference_model(model_path, precision.reference, accelerator.device)
    for m in filter(None, (policy, ref_model)):
        if run.attn_implementation != "auto":
            m.set_attn_implementation(run.attn_implementation)
    layout = pass_layout(
        run.padding_free, run.share_prompts, policy.config._attn_implementation, sliding(policy.config)
    )
    memory_tokens = micro_batch_tokens(
        policy.config, precision.activation_bytes, prompt_len, completion_len,
        memory_gb=run.micro_batch_memory_gb, micro_batch_size=run.micro_batch_size,
        max_tokens_per_micro_batch=run.max_tokens_per_micro_batch, gradient_checkpointing=run.gradient_checkpointing,
        say=say,
    )  # fmt: skip
    opt = optimizer(policy.parameters())
    # The schedule counts optimiser steps (--mu x --num_minibatches a step), as the scheduler is stepped.
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    policy, opt = accelerator.prepare(policy, opt)
    confine_zero3_linear(policy)  # DeepSpeed's F.linear for the policy only, not the rollout engine's layers
    accelerator.register_for_checkpointing(scheduler)  # stepped once per optimiser step, on every rank
    return policy, ref_model, opt, scheduler, layout, memory_tokens


def rollout_engine(
    run: RunFlags, model_path: str, tokenizer, policy, mode, precision: Precision, *, seed: int, max_prompt_len: int,
    added_len: int, rows: list[dict], eval_sets: dict, prompts_per_step: int, group_size: int, say, stop: list[str] = (),
):  # fmt: skip
    """The rollout engine of --rollout (`common.rollout.make_engine`), sized for a step's rollout or an
    evaluation on this rank, whichever is larger, for sequences of `max_prompt_len` + `added_len` tokens (the
    completion and any extra context); `seed`: this rank's; `stop`: the stop strings. Says when its KV cache
    cannot hold a step at once."""
    from common.rollout import make_engine

    world = mode.world
    rows_per_rank = prompts_per_step // world * group_size  # sequences sampled at once: the rollout, an evaluation
    eval_rows_per_rank = max((len(r) for r in eval_sets.values()), default=0) * run.eval_n // world
    engine = make_engine(
        run.rollout, model_path, tokenizer, policy, seed=seed, world=world,
        max_model_len=max_prompt_len + added_len, dtype=precision.engine,
        gpu_memory_utilization=run.vllm_gpu_memory_utilization, sleep=run.vllm_sleep,
        max_num_seqs=run.vllm_max_num_seqs or min(1024, max(rows_per_rank, eval_rows_per_rank)),
        max_num_batched_tokens=run.vllm_max_num_batched_tokens, synced=mode.sharded, per_prompt_seeds=run.per_prompt_seeds,
        stop=stop,
    )  # fmt: skip
    kv_note = engine.kv_cache_note(
        [len(r["prompt_ids"]) for r in rows], prompts_per_step // world, group_size, added_len
    )
    if kv_note:
        say(kv_note)
    return engine


def resume(asked: bool, accelerator, run_dir: Path, policy, optimizer, scheduler, sampler, engine) -> int:
    """With --resume and a good checkpoint: its weights, optimiser, schedule (at this run's learning rate), RNG
    and data order, then the rollout engine's copy of the weights. Returns the step to start from (0: none)."""
    if not asked:
        return 0
    from common.checkpoint import load_checkpoint
    from common.distributed import state_dict_for_sync

    base_lrs = list(scheduler.base_lrs)
    state = load_checkpoint(accelerator, run_dir)
    if state is None:
        return 0
    sampler.load_state_dict(state["sampler"])
    set_base_lr(optimizer, scheduler, base_lrs)  # this run's --lr, not the checkpoint's
    engine.load_weights(state_dict_for_sync(accelerator, policy, engine.weight_dtype))
    return state["step"]


def open_logs(
    run: RunFlags, run_dir: Path, script: str, values: dict, accelerator, mode, start_step: int, total_steps: int,
    is_main: bool, machine: dict,
):  # fmt: skip
    """Once everything has loaded: the answer verifier, the run directory made this run's (rank 0), and the
    logger (metrics.jsonl, the progress bar, the trackers of --report_to). `machine`: what it runs on and in
    which precision (`common.machine.describe_machine`, read before loading), recorded with the launch.
    Returns (verifier, logger)."""
    from common.metrics import RunLogger
    from common.run_dir import start_run_dir
    from common.verifier import MathVerifier, default_workers

    verifier = MathVerifier(
        workers=run.verifier_workers or default_workers(),
        memory_mb=run.verifier_memory_mb,
        budget_s=run.reward_time_budget_s or None,
    )
    if is_main:  # everything has loaded: now the run directory is this run's
        # threads: CPU kernels round by them, so a CPU run's figures differ with them
        launch = {"processes": accelerator.num_processes, "parallel": mode.kind, "script": script}
        launch |= {"threads": machine["threads"], "machine": machine}
        start_run_dir(run_dir, values, start_step > 0, run.overwrite, launch)
    accelerator.wait_for_everyone()
    logger = RunLogger(
        run_dir, total_steps, accelerator.is_main_process, start_step, accelerator if run.report_to != "none" else None,
        values, project=run.project, run_name=run.run_name, log_every=run.log_every, log_samples=run.log_samples,
    )  # fmt: skip
    return verifier, logger


def evaluate_before_training(session: Session, benchmarks: str, say) -> None:
    """Step 0: the policy before training, every curve's start; its per-sample records go beside the final
    evaluation's (before vs after, sample by sample)."""
    say(f"evaluating the policy before training (--eval_benchmarks {benchmarks})")
    summary, records = session.evaluate()
    session.logger.eval_line(0, summary)
    if session.is_main:
        from common.evaluation import write_results

        write_results(session.run_dir / "eval-step-0", summary, records, {"step": 0, "benchmarks": benchmarks})
    session.logger.log(0, summary, advance=False)  # the same on every rank: the evaluation gathers its records
