"""Per-step metrics: one JSON line per step in the run directory, a tqdm bar on the console."""

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm


class RunLogger:
    """Writes `metrics.jsonl` under run_dir (the flags: common/run_dir.py); silent when not enabled (non-zero ranks)."""

    # Figures shown next to the progress bar.
    SHOWN = {
        "train/reward": "reward",
        "train/accuracy": "acc",
        "train/response_len": "len",
        "train/entropy": "entropy",
        "time/step_s": "s/step",
    }

    def __init__(self, run_dir: str | Path, total_steps: int, enabled: bool = True, initial_step: int = 0):
        self.enabled = enabled
        # One bar per run: transformers' own (weight loading, checkpoint shards) would interleave with it.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if not enabled:
            return
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(self.run_dir / "metrics.jsonl", "a")
        self.bar = tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True, desc=self.run_dir.name)

    def log(self, step: int, metrics: dict, advance: bool = True) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        self.bar.set_postfix(
            {name: f"{row[k]:.3g}" for k, name in self.SHOWN.items() if isinstance(row.get(k), float)}, refresh=False
        )
        self.bar.update(1 if advance else 0)

    def write(self, line: str) -> None:
        """A console line that does not break the progress bar (rank 0 only)."""
        if self.enabled:
            self.bar.write(line)

    def close(self) -> None:
        if self.enabled:
            self.bar.close()
            self.file.close()


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
