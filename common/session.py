"""A training session: everything around the algorithm, in parts by the role the steps use, set up in one call.

    s = start_session("grpo_base", spec_from(args, ...), run, flag_record(args, run))
    with s:                                       # closes on any exit: the final line, or the error's
        for step in s.steps():                    # stops early, after saving, on SIGTERM / Ctrl-C
            ...                                   # the algorithm: rollout, rewards, pi_old, advantages, update
            s.rollout.sync_weights(s.trainer)     # the rollout engine gets the new weights
            s.end_step(step + 1, metrics, timer)  # evaluate, log, save

The parts (`s.trainer`, `s.rollout`, `s.rewards`, `s.io`) are mapped in docs/CODE.md. `start_session` first runs
what can be checked before any model loads, each failure one line: the launch and reward terms
(`check_launch_and_rewards`), the run directory, model, data, the reward terms against the prompt's answer format
(`common.prompts.check_prompt_format`), --reward_fn, steps and benchmarks (`check_before_loading` -> `Prepared`).
Past `spec_from`, nothing in common/ sees a script's Args."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.checkpoint import ensure_export, save_checkpoint
from common.cli import clear_errors, require
from common.evaluation import TrainingEval, load_benchmarks, write_results
from common.math_data import load_prompts
from common.metrics import (
    PhaseTimer,
    RunLogger,
    ScoreWatch,
    SignalWatch,
    StopSignal,
    describe_machine,
    peak_memory_gb,
    quiet_libraries,
    reduce_metrics,
    warn_rollout_gap,
)
from common.models import (
    check_context_length,
    hub_error,
    load_tokenizer,
    model_to_load,
    offline_unless_hub_reachable,
    precision_for,
)
from common.prompts import check_prompt_format, pool_of
from common.rewards import REWARD_FUNCS, Scorer, load_reward_fn, open_scorer, probe_reward_fn
from common.rollout import Rollout, count_steps, engine_size, open_rollout
from common.run_dir import RunLock, check_run_dir, check_writable, start_run_dir
from common.run_flags import RunFlags, launch_world
from common.trainer import Trainer, check_launch, end_rank, open_trainer


def check_launch_and_rewards(rewards: str, reward_fn: str | None) -> tuple[list[str], list]:
    """The checks that need only the flags and the launch (accelerate sets WORLD_SIZE before any process starts).
    Returns (the reward terms, the loaded --reward_fn functions)."""
    check_launch(dict(os.environ), sys.argv)
    terms = rewards.split(",")
    unknown = set(terms) - set(REWARD_FUNCS)
    require(
        not unknown,
        f"--rewards: unknown term(s) {sorted(unknown)}; choose from {sorted(REWARD_FUNCS)}, or add your own with --reward_fn",
    )
    with clear_errors("--reward_fn"):
        custom = [load_reward_fn(spec) for spec in (reward_fn or "").split(",") if spec]
    return terms, custom


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
    stop: list[str]  # the stop strings, --stop's and the few-shot format's
    pool: list[dict] | None  # the worked examples of prompts outside the dataset (--few_shot)


def check_before_loading(
    script: str, spec, run: RunFlags, values: dict, resumable: set[str], terms: list[str], custom: list
) -> Prepared:  # fmt: skip
    """Everything about `spec` (`common.session.TrainSpec`) checked without a model (`values` and `resumable`: the
    flags and which of them a resume may change; `terms`, `custom`: the reward terms and --reward_fn functions)."""
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
    stop = check_prompt_format(
        terms, rows[0]["prompt_ids"], tokenizer, spec.template, spec.few_shot, run.stop, say,
        bool(run.eval_steps),
    )  # fmt: skip
    pool = pool_of(rows, spec.few_shot) if spec.few_shot else None  # the evaluation's worked examples
    # each --reward_fn called as training calls it, on stand-ins for a few rows: one that would fail in training
    # fails here (`common.rewards.probe_reward_fn`)
    with clear_errors("--reward_fn"):
        for fn in custom:
            probe_reward_fn(fn, rows, tokenizer.decode)
    with clear_errors():
        total_steps, length = count_steps(spec.steps, spec.epochs, len(rows), spec.prompts_per_step)
    if is_main:
        print(f"{script}: {length}, {spec.prompts_per_step} prompts x {spec.group_size} completions a step")
    eval_sets = {}
    if run.eval_steps:  # fail fast, before training
        with clear_errors("--eval_benchmarks"):
            eval_sets = load_benchmarks(run.eval_benchmarks)
    return Prepared(
        run_dir, lock, is_main, model_path, tokenizer, rows, opens_think, total_steps, eval_sets, stop, pool
    )


@dataclass
class Session:
    spec: TrainSpec  # what is trained
    trainer: Trainer
    rollout: Rollout
    rewards: Scorer
    io: RunIO

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind, error, tb) -> None:
        """Normal end: `close()`. An error: the progress bar ends its line first (so the error's own line does not
        run on after it), then the engine, the verifier and the lock are let go."""
        if kind is None:
            self.close()
            return
        self.io.logger.abort()
        for release in (self.rewards.close, self.rollout.engine.close, self.io.lock.release):
            with contextlib.suppress(Exception):  # the error being raised is the one to report
                release()

    def steps(self) -> Iterator[int]:
        """The step indices still to run; ends early once a stop signal has been honoured."""
        for step in range(self.io.start_step, self.io.total_steps):
            if self.io.stop.stopped:
                return
            yield step

    def timer(self):
        """A step's phase timer; on a GPU it waits for the device at each boundary (its kernels run asynchronously)."""
        return PhaseTimer(sync=self.trainer.device_sync)

    def evaluate(self) -> tuple[dict, list[dict]]:
        """pass@k of the live policy on --eval_benchmarks, its problems split over the ranks (summary on every rank)."""
        return self.io.evaluation.run(
            self.rollout.engine, self.rollout.tokenizer, self.rewards.verifier, self.trainer.accelerator
        )

    def evaluate_before_training(self) -> None:
        """Step 0, every curve's start; its records go beside the final evaluation's (before vs after, per sample)."""
        io = self.io
        io.say(f"evaluating the policy before training (--eval_benchmarks {io.evaluation.benchmarks})")
        summary, records = self.evaluate()
        io.record_eval(0, summary, records, io.run_dir / "eval-step-0")
        io.logger.log(0, summary, advance=False)  # the same on every rank: the evaluation gathers its records

    def end_step(self, step: int, metrics: dict, timer, samples=None) -> None:
        """After the update and the sync: evaluate when due, add the run's own figures, reduce over ranks, log (and
        `samples`: see `RunLogger.log_samples`), warn, agree on a stop over the ranks, save when due."""
        io, trainer, verifier = self.io, self.trainer, self.rewards.verifier
        step_s = sum(timer.seconds.values())  # the step itself; evaluation is timed on its own
        if io.evaluation.due(step, io.total_steps):
            with timer("eval"):
                summary, records = self.evaluate()
            metrics |= summary
            io.record_eval(step, summary, records, io.run_dir if step == io.total_steps else None)
        metrics |= {f"time/{k}_s": v for k, v in timer.seconds.items()} | {
            "time/step_s": step_s,
            "time/peak_mem_gb": peak_memory_gb(),
            "reward/timeouts": verifier.take_timeouts(),
            "reward/unchecked": io.score_watch.take_unchecked(),
            "train/lr": trainer.learning_rate(),
        }
        metrics = reduce_metrics(trainer.accelerator, {k: float(v) for k, v in metrics.items()})
        metrics["train/epoch"] = self.rollout.sampler.epoch
        io.score_watch.warn_unchecked(step, metrics["reward/unchecked"], verifier.budget_s)
        io.logger.log(step, metrics)
        io.logger.log_samples(step, samples, self.rollout.tokenizer.decode)
        io.watch.update(step, metrics)
        warn_rollout_gap(step, metrics, io.last_metrics, io.say)  # did the first sync reach the engine's weights?
        io.stop.agree(trainer.accelerator)  # every rank stops after the same step
        final = step == io.total_steps
        io.checkpoints.save_if_due(
            step, trainer, self.rollout, final=final, stopping=io.stop.stopped, skipped=trainer.take_skipped()
        )
        io.last_metrics = metrics

    def close(self) -> None:
        """Close the log, trackers and verifier; print the closing line; exit non-zero if a signal stopped it."""
        io, accelerator = self.io, self.trainer.accelerator
        ranks = accelerator.num_processes
        if accelerator.is_main_process and not io.stop.stopped:
            ensure_export(io.run_dir, io.total_steps)  # a resume of a finished run whose export was cut short
        accelerator.wait_for_everyone()  # the last collective: the engine's teardown may end the process group
        self.rewards.close()
        self.rollout.engine.close()
        accelerator.end_training()  # the trackers' last writes
        io.logger.close(io.last_metrics, stopped=io.stop.message(io.checkpoints.saved_step))
        io.lock.release()
        code = io.stop.exit_code if io.stop.stopped else 0
        end_rank(code, ranks)  # several processes: each ends here (its docstring says why)
        if io.stop.stopped:
            raise SystemExit(code)


