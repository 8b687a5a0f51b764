"""The figure `tools.plot` draws: which panels (`choose_metrics`, `requested_metrics`) and the panels themselves
(`figure`, saved by `plot_runs`), each titled by its metric key as metrics.jsonl names it."""

import difflib
import math
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
GEC = {"gec": "edge"}  # EDGE-GRPO logs edge/, and gec/ when its GEC runs
XLABEL = "training step"  # metrics.jsonl's "step": one rollout batch, not an optimiser step


def is_method_key(key: str) -> bool:
    return "/" in key and not key.startswith(SHARED_NAMESPACES)


def method_of(rows: list[dict]) -> str:
    """The namespaces of a run's own metrics ("egpo", "edge"; "grpo" when it logs none): one method's."""
    namespaces = {k.split("/", 1)[0] for k in numeric_keys(rows) if is_method_key(k)}
    return " + ".join(sorted({GEC.get(n, n) for n in namespaces})) or "grpo"


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


def choose_metrics(runs: dict[str, list[dict]], method_panels: bool | None = None, max_extra: int = 9) -> list[str]:
    """The common metrics any run logs (train/reward left out when it equals train/accuracy), then at most
    `max_extra` method metrics: method_panels None: when every run is one method; True: always; False: never."""
    present = set().union(*map(numeric_keys, runs.values()))
    chosen = [k for k in COMMON if k in present]
    if REWARD in chosen and reward_is_accuracy(runs):
        chosen.remove(REWARD)
    own = sorted(k for k in present if is_method_key(k))
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
    for k in own:
        namespace = k.split("/", 1)[0]
        by_method.setdefault(GEC.get(namespace, namespace), []).append(k)
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
            keys = sorted(k for k in present if k.startswith(prefix))
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
        ax.set_title(f"{key} (= {REWARD})" if key == ACCURACY and merged else key, fontsize=10)
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
