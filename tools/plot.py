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
periodic evaluation logged in `metrics.jsonl`.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

from common.cli import arg, not_utf8, parse_args
from common.evaluation import RESULTS_FILE
from common.jsonl import iter_jsonl

METRICS_FILE = "metrics.jsonl"
REWARD, ACCURACY = "train/reward", "train/accuracy"
EVAL_KEY = "eval/overall/pass@1"
# The metrics every script logs, in panel order.
COMMON = (
    ACCURACY,
    REWARD,
    EVAL_KEY,
    "train/entropy",
    "train/response_len",
    "train/zero_adv_group_frac",
    "train/adv_var_within_group",
)
# Namespaces every script shares; any other namespace is one method's own.
SHARED_NAMESPACES = ("train/", "eval/", "time/", "reward/")
# A method's namespaces -> the method (EDGE-GRPO logs its guided error correction under gec/); the baselines'
# after them (baselines/; GSPO logs no metric of its own).
METHODS = {
    "egpo": "EGPO",
    "cw": "CW-GRPO",
    "pro": "Pro-GRPO",
    "edge": "EDGE-GRPO",
    "gec": "EDGE-GRPO",
    "dapo": "DAPO",
    "dr": "Dr. GRPO",
    "kl_cov": "KL-Cov / Clip-Cov",
}
XLABEL = "training step"  # metrics.jsonl's "step": one rollout batch, not an optimiser step

