"""Runs that trained alike: the same reward at every step and gradient norms a rounding apart, on every seed they
share. On-policy every ratio is 1, so runs whose advantages and loss aggregation agree train alike whatever their
ideas off-policy; the page names them from the stored curves and says why from their flags."""

from scripts.comparison.grid import BASE, BASELINES, COMPARED_WITH, NAMES
from scripts.comparison.verdicts import Reader

NORM_GAP = 1e-4  # relative gap between two runs' gradient norms, step by step, still read as rounding
ANCHOR = "runs-that-trained-alike"  # the page's section below
COUNTS = {2: "Two", 3: "Three", 4: "Four", 5: "Five"}


def norm_gap(reader: Reader, a: str, b: str) -> float | None:
    """The largest relative gap between a's and b's gradient norms when they trained alike on every seed they share
    (the same rewards, norms within NORM_GAP, some above zero), else None."""
    seeds = sorted(set(reader.figures[a]) & set(reader.figures[b]))
    pairs = [(reader.figures[a][s], reader.figures[b][s]) for s in seeds]
    norms = [(x, y) for f, g in pairs for x, y in zip(f.get("grad_norm_curve", []), g.get("grad_norm_curve", []))]
    if (
        not pairs
        or any(f.get("reward_curve") != g.get("reward_curve") for f, g in pairs)
        or not any(y for _, y in norms)
    ):
        return None
    gap = max(abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in norms)
    return gap if gap <= NORM_GAP else None


def groups(reader: Reader) -> list[tuple[list[str], float]]:
    """Each set of two or more runs of which every two trained alike, in the grid's order (GRPO's first), with the
    largest gap between two of its members' gradient norms."""
    found, left = [], list(reader.figures)
    while left:
        group, gap = [left[0]], 0.0
        for m in left[1:]:
            gaps = [norm_gap(reader, m, g) for g in group]
            if None not in gaps:
                group, gap = group + [m], max(gap, *gaps)
        left = [m for m in left if m not in group]
        found += [(group, gap)] if len(group) > 1 else []
    return found


def shared_flags(group: list[str], infos: dict, bookkeeping: set) -> list[str]:
    """The flags every run of the group sets alike and GRPO sets otherwise (not the comparison's `bookkeeping`)."""
    base = infos[BASE][min(infos[BASE])]["script_flags"]
    flags = [infos[m][min(infos[m])]["script_flags"] for m in group]
    return [
        f"`--{k} {v}`"
        for k, v in flags[0].items()
        if k in base and k not in bookkeeping and v != base[k] and all(f.get(k) == v for f in flags)
    ]


def listed(names: list[str]) -> str:
    """'a', '*a* and *b*', '*a*, *b* and *c*': italics keep apart names that hold commas."""
    if len(names) == 1:
        return names[0]
    names = [f"*{n}*" for n in names]
    return ", ".join(names[:-1]) + " and " + names[-1]


def consequences(group: list[str]) -> str:
    """What the page's comparisons of these runs then read: a baseline's rows its group's shared setting, not its
    idea; a method against that baseline, the method against its own ablation."""
    if BASE in group:
        return f"So here {listed([NAMES[m] for m in group if m != BASE])}'s row and claims compare GRPO with itself."
    said = [f"{NAMES[b]}'s rows and claims read that setting, not its own idea" for b in group if b in BASELINES]
    said += [
        f"{NAMES[m]} against {NAMES[b]} is {NAMES[m]} against its own ablation"
        for b in group
        for m, against in COMPARED_WITH.items()
        if b in against and f"{m}-off" in group
    ]
    return f"So here {'; '.join(said)}." if said else ""


