"""Paired statistics for few-seed comparisons: Student's t over seeds (`scipy.stats`), Holm's step-down.

Runs of one seed share the starting policy and data order, and every run is evaluated on the same held-out
problems: two runs are paired by seed, a held-out figure by seed and problem.
- A held-out difference: Student's t over the seeds' mean paired differences (`ttest_1samp`, n - 1 df; Student
  1908): the 100 sums are fixed, the benchmark, so only the seeds are random. A seeds x problems bootstrap
  under-covers at 5 seeds (85-98% for 95%); a two-way random-effects interval gives the same verdicts here but
  its df collapse where the seeds barely vary (greedy). design.py simulates the coverage.
- A figure of the training (one number a run): the paired t over seeds (`ttest_rel`).
- P(beats): the share of (seed, problem) pairs where the first run's pass@1 is above the second's, ties 1/2,
  its interval Student's t over the seeds' shares.
- Holm's step-down (Holm 1979, Scand. J. Statist. 6:65-70) adjusts the primary family's p-values."""

from dataclasses import dataclass, replace
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
HIGHER, LOWER, TIED = "higher", "lower", "not told apart"


def shown(v: float, digits: int = 3, sign: str = "") -> str:
    """`v` to `digits` places, half up, float noise rounded off first: 0.5425 and 0.5425000000000001 both 0.543."""
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
    """A figure or a difference: its 95% interval, two-sided p against zero, the between-seed SD behind the
    interval; `beats`: P(first beats second), for a held-out difference."""

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
    """(mean, low, high, p, sd) of Student's t over `values` against zero; no spread: the value, p 1 at zero else 0."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if v.min() == v.max():
        return mean, mean, mean, float(mean == 0), 0.0
    res = stats.ttest_1samp(v, 0.0)
    low, high = res.confidence_interval(CONFIDENCE)
    return mean, float(low), float(high), float(res.pvalue), float(v.std(ddof=1))


def grid_mean(table: np.ndarray) -> Estimate:
    """The mean of a [seeds, problems] table, Student's t over the seeds' means (one seed: over its problems)."""
    table = np.asarray(table, dtype=float)
    S, J = table.shape
    mean, low, high, p, sd = t_interval(table[0] if S == 1 else table.mean(axis=1))
    return Estimate(mean, low, high, S, J, p, sd)


def paired_beats(a: np.ndarray, b: np.ndarray) -> Beats:
    """P(a beats b) on the same seed and problem, ties 1/2: t over the seeds' shares, clipped to [0, 1]."""
    wins = (a > b) + 0.5 * (a == b)
    mean, low, high, _, _ = t_interval(wins.mean(axis=1) if len(a) > 1 else wins[0])
    return Beats(mean, max(low, 0.0), min(high, 1.0), float((a == b).mean()))


def paired_problems(a: np.ndarray, b: np.ndarray) -> Estimate:
    """a - b of two [seeds, problems] tables, paired by seed and problem, with P(a beats b)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return replace(grid_mean(a - b), beats=paired_beats(a, b))


def paired_seeds(a: list, b: list) -> Estimate:
    """a - b of a figure of two runs' training, paired by seed: the paired t-interval (`scipy.stats.ttest_rel`'s)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    mean, low, high, p, sd = t_interval(d)
    return Estimate(mean, low, high, len(d), 1, p, sd)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's adjusted p-values, in the order given: the i-th smallest of m times m - i + 1, monotone, capped at 1."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]), 1.0)
    out = np.empty(len(p))
    out[order] = stepped
    return out.tolist()
