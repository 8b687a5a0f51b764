"""The page's comparisons, each a paired estimate (stats.py) over the seeds both runs have; the primary family (each
method and baseline against GRPO, held-out pass@1 at T = EVAL_TEMPERATURE) Holm-adjusted, the rest exploratory."""

from dataclasses import dataclass

import numpy as np

from scripts.comparison.design import mdd
from scripts.comparison.grid import (
    ABLATIONS,
    BASE,
    BASELINES,
    CLAIMS,
    COMPARED_WITH,
    EVAL_TEMPERATURE,
    METHODS,
    P1,
    STABILISERS,
    TRAINING_KEYS,
    UNTESTABLE,
    method_of,
    own_setting,
    pass_key,
    setting_text,
)
from scripts.comparison.stats import (
    ALPHA,
    HIGHER,
    LOWER,
    TIED,
    Estimate,
    grid_mean,
    holm,
    paired_problems,
    paired_seeds,
)

SUPPORTED, CONTRADICTED, UNDECIDED = "supported", "contradicted", "not told apart"
MIN_SEEDS = 3  # fewer seeds in both runs: not compared (over 2 seeds, t's quantile is 12.7)


class Reader:
    """The page's estimates from the runs' figures ({run: {seed: figures}}), each computed once."""

    def __init__(self, figures: dict):
        self.figures = figures
        self._cache = {}

    def seeds(self, key: str, *runs: str) -> list:
        """The seeds every one of `runs` has `key` at (evaluated there, or logged it)."""
        have = [{s for s, f in self.figures.get(r, {}).items() if f.get(key) is not None} for r in runs]
        return sorted(set.intersection(*have)) if have else []

    def level(self, run: str, key: str = P1, seeds: tuple | None = None) -> Estimate | None:
        """A run's held-out figure over its seeds (or `seeds`) and problems with its interval; None if not evaluated."""
        if (run, key, seeds) not in self._cache:
            have = self.seeds(key, run) if seeds is None else list(seeds)
            table = [self.figures[run][s][f"{key}_problems"] for s in have]
            self._cache[(run, key, seeds)] = grid_mean(np.array(table)) if have else None
        return self._cache[(run, key, seeds)]

    def gap(self, a: str, b: str, key: str = P1) -> tuple[float, int] | None:
        """(a - b, seeds) over the seeds both have, with no interval: what a comparison short of MIN_SEEDS seeds
        shows (a run is never set beside another's mean over other seeds); None if they share none."""
        seeds = self.seeds(key, a, b)
        if not seeds:
            return None
        _, vals = self._paired(a, b, key, seeds)
        return float(np.mean(vals[0]) - np.mean(vals[1])), len(seeds)

    def _paired(self, a: str, b: str, key: str, seeds: list) -> tuple[bool, list]:
        """(per problem?, [a's, b's] figures on `seeds`): per-problem tables, else one number a seed."""
        per_problem = f"{key}_problems" in self.figures[a][seeds[0]]
        return per_problem, [
            [self.figures[r][s][f"{key}_problems" if per_problem else key] for s in seeds] for r in (a, b)
        ]

    def differences(self, a: str, b: str, key: str = P1) -> np.ndarray | None:
        """a - b, [seeds, problems], of a held-out figure over the seeds both have; None under MIN_SEEDS seeds."""
        seeds = self.seeds(key, a, b)
        if len(seeds) < MIN_SEEDS:
            return None
        _, vals = self._paired(a, b, key, seeds)
        return np.array(vals[0], dtype=float) - np.array(vals[1], dtype=float)

    def diff(self, a: str, b: str, key: str = P1) -> Estimate | None:
        """a - b, paired by seed (and problem), over the seeds both have; None under MIN_SEEDS seeds."""
        if (a, b, key) not in self._cache:
            seeds = self.seeds(key, a, b)
            est = None
            if len(seeds) >= MIN_SEEDS:
                per_problem, vals = self._paired(a, b, key, seeds)
                est = paired_problems(*map(np.array, vals)) if per_problem else paired_seeds(*vals)
            self._cache[(a, b, key)] = est
        return self._cache[(a, b, key)]


def claim_word(est: Estimate | None, direction: str, p_holm: float | None = None) -> str:
    """Supported when the difference is told apart from zero on the claimed side (interval, or Holm p < ALPHA in the
    primary family), contradicted on the other."""
    said = None if est is None else est.word if p_holm is None else primary_word(est, p_holm)
    if said not in (HIGHER, LOWER):
        return UNDECIDED
    return SUPPORTED if (said == HIGHER) == (direction == "higher") else CONTRADICTED


def primary(reader: Reader) -> dict[str, tuple[Estimate, float]]:
    """The primary family: {run: (its difference to GRPO in pass@1 at EVAL_TEMPERATURE, its Holm-adjusted p)}."""
    runs = [m for m in reader.figures if m in METHODS + BASELINES and m != BASE and reader.diff(m, BASE)]
    ests = [reader.diff(m, BASE) for m in runs]
    return dict(zip(runs, zip(ests, holm([e.p for e in ests]))))


def primary_word(est: Estimate, p_holm: float) -> str:
    """higher / lower when the Holm-adjusted p is under ALPHA, else not told apart."""
    return TIED if p_holm >= ALPHA else HIGHER if est.value > 0 else LOWER


