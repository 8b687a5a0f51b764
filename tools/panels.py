"""The figure `tools.plot` draws: which panels (`choose_metrics`, `requested_metrics`), their labels (`describe`),
and the panels themselves (`figure`, saved by `plot_runs`)."""

import difflib
import math
import textwrap
from pathlib import Path

from tools.run_logs import LogError, finite, numeric_keys, series

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
# A method's namespaces -> the method (EDGE-GRPO's GEC logs under gec/); GSPO logs none of its own.
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
    "train/rollout_is_corrected_frac": ("Tokens the rollout correction changed", "fraction of tokens"),
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
            r, a = finite(row.get(REWARD)), finite(row.get(ACCURACY))
            if (r is None) != (a is None) or (r is not None and abs(r - a) > 1e-9 * max(1.0, abs(a))):
                return False
            both = both or r is not None
    return both


def _order(key: str) -> tuple:
    """Sort key: the metrics LABELS knows in its order, then the rest by name."""
    keys = list(LABELS)
    return (0, keys.index(key), "") if key in keys else (1, 0, key)


def choose_metrics(runs: dict[str, list[dict]], method_panels: bool | None = None, max_extra: int = 9) -> list[str]:
    """The common metrics any run logs (train/reward left out when it equals train/accuracy), then at most
    `max_extra` method metrics: method_panels None: when every run is one method; True: always; False: never."""
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
    """The panels --metrics names (keys, or `ns/*`), in its order; a key no run logs is left out with a note."""
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


def ema(values: list[float], weight: float) -> list[float]:
    """Exponential moving average with TensorBoard's bias correction; weight 0 = none."""
    out, s = [], 0.0
    for t, v in enumerate(values, 1):
        s = weight * s + (1 - weight) * v
        out.append(s / (1 - weight**t))
    return out


def auto_smoothing(n: int) -> float:
    """The default EMA weight for n points: a time constant of n/40 points, within [2, 100]."""
    return 1 - 1 / min(max(n / 40, 2.0), 100.0)


def run_labels(paths: list[str]) -> list[str]:
    """Run directory names; 'parent/name' where two runs share a name."""
    dirs = [Path(p).parent if Path(p).is_file() else Path(p) for p in paths]
    names = [d.resolve().name for d in dirs]
    return [f"{d.resolve().parent.name}/{n}" if names.count(n) > 1 else n for d, n in zip(dirs, names)]


def figure(runs: dict[str, list[dict]], metrics: list[str], smooth: float | None = None):
    """One panel per metric, one colour per run: training curves an EMA (`smooth`; None: `auto_smoothing`) over
    the faint raw curve; eval/ metrics markers, not smoothed."""
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