# key -> (panel title, y-axis label). A method's keys are in the order its panels appear.
LABELS: dict[str, tuple[str, str]] = {
    ACCURACY: ("Training accuracy", "fraction correct"),
    REWARD: ("Training reward", "mean reward"),
    EVAL_KEY: ("Eval pass@1 (all benchmarks)", "pass@1"),
    "train/entropy": ("Policy entropy", "nats per token"),
    "train/response_len": ("Response length", "tokens"),
    "train/zero_adv_group_frac": ("Groups with no signal (all rewards equal)", "fraction of groups"),
    "train/adv_var_within_group": ("Advantage variance within a group", "variance"),
    "train/truncated_frac": ("Truncated responses", "fraction of responses"),
    "train/loss": ("Policy loss", "loss"),
    "train/grad_norm": ("Gradient norm", "L2 norm"),
    "train/approx_kl": ("Approx. KL(old policy || policy)", "nats per token"),
    "train/clip_frac_low": ("Tokens clipped at 1 - eps_low", "fraction of tokens"),
    "train/clip_frac_high": ("Tokens clipped at 1 + eps_high", "fraction of tokens"),
    "train/rollout_logp_gap": ("Rollout vs trainer log-prob gap", "|difference| in nats per token"),
    "train/tis_capped_frac": ("Tokens at the TIS cap", "fraction of tokens"),
    "train/skipped_steps": ("Skipped optimiser steps", "steps"),
    "train/lr": ("Learning rate", "learning rate"),
    "train/epoch": ("Epoch", "epoch"),
    "time/step_s": ("Time per step", "seconds"),
    "time/rollout_s": ("Rollout time per step", "seconds"),
    "time/gec_s": ("GEC time per step", "seconds"),
    "time/tokens_per_s": ("Throughput", "tokens per second"),
    "time/peak_mem_gb": ("Peak accelerator memory", "GB"),
    "reward/timeouts": ("Verifier timeouts", "answers per step"),
    "reward/unchecked": ("Answers not checked", "answers per step"),
    "egpo/entropy_proxy_correct": ("EGPO: entropy proxy H, correct answers", "nats per token"),
    "egpo/entropy_proxy_incorrect": ("EGPO: entropy proxy H, incorrect answers", "nats per token"),
    "egpo/nsr_group_frac": ("EGPO: all-incorrect (NSR) groups", "fraction of groups"),
    "egpo/w_mean": ("EGPO: mean weight", "weight w"),
    "egpo/w_at_lambda_min_frac": ("EGPO: weight at lambda_min (fraction)", "fraction of completions"),
    "egpo/w_at_lambda_max_frac": ("EGPO: weight at lambda_max (fraction)", "fraction of completions"),
    "egpo/w_at_one_frac": ("EGPO: weight at 1 (fraction)", "fraction of completions"),
    "egpo/w_min": ("EGPO: smallest weight", "weight w"),
    "egpo/w_max": ("EGPO: largest weight", "weight w"),
    "cw/cov_top1pct_share": ("CW-GRPO: top 1% tokens' share of sum |c|", "fraction of sum |c|"),
    "cw/cov_top1pct_weight": ("CW-GRPO: top 1% tokens' kernel weight", "mean weight"),
    "cw/cov_mean": ("CW-GRPO: mean covariance c", "covariance c"),
    "cw/cov_abs_p60": ("CW-GRPO: |c|, 60th percentile", "|covariance|"),
    "cw/cov_abs_p80": ("CW-GRPO: |c|, 80th percentile", "|covariance|"),
    "cw/cov_abs_p99": ("CW-GRPO: |c|, 99th percentile", "|covariance|"),
    "cw/cov_abs_p99.99": ("CW-GRPO: |c|, 99.99th percentile", "|covariance|"),
    "cw/cov_abs_max": ("CW-GRPO: largest |c|", "|covariance|"),
    "pro/conf_prompt": ("Pro-GRPO: prompt confidence c(q)", "confidence"),
    "pro/conf_answer_correct": ("Pro-GRPO: answer confidence, correct", "confidence"),
    "pro/conf_answer_incorrect": ("Pro-GRPO: answer confidence, incorrect", "confidence"),
    "pro/mixed_group_frac": ("Pro-GRPO: mixed groups (re-weighted)", "fraction of groups"),
    "pro/bonus_abs": ("Pro-GRPO: size of the advantage bonus", "|bonus|"),
    "pro/adv_sign_flip_frac": ("Pro-GRPO: advantage sign flips", "fraction of completions"),
    "pro/lowprob_token_prob": ("Pro-GRPO: low-probability tokens' probability", "probability"),
    "dr/response_len_above_mean": ("Dr. GRPO: length of responses above their group's mean", "tokens"),
    "dr/response_len_below_mean": ("Dr. GRPO: length of responses below their group's mean", "tokens"),
    "kl_cov/cov_mean": ("KL-Cov: mean log-prob x advantage covariance", "covariance"),
    "kl_cov/cov_top_k": ("KL-Cov: covariance threshold of the top k", "covariance"),
    "kl_cov/band_frac": ("Clip-Cov: tokens in the covariance band", "fraction of tokens"),
    "kl_cov/chosen_frac": ("KL-Cov / Clip-Cov: tokens penalised or cut", "fraction of tokens"),
    "edge/entropy_P": ("EDGE-GRPO: completion entropy P", "nats per token"),
    "edge/adv_var_within_group_before_eda": ("EDGE-GRPO: advantage variance before EDA", "variance"),
    "gec/rollout_accuracy": ("EDGE-GRPO: accuracy before GEC", "fraction correct"),
    "gec/fixed": ("EDGE-GRPO: GEC edits correct afterwards", "completions per step"),
    "gec/reflection_fixed": ("EDGE-GRPO: reflections correct afterwards", "completions per step"),
    "gec/reflection": ("EDGE-GRPO: GEC reflections", "completions per step"),
    "gec/injection": ("EDGE-GRPO: GEC answer injections", "completions per step"),
    "gec/replacement": ("EDGE-GRPO: GEC reference solutions", "completions per step"),
}
# Words of a key a title spells out (for keys LABELS does not know).
WORDS = {
    "w": "weight",
    "adv": "advantage",
    "var": "variance",
    "cov": "covariance",
    "conf": "confidence",
    "len": "length",
    "prob": "probability",
    "frac": "(fraction)",
    "s": "(seconds)",
    "nsr": "NSR",
    "eda": "EDA",
    "gec": "GEC",
    "kl": "KL",
    "lr": "learning rate",
}
# Key endings whose y-axis label is known.
UNITS = {"_frac": "fraction", "_s": "seconds", "_len": "tokens", "_gb": "GB"}
# Names joined by "_" that are one word (the flags lambda_min, eps_high, ...).
JOINED = ("lambda_min", "lambda_max", "eps_low", "eps_high", "per_s")


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

    A step logged twice (a resumed run appends) keeps its last row; a last line cut short (a live
    or killed run) is left out.
    """
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
    return {k for r in rows for k, v in r.items() if k != "step" and _number(v) is not None}


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
        summary = {k: v for k, v in row.items() if k.startswith("eval/") and _number(v) is not None}
        if summary:
            return summary, f"step {row['step']:g}"
    return None


# ---------------------------------------------------------------------------
# Choosing the panels
# ---------------------------------------------------------------------------


def is_method_key(key: str) -> bool:
    return "/" in key and not key.startswith(SHARED_NAMESPACES)


def method_of_key(key: str) -> str:
    """The method a method key belongs to: "EGPO" for egpo/..., "EDGE-GRPO" for gec/..., the namespace if unknown."""
    namespace = key.split("/", 1)[0]
    return METHODS.get(namespace, namespace)


def method_of(rows: list[dict]) -> str:
    """The method a run's own metrics name ("EGPO", "EDGE-GRPO", ...; "GRPO" when it logs none)."""
    return " + ".join(sorted({method_of_key(k) for k in numeric_keys(rows) if is_method_key(k)})) or "GRPO"


