"""Paired statistics for few-seed comparisons, computed by scipy and rliable (Agarwal et al., NeurIPS 2021).

Every run is evaluated on the same held-out problems, and runs of one seed start from the same policy with the
same data order: two runs' figures are paired by seed, and a held-out figure by seed and problem.
- A held-out figure's difference: `scipy.stats.bootstrap` resamples seeds and problems together (each draw takes
  seeds and problems with replacement, independently, and averages the paired differences over the seeds x problems
  drawn), so its 95% interval covers the training's seed-to-seed variation and the choice of problems.
- A figure of the training (entropy, advantage variance, AUROC: one number per run): the paired t-interval over
  seeds (`scipy.stats.ttest_rel`); a bootstrap over a handful of values would be narrower than the data allow.
- The probability of improvement is rliable's `probability_of_improvement`: P(X > Y) over runs, ties 1/2,
  averaged over problems.
A difference is told apart from zero when its interval excludes zero."""

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

N_RESAMPLES = 10_000
CONFIDENCE = 0.95
METHOD = "percentile"  # rliable's default; BCa's jackknife degenerates on a handful of seeds
RNG_SEED = 0  # the page's figures repeat to the digit on any machine
HIGHER, LOWER, TIED = "higher", "lower", "not told apart"


def shown(v: float, digits: int = 3, sign: str = "") -> str:
    """`v` to `digits` places, half up, alike however it was summed: float noise is rounded off first, so the mean
    of the same numbers taken in another order prints the same (0.5425 and 0.5425000000000001 both as 0.543)."""
    exact = Decimal(repr(round(v, 9))).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{exact:{sign}.{digits}f}"


@dataclass(frozen=True)
class Estimate:
    """A figure or a difference, with its 95% interval; `improve`: P(first > second), for a difference."""

    value: float
    low: float
    high: float
    seeds: int
    problems: int  # 1: a figure of the training, resampled over seeds only
    improve: float | None = None

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


def _bootstrap(samples: tuple, statistic, paired: bool = False) -> tuple[float, float]:
    from scipy import stats

    res = stats.bootstrap(
        samples, statistic, paired=paired, vectorized=True, n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE,
        method=METHOD, rng=np.random.default_rng(RNG_SEED),
    )  # fmt: skip
    low, high = res.confidence_interval
    return float(low), float(high)


def grid_mean(table: np.ndarray) -> Estimate:
    """The mean of a [seeds, problems] table, its interval from seeds and problems resampled together."""
    table = np.asarray(table, dtype=float)
    S, J = table.shape
    if table.min() == table.max():  # nothing varies: the interval is the value (the bootstrap would warn)
        return Estimate(float(table.mean()), float(table.min()), float(table.max()), S, J)
    if S == 1:  # one seed: only the problems can be resampled (the page says so beside the figure)
        low, high = _bootstrap((table[0],), lambda x, axis=-1: x.mean(axis=axis))
        return Estimate(float(table.mean()), low, high, S, J)

    def statistic(seeds, problems, axis=-1):
        rows = table[np.asarray(seeds, dtype=int)]  # [..., S, J]
        cols = np.asarray(problems, dtype=int)[..., None, :].repeat(S, axis=-2)
        return np.take_along_axis(rows, cols, axis=-1).mean(axis=(-2, -1))

    low, high = _bootstrap((np.arange(S), np.arange(J)), statistic)
    return Estimate(float(table.mean()), low, high, S, J)


def paired_problems(a: np.ndarray, b: np.ndarray) -> Estimate:
    """a - b of two runs' [seeds, problems] tables, paired by seed and problem (the same seeds, in order); with
    rliable's probability that a beats b."""
    from rliable import metrics

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = grid_mean(a - b)
    return Estimate(d.value, d.low, d.high, d.seeds, d.problems, float(metrics.probability_of_improvement(a, b)))


def paired_seeds(a: list, b: list) -> Estimate:
    """a - b of a figure of two runs' training, paired by seed: the paired t-interval; with rliable's probability
    that a beats b."""
    from rliable import metrics
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = a - b
    improve = float(metrics.probability_of_improvement(a[:, None], b[:, None]))
    if d.min() == d.max():  # no spread: the interval is the value (the t statistic is undefined)
        return Estimate(float(d.mean()), float(d.min()), float(d.max()), len(d), 1, improve)
    low, high = stats.ttest_rel(a, b).confidence_interval(CONFIDENCE)
    return Estimate(float(d.mean()), float(low), float(high), len(d), 1, improve)
