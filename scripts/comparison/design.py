"""What this design can tell, from the stored runs themselves: the variance components of a held-out difference,
the coverage of stats.py's t interval simulated from them, and the smallest difference found with 80% power.

- Variance components of a [seeds, problems] table: the balanced two-way ANOVA's method-of-moments estimators
  (Searle, Casella & McCulloch 1992, "Variance Components"), negatives set to 0.
- Coverage: replicates with a true difference of 0, seed effects drawn normal, residuals resampled from the
  measured ones; problems fixed, and (for a reader who takes the sums as a sample) drawn too.
- The minimal detectable difference: (t_{1-alpha/2, n-1} + t_{1-beta, n-1}) sd / sqrt(n), the normal formula
  with t quantiles (the tests check it against `scipy.stats.nct`).
Seeded (SIM_SEED): the page's figures repeat to the digit."""

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
    """The share of SIM_REPS simulated designs whose Student's t interval over the seeds contains the truth."""
    from scipy import stats

    J = c.pool.shape[1]
    residuals = rng.choice(c.pool.ravel(), (SIM_REPS, seeds, J)).mean(axis=-1)
    means = rng.normal(0.0, np.sqrt(c.seed), (SIM_REPS, seeds)) + residuals
    if random_problems:  # the same problems' effects in every seed of a replicate: their mean shifts them all
        means = means + rng.normal(0.0, np.sqrt(c.problem / J), (SIM_REPS, 1))
    half = stats.t.ppf(1 - ALPHA / 2, seeds - 1) * means.std(axis=1, ddof=1) / np.sqrt(seeds)
    return float((np.abs(means.mean(axis=1)) <= half).mean())


def coverage_found(tables: list[np.ndarray]) -> dict:
    """{(seeds, random problems?): [each table's coverage]} for SIM_SEEDS with problems fixed, and 5 seeds random;
    tables without spread left out."""
    rng = np.random.default_rng(SIM_SEED)
    comps = [components(t) for t in tables if np.ptp(t) > 0]
    cases = [(s, False) for s in SIM_SEEDS] + [(SIM_SEEDS[0], True)]
    return {(s, r): [coverage(c, s, rng, r) for c in comps] for s, r in cases}


def mdd(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The difference a two-sided paired t-test over `n` seeds with between-seed SD `sd` detects with `power`."""
    from scipy import stats

    return float((stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / np.sqrt(n))