def reward_is_accuracy(runs: dict[str, list[dict]]) -> bool:
    """Whether every run logs train/reward equal to train/accuracy at every step (the reward is accuracy alone)."""
    both = False
    for rows in runs.values():
        for row in rows:
            r, a = _number(row.get(REWARD)), _number(row.get(ACCURACY))
            if (r is None) != (a is None) or (r is not None and abs(r - a) > 1e-9 * max(1.0, abs(a))):
                return False
            both = both or r is not None
    return both


def _order(key: str) -> tuple:
    """Sort key: the metrics LABELS knows in its order, then the rest by name."""
    keys = list(LABELS)
    return (0, keys.index(key), "") if key in keys else (1, 0, key)


def choose_metrics(runs: dict[str, list[dict]], method_panels: bool | None = None, max_extra: int = 9) -> list[str]:
    """Panels: the common metrics any run logs (train/reward left out when it is train/accuracy in
    every run), then the methods' own metrics, at most `max_extra` of them: with method_panels None,
    only when every run is the same method; True: always; False: never."""
    present = set().union(*map(numeric_keys, runs.values()))
    chosen = [k for k in COMMON if k in present]
    if REWARD in chosen and reward_is_accuracy(runs):
        chosen.remove(REWARD)
    own = sorted((k for k in present if is_method_key(k)), key=_order)
    if not own or method_panels is False:
        return chosen
    methods = sorted({method_of(rows) for rows in runs.values()})
    if method_panels is None and len(methods) > 1:
        print(
            f"note: {len(own)} method panels left out, the runs are of different methods ({', '.join(methods)}); "
            "--method_panels shows them"
        )
        return chosen
    by_method: dict[str, list[str]] = {}
    for k in sorted(own, key=method_of_key):  # methods by name; a method's keys stay in LABELS order
        by_method.setdefault(method_of_key(k), []).append(k)
    # Round robin over the methods, so that a cap leaves every method a panel.
    extra = []
    for rank in range(max(map(len, by_method.values()))):
        extra += [keys[rank] for keys in by_method.values() if rank < len(keys)]
    if len(extra) > max_extra:
        print(
            f"note: {len(extra) - max_extra} method metrics not plotted (--max_extra {max_extra}): "
            f"{', '.join(extra[max_extra:])}"
        )
    return chosen + extra[:max_extra]


def requested_metrics(runs: dict[str, list[dict]], spec: str) -> list[str]:
    """The panels --metrics names, in its order: keys, or `ns/*` for every key of a namespace. A key
    no run logs is left out with a note (and a close match); none left is an error."""
    present = set().union(*map(numeric_keys, runs.values()))
    chosen, missing = [], []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item.endswith(("/*", "/")):
            prefix = item.rstrip("*")
            keys = sorted((k for k in present if k.startswith(prefix)), key=_order)
            chosen += [k for k in keys if k not in chosen]
            missing += [] if keys else [item]
        elif item in present:
            chosen += [] if item in chosen else [item]
        else:
            missing.append(item)
    for item in missing:
        close = difflib.get_close_matches(item, sorted(present), n=1, cutoff=0.6)
        print(f"note: no run logs {item}" + (f"; did you mean {close[0]}?" if close else ""))
    if not chosen:
        raise LogError(f"--metrics {spec}: no run logs any of these metrics")
    return chosen


# ---------------------------------------------------------------------------
# Titles and labels
# ---------------------------------------------------------------------------


def _spell(name: str) -> str:
    for joined in JOINED:
        name = name.replace(joined, joined.replace("_", "\0"))
    return " ".join(WORDS.get(w, w).replace("\0", "_") for w in name.split("_"))


