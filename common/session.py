"""A training session: everything around the algorithm, in parts by the role the steps use, set up in one call.

    s = start_session("grpo_base", spec_from(args, ...), run, flag_record(args, run))
    with s:                                       # closes on any exit: the final line, or the error's
        for step in s.steps():                    # stops early, after saving, on SIGTERM / Ctrl-C
            ...                                   # the algorithm: rollout, rewards, pi_old, advantages, update
            s.rollout.sync_weights(s.trainer)     # the rollout engine gets the new weights
            s.end_step(step + 1, metrics, timer)  # evaluate, log, save

The parts, each built by the module that holds it:

- `s.trainer` (common/trainer.py): the accelerator, the policy and the reference model, the optimiser and its
  schedule, the micro-batches of a pass, the optimiser step;
- `s.rollout` (common/rollout_side.py): the rollout engine, the prompt sampler, each prompt's seed, the
  engine's sleep and its wake-up with the new weights (the sync);
- `s.rewards` (common/scoring.py): the reward terms and the answer verifier, scoring a step's completions;
- `s.io` (common/run_io.py): the run directory, the log, checkpoints, the evaluation during training and the
  health checks that read the steps.

`start_session` checks what it can before a model loads (common/before_loading.py), then builds the trainer,
the rollout side, resumes from the newest good checkpoint when asked, builds the rewards and the run's I/O,
and records the run's flags. The scripts never see a flag of RunFlags by name, and common/ reads a script's
Args once, by the names of the flags every script shares, into the spec of what is trained
(`common.train_spec.spec_from`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from common.rollout_side import Rollout
from common.run_flags import RunFlags
from common.run_io import RunIO
from common.scoring import Scorer
from common.train_spec import TrainSpec
from common.trainer import Trainer


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
        """Normal end: `close()`. An error: the progress bar ends its line first (the error's own line
        must not run on after it), then the engine, the verifier and the lock are let go."""
        if kind is None:
            self.close()
            return
        self.io.logger.abort()
        for release in (self.rewards.close, self.rollout.engine.close, self.io.lock.release):
            try:
                release()
            except Exception:  # noqa: BLE001 - the error being raised is the one to report
                pass

    def steps(self) -> Iterator[int]:
        """The step indices still to run; ends early once a stop signal has been honoured."""
        for step in range(self.io.start_step, self.io.total_steps):
            if self.io.stop.stopped:
                return
            yield step

    def timer(self):
        """A step's phase timer; on a GPU it waits for the device at each boundary (its kernels run asynchronously)."""
        from common.metrics import PhaseTimer

        return PhaseTimer(sync=self.trainer.device_sync)

    def evaluate(self) -> tuple[dict, list[dict]]:
        """pass@k of the live policy on --eval_benchmarks, its problems split over the ranks (summary on every rank)."""
        return self.io.evaluation.run(
            self.rollout.engine, self.rollout.tokenizer, self.rewards.verifier, self.trainer.accelerator
        )

    def evaluate_before_training(self) -> None:
        """Step 0: the policy before training, every curve's start; its per-sample records go beside the final
        evaluation's (before vs after, sample by sample)."""
        io = self.io
        io.say(f"evaluating the policy before training (--eval_benchmarks {io.evaluation.benchmarks})")
        summary, records = self.evaluate()
        io.record_eval(0, summary, records, io.run_dir / "eval-step-0")
        io.logger.log(0, summary, advance=False)  # the same on every rank: the evaluation gathers its records

    def end_step(self, step: int, metrics: dict, timer, samples=None) -> None:
        """After the update and the sync: evaluate when due, add the run's own figures (phase times, memory,
        learning rate, unchecked answers), reduce over ranks, log (and `samples`: the step's dataset rows,
        texts, rewards, advantages), warn, agree on a stop over the ranks, save when due."""
        from common.distributed import peak_memory_gb, reduce_metrics
        from common.health import warn_rollout_gap

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
        """Close the log, the trackers and the verifier; print one closing line (the final figures and
        where the model is, or how to resume a stopped run); exit non-zero if a signal stopped it."""
        from common.checkpoint import ensure_export
        from common.distributed import end_rank

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
    """Set up a run (module docstring). `script`: the script's name (the default --output_dir is
    runs/<script>); `spec`: what is trained (`common.train_spec.spec_from`); `run`: how the run goes; `flags`:
    `common.cli.flag_record(args, run)`, recorded in run_config.json. Whether a GPU trains is asked here once
    and passed down (`precision_for`, the memory preflight)."""
    import torch

    from common.before_loading import check_before_loading, check_launch_and_rewards, check_prompt_format
    from common.evaluation import TrainingEval
    from common.machine import describe_machine
    from common.models import announce_loading, precision_for
    from common.prompts import pool_of
    from common.rollout_side import engine_size, open_rollout
    from common.run_flags import launch_world
    from common.run_io import open_run_io
    from common.scoring import open_scorer
    from common.trainer import open_trainer

    values, resumable = flags
    machine = describe_machine(
        torch.get_num_threads(), torch.cuda.get_device_name() if torch.cuda.is_available() else None
    )
    terms, custom = check_launch_and_rewards(spec.rewards, spec.reward_fn, spec.prompts_per_step, spec.group_size)
    pre = check_before_loading(script, spec, run, values, resumable)
    gpu, say0 = torch.cuda.is_available(), print if pre.is_main else lambda _: None
    stop = check_prompt_format(
        terms, pre.rows[0]["prompt_ids"], pre.tokenizer, spec.template, spec.few_shot, run.stop, say0,
        bool(run.eval_steps),
    )  # fmt: skip
    precision = precision_for(run.precision, gpu)
    announce_loading(say0, pre.model_path, spec.reference_model, run.rollout, run.precision, gpu, machine["bf16_units"])
    size = engine_size(spec, run, launch_world(), pre.eval_sets)  # the preflight plans it, the rollout builds it
    trainer = open_trainer(spec, run, pre.model_path, precision, pre.run_dir, pre.total_steps, gpu, say0, size)
    rollout = open_rollout(spec, run, pre.model_path, pre.tokenizer, trainer, precision, pre.rows, size, stop, say0)
    start_step = 0
    if run.resume and (state := trainer.resume(pre.run_dir)) is not None:
        rollout.resume(state, trainer)
        start_step = state["step"]
    rewards = open_scorer(run, terms, custom, pre.opens_think, pre.tokenizer, trainer.device)
    evaluation = TrainingEval(
        run.eval_steps, run.eval_benchmarks, pre.eval_sets, run.eval_n, run.eval_temperature, spec.template,
        spec.max_completion_len, spec.top_p, spec.seed, spec.max_prompt_len, spec.few_shot,
        pool_of(pre.rows, spec.few_shot) if spec.few_shot else None,
    )  # fmt: skip
    io = open_run_io(
        script, run, pre, values, trainer.accelerator, trainer.mode, start_step,
        machine | {"precision": precision.record()}, evaluation, spec.group_size,
    )  # fmt: skip
    # The guard speaks through the log, and its advice on divergence names the newest checkpoint.
    trainer.guard.say, trainer.guard.checkpoint_hint = io.say, lambda: io.checkpoints.saved_step
    session = Session(spec, trainer, rollout, rewards, io)
    if run.eval_steps and run.eval_before and start_step == 0:
        session.evaluate_before_training()
    return session