def start_session(script: str, spec: TrainSpec, run: RunFlags, flags: tuple[dict, set[str]]) -> Session:
    """Set up a run (module docstring). `script`: the default --output_dir is runs/<script>; `flags`:
    `common.cli.flag_record(args, run)`, recorded in run_config.json. Whether a GPU trains is asked here once."""
    values, resumable = flags
    machine = describe_machine(
        torch.get_num_threads(), torch.cuda.get_device_name() if torch.cuda.is_available() else None
    )
    terms, custom = check_launch_and_rewards(spec.rewards, spec.reward_fn)
    pre = check_before_loading(script, spec, run, values, resumable, terms, custom)
    gpu, say0 = torch.cuda.is_available(), print if pre.is_main else lambda _: None
    precision = precision_for(run.precision, gpu)
    loads = "the policy" + ", the reference model" * spec.reference_model + f" and the {run.rollout} rollout engine"
    say0(f"loading {pre.model_path}: {loads}")
    size = engine_size(spec, run, launch_world(), pre.eval_sets)  # the preflight plans it, the rollout builds it
    trainer = open_trainer(spec, run, pre.model_path, precision, pre.run_dir, pre.total_steps, gpu, say0, size)
    rollout = open_rollout(spec, run, pre.model_path, pre.tokenizer, trainer, precision, pre.rows, size, pre.stop)
    start_step = 0
    if run.resume and (state := trainer.resume(pre.run_dir)) is not None:
        rollout.resume(state, trainer)
        start_step = state["step"]
    rewards = open_scorer(run, terms, custom, pre.opens_think, pre.tokenizer, trainer.device)
    evaluation = TrainingEval(
        run.eval_steps, run.eval_benchmarks, pre.eval_sets, run.eval_n, run.eval_temperature, spec.template,
        spec.max_completion_len, spec.top_p, spec.seed, spec.max_prompt_len, spec.few_shot, pre.pool,
    )  # fmt: skip
    io = open_run_io(
        script, run, pre, values, trainer.accelerator, trainer.mode, start_step,
        machine | {"precision": precision.record()}, evaluation,
    )  # fmt: skip
    # The guard speaks through the log, and its advice on divergence names the newest checkpoint.
    trainer.guard.say, trainer.guard.checkpoint_hint = io.say, lambda: io.checkpoints.saved_step
    session = Session(spec, trainer, rollout, rewards, io)
    if run.eval_steps and run.eval_before and start_step == 0:
        session.evaluate_before_training()
    return session