def describe(key: str, merged: bool = False) -> tuple[str, str]:
    """(panel title, y-axis label) of a metric key; merged: train/accuracy's panel stands for train/reward too."""
    if key == ACCURACY and merged:
        return "Training accuracy (= reward)", "fraction correct"
    if key in LABELS:
        return LABELS[key]
    parts = key.split("/")
    if parts[0] == "eval" and len(parts) == 3:
        where = {"overall": "all benchmarks", "mean": "benchmark mean"}.get(parts[1], parts[1])
        stat = parts[2]
        if stat.startswith("pass@"):
            return f"Eval {stat} ({where})", stat
        named = {"response_len": ("response length", "tokens"), "truncated_frac": ("truncated", "fraction")}
        text, unit = named.get(stat, (_spell(stat), stat))
        return f"Eval {text} ({where})", unit
    namespace, _, rest = key.partition("/")
    prefix = {"train": "Training", "time": "Time", "reward": "Reward"}.get(namespace) or METHODS.get(namespace)
    prefix = prefix or namespace.upper()
    unit = next((u for end, u in UNITS.items() if rest.endswith(end)), rest or key)
    return f"{prefix}: {_spell(rest.replace('/', ' '))}" if rest else key, unit


# ---------------------------------------------------------------------------
# Figure
# ---------------------------------------------------------------------------


def ema(values: list[float], weight: float) -> list[float]:
    """Exponential moving average with TensorBoard's bias correction (the first points are the mean
    so far, not pulled towards the first value); weight 0 = none."""
    out, s = [], 0.0
    for t, v in enumerate(values, 1):
        s = weight * s + (1 - weight) * v
        out.append(s / (1 - weight**t))
    return out


def auto_smoothing(n: int) -> float:
    """The default EMA weight for a curve of n points: light, a time constant of about n/40 points
    (at least 2, at most 100): 0.5 up to 80 points, 0.9 at 400, 0.96 at 1000, 0.99 from 4000."""
    return 1 - 1 / min(max(n / 40, 2.0), 100.0)


def run_labels(paths: list[str]) -> list[str]:
    """Run directory names; 'parent/name' where two runs share a name."""
    dirs = [Path(p).parent if Path(p).is_file() else Path(p) for p in paths]
    names = [d.resolve().name for d in dirs]
    return [f"{d.resolve().parent.name}/{n}" if names.count(n) > 1 else n for d, n in zip(dirs, names)]


def figure(runs: dict[str, list[dict]], metrics: list[str], smooth: float | None = None):
    """The matplotlib Figure: one panel per metric, one colour per run. Training curves: an EMA
    (weight `smooth`; None: auto_smoothing of each curve) over the raw curve drawn faintly; eval/
    metrics (logged every N steps): markers joined by a thin line, not smoothed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not metrics:
        raise LogError("no metric to plot: none of the logs has a numeric metric besides the step")
    merged = ACCURACY in metrics and REWARD not in metrics and reward_is_accuracy(runs)
    ncols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.8 * ncols, 3.2 * nrows + 0.4), squeeze=False, layout="constrained"
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    first, last = min(r[0]["step"] for r in runs.values()), max(r[-1]["step"] for r in runs.values())
    pad = 0.02 * (last - first) or 0.5  # every panel spans all the runs' steps (eval's first point is step N)
    for ax, key in zip(axes.flat, metrics):
        for i, rows in enumerate(runs.values()):
            steps, values = series(rows, key)
            if not steps:
                continue
            color = colors[i % len(colors)]
            if key.startswith("eval/") or len(steps) == 1:
                ax.plot(steps, values, color=color, linewidth=1, marker="o", markersize=4, alpha=0.9)
                continue
            weight = auto_smoothing(len(steps)) if smooth is None else smooth
            if weight > 0:
                ax.plot(steps, values, color=color, alpha=0.2, linewidth=0.8)
                values = ema(values, weight)
            ax.plot(steps, values, color=color, linewidth=1.6)
        title, ylabel = describe(key, merged)
        ax.set_title("\n".join(textwrap.wrap(title, 46)), fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_xlabel(XLABEL, fontsize=9)
        ax.set_xlim(first - pad, last + pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=colors[i % len(colors)], linewidth=2) for i in range(len(runs))]
    fig.legend(handles, list(runs), loc="outside upper center", ncol=min(len(runs), 5), frameon=False)
    return fig


def plot_runs(runs: dict[str, list[dict]], metrics: list[str], output: str | Path, smooth: float | None = None) -> Path:
    """figure(), saved as PNG (Agg backend, no display needed)."""
    import matplotlib.pyplot as plt

    fig = figure(runs, metrics, smooth)
    output = Path(output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(output, dpi=120)
    except OSError as e:
        raise LogError(f"--output {output}: cannot write ({e.strerror or e})") from None
    finally:
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
    """compare.png beside the runs: in the run directory for one, in their common parent for several (never
    the repository's docs/, which holds the shipped figures)."""
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
