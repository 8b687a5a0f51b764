"""docs/results_real.md, read in a minute: the verdict table first, then one computed sentence per claim, each
method against its ablations and its paper's baselines, the mechanisms' figures, the details, and how it was run
and read. The README's block and each method page's block are parts of it. Nothing here is typed by hand."""

from scripts.comparison import alike, details
from scripts.comparison.design import POWER
from scripts.comparison.grid import (
    ABLATIONS,
    BASE,
    COMPARED_WITH,
    EVAL_TEMPERATURE,
    NAMES,
    P1,
    REFERENCE,
    REGIMES,
    ROWS,
    SCRIPT,
    STABILISERS,
    own_setting,
    papers_setting,
    pass_key,
    setting_text,
    whose_setting,
)
from scripts.comparison.stats import ALPHA, CONFIDENCE, Estimate, shown
from scripts.comparison.verdicts import (
    CONTRADICTED,
    MIN_SEEDS,
    SUPPORTED,
    UNDECIDED,
    Reader,
    ablation_groups,
    claim_word,
    claims,
    comparisons,
    detectable,
    evaluations,
    primary,
    primary_word,
    reading,
)

PAGE, FIGURE, STORE = "results_real.md", "compare_real.png", "real_compare"
PRIMARY = REGIMES["primary"]
BOOKKEEPING = {"eval_before"}  # the comparison's own flag, not a method's
WORDS = {"higher": "better", "lower": "worse", "not told apart": "not told apart"}  # a difference, in words


def pct(e: Estimate | None) -> str:
    """A run's figure with its interval: '0.536 [0.49, 0.58]'."""
    if e is None:
        return "-"
    level = f"{shown(e.value)} [{shown(e.low)}, {shown(e.high)}]"
    return level + (" (1 seed: over problems only)" if e.seeds == 1 else "")


def diff_cell(e: Estimate | None, gap: tuple[float, int] | None = None) -> str:
    """A difference with its interval; short of MIN_SEEDS seeds, the gap over the seeds both ran, with no interval."""
    if e is not None:
        return e.text()
    if gap is None:
        return "not compared (no seed run by both)"
    value, n = gap
    return f"{shown(value, 3, '+')} over {n} seed{'s' * (n != 1)} both ran (no interval: a verdict needs {MIN_SEEDS})"


def improve_cell(e: Estimate | None) -> str:
    return "-" if e is None or e.beats is None else e.beats.text()


def word(e: Estimate | None) -> str:
    """An exploratory difference's word, off its unadjusted interval."""
    return "-" if e is None else WORDS[e.word]


def primary_cells(reader: Reader, m: str) -> tuple[str, str]:
    """(Holm-adjusted p, the word it gives) of a run in the primary family; ('-', '-') outside it."""
    if (found := primary(reader).get(m)) is None:
        return "-", "-"
    e, p = found
    return ("< 0.001" if p < 0.001 else shown(p, 3)), WORDS[primary_word(e, p)]


def runs_of(figures: dict) -> list[str]:
    """The methods, baselines and TRL's row stored (not the ablations), in the grid's order."""
    return [m for m in figures if m in ROWS]


