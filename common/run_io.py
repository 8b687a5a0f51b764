"""The run's I/O: its directory and lock, the log (metrics.jsonl, samples, the progress bar, trackers), the
checkpoints and when they are due, the evaluation during training, and the health checks that read the
steps: flat rewards, unchecked answers, stop signals (`RunIO`, built by `open_run_io`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from common.evaluation import TrainingEval
from common.health import ScoreWatch, SignalWatch, StopSignal
from common.metrics import RunLogger
from common.run_flags import RunFlags


@dataclass
class Checkpoints:
    """When the run saves (--save_steps, --save_minutes, the last step, a stop), and what it saved last."""

    run_dir: Path
    keep_last: int  # complete checkpoints kept on disk (0: all)
    save_steps: int  # 0: off
    save_minutes: float  # 0: off
    saved_step: int | None  # the newest checkpoint of this run (or the one it resumed from); None: none yet
    stop: StopSignal | None = None  # told which checkpoint is being written, for a second signal's line
    last_save: float = field(default_factory=time.monotonic)

    def save_if_due(self, step: int, trainer, rollout, *, final: bool, stopping: bool, skipped: bool) -> None:
        """Save `trainer`'s state and `rollout`'s data order after `step` when due. `skipped`: an update of the
        step was skipped: a step like that is not saved on schedule, so a diverging run keeps its last checkpoint
        from before the trouble as its newest (the resume advice points there)."""
        from common.checkpoint import save_checkpoint

        due = (
            final
            or stopping
            or (self.save_steps and step % self.save_steps == 0)
            or (self.save_minutes and time.monotonic() - self.last_save >= 60 * self.save_minutes)
        )
        if not due or (skipped and not (final or stopping)):
            return
        if self.stop is not None:
            self.stop.saving, self.stop.saved = f"checkpoint-{step}", self.saved_step
        try:
            saved = save_checkpoint(
                trainer.accelerator, trainer.model, rollout.tokenizer, self.run_dir, step,
                {"sampler": rollout.sampler.state_dict()}, self.keep_last, export=final, mode=trainer.mode,
            )  # fmt: skip
        finally:
            if self.stop is not None:
                self.stop.saving = None
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
    score_watch: ScoreWatch  # what each scoring says: the first step's flat rewards, unchecked answers
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
            from common.evaluation import write_results

            write_results(out_dir, summary, records, {"step": step, "benchmarks": self.evaluation.benchmarks})


def open_run_io(script: str, run: RunFlags, pre, values: dict, accelerator, mode, start_step: int, machine: dict,
                evaluation: TrainingEval, group_size: int) -> RunIO:  # fmt: skip
    """Once everything has loaded: the run directory made this run's (`pre`: what was checked before loading,
    `common.before_loading.Prepared`; `values`: the flags for run_config.json; `machine`: what it runs on and in
    which precision, recorded with the launch), the logger, the checkpoint schedule and the health checks,
    which speak through the log."""
    from common.run_dir import start_run_dir

    if pre.is_main:  # everything has loaded: now the run directory is this run's
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
    checkpoints = Checkpoints(
        pre.run_dir, run.keep_last, run.save_steps, run.save_minutes, start_step or None, stop
    )  # fmt: skip
    return RunIO(
        pre.run_dir, pre.lock, logger, checkpoints, evaluation, SignalWatch(run.warn_flat_steps, say=logger.write),
        ScoreWatch(group_size, say=logger.write), stop, start_step, pre.total_steps, accelerator.is_main_process,
    )  # fmt: skip
