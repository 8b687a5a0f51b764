"""Reading the runs `tools.plot` compares: a run's metrics.jsonl (`read_metrics`), one metric's curve
(`series`), and its final evaluation (`read_eval`: eval_results.json, else the last periodic evaluation);
a file that cannot be used is a `LogError` naming it."""

import json
import math
from pathlib import Path

from common.cli import not_utf8
from common.evaluation import RESULTS_FILE
from common.run_dir import iter_jsonl

METRICS_FILE = "metrics.jsonl"


class LogError(ValueError):
    """A run directory or one of its files cannot be used; the message names the file."""


def _metrics_path(run: str | Path) -> Path:
    run = Path(run)
    path = run if run.is_file() else run / METRICS_FILE
    if not run.exists():
        raise LogError(f"{run}: no such run directory")
    if not path.is_file():
        raise LogError(f"{path}: missing (is {run} a training run directory?)")
    return path


def read_metrics(run: str | Path) -> list[dict]:
    """Rows of a run's metrics.jsonl, sorted by step: a step logged twice (a resumed run) keeps its last row, a
    torn last line (a live or killed run) is left out."""
    path = _metrics_path(run)
    by_step: dict[float, dict] = {}
    try:
        rows = list(iter_jsonl(path, skip_torn_last_line=True))
    except UnicodeDecodeError:
        raise LogError(not_utf8(path)) from None
    except ValueError as e:  # names the file and line
        raise LogError(str(e)) from None
    for lineno, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise LogError(f"{path}:{lineno}: malformed log line, expected a JSON object, got {type(row).__name__}")
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            raise LogError(f'{path}:{lineno}: malformed log line, no numeric "step" (got {step!r})')
        by_step[step] = row
    if not by_step:
        raise LogError(f"{path}: empty log, no metric rows")
    return [by_step[s] for s in sorted(by_step)]


def finite(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric; steps where it is null or absent are left out."""
    pairs = [(r["step"], finite(r.get(key))) for r in rows]
    pairs = [(s, v) for s, v in pairs if v is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def numeric_keys(rows: list[dict]) -> set[str]:
    return {k for r in rows for k, v in r.items() if k != "step" and finite(v) is not None}


def read_eval(run: str | Path, rows: list[dict] | None = None) -> tuple[dict[str, float], str] | None:
    """(final eval summary, where it came from), or None if the run has no evaluation."""
    run = Path(run)
    run_dir = run.parent if run.is_file() else run
    path = run_dir / RESULTS_FILE
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise LogError(f"{path}: malformed, not JSON ({e.msg})") from None
        summary = data.get("summary") if isinstance(data, dict) else None
        if not isinstance(summary, dict):
            raise LogError(f'{path}: malformed, no "summary" object (write it with tools/evaluate.py)')
        config = data.get("config") or {}
        checkpoint = config.get("checkpoint") or Path(str(config.get("model_path", ""))).parent.name
        return summary, RESULTS_FILE + (f" ({checkpoint})" if checkpoint.startswith("checkpoint-") else "")
    for row in reversed(rows if rows is not None else read_metrics(run)):  # last periodic evaluation
        summary = {k: v for k, v in row.items() if k.startswith("eval/") and finite(v) is not None}
        if summary:
            return summary, f"step {row['step']:g}"
    return None