def verdict_table(reader: Reader, infos: dict) -> list[str]:
    """The primary family: every method and baseline at T = EVAL_TEMPERATURE, its held-out pass@1, the difference
    to GRPO, its Holm-adjusted p, the chance it beats GRPO, and one word."""
    L = [
        "| run | trained at | seeds | held-out pass@1 [95% CI] | minus GRPO's [95% CI] | p, Holm-adjusted "
        "| P(beats GRPO) [95% CI], ties | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    found = alike.groups(reader)  # runs that trained as another did: noted in their verdicts
    for m in runs_of(reader.figures):
        t = infos[m][min(infos[m])]["script_flags"]["temperature"]
        e = None if m == BASE else reader.diff(m, BASE)
        p, said = primary_cells(reader, m)
        if m == REFERENCE and e is not None:  # outside the family: its own p and interval
            p, said = shown(e.p, 3) + " (its own)", word(e) + " (a check of the reference, outside the family)"
        L.append(
            f"| {NAMES[m]} | T = {t} | {len(reader.figures[m])} | {pct(reader.level(m))} | "
            f"{'-' if m == BASE else diff_cell(e, reader.gap(m, BASE))} | {p} | "
            f"{'-' if m == BASE else improve_cell(e)} | "
            f"{'(the yardstick)' if m == BASE else said + alike.tag(found, m)} |"
        )
    return L + [
        "",
        f"This table is the primary family: its {len(primary(reader))} differences are Holm-adjusted together, a "
        f"verdict when the adjusted p is under {ALPHA:.2f}; everything else on the page is exploratory. A difference "
        "is paired over the seeds both runs have (the seeds column counts a run's own). P(beats GRPO): on the same "
        "seed and held-out problem, the chance its pass@1 is above GRPO's, ties 1/2, with the share of ties.",
    ]


def primary_said(reader: Reader) -> str:
    """The primary family in words: the runs better than GRPO, worse, not told apart, not compared yet."""
    said = {"better": [], "worse": [], "not told apart": [], f"not compared yet (fewer than {MIN_SEEDS} seeds)": []}
    family = primary(reader)
    for m in runs_of(reader.figures):
        if m != BASE:
            said[WORDS[primary_word(*family[m])] if m in family else list(said)[-1]].append(NAMES[m])
    return "; ".join(f"{w}: {', '.join(names) or 'none'}" for w, names in said.items() if names or w == "better")


def summary_line(reader: Reader) -> str:
    """The verdict table in one sentence, and how each method's difference splits by its ablation."""
    line = f"**In short**, against GRPO at T = {EVAL_TEMPERATURE}, Holm-adjusted: {primary_said(reader)}."
    why = [f"{NAMES[m]}'s idea {a.text()}, its other defaults {b.text()}" for m, (a, b) in split_by_ablation(reader)]
    return line + (
        f" Why, from each method's ablation (the difference to GRPO split in two, exploratory): {'; '.join(why)}."
        if why
        else ""
    )


def split_by_ablation(reader: Reader) -> list[tuple[str, tuple[Estimate, Estimate]]]:
    """(method, (the method against its whole ablation, that ablation against GRPO)) at T = EVAL_TEMPERATURE, for
    each method told apart from GRPO whose two halves are both compared."""
    out = []
    for m, (whole, p) in primary(reader).items():
        off = f"{m}-off"
        if primary_word(whole, p) != UNDECIDED and off in reader.figures:
            idea, rest = reader.diff(m, off), reader.diff(off, BASE)
            out += [(m, (idea, rest))] if idea is not None and rest is not None else []
    return out


def own_setting_table(reader: Reader) -> list[str]:
    """Each run with an evaluation setting of its own, read there beside GRPO at the same setting."""
    rows = [(m, st) for m in runs_of(reader.figures) if m != BASE and (st := own_setting(m))]
    rows = [(m, st) for m, st in rows if reader.level(m, pass_key(1, st)) is not None]
    if not rows:
        return []
    L = [
        "At each run's own evaluation setting (whose: the last column), beside GRPO's runs evaluated there "
        "(exploratory):",
        "",
        "| run | setting | held-out pass@1 [95% CI] | GRPO's there, on the same seeds | minus GRPO's [95% CI] "
        "| P(beats GRPO) [95% CI], ties | verdict | whose setting |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, st in rows:
        key = pass_key(1, st)
        e, same = reader.diff(m, BASE, key), tuple(reader.seeds(key, m, BASE))
        L.append(
            f"| {NAMES[m]} | {setting_text(st)} | {pct(reader.level(m, key))} | {pct(reader.level(BASE, key, same))} | "
            f"{diff_cell(e, reader.gap(m, BASE, key))} | {improve_cell(e)} | {word(e)} | {whose_setting(m)} |"
        )
    return L


def grpo_pairs(reader: Reader) -> list[tuple[str, str, str]]:
    """(run, GRPO, key) of each held-out pass@1 comparison with GRPO, at every evaluation a run is read by."""
    return [(m, BASE, k) for m in runs_of(reader.figures) if m != BASE for k, _ in evaluations(m)]


def rule_line(reader: Reader) -> str:
    """How a verdict is reached, the smallest difference detected with 80% power, and the interval's coverage."""
    line = (
        "A difference's interval is Student's t over the seeds' paired differences ([how](#statistics)). The "
        f"verdicts above are Holm-adjusted; every other verdict word on the page is read off its unadjusted "
        f"{CONFIDENCE:.0%} interval (better or worse when it excludes zero) and is exploratory."
    )
    if found := detectable(reader, grpo_pairs(reader)):
        line += (
            f" With these seeds a difference in pass@1 from GRPO's is detected with {POWER:.0%} power when it is at "
            f"least {shown(found[0])} at the median of the comparisons with GRPO ({shown(found[1])} to "
            f"{shown(found[2])}): a smaller one is more likely missed than found."
        )
    return " ".join(x for x in (line, details.coverage_text(reader)) if x)


def regime_line(infos: dict) -> str:
    """The regime the stored runs are in, in one line."""
    if not alike.on_policy(infos):
        return "Some stored runs take several optimiser steps per rollout: the clip binds in those."
    return (
        "The stored grid is the on-policy regime (one optimiser step per rollout), in which the clip never binds "
        "([why](#runs-that-trained-alike))."
    )


def against_ablation(reader: Reader, m: str, key: str, direction: str) -> str:
    """A mechanism claim read again against the method's own ablation (its idea alone: GRPO differs from the
    method in its other defaults too), where that ablation is stored with enough seeds; '' otherwise."""
    off = f"{m}-off"
    if key.startswith("pass1") or (e := reader.diff(m, off, key)) is None:  # accuracy: the ablation table
        return ""
    return f" Against its ablation ({ABLATIONS[off][2]}), the idea alone: {e.text()}, **{claim_word(e, direction)}**."


def claim_line(c) -> str:
    """One computed sentence for a tested claim."""
    at = f", at {c.where}" if c.where else ""
    what = details.key_name(c.key)
    other = "GRPO's" if c.against == BASE else f"{NAMES[c.against]}'s (the same script and temperature)"
    how = "primary, Holm-adjusted" if c.primary else "exploratory"
    cells = f"{c.est.seeds} seeds{f' x {c.est.problems} problems' if c.est.problems > 1 else ''}"
    return (
        f"- **{NAMES[c.method]}**, {c.text}{at}: **{c.verdict}** ({how}). {what[0].upper() + what[1:]} minus "
        f"{other}: {c.est.text()} ({c.direction} claimed; {cells})."
    )


def claim_lines(reader: Reader, infos: dict) -> list[str]:
    """One computed sentence per claim; the claims that cannot fail here, one line each."""
    L, found = [], claims(reader, infos)
    for c in found:
        if c.untestable:
            L.append(f"- **{NAMES[c.method]}**, {c.text}: **not testable here**: {c.untestable}.")
        elif c.est is not None:  # the untested: listed below, in one line
            again = against_ablation(reader, c.method, c.key, c.direction) if c.against == BASE else ""
            L.append(claim_line(c) + again)
    untested = {}
    for c in found:
        untested[c.method] = untested.get(c.method, 0) + (c.est is None and not c.untestable)
    if untested := {m: n for m, n in untested.items() if n}:
        listed = ", ".join(f"{NAMES[m]} ({n})" for m, n in untested.items())
        L.append(f"- Not tested yet (fewer than {MIN_SEEDS} seeds run and evaluated by both): {listed}.")
    tested = [c for c in found if c.est is not None]
    counts = {w: sum(c.verdict == w for c in tested) for w in (SUPPORTED, CONTRADICTED, UNDECIDED)}
    held = {w: sum(c.verdict == w for c in tested if c.primary) for w in (SUPPORTED, CONTRADICTED)}
    L += [
        "",
        f"Of {len(found)} claims, {len(tested)} tested, {sum(bool(c.untestable) for c in found)} not testable here: "
        f"{counts[SUPPORTED]} supported, {counts[CONTRADICTED]} contradicted, {counts[UNDECIDED]} not told apart; "
        f"of the primary ones (accuracy at T = {EVAL_TEMPERATURE}, Holm-adjusted), {held[SUPPORTED]} supported and "
        f"{held[CONTRADICTED]} contradicted." + alike.alike_claims(alike.groups(reader), [c.method for c in tested]),
    ]
    return L


def what_it_reads(a: str, b: str) -> str:
    """What a comparison of run `a` against run `b` reads, in words (the table's "reads" column)."""
    if b == BASE:
        return "the rest of its settings"
    if b in COMPARED_WITH.get(a, ()):
        return "its paper's baseline"
    if a in STABILISERS or b in STABILISERS:
        return "the stabiliser"
    if a in ABLATIONS:
        return "the part left on"
    return "the idea" if b == f"{a}-off" else "the part turned off"


def comparison_table(reader: Reader) -> list[str]:
    """Each method against its ablations and the baselines its paper compares with, at each evaluation."""
    L = [
        "| first | second | reads | evaluated at | first minus second [95% CI] | P(first beats second) [95% CI], ties "
        "| verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for a, b in comparisons(reader.figures):
        reads = what_it_reads(a, b)
        for key, where in evaluations(a if a not in ABLATIONS else ABLATIONS[a][0]):
            if (e := reader.diff(a, b, key)) is not None:  # the others: `pending_comparisons`
                L.append(
                    f"| {NAMES[a]} | {NAMES[b]} | {reads} | {where} | {e.text()} | {improve_cell(e)} | {word(e)} |"
                )
    return L


def pending_comparisons(reader: Reader) -> list[str]:
    """The comparisons not made yet (fewer than MIN_SEEDS seeds run by both), in one line."""
    pending = [f"{NAMES[a]} against {NAMES[b]}" for a, b in comparisons(reader.figures) if reader.diff(a, b) is None]
    if not pending:
        return []
    return ["", f"Not compared yet (fewer than {MIN_SEEDS} seeds run by both): {'; '.join(pending)}."]


def ablation_section(reader: Reader, infos: dict) -> list[str]:
    groups = ablation_groups(reader.figures)
    if not comparisons(reader.figures):  # no ablation and no paper's baseline stored beside its method
        return []
    L = ["## Each method against its ablations and its paper's baselines", ""]
    if groups:
        L += [
            "A method differs from GRPO in its idea and also in its other defaults (temperature, loss aggregation, "
            "reward, weight decay: [Setup](#setup)). Each ablation runs the method's own script with the idea turned "
            "off and every other flag kept: the method against it reads the idea alone, the ablation against GRPO "
            "the rest. The ablations:",
            "",
        ]
        for group in groups.values():
            L += [f"- {NAMES[a]}: `{SCRIPT[a]} {' '.join(ABLATIONS[a][1])}`" for a in group]
        L += [""]
    L += comparison_table(reader) + pending_comparisons(reader)
    if groups:
        L += ["", "What each method's accuracy against GRPO comes with:", ""]
        for m in groups:
            L += [f"- **{NAMES[m]}**"] + [f"  - {line}" for line in reading(m, reader, infos, BOOKKEEPING)]
    return L + [""]


def setup_section(reader: Reader, infos: dict, task: str) -> list[str]:
    base = infos[BASE][min(infos[BASE])]
    flags = base["flags"]
    L = ["## How it was run and read", "", "### Setup", ""]
    L.append(
        f"- `--model {base['model']}`, {base['steps']} steps; {task}; {base['data']['train']} training problems, "
        f"{base['data']['held_out']} held-out problems never trained on (`scripts/real_model_demo.py`'s data)."
    )
    L.append(
        f"- Every run: `{' '.join(flags)}`: the same data and budget for all, and the same seeds as far as each "
        f"has them. The seeds: {seeds_text(infos)}."
    )
    L.append("- Each run keeps its own defaults otherwise; where they differ from GRPO's (GRPO's in brackets):")
    L += ["  " + line for line in details.method_defaults(infos, BOOKKEEPING)]
    n = flags[flags.index("--eval_n") + 1]
    L.append(
        f"- Every run is evaluated after its last step, {n} samples per held-out problem at T = {EVAL_TEMPERATURE}; "
        "pass@k is the unbiased estimator (Chen et al. 2021). The policy before training is every run's: evaluated "
        "once per seed, before GRPO's first step. After training each run is evaluated again at its own evaluation "
        "setting, and at that of each method that reads it (GRPO at all of them), from its saved model, with the "
        "same prompts and seed (greedy: one sample per problem). Whose each setting is:"
    )
    for m in runs_of(reader.figures):
        if own := own_setting(m):
            papers = "its paper's" if papers_setting(m) else "not its paper's"
            L.append(f"  - {NAMES[m]}: {setting_text(own)}, {whose_setting(m)} ({papers}).")
    if missing := not_evaluated_there(reader):
        L.append(f"  - Not evaluated at its setting yet (`python scripts/compare_real.py` does it): {missing}.")
    L.append(
        "- A held-out sample's confidence is its mean token log-prob under logits / T over the whole completion: "
        "minus EGPO's entropy proxy (eq. 5, [algorithms/egpo.md](algorithms/egpo.md)). AUROC: the chance that a "
        "right sample is more confident than a wrong one, ties 1/2, over a run's held-out samples."
    )
    L += ["- " + line for line in details.machine_lines(infos)] + [""]
    return L


def not_evaluated_there(reader: Reader) -> str:
    """The runs and seeds stored without an evaluation at their method's own setting, in words ('' for none)."""
    missing = []
    for r, seeds in reader.figures.items():
        if own := own_setting(r):
            lacking = [s for s, f in seeds.items() if f.get(pass_key(1, own)) is None]
            missing += [f"{NAMES[r]} seed{'s' * (len(lacking) > 1)} {', '.join(map(str, lacking))}"] if lacking else []
    return "; ".join(missing)


def seeds_text(infos: dict) -> str:
    """'0, 1, 2, 3, 4', and the runs with fewer named."""
    every = sorted({s for runs in infos.values() for s in runs})
    fewer = {m: sorted(runs) for m, runs in infos.items() if sorted(runs) != every}
    line = ", ".join(map(str, every))
    if fewer:
        line += " (fewer: " + "; ".join(f"{NAMES[m]} {', '.join(map(str, ss))}" for m, ss in fewer.items()) + ")"
    return line


def progress(figures: dict) -> tuple[int, int]:
    """(runs stored, runs planned) of the primary grid: every row on its seeds, every ablation on the first few."""
    planned = len(ROWS) * len(PRIMARY.seeds) + len(PRIMARY.ablations) * PRIMARY.ablation_seeds
    return sum(len(runs) for runs in figures.values()), planned


def complete(figures: dict) -> bool:
    """Does the primary store hold every method and baseline on every seed of its regime?"""
    return all(len(figures.get(m, {})) >= len(PRIMARY.seeds) for m in ROWS)


def primary_section(figures: dict, infos: dict) -> list[str]:
    """The primary regime's verdict table, read as the on-policy one is; while its grid runs, what it holds so far."""
    reader, base = Reader(figures), infos[BASE][min(infos[BASE])]
    stored, planned = progress(figures)
    steps, n = (base["script_flags"][k] for k in ("num_minibatches", "eval_n"))
    L = [
        f"## Which method: {steps} optimiser steps per rollout (the primary regime)",
        "",
        f"Held-out pass@1 after training, at T = {EVAL_TEMPERATURE} for every run, on {base['data']['held_out']} "
        f"held-out sums at {n} samples each. Every run takes {steps} optimiser steps per rollout "
        f"(`--num_minibatches {steps}`, the fewest the papers take), so the ratio leaves 1 and the clip acts. "
        f"TRL's GRPOTrainer is configured as GRPO ([how](../scripts/comparison/trl_grpo.py)): a check of the "
        f"reference, outside the family. The runs: [{PRIMARY.store}/]({PRIMARY.store}/).",
        "",
    ]
    if stored < planned:
        L += [
            f"**The grid is under way**: {stored} of its {planned} runs stored so far "
            "(`python scripts/compare_real.py` runs the rest, resumable). The table reads what is stored; a row "
            f"with fewer than {MIN_SEEDS} seeds has no verdict yet.",
            "",
        ]
    return L + [*verdict_table(reader, infos), "", rule_line(reader), ""]


def page(figures: dict, infos: dict, task: str, primary_runs: tuple[dict, dict] | None = None) -> str:
    """The page; `primary_runs`: the primary regime's (figures, infos), its table first, when stored."""
    reader = Reader(figures)
    L = [
        "# The methods and baselines side by side on a real model",
        "",
        "Written by `python scripts/compare_real.py` from the runs stored in [real_compare/](real_compare/) "
        "(`--render_only` writes it again from them). Figure: [compare_real.png](compare_real.png).",
        "",
        *(primary_section(*primary_runs) if primary_runs else []),
        "## Which method" + (": one optimiser step per rollout (the on-policy regime)" if primary_runs else ""),
        "",
        f"Held-out pass@1 after training, at T = {EVAL_TEMPERATURE} for every run:",
        "",
        *verdict_table(reader, infos),
        "",
        regime_line(infos),
        "",
        summary_line(reader),
        "",
        *alike.lines(reader, infos, BOOKKEEPING),
        *own_setting_table(reader),
        "",
        rule_line(reader),
        "",
        "## The papers' claims",
        "",
        *claim_lines(reader, infos),
        "",
        *ablation_section(reader, infos),
        *details.mechanism_sections(reader, infos),
        *details.detail_sections(reader, infos),
        *setup_section(reader, infos, task),
        *alike.section(reader, infos),
        *details.statistics_section(reader),
        *details.scale_section(reader, infos),
    ]
    return "\n".join(L)


def readme_block(figures: dict, infos: dict, docs: str = "docs", primary_runs: tuple[dict, dict] | None = None) -> str:
    """The README's lines: the verdict table (the primary regime's once its grid is complete), one line, the links."""
    L = [f"[{docs}/{PAGE}]({docs}/{PAGE}) (figure: [{docs}/{FIGURE}]({docs}/{FIGURE})):", ""]
    if primary_runs and complete(primary_runs[0]):
        figures, infos = primary_runs
        L += [f"{PRIMARY.budget.num_minibatches} optimiser steps per rollout (the primary regime):", ""]
    elif primary_runs:
        stored, planned = progress(primary_runs[0])
        L += [
            f"One optimiser step per rollout (the on-policy regime); the primary regime's grid "
            f"({PRIMARY.budget.num_minibatches} steps per rollout) is under way, {stored} of {planned} runs stored:",
            "",
        ]
    if figures:
        reader = Reader(figures)
        found = detectable(reader, grpo_pairs(reader))
        reach = f"; a difference under {shown(found[0])} is more likely missed than found" if found else ""
        L += verdict_table(reader, infos)[:-2] + [
            "",
            f"Against GRPO at T = {EVAL_TEMPERATURE}, Holm-adjusted over these {len(primary(reader))}: "
            f"{primary_said(reader)}{reach}; the rest of the page is exploratory "
            f"([how]({docs}/{PAGE}#statistics)).",
        ]
    return "\n".join(L)


def method_block(m: str, figures: dict, infos: dict) -> str:
    """A method page's lines: its comparisons, and where the rest is."""
    reader = Reader(figures)
    rows = [line for line in comparison_table(reader)[2:] if line.startswith(f"| {NAMES[m]} ")]
    whole = [
        f"| {NAMES[m]} | GRPO | the whole method | {where} | {diff_cell(e)} | {improve_cell(e)} | "
        f"{primary_cells(reader, m)[1] + ' (primary, Holm)' if key == P1 else word(e)} |"
        for key, where in evaluations(m)
        if (e := reader.diff(m, BASE, key)) is not None
    ]
    base = infos[BASE][min(infos[BASE])]
    return "\n".join(
        [
            f"On `--model {base['model']}`, {base['steps']} steps ([results_real.md](../{PAGE}), the runs in "
            f"[real_compare/](../{STORE}/)); the verdict against GRPO at T = {EVAL_TEMPERATURE} is Holm-adjusted "
            "(the primary family), the others are exploratory:",
            "",
            *comparison_table(reader)[:2],
            *whole,
            *rows,
        ]
    )