def evaluations(run: str) -> list[tuple[str, str]]:
    """(figure, in words) of each held-out pass@1 a run is read by: at EVAL_TEMPERATURE, and at its own setting."""
    out = [(P1, f"T = {EVAL_TEMPERATURE}")]
    if own := own_setting(run):
        out.append((pass_key(1, own), setting_text(own)))
    return out


@dataclass(frozen=True)
class Claim:
    """A paper's claim as read here: against GRPO, or against the method's whole ablation where the figure is one of
    the training and the method trained at another temperature than GRPO; `untestable`: why it cannot fail here."""

    method: str
    text: str
    where: str
    key: str
    direction: str
    against: str
    est: Estimate | None
    verdict: str
    primary: bool
    untestable: str = ""


def trained_at(infos: dict, run: str) -> float:
    return infos[run][min(infos[run])]["script_flags"]["temperature"]


def claims(reader: Reader, infos: dict) -> list[Claim]:
    """Each stored method's claims; an accuracy claim at T = EVAL_TEMPERATURE (primary: Holm-adjusted) and again at
    the method's own evaluation setting (exploratory)."""
    out, family = [], primary(reader)
    for m, text, key, direction in CLAIMS:
        if m not in reader.figures:
            continue
        if why := UNTESTABLE.get((m, key)):
            out.append(Claim(m, text, "", key, direction, BASE, None, UNDECIDED, False, why))
            continue
        # Entropy and the advantage signal are measured at the run's own sampling temperature: read at the same one.
        other_t = key in TRAINING_KEYS and trained_at(infos, m) != trained_at(infos, BASE)
        against = f"{m}-off" if other_t else BASE
        for k, where in evaluations(m) if key == P1 else [(key, "")]:
            est, p = family.get(m, (None, None)) if k == P1 else (reader.diff(m, against, k), None)
            out.append(Claim(m, text, where, k, direction, against, est, claim_word(est, direction, p), k == P1))
    return out


def ablation_groups(figures: dict) -> dict:
    """{method: [its whole ablation, its other stored ablations and stabilisers]} where the whole one is stored."""
    return {
        m: [f"{m}-off"] + [a for a, (of, _, _) in ABLATIONS.items() if of == m and a in figures and a != f"{m}-off"]
        for m in METHODS
        if m in figures and f"{m}-off" in figures
    }


def comparisons(figures: dict) -> list[tuple[str, str]]:
    """(first, second) of each comparison besides against GRPO: a method against its ablations, its whole ablation
    against GRPO, a partial ablation against the whole, and the method against its paper's baselines."""
    out = []
    for m, group in ablation_groups(figures).items():
        full, *others = group
        out += [(m, full), (full, BASE)]
        out += [(m, a) for a in others] + [(a, full) for a in others if a not in STABILISERS]
    out += [(m, b) for m, bs in COMPARED_WITH.items() if m in figures for b in bs if b in figures]
    return out


def other_settings(m: str, infos: dict, bookkeeping: set) -> str:
    """The flags in which a method's own defaults differ from GRPO's (its idea's flags and the comparison's
    bookkeeping left out): what an ablation keeps and GRPO does not."""
    base, flags = (infos[r][min(infos[r])]["script_flags"] for r in (BASE, m))
    diff = [f"--{k} {flags[k]}" for k in flags if k in base and flags[k] != base[k] and k not in bookkeeping]
    return ", ".join(diff) or "none"


def part_said(est: Estimate | None) -> str:
    """An estimate of a part's effect on accuracy, in words: 'costs accuracy (-0.112 [-0.169, -0.050])'."""
    if est is None:
        return f"not compared (fewer than {MIN_SEEDS} seeds run by both)"
    verb = {HIGHER: "gains accuracy", LOWER: "costs accuracy"}.get(est.word, "is not told apart from zero")
    return f"{verb} ({est.text()})"


def reading(m: str, reader: Reader, infos: dict, bookkeeping: set) -> list[str]:
    """One short sentence per evaluation on what a method's accuracy against GRPO comes with: the idea (the
    method against its whole ablation) and the rest of its settings (that ablation against GRPO)."""
    full = ablation_groups(reader.figures)[m][0]
    rest = other_settings(method_of(m), infos, bookkeeping)
    lines = []
    for key, where in evaluations(m):
        whole = reader.diff(m, BASE, key)
        said = f"against GRPO {whole.text()}" if whole else "against GRPO not compared"
        lines.append(
            f"At {where}, {said}: the idea (against {ABLATIONS[full][2]}) {part_said(reader.diff(m, full, key))}; "
            f"the rest of its settings ({rest}) {part_said(reader.diff(full, BASE, key))}."
        )
    return lines


def fell(reader: Reader, runs: list) -> list[tuple[str, int, float, float]]:
    """(run, seed, before, after) of each run whose held-out pass@1 after training is below the same seed's before."""
    out = []
    for m in runs:
        for seed, f in reader.figures[m].items():
            before = reader.figures[BASE].get(seed, {}).get("pass1_before")
            if before is not None and f[P1] < before:
                out.append((m, seed, before, f[P1]))
    return out


def detectable(reader: Reader, pairs: list[tuple[str, str, str]]) -> tuple[float, float, float] | None:
    """(median, lowest, highest) over `pairs` ((a, b, key)) of the difference detected with 80% power (design.mdd);
    pairs without spread (runs that trained alike) left out."""
    found = sorted(mdd(e.sd, e.seeds) for a, b, k in pairs if (e := reader.diff(a, b, k)) is not None and e.sd)
    if not found:
        return None
    return float(np.median(found)), found[0], found[-1]
