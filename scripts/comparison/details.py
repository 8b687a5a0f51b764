"""The page's details: what each mechanism did (EDGE-GRPO's GEC and EDA, CW-GRPO's kernel), held-out pass@k,
training, calibration, cost, the runs' machines, the statistics and their simulated coverage, and what this scale
can and cannot show."""

from collections import Counter

import numpy as np

from scripts.comparison.design import SIM_REPS, SIM_SEED, SIM_SEEDS, components, coverage_found
from scripts.comparison.figures import mean
from scripts.comparison.grid import ABLATIONS, BASE, EVAL_TEMPERATURE, NAMES, SCRIPT
from scripts.comparison.stats import CONFIDENCE, shown
from scripts.comparison.verdicts import MIN_SEEDS, Reader, ablation_groups, fell, primary

DASH, ARROW = "–", "→"
KEY_NAMES = {
    "zero_adv": "groups with zero advantage, mean over steps",
    "adv_var": "within-group advantage variance, mean over steps",
    "auroc_after": "AUROC of the confidence for right vs wrong, held-out, after training",
    "entropy_drift": "|relative entropy change|, first half of the steps to the second",
    "entropy_late": "policy entropy, mean over the second half of the steps",
    "passmax_after": "held-out pass@k at the largest k, after training",
}


def key_name(key: str) -> str:
    return "held-out pass@1" if key.startswith("pass1_after") else KEY_NAMES[key]


def fmt(v, digits: int = 3) -> str:
    return "undefined" if v is None else shown(v, digits)


def seeds_of(runs: dict, key: str) -> list:
    """A figure over the seeds, None where a run lacks it (not evaluated there)."""
    return [runs[s].get(key) for s in sorted(runs)]


def cell(vs: list, digits: int = 3) -> str:
    """mean (min–max over seeds); one seed: its value; '-' when no seed has it; per seed when some lack it."""
    if all(v is None for v in vs):
        return "-"
    if any(v is None for v in vs):
        return " / ".join(fmt(v, digits) for v in vs) + " (per seed)"
    if len(vs) == 1:
        return fmt(vs[0], digits)
    return f"{fmt(mean(vs), digits)} ({fmt(min(vs), digits)}{DASH}{fmt(max(vs), digits)})"


def total(vs: list) -> str:
    """A count summed over seeds; 'not logged' when a seed lacks it."""
    return "not logged" if any(v is None for v in vs) else f"{sum(vs):.0f}"


def method_defaults(infos: dict, bookkeeping: set) -> list[str]:
    """The flags in which each run differs from grpo_base's (its own defaults and its variant's flags)."""
    base = infos[BASE][min(infos[BASE])]["script_flags"]
    lines = []
    for m, runs in infos.items():
        if m == BASE:
            continue
        flags = {k: v for k, v in runs[min(runs)]["script_flags"].items() if k not in bookkeeping}
        diff = [f"`--{k} {flags[k]}` ({base[k]})" for k in flags if k in base and flags[k] != base[k]]
        own = [f"`--{k} {flags[k]}`" for k in flags if k not in base]
        lines.append(f"- {NAMES[m]} (`{SCRIPT[m]}`): " + "; ".join(diff + own))
    return lines


def machine_lines(infos: dict) -> list[str]:
    """The runs' machines: CPU, bf16 units, cores, threads, precision, and the load at each run's start."""
    records = [i.get("machine") for runs in infos.values() for i in runs.values()]
    known = [r for r in records if r]
    kinds = Counter(
        (r["cpu"], ", ".join(r["bf16_units"]) or "none", r["cores"], r["threads"], precision_text(r.get("precision")))
        for r in known
    )
    lines = [
        f"{n} runs on {cpu} (bf16 units: {units}), {cores} cores, {threads} compute threads, {prec}"
        for (cpu, units, cores, threads, prec), n in kinds.most_common()
    ]
    if known:
        loads = [r["load_1min"] for r in known if r.get("load_1min") is not None]
        lines.append(
            f"The 1-minute load average at each run's start: {min(loads):.1f} to {max(loads):.1f} (a run's own work "
            "is about 2; more: something else ran beside it, which slows its timings, not its figures)."
        )
    if missing := len(records) - len(known):
        lines.append(f"{missing} runs were made before runs recorded their machine: their CPU and load are not known.")
    return lines


