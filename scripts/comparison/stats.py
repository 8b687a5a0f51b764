"""Paired statistics for few-seed comparisons: Student's t over seeds (`scipy.stats`), Holm's step-down.

Every run is evaluated on the same held-out problems, and runs of one seed start from the same policy with the
same data order: two runs' figures are paired by seed, and a held-out figure by seed and problem.
- A held-out figure's difference: Student's t over the per-seed paired differences, each seed's mean over the
  held-out problems (`scipy.stats.ttest_1samp`, n - 1 degrees of freedom). The problems are fixed: the 100
  held-out sums are the benchmark, as a paper's test set is, so the estimand is the mean over them and only the
  training's seed-to-seed variation (with the sampling noise inside each seed's mean) is random. Why not the
  seeds x problems bootstrap it replaces: resampling 5 seeds shrinks their variance by 4/5 and reads a 1.96-wide
  normal quantile where 4 degrees of freedom need 2.78, so it under-covers (85-98% for a nominal 95%). Why not a
  two-way random-effects t interval (problems random too, Satterthwaite's degrees of freedom): on the stored
  runs it gives the same verdicts and intervals within about 0.01 (seeds carry most of the variance, and its
  added problem variance is offset by its larger degrees of freedom), but where the seeds' mean differences
  barely vary (the greedy evaluations) its degrees of freedom fall under 3 or to 0. design.py simulates the
  coverage from the measured variance components.
  Student (1908), "The probable error of a mean"; with 5-10 seeds the guide's rule: t over seeds, no bootstrap.
- A figure of the training (entropy, advantage variance, AUROC: one number per run): the paired t over seeds
  (`scipy.stats.ttest_rel`), the same interval.
- P(beats): paired by seed and problem, the share of (seed, problem) pairs where the first run's pass@1 is above
  the second's, ties 1/2; its interval is Student's t over the seeds' shares, and the share of ties is given.
- Holm's step-down (Holm 1979, "A simple sequentially rejective multiple test procedure", Scand. J. Statist.
  6:65-70) adjusts the primary family's p-values: the family-wise error stays under 5%.
A difference is told apart from zero when its interval excludes zero (its p-value is under 5%)."""

from dataclasses import dataclass, replace
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
HIGHER, LOWER, TIED = "higher", "lower", "not told apart"


def shown(v: float, digits: int = 3, sign: str = "") -> str:
    """`v` to `digits` places, half up, alike however it was summed: float noise is rounded off first, so the mean
    of the same numbers taken in another order prints the same (0.5425 and 0.5425000000000001 both as 0.543)."""
    exact = Decimal(repr(round(float(v), 9))).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{exact:{sign}.{digits}f}"


@dataclass(frozen=True)
class Beats:
    """P(first beats second), paired by seed and problem, ties 1/2, with its 95% interval and the share of ties."""

    value: float
    low: float
    high: float
    ties: float

    def text(self) -> str:
        """'0.24 [0.18, 0.30], ties 0.31'."""
        return f"{shown(self.value, 2)} [{shown(self.low, 2)}, {shown(self.high, 2)}], ties {shown(self.ties, 2)}"


@dataclass(frozen=True)
class Estimate:
    """A figure or a difference, with its 95% interval, its two-sided p-value against zero, and the between-seed
    SD of the per-seed values its interval comes from; `beats`: P(first beats second), for a held-out difference."""

    value: float
    low: float
    high: float
    seeds: int
    problems: int  # 1: a figure of the training, one number a seed
    p: float = 1.0
    sd: float = 0.0
    beats: Beats | None = None

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def word(self) -> str:
        """higher / lower when the interval excludes zero (a difference), else not told apart."""
        return HIGHER if self.low > 0 else LOWER if self.high < 0 else TIED

    def text(self, digits: int = 3) -> str:
        """'-0.112 [-0.169, -0.050]'."""
        return f"{shown(self.value, digits, '+')} [{shown(self.low, digits, '+')}, {shown(self.high, digits, '+')}]"


def t_interval(values) -> tuple[float, float, float, float, float]:
    """(mean, low, high, p, sd) of Student's t over `values` against zero. No spread: the interval is the value,
    and p is 1 at zero, 0 elsewhere (the t statistic is undefined)."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if v.min() == v.max():
        return mean, mean, mean, float(mean == 0), 0.0
    res = stats.ttest_1samp(v, 0.0)
    low, high = res.confidence_interval(CONFIDENCE)
    return mean, float(low), float(high), float(res.pvalue), float(v.std(ddof=1))


def grid_mean(table: np.ndarray) -> Estimate:
    """The mean of a [seeds, problems] table, its interval Student's t over the seeds' means; one seed: over its
    problems (the page says so beside the figure)."""
    table = np.asarray(table, dtype=float)
    S, J = table.shape
    mean, low, high, p, sd = t_interval(table[0] if S == 1 else table.mean(axis=1))
    return Estimate(mean, low, high, S, J, p, sd)


def paired_beats(a: np.ndarray, b: np.ndarray) -> Beats:
    """P(a beats b) on the same seed and problem, ties 1/2: its mean over the seeds' shares and Student's t
    interval over them (clipped to [0, 1]), and the share of tied pairs."""
    wins = (a > b) + 0.5 * (a == b)
    mean, low, high, _, _ = t_interval(wins.mean(axis=1) if len(a) > 1 else wins[0])
    return Beats(mean, max(low, 0.0), min(high, 1.0), float((a == b).mean()))


def paired_problems(a: np.ndarray, b: np.ndarray) -> Estimate:
    """a - b of two runs' [seeds, problems] tables, paired by seed and problem (the same seeds, in order): Student's
    t over the seeds' mean differences; with P(a beats b), paired."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return replace(grid_mean(a - b), beats=paired_beats(a, b))


def paired_seeds(a: list, b: list) -> Estimate:
    """a - b of a figure of two runs' training, paired by seed: the paired t-interval (`scipy.stats.ttest_rel`'s)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    mean, low, high, p, sd = t_interval(d)
    return Estimate(mean, low, high, len(d), 1, p, sd)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest of m is multiplied by m - i + 1
    (i from 1), kept at least the one before it, and capped at 1. Reject where the adjusted p is under alpha."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]), 1.0)
    out = np.empty(len(p))
    out[order] = stepped
    return out.tolist()