@dataclass
class Checkpoints:
    """When the run saves (--save_steps, --save_minutes, the last step, a stop), and what it saved last."""

    run_dir: Path
    keep_last: int  # complete checkpoints kept on disk (0: all)
    save_steps: int  # 0: off
    save_minutes: float  # 0: off
    saved_step: int | None  # the newest checkpoint of this run (or the one it resumed from); None: none yet
    last_save: float = field(default_factory=time.monotonic)

    def save_if_due(self, step: int, trainer, rollout, *, final: bool, stopping: bool, skipped: bool) -> None:
        """Save `trainer`'s state and `rollout`'s data order after `step` when due. A step with a `skipped` update
        is not saved on schedule: a diverging run's newest checkpoint stays one from before the trouble."""
        due = (
            final
            or stopping
            or (self.save_steps and step % self.save_steps == 0)
            or (self.save_minutes and time.monotonic() - self.last_save >= 60 * self.save_minutes)
        )
        if not due or (skipped and not (final or stopping)):
            return
        saved = save_checkpoint(
            trainer.accelerator, trainer.model, rollout.tokenizer, self.run_dir, step,
            {"sampler": rollout.sampler.state_dict()}, self.keep_last, export=final,
        )  # fmt: skip
        if saved is not None:
            self.saved_step, self.last_save = step, time.monotonic()


