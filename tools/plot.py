"""Compare runs: training curves side by side, and a table of their final evaluation results.

    python -m tools.plot runs/grpo_base runs/egpo --table runs/results.md   # the figure: runs/compare.png
    python -m tools.plot runs/egpo_c1 runs/egpo_c5          # runs of one method: its own panels too
    python -m tools.plot runs/grpo_base runs/egpo --metrics train/accuracy,egpo/*   # exactly these panels

Each RUN_DIR holds the `metrics.jsonl` a training script writes (one JSON object per step with
"step" and metric keys; null for a value that was not finite) and, optionally, the
`eval_results.json` of `tools/evaluate.py`.

The figure has one panel per metric, x axis the training step (the "step" of metrics.jsonl: one rollout
batch, with --mu x --num_minibatches optimiser steps), one colour per run. First what
every script logs: training accuracy and reward (one panel when reward is accuracy alone in every
run), the periodic evaluation's overall pass@1, policy entropy, response length, groups with no
signal (all rewards equal) and the within-group advantage variance. Then a method's own metrics
(namespaces egpo/, cw/, pro/, edge/ and gec/), only when every run is the same method, or with
--method_panels: in a comparison of methods they would be one method's internals. --metrics
names the panels instead (`ns/*` for every metric of a namespace). Training curves are smoothed by
an exponential moving average, the raw curve faint behind; evaluations are markers, never smoothed.

The table gives each run's final pass@k per benchmark: from `eval_results.json`, else the last
periodic evaluation logged in `metrics.jsonl`. Reading the runs: tools/run_logs.py; the panels and the
figure: tools/panels.py.
"""

from __future__ import annotations  # --help's usage line reads the field types as strings (common/cli.py)

import os
from dataclasses import dataclass
from pathlib import Path

from common.cli import arg, parse_args
from tools.panels import choose_metrics, plot_runs, requested_metrics, run_labels
from tools.run_logs import LogError, finite, read_eval, read_metrics


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
        return "No evaluation results: run `python -m tools.evaluate --model RUN_DIR`, or train with `python grpo_base.py --eval_steps N` (any script).\n"
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
            values = [finite(summary.get(f"eval/{b}/pass@{k}")) for b in benches]
            cells = ["—" if v is None else f"{100 * v:.1f}" for v in values]
            out.append(f"| {label} | " + " | ".join(cells) + f" | {source} |")
        out.append("")
    out.append("overall = total correct / total problems; mean = unweighted mean over benchmarks.")
    return "\n".join(out) + "\n"


@dataclass
class Args:
    # What to compare.
    runs: list[str] = arg(None, "run directories (or their metrics.jsonl files)", positional=True)
    output: str | None = arg(
        None, "PNG to write (default: compare.png in the run directory, or in the runs' common parent directory)"
    )
    table: str | None = arg(None, "also write the eval results table to this markdown file")
    # Panels.
    metrics: str | None = arg(
        None, "comma-separated metric keys to plot, in this order, instead of the default panels; ns/* for a namespace"
    )
    method_panels: bool | None = arg(
        None,
        "the methods' own metrics (egpo/, cw/, pro/, edge/, gec/) after the common panels: "
        "none = when every run is the same method, --method_panels = always, false = never",
    )
    max_extra: int = arg(9, "at most this many method panels (a note names the others)", at_least=0)
    smooth: float | None = arg(
        None,
        "EMA weight for the training curves, the raw curve faint behind (eval points are never smoothed); "
        "0 = none; none = light, from each curve's length (0.5 up to 80 steps, 0.9 at 400, 0.99 from 4000)",
        at_least=0,
        below=1,
    )


def default_output(runs: list[str]) -> Path:
    """compare.png in the run directory, or the runs' common parent (never docs/, which holds the shipped figures)."""
    dirs = [Path(r).resolve().parent if Path(r).is_file() else Path(r).resolve() for r in runs]
    common = Path(os.path.commonpath(dirs)) if len(dirs) > 1 else dirs[0]
    return common / "compare.png"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(Args, argv=argv, description=__doc__)
    try:
        labels = run_labels(args.runs)
        runs = {label: read_metrics(path) for label, path in zip(labels, args.runs)}
        if args.metrics:
            metrics = requested_metrics(runs, args.metrics)
        else:
            metrics = choose_metrics(runs, args.method_panels, args.max_extra)
        evals = {label: read_eval(path, runs[label]) for label, path in zip(labels, args.runs)}
        png = plot_runs(runs, metrics, args.output or default_output(args.runs), args.smooth)
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