def precision_text(p: dict | None) -> str:
    if not p:
        return "precision not recorded"
    autocast = "no autocast" if p["autocast"] == "no" else f"{p['autocast']} autocast"
    return f"{p['weights']} weights, {autocast}, vLLM in {p['engine']}"


def mechanism_sections(reader: Reader, infos: dict) -> list[str]:
    groups = ablation_groups(reader.figures)
    L = []
    if "edge_grpo" in groups:
        L += edge_mechanism(reader.figures, infos, groups["edge_grpo"])
    if "cw_grpo" in groups:
        L += cw_mechanism(reader, groups["cw_grpo"])
    return L


def edge_mechanism(figures: dict, infos: dict, ablations: list) -> list[str]:
    """GEC's edits and EDA's scaling, in EDGE-GRPO's runs and its ablations."""
    flags = infos["edge_grpo"][min(infos["edge_grpo"])]["flags"]
    group = int(flags[flags.index("--group_size") + 1])
    L = [
        "## What the mechanisms did",
        "",
        "### EDGE-GRPO: GEC and EDA",
        "",
        "Per run, over its steps: the share of completions GEC edited (every wrong answer: continued after a "
        "reflection with p = 0.5, given the right answer with p = 0.25, swapped for the reference solution with "
        "p = 0.25); the reflections that ended in a right answer, summed over seeds; the share of the step's sum "
        "|A| that the completions ending in inserted text carried; the entropy P (eq. 3) of those completions and "
        "of all; the largest |A| of any step, per seed. '-': GEC off.",
        "",
        "| run | completions edited | reflections that fixed the answer | insertions' share of sum \\|A\\| "
        "| P, insertions / all | largest \\|A\\|, per seed |",
        "|---|---|---|---|---|---|",
    ]
    for m in ("edge_grpo", *ablations):
        runs = figures[m]
        gec_on = all(f["gec_edited"] is not None for f in runs.values())
        shares = cell(seeds_of(runs, "adv_share_injected"))
        fixed = f"{total(seeds_of(runs, 'reflections_fixed'))} of {total(seeds_of(runs, 'reflections'))}"
        P = (cell(seeds_of(runs, "P_injected")) if gec_on else "-") + f" / {cell(seeds_of(runs, 'P_all'))}"
        row = [cell(seeds_of(runs, "gec_edited")), fixed, shares] if gec_on else ["-", "-", "-"]
        largest = ", ".join(fmt(v, 2) for v in seeds_of(runs, "adv_abs_max"))
        L.append(f"| {NAMES[m]} | {' | '.join(row)} | {P} | {largest} |")
    L += [
        "",
        f"GRPO's |A| is at most (G - 1) / sqrt(G) = {(group - 1) / group**0.5:.2f} at G = {group}; EDA divides it "
        "by P_i / mean_group(P) (eq. 7), without a bound unless `edge_grpo.py --eda_ratio_bound` sets one.",
        "",
    ]
    return L


def cw_mechanism(reader: Reader, ablations: list) -> list[str]:
    """The kernel's weight on the tokens of extreme covariance, with it on and (computed, not applied) off."""
    figures = reader.figures
    L = [
        "### CW-GRPO: the kernel",
        "",
        "Per step, over the groups with a signal: the 1% of tokens with the largest |covariance| between log-prob "
        "and advantage (Sec. 2.3), their share of the sum of |covariance|, and the mean kernel weight on them (1: "
        "kept as GRPO keeps them; with the kernel off the weight is computed, not applied); the mean over steps:",
        "",
        "| run | top 1%'s share of sum \\|covariance\\| | their mean weight | gradient norm before clipping, mean |",
        "|---|---|---|---|",
    ]
    for m in ("cw_grpo", *ablations):
        runs = figures[m]
        L.append(
            f"| {NAMES[m]} | {cell(seeds_of(runs, 'cw_top_share'))} | {cell(seeds_of(runs, 'cw_top_weight'))} "
            f"| {cell(seeds_of(runs, 'grad_norm'), 2)} |"
        )
    if (e := reader.diff("cw_grpo", "cw_grpo-off", "grad_norm")) is not None:
        L += ["", f"The gradient norm before clipping with the kernel minus without it: {e.text(2)} ({e.seeds} seeds)."]
    return L + [""]