def lines(reader: Reader, infos: dict, bookkeeping: set) -> list[str]:
    """One paragraph for each group of runs that trained alike: who, how close, and what follows."""
    L = []
    for group, gap in groups(reader):
        seeds = set.intersection(*(set(reader.figures[m]) for m in group))
        others = [NAMES[m] for m in group if m != BASE]
        same = f"on each of the {len(seeds)} seeds they share, the same reward at every step and gradient norms within {gap:.0e} (relative)"
        if BASE in group:
            head = f"**{listed(others)} trained as GRPO did**: {same} of GRPO's ([why](#{ANCHOR}))."
        else:
            also = shared_flags(group, infos, bookkeeping)
            setting = f"; of GRPO's settings all of them change {'these' if len(also) > 1 else 'one'}: " if also else ""
            setting += ", ".join(also)
            head = (
                f"**{COUNTS.get(len(group), len(group))} runs trained alike**, {listed(others)}: {same} of one "
                f"another{setting} ([why](#{ANCHOR}))."
            )
        L += [f"{head} {consequences(group)}".rstrip(), ""]
    return L


def tag(found: list[tuple[list[str], float]], m: str) -> str:
    """A verdict's note for a run that trained as another did ('' for none); `found`: `groups(reader)`."""
    for group, _ in found:
        if m in group and m != BASE:
            return " (trained as GRPO did)" if BASE in group else f" (trained as {len(group) - 1} other runs did)"
    return ""


def alike_claims(found: list[tuple[list[str], float]], claimed: list[str]) -> str:
    """The claims count's note on the `claimed` runs that trained as another did; `found`: `groups(reader)`."""
    runs = [m for group, _ in found for m in group if m != BASE and m in claimed]
    if not (n := sum(claimed.count(m) for m in runs)):
        return ""
    return (
        f" {n} of them are claims of runs that trained as another did ({', '.join(NAMES[m] for m in runs)}): "
        f"they test the setting those runs share, not their idea ([why](#{ANCHOR}))."
    )


def on_policy(infos: dict) -> bool:
    """Whether every run took one optimiser step per rollout (the policy trained is the one that sampled)."""
    flags = [f["script_flags"] for runs in infos.values() for f in runs.values()]
    return all(f.get("mu") == 1 and f.get("num_minibatches") == 1 for f in flags)


def section(reader: Reader, infos: dict) -> list[str]:
    """Why runs train alike, read from the runs' flags; nothing when none did."""
    if not (found := groups(reader)):
        return []
    L = ["### Runs that trained alike", ""]
    if not on_policy(infos):
        return L + [
            "Some runs take several optimiser steps per rollout: runs that trained alike did so by the data.",
            "",
        ]
    base = infos[BASE][min(infos[BASE])]
    lr, steps = base["script_flags"]["lr"], base["steps"]
    decays = [{r["script_flags"].get("weight_decay", 0.0) for m in g for r in infos[m].values()} for g, _ in found]
    decays = sorted(max(d) for d in decays if len(d) > 1)  # a group whose runs decay their weights differently
    decay = ""
    if decays:
        decay = f" A weight decay of {decays[-1]} at `--lr {lr}` shrinks a weight by {lr * decays[-1]:.0e} of itself a "
        decay += f"step, too little to change a sample in {steps} steps."
    return L + [
        "Every run here takes one optimiser step per rollout (`--mu 1 --num_minibatches 1`, each script's default): "
        "the policy trained is the one that sampled, so every ratio pi_theta / pi_old is 1 to rounding. No clip range "
        "then acts, and a penalty on |log pi_theta - log pi_old| (KL-Cov's) is zero, its gradient too; a cut of "
        "chosen tokens' gradients (Clip-Cov's) still acts. What is left "
        "of a run is its rewards, its sampling, its advantage and its loss aggregation: runs that agree in these train "
        "alike, whatever their ideas do off-policy ([algorithms/gspo.md](algorithms/gspo.md) works GSPO's case out)."
        f"{decay} Where such ideas differ is off-policy, from a rollout's second optimiser step on: runs with "
        "`--num_minibatches 4` (GSPO's paper's split) would compare them, and this grid has none.",
        "",
    ]
