"""What a run records: one JSON line per step in the run directory, a few completions, the progress bar
and our own console lines (common/console.py filters the libraries'); and a timer of a step's phases."""

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm


class RunLogger:
    """Writes `metrics.jsonl` and `samples.jsonl` under run_dir and drives the progress bar; silent when
    not enabled (ranks other than 0)."""

    # Figures shown next to the progress bar and in the --log_every lines.
    SHOWN = {
        "train/reward": "reward",
        "train/accuracy": "acc",
        "train/response_len": "len",
        "train/entropy": "entropy",
        "time/step_s": "s/step",
    }

    def __init__(
        self,
        run_dir: str | Path,
        total_steps: int,
        enabled: bool = True,
        initial_step: int = 0,
        trackers=None,
        flags: dict | None = None,
        project: str = "grpo-zoo",
        run_name: str | None = None,
        log_every: int = 0,
        log_samples: int = 4,
    ):
        """`trackers`: an Accelerator built with `log_with` (--report_to): every row goes to its trackers
        too, under `project` / `run_name` (default: the run directory's name), with `flags` as their
        run config; metrics.jsonl stays the source of truth for plots and resume. `log_every` > 0:
        a console line of figures every that many steps."""
        self.enabled = enabled
        self.trackers = trackers if enabled else None
        self.log_every, self.log_samples_n = log_every, log_samples
        if not enabled:
            return
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.trackers is not None:
            config = {k: v for k, v in (flags or {}).items() if isinstance(v, (int, float, str, bool))}
            name = run_name or self.run_dir.resolve().name
            init = {"wandb": {"name": name, "dir": str(self.run_dir)}, "trackio": {"name": name}}
            self.trackers.init_trackers(project, config, init_kwargs=init)
        self.file = open(self.run_dir / "metrics.jsonl", "a")
        self.bar = tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True, desc=self.run_dir.name)

    def log(self, step: int, metrics: dict, advance: bool = True) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.trackers is not None:
            self.trackers.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}, step=step)
        shown = {name: f"{row[k]:.3g}" for k, name in self.SHOWN.items() if isinstance(row.get(k), float)}
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1 if advance else 0)
        if advance and self.log_every and step % self.log_every == 0:
            self.write(f"step {step}: " + ", ".join(f"{name} {v}" for name, v in shown.items()))

    def eval_line(self, step: int, summary: dict) -> None:
        """One console line when an evaluation ends: pass@1 per benchmark and overall."""
        if not self.enabled:
            return
        scores = {
            k.split("/")[1]: v for k, v in summary.items() if k.endswith("/pass@1") and not k.startswith("eval/mean")
        }
        self.write(f"eval at step {step}: pass@1 " + ", ".join(f"{name} {v:.3f}" for name, v in scores.items()))

    def write(self, line: str) -> None:
        """A console line that does not break the progress bar (rank 0 only)."""
        if self.enabled:
            self.bar.write(line)

    def log_samples(self, step: int, columns, decode) -> None:
        """--log_samples completions of the step in samples.jsonl, spread over its groups: the first completion
        of each group, then the second of each, and so on. `columns`: the completions' (dataset rows, texts,
        rewards, advantages) in order, the G completions of a group sharing one row object; `decode`: token
        ids -> text, for the prompt as the policy saw it (template included)."""
        if not self.enabled or not self.log_samples_n or not columns:
            return
        rows, texts, rewards, advantages = columns
        place = [0] * len(texts)  # each completion's place in its group
        for i in range(1, len(texts)):
            place[i] = place[i - 1] + 1 if rows[i] is rows[i - 1] else 0
        picked = sorted(sorted(range(len(texts)), key=place.__getitem__)[: self.log_samples_n])
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for i in picked:
                sample = {
                    "prompt": decode(rows[i]["prompt_ids"]),
                    "completion": texts[i],
                    "reward": rewards[i],
                    "advantage": advantages[i].mean(),
                }
                f.write(json.dumps({"step": step, **{k: _plain(v) for k, v in sample.items()}}) + "\n")

    def abort(self) -> None:
        """An error ends the run: finish the progress bar's line, keep the log."""
        if self.enabled:
            self.bar.close()
            self.file.close()

    def close(self, last: dict | None = None, stopped: str | None = None) -> None:
        """Close the log; print one closing line: the last step's figures and where the final model is,
        or (`stopped`) what was saved and how to resume."""
        if not self.enabled:
            return
        self.bar.close()
        self.file.close()
        if stopped:
            print(stopped, flush=True)
            return
        figures = {k: (last or {}).get(k) for k in ("train/reward", "train/accuracy", "eval/overall/pass@1")}
        shown = ", ".join(f"{k.split('/', 1)[1]} {v:.3f}" for k, v in figures.items() if isinstance(v, (int, float)))
        where = f"; model: {self.run_dir / 'model'}" if (self.run_dir / "model").is_dir() else ""
        print(
            f"done: {self.run_dir / 'metrics.jsonl'}{' (last step: ' + shown + ')' if shown else ''}{where}", flush=True
        )


def _plain(v):
    """Tensors and numpy scalars -> JSON numbers; NaN/inf -> null (JSON has neither)."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class PhaseTimer:
    """Wall-clock seconds per phase of a step: `with timer("rollout"): ...`."""

    def __init__(self, sync=None):
        self.seconds: dict[str, float] = {}
        self.sync = sync  # e.g. torch.cuda.synchronize, so GPU work is charged to its phase

    @contextmanager
    def __call__(self, phase: str):
        if self.sync:
            self.sync()
        start = time.perf_counter()
        yield
        if self.sync:
            self.sync()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
