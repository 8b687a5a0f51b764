"""What this design can tell, from the stored runs themselves: the variance components of a held-out difference,
the coverage of stats.py's t interval simulated from them, and the smallest difference found with 80% power.

- Variance components of a [seeds, problems] table of paired differences, one value a cell: the balanced two-way
  ANOVA's method-of-moments estimators (expected mean squares; a negative estimate is set to 0; Searle, Casella
  & McCulloch 1992, "Variance Components", ANOVA estimation for balanced data): seed, problem, and residual (the
  seed x problem interaction with the sampling noise of 8 samples a problem).
- Coverage: replicates of the design with a known difference (0: the t interval is shift-invariant), seed effects
  drawn normal with the measured seed variance, residuals resampled from the measured ones (rescaled to their
  unbiased variance: their skew and discreteness are kept), each replicate's t interval tested for containing
  the truth. The problems fixed, as the interval takes them; and, for a reader who takes the 100 sums as a
  sample of all sums, problem effects drawn with the measured problem variance (which the interval leaves out).
- The minimal detectable difference at power 1 - beta of the two-sided paired t-test at alpha over n seeds with
  between-seed SD sd: (t_{1-alpha/2, n-1} + t_{1-beta, n-1}) sd / sqrt(n), the normal sample-size formula with
  t quantiles, an approximation to the noncentral t's power (the tests check it against `scipy.stats.nct`).
Deterministic: one generator, seeded (SIM_SEED), so the page's figures repeat to the digit."""

from dataclasses import dataclass

import numpy as np

from scripts.comparison.stats import ALPHA

POWER = 0.8
SIM_SEED = 0
SIM_REPS = 4000  # a 95% coverage's Monte Carlo SE: 0.34 points
SIM_SEEDS = (5, 10)


@dataclass(frozen=True)
class Components:
    """A paired difference's variance components, and its residuals (rescaled) to resample."""

    seed: float
    problem: float
    residual: float
    pool: np.ndarray  # [seeds, problems]

    def seed_share(self) -> float:
        """The seeds' share of the variance of the difference's mean over this design (problems random)."""
        S, J = self.pool.shape
        total = self.seed / S + self.problem / J + self.residual / (S * J)
        return self.seed / S / total if total else 0.0


def components(d: np.ndarray) -> Components:
    """The seed, problem and residual variances of a [seeds, problems] table (two-way ANOVA, method of moments)."""
    d = np.asarray(d, dtype=float)
    S, J = d.shape
    seeds, problems = d.mean(axis=1), d.mean(axis=0)
    resid = d - seeds[:, None] - problems[None, :] + d.mean()
    ms_e = float((resid**2).sum() / ((S - 1) * (J - 1)))
    ms_s, ms_p = J * float(seeds.var(ddof=1)), S * float(problems.var(ddof=1))
    pool = resid * np.sqrt(S * J / ((S - 1) * (J - 1)))  # the residuals' variance made ms_e
    return Components(max((ms_s - ms_e) / J, 0.0), max((ms_p - ms_e) / S, 0.0), ms_e, pool)


def coverage(c: Components, seeds: int, rng: np.random.Generator, random_problems: bool = False) -> float:
    """The share of SIM_REPS simulated designs (`seeds` seeds x the measured problems) whose Student's t interval
    over the seeds' means contains the true difference."""
    from scipy import stats

    J = c.pool.shape[1]
    residuals = rng.choice(c.pool.ravel(), (SIM_REPS, seeds, J)).mean(axis=-1)
    means = rng.normal(0.0, np.sqrt(c.seed), (SIM_REPS, seeds)) + residuals
    if random_problems:  # the same problems' effects in every seed of a replicate: their mean shifts them all
        means = means + rng.normal(0.0, np.sqrt(c.problem / J), (SIM_REPS, 1))
    half = stats.t.ppf(1 - ALPHA / 2, seeds - 1) * means.std(axis=1, ddof=1) / np.sqrt(seeds)
    return float((np.abs(means.mean(axis=1)) <= half).mean())


def coverage_found(tables: list[np.ndarray]) -> dict:
    """{(seeds, random problems?): [coverage of each table's measured components]} for each of SIM_SEEDS, problems
    fixed, and 5 seeds with problems random; tables whose differences are all alike (nothing to simulate) left
    out."""
    rng = np.random.default_rng(SIM_SEED)
    comps = [components(t) for t in tables if np.ptp(t) > 0]
    cases = [(s, False) for s in SIM_SEEDS] + [(SIM_SEEDS[0], True)]
    return {(s, r): [coverage(c, s, rng, r) for c in comps] for s, r in cases}


def mdd(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The difference a two-sided paired t-test over `n` seeds with between-seed SD `sd` detects with `power`."""
    from scipy import stats

    return float((stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / np.sqrt(n))
