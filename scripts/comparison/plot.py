"""docs/compare_real.png: each run's held-out pass@1 with its 95% interval beside GRPO's, its difference to GRPO
with its interval, and the training curves."""

from pathlib import Path

from scripts.comparison.figures import mean
from scripts.comparison.grid import BASE, COLORS, EVAL_TEMPERATURE, NAMES
from scripts.comparison.verdicts import Reader


def draw(reader: Reader, runs: list[str], model: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    y = list(range(len(runs)))[::-1]
    ax = axes[0][0]
    base = reader.level(BASE)
    ax.axvspan(base.low, base.high, color="grey", alpha=0.2, label="GRPO's 95% interval")
    for yi, m in zip(y, runs):
        e = reader.level(m)
        ax.errorbar(e.value, yi, xerr=[[e.value - e.low], [e.high - e.value]], fmt="o", color=COLORS[m], capsize=3)
    ax.set_yticks(y, [NAMES[m] for m in runs])
    ax.set(title=f"Held-out pass@1 after training, T = {EVAL_TEMPERATURE} (95% t interval over seeds)", xlabel="pass@1")
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[0][1]
    ax.axvline(0, color="black", lw=0.8)
    others = [m for m in runs if m != BASE]
    for yi, m in zip(range(len(others))[::-1], others):
        if (e := reader.diff(m, BASE)) is not None:
            ax.errorbar(e.value, yi, xerr=[[e.value - e.low], [e.high - e.value]], fmt="o", color=COLORS[m], capsize=3)
    ax.set_yticks(list(range(len(others)))[::-1], [NAMES[m] for m in others])
    ax.set(title="Minus GRPO's, paired by seed (95% t interval over seeds)", xlabel="difference in pass@1")
    curves = [
        ("acc", "Training accuracy (the policy's own)", "fraction correct"),
        ("entropy", "Policy entropy", "nats"),
    ]
    for ax, (key, title, ylabel) in zip(axes[1], curves):
        for m in runs:
            seeds = reader.figures[m]
            cols = list(zip(*[seeds[s][key] for s in sorted(seeds)]))
            x = list(range(1, len(cols) + 1))
            ax.plot(x, [mean(list(c)) for c in cols], color=COLORS[m], label=NAMES[m])
        ax.set(title=f"{title}, mean over seeds", xlabel="step", ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1][0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"Methods and baselines on --model {model}: held-out pass@1 and training")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