def detail_sections(reader: Reader, infos: dict) -> list[str]:
    figures = {m: f for m, f in reader.figures.items() if m not in ABLATIONS}
    base = infos[BASE][min(infos[BASE])]
    steps, flags = base["steps"], base["flags"]
    ks = figures[BASE][min(figures[BASE])]["ks_after"]
    L = ["## Details", "", "Each cell: the mean over seeds and, in brackets, the lowest and highest seed.", ""]
    L += [
        f"Held-out pass@k at T = {EVAL_TEMPERATURE} before the first step (the same policy for every run: one row) "
        f"and after step {steps}:",
        "",
        "| run | " + " | ".join(f"pass@{k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    rows = [("before training", figures[BASE], "before")] + [(NAMES[m], r, "after") for m, r in figures.items()]
    L += [
        f"| {name} | " + " | ".join(cell(seeds_of(r, f"pass{k}_{when}")) for k in ks) + " |" for name, r, when in rows
    ]
    L.append("")
    prompts, group = flags[flags.index("--prompts_per_step") + 1], flags[flags.index("--group_size") + 1]
    L += [
        "Training accuracy by step, the policy's own (for EDGE-GRPO before GEC's edits), on its "
        f"{prompts} x {group} samples a step at its own temperature (mean over seeds):",
        "",
        "| run | " + " | ".join(str(s) for s in range(1, steps + 1)) + " |",
        "|---|" + "---|" * steps,
    ]
    for m, runs in figures.items():
        cols = zip(*[runs[s]["acc"] for s in sorted(runs)])
        L.append(f"| {NAMES[m]} | " + " | ".join(fmt(mean(list(c)), 2) for c in cols) + " |")
    L += [
        "",
        "Entropy (nats per token under logits / T, at the run's own T) and the advantage signal, means over the steps; "
        "zero-advantage groups: all rewards equal (for EDGE-GRPO after GEC), less EGPO's all-wrong groups that NSR "
        "trains; the entropy change compares the first half of the steps with the second; AUROC of the confidence "
        "after training; time per step (rollout, scoring, update and sync; evaluations not counted):",
        "",
    ]
    cols = [
        ("training accuracy", "acc_mean", 3),
        ("entropy, second half", "entropy_late", 3),
        ("entropy change", "entropy_change", 3),
        ("zero-advantage groups", "zero_adv", 3),
        ("advantage variance", "adv_var", 3),
        ("AUROC after", "auroc_after", 3),
        ("s / step", "step_s", 1),
    ]
    L += ["| run | " + " | ".join(c for c, _, _ in cols) + " |", "|---|" + "---|" * len(cols)]
    L += [
        f"| {NAMES[m]} | " + " | ".join(cell(seeds_of(r, k), d) for _, k, d in cols) + " |" for m, r in figures.items()
    ]
    return L + ["", *cost_lines(reader, figures), ""]


def cost_lines(reader: Reader, figures: dict) -> list[str]:
    """Time per step against GRPO's, paired by seed; the spread of GRPO's own."""
    lo, hi = min(seeds_of(figures[BASE], "step_s")), max(seeds_of(figures[BASE], "step_s"))
    parts = [
        f"{NAMES[m]} {e.text(1)} s" for m in figures if m != BASE and (e := reader.diff(m, BASE, "step_s")) is not None
    ]
    return [
        f"Time per step minus GRPO's, paired by seed: {'; '.join(parts) or 'none compared'}. GRPO's own seeds took "
        f"{lo:.1f} to {hi:.1f} s / step for work of one size: the runs ran one after another, with the load the "
        "setup names."
    ]


def scale_section(reader: Reader, infos: dict) -> list[str]:
    """What this scale can and cannot show, and which runs ended below their start."""
    base = infos[BASE][min(infos[BASE])]
    steps, model, flags = base["steps"], base["model"], base["flags"]
    ran = [m for m in reader.figures]
    down = fell(reader, ran)
    total_runs = sum(len(r) for r in reader.figures.values())
    if down:
        where = ", ".join(f"{NAMES[m]} seed {s} ({shown(b)} {ARROW} {shown(a)})" for m, s, b, a in down)
        fell_line = f"Held-out pass@1 ended below its start in {len(down)} of {total_runs} runs: {where}."
    else:
        fell_line = f"No run's held-out pass@1 ended below its start ({total_runs} runs)."
    return [
        "### What this scale can and cannot show",
        "",
        f"`--model {model}`, {steps} steps of {flags[flags.index('--prompts_per_step') + 1]} prompts, a task "
        "answered in one line. It can show whether each mechanism moves its own figure (zero-advantage groups, "
        "advantage variance, entropy, the confidence's ranking) on a real pretrained model, at what cost per step, "
        f"and whether a short run gains or loses held-out accuracy. {fell_line} It cannot show the papers' gains on "
        "their benchmarks, which come from hundreds of steps on larger models with long reasoning: short answers "
        "leave little room for the entropy and confidence signals these methods act on.",
        "",
    ]


def coverage_text(reader: Reader) -> str:
    """The t interval's coverage simulated from the primary family's measured variance components, in words."""
    tables = [d for m in primary(reader) if (d := reader.differences(m, BASE)) is not None]
    found = {case: c for case, c in coverage_found(tables).items() if c}
    if not found:
        return ""

    def span(c: list) -> str:
        return f"{min(c):.1%}" if min(c) == max(c) else f"{min(c):.1%} to {max(c):.1%}"

    fixed = ", ".join(f"{span(found[(s, False)])} at {s} seeds" for s in SIM_SEEDS if (s, False) in found)
    line = f"Simulated from the measured variance components, its {CONFIDENCE:.0%} interval covers the true difference "
    line += f"in {fixed}"
    if (key := (SIM_SEEDS[0], True)) in found:
        sums = tables[0].shape[1]
        line += f" ({span(found[key])} at {SIM_SEEDS[0]} seeds if the {sums} sums are taken as a sample of all sums)"
    return line + "."


def statistics_section(reader: Reader) -> list[str]:
    tables = [d for m in primary(reader) if (d := reader.differences(m, BASE)) is not None and np.ptp(d)]
    shares = sorted(components(d).seed_share() for d in tables)
    seeds_carry = ""
    if shares:
        seeds_carry = f" In the primary family the seeds carry {shares[0]:.0%} to {shares[-1]:.0%} of the variance of "
        seeds_carry += "a difference's mean (the rest: the problems and the sampling)."
    return [
        "### Statistics",
        "",
        "Runs of one seed share the data order and the starting policy, and every run is evaluated on the same "
        "held-out problems: two runs are paired by seed, and a held-out figure by seed and problem. A held-out "
        f"difference's {CONFIDENCE:.0%} interval is Student's t over the seeds' paired differences, each seed's mean "
        "over the held-out problems (`scipy.stats.ttest_1samp`, one degree of freedom fewer than the seeds): the "
        "problems are fixed, the benchmark, and the seeds random. It replaces a bootstrap over seeds and problems, "
        "which with 5 seeds shrank the seeds' variance by 4/5 and read a normal quantile (1.96 where 4 degrees of "
        "freedom need 2.78), and under-covered. A run's own pass@1 interval is the same t over its seeds' means. A "
        "figure of the training (entropy, advantage variance, AUROC, time per step: one number a run) gets the paired "
        "t-interval over seeds (`scipy.stats.ttest_rel`). P(beats): on the same seed and problem, the chance that "
        "the first run's pass@1 is above the second's, ties 1/2, its interval Student's t over the seeds' shares; "
        "the share of ties is given beside it, since ties pull it to 1/2. The primary family (each method and "
        f"baseline against GRPO, held-out pass@1 at T = {EVAL_TEMPERATURE}) is Holm-adjusted (Holm 1979); every other "
        f"comparison is exploratory. A comparison needs {MIN_SEEDS} seeds in both runs." + seeds_carry,
        "",
        f"The coverage is simulated ({SIM_REPS:,} designs per comparison, generator seed {SIM_SEED}) from each "
        "primary comparison's variance components (the two-way ANOVA's, seeds x problems): seed effects drawn "
        "normal, residuals resampled from the measured ones, the problems fixed. The 80%-power difference is "
        "(t(0.975, n - 1) + t(0.8, n - 1)) x the seeds' SD of the paired differences / sqrt(n). Code: "
        "`scripts/comparison/stats.py` and `design.py`.",
        "",
    ]
