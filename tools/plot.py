"""Compare runs: training curves side by side, and a table of their final evaluation results.

    python -m tools.plot runs/grpo_base runs/edge_grpo runs/egpo --output docs/compare.png --table docs/results.md

Each RUN_DIR holds the `metrics.jsonl` a training script writes (one JSON
object per step with "step" and metric keys; null for a value that was not
finite) and, optionally, the `eval_results.json` of `tools/evaluate.py`. The
figure has one panel per metric: the ones every script logs under `train/`
(reward, accuracy, entropy, response length, zero-advantage group fraction,
within-group advantage variance), the periodic evaluation's overall pass@1
when some run has it, then up to `--max_extra` of the methods' own metrics:
those under a namespace other than the shared `train/`, `eval/`, `time/` and
`reward/` (`egpo/`, `cw/`, `pro/`, `edge/`, `gec/`). The table gives each run's final pass@k per
benchmark: from `eval_results.json`, else the last periodic evaluation logged
in `metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from common.evaluation import RESULTS_FILE
from common.jsonl import iter_jsonl

METRICS_FILE = "metrics.jsonl"

# The metrics every script logs, in panel order.
COMMON = tuple(
    f"train/{k}"
    for k in ("reward", "accuracy", "entropy", "response_len", "zero_adv_group_frac", "adv_var_within_group")
)
EVAL_KEY = "eval/overall/pass@1"
# Namespaces every script shares; any other namespace is one method's own.
SHARED_NAMESPACES = ("train/", "eval/", "time/", "reward/")


class LogError(ValueError):
    """A run directory or one of its files cannot be used; the message names the file."""


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def _metrics_path(run: str | Path) -> Path:
    run = Path(run)
    path = run if run.is_file() else run / METRICS_FILE
    if not run.exists():
        raise LogError(f"{run}: no such run directory")
    if not path.is_file():
        raise LogError(f"{path}: missing (is {run} a training run directory?)")
    return path


def read_metrics(run: str | Path) -> list[dict]:
    """Rows of a run's metrics.jsonl (a run directory or the file itself), sorted by step.

    A step logged twice (a resumed run appends) keeps its last row.
    """
    path = _metrics_path(run)
    by_step: dict[float, dict] = {}
    try:
        rows = list(iter_jsonl(path, skip_torn_last_line=True))  # a live or killed run's last line may be cut short
    except ValueError as e:
        raise LogError(f"malformed log line, not JSON: {e}") from None
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


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric; steps where it is null or absent are left out."""
    pairs = [(r["step"], _number(r.get(key))) for r in rows]
    pairs = [(s, v) for s, v in pairs if v is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def numeric_keys(rows: list[dict]) -> set[str]:
    return {k for r in rows for k, v in r.items() if _number(v) is not None}


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
        return summary, RESULTS_FILE
    for row in reversed(rows if rows is not None else read_metrics(run)):  # last periodic evaluation
        summary = {k: v for k, v in row.items() if k.startswith("eval/") and _number(v) is not None}
        if summary:
            return summary, f"step {row['step']:g}"
    return None


# ---------------------------------------------------------------------------
# Figure
# ---------------------------------------------------------------------------


def choose_metrics(runs: dict[str, list[dict]], max_extra: int = 6) -> list[str]:
    """Panels: the common metrics any run has, eval pass@1, then the methods' own metrics (capped)."""
    keys = [numeric_keys(rows) for rows in runs.values()]
    present = set().union(*keys)
    chosen = [k for k in COMMON if k in present]
    if EVAL_KEY in present:
        chosen.append(EVAL_KEY)
    own = sorted(k for k in present - set(chosen) if "/" in k and not k.startswith(SHARED_NAMESPACES))
    by_method: dict[str, list[str]] = {}
    for k in own:
        by_method.setdefault(k.split("/", 1)[0], []).append(k)
    # Round robin over the methods' namespaces, so that a cap leaves every method a panel.
    extra = []
    for rank in range(max(map(len, by_method.values()), default=0)):
        extra += [keys[rank] for keys in by_method.values() if rank < len(keys)]
    if len(extra) > max_extra:
        print(
            f"note: {len(extra) - max_extra} method-specific metrics not plotted (--max_extra {max_extra}): "
            f"{', '.join(extra[max_extra:])}"
        )
    return chosen + extra[:max_extra]


def ema(values: list[float], weight: float) -> list[float]:
    """Exponential moving average (TensorBoard-style smoothing); weight 0 = none."""
    out, s = [], None
    for v in values:
        s = v if s is None else weight * s + (1 - weight) * v
        out.append(s)
    return out


def run_labels(paths: list[str]) -> list[str]:
    """Run directory names; 'parent/name' where two runs share a name."""
    dirs = [Path(p).parent if Path(p).is_file() else Path(p) for p in paths]
    names = [d.resolve().name for d in dirs]
    return [f"{d.resolve().parent.name}/{n}" if names.count(n) > 1 else n for d, n in zip(dirs, names)]


def plot_runs(runs: dict[str, list[dict]], metrics: list[str], output: str | Path, smooth: float = 0.0) -> Path:
    """One panel per metric, one line per run; saved as PNG (Agg backend, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not metrics:
        raise LogError("no metric to plot: none of the logs has a numeric metric besides the step")
    ncols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.3 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key in zip(axes.flat, metrics):
        for i, (label, rows) in enumerate(runs.items()):
            steps, values = series(rows, key)
            if not steps:
                continue
            color = colors[i % len(colors)]
            sparse = len(steps) <= 20  # e.g. periodic eval: markers, and no smoothing across far-apart points
            marker = "o" if sparse else None
            if smooth > 0 and not sparse:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
                values = ema(values, smooth)
            ax.plot(steps, values, color=color, label=label, linewidth=1.6, marker=marker, markersize=3)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    handles = {label: plt.Line2D([], [], color=colors[i % len(colors)], linewidth=2) for i, label in enumerate(runs)}
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=min(len(runs), 5), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (3.3 * nrows)))
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


# ---------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------


def results_table(evals: dict[str, tuple[dict[str, float], str] | None]) -> str:
    """Markdown: one table per k (pass@k in %), a row per run, a column per benchmark."""
    benches, ks, sizes = [], set(), {}
    for item in evals.values():
        if item is None:
            continue
        for key, value in item[0].items():
            parts = key.split("/")
            if len(parts) != 3 or parts[0] != "eval":
                continue
            if parts[1] not in benches:
                benches.append(parts[1])
            if parts[2].startswith("pass@") and parts[2][5:].isdigit():
                ks.add(int(parts[2][5:]))
            elif parts[2] == "num_problems":
                sizes.setdefault(parts[1], set()).add(int(value))
    if not ks:
        return "No evaluation results: run `python -m tools.evaluate --model RUN_DIR`, or train with --eval_steps.\n"
    benches = [b for b in benches if b not in ("overall", "mean")] + [b for b in ("overall", "mean") if b in benches]

    def head(b: str) -> str:
        n = sizes.get(b)
        return f"{b} ({next(iter(n))})" if n and len(n) == 1 else b  # a count only when the runs agree

    out = []
    for k in sorted(ks):
        out += [
            f"### pass@{k} (%)",
            "",
            "| run | " + " | ".join(map(head, benches)) + " | source |",
            "|---|" + "---|" * (len(benches) + 1),
        ]
        for label, item in evals.items():
            summary, source = item or ({}, "no evaluation")
            cells = [
                f"{100 * summary[f'eval/{b}/pass@{k}']:.1f}"
                if _number(summary.get(f"eval/{b}/pass@{k}")) is not None
                else "—"
                for b in benches
            ]
            out.append(f"| {label} | " + " | ".join(cells) + f" | {source} |")
        out.append("")
    out.append("overall = total correct / total problems; mean = unweighted mean over benchmarks.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories (or their metrics.jsonl files)")
    p.add_argument("--output", default="docs/compare.png", help="PNG to write (default: %(default)s)")
    p.add_argument("--table", default=None, help="also write the eval results table to this markdown file")
    p.add_argument("--metrics", default=None, help="comma-separated metric keys to plot instead of the default panels")
    p.add_argument("--smooth", type=float, default=0.0, help="EMA weight in [0, 1) for the curves (raw shown faintly)")
    p.add_argument("--max_extra", type=int, default=6, help="at most this many method-specific panels")
    args = p.parse_args(argv)
    if not 0 <= args.smooth < 1:
        p.error("--smooth must be in [0, 1)")
    try:
        labels = run_labels(args.runs)
        runs = {label: read_metrics(path) for label, path in zip(labels, args.runs)}
        metrics = args.metrics.split(",") if args.metrics else choose_metrics(runs, args.max_extra)
        missing = [m for m in metrics if not any(series(rows, m)[0] for rows in runs.values())]
        if missing:
            print(f"note: no run logs {', '.join(missing)}")
        evals = {label: read_eval(path, runs[label]) for label, path in zip(labels, args.runs)}
        png = plot_runs(runs, metrics, args.output, args.smooth)
    except LogError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {png} ({len(metrics)} panels, {len(runs)} runs)")
    table = results_table(evals)
    print(table)
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(table)
        print(f"wrote {args.table}")


if __name__ == "__main__":
    main()