@dataclass
class RunIO:
    run_dir: Path
    lock: object  # common.run_dir.RunLock, held by rank 0
    logger: RunLogger
    checkpoints: Checkpoints
    evaluation: TrainingEval
    watch: SignalWatch  # flat rewards over --warn_flat_steps steps
    score_watch: ScoreWatch  # answers each scoring left unchecked
    stop: StopSignal  # SIGTERM / Ctrl-C: stop after the step, once saved
    start_step: int
    total_steps: int
    is_main: bool
    last_metrics: dict = field(default_factory=dict)

    def say(self, line: str) -> None:
        """A console line on rank 0 that keeps the progress bar whole."""
        self.logger.write(line)

    def record_eval(self, step: int, summary: dict, records: list[dict], out_dir: Path | None) -> None:
        """An evaluation's console line, and its results and per-sample records in `out_dir` (rank 0; None: none)."""
        self.logger.eval_line(step, summary)
        if out_dir is not None and self.is_main:
            write_results(out_dir, summary, records, {"step": step, "benchmarks": self.evaluation.benchmarks})


def open_run_io(script: str, run: RunFlags, pre, values: dict, accelerator, mode, start_step: int, machine: dict,
                evaluation: TrainingEval) -> RunIO:  # fmt: skip
    """Once everything has loaded: the run directory made this run's (`pre`: `common.session.Prepared`), the
    logger, the checkpoint schedule and the health checks, which speak through the log."""
    if pre.is_main:
        # threads: CPU kernels round by them, so a CPU run's figures differ with them
        launch = {"processes": accelerator.num_processes, "parallel": mode.kind, "script": script}
        launch |= {"threads": machine["threads"], "machine": machine}
        start_run_dir(pre.run_dir, values, start_step > 0, run.overwrite, launch)
    accelerator.wait_for_everyone()
    logger = RunLogger(
        pre.run_dir, pre.total_steps, accelerator.is_main_process, start_step,
        accelerator if run.report_to != "none" else None, values, project=run.project, run_name=run.run_name,
        log_every=run.log_every, log_samples=run.log_samples,
    )  # fmt: skip
    stop = StopSignal()
    checkpoints = Checkpoints(pre.run_dir, run.keep_last, run.save_steps, run.save_minutes, start_step or None)
    return RunIO(
        pre.run_dir, pre.lock, logger, checkpoints, evaluation, SignalWatch(run.warn_flat_steps, say=logger.write),
        ScoreWatch(say=logger.write), stop, start_step, pre.total_steps, accelerator.is_main_process,
    )  # fmt: skip


# What a run trains: the fields a script's Args holds under these names (`spec_from` reads them), then what the
# script decides itself, passed by keyword.
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
    rollout_correction: str  # pi_old / pi_rollout weights: a mode of common.logprobs.MODES, or auto
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
    """The spec of a script's `args`: the FROM_ARGS fields by name, and `own`, what the script decides itself."""
    return TrainSpec(**{name: getattr(args, name) for name in FROM_ARGS}, **own)
