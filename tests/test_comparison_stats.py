"""scripts/comparison/stats.py and verdicts.py: the paired intervals the comparison's verdicts come from, checked
against their definitions on synthetic runs (no training here)."""

import importlib.util

import numpy as np
import pytest
from train_utils import ROOT

SPEC = importlib.util.spec_from_file_location("compare_real", ROOT / "scripts" / "compare_real.py")
compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare)  # puts the repository root on sys.path: scripts.comparison imports below

from scripts.comparison import design, page, stats, verdicts  # noqa: E402
from scripts.comparison.grid import BASE, P1  # noqa: E402


def test_the_interval_is_students_t_over_the_seeds_mean_differences():
    """By hand: seed means 0.1 .. 0.5 (each seed's problems spread around its mean), so the mean is 0.3, the SD
    sqrt(0.025), and the half-width t(0.975, 4) = 2.776445 times 0.158114 / sqrt(5)."""
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 0.3, (5, 100))
    d = np.array([[0.1], [0.2], [0.3], [0.4], [0.5]]) + noise - noise.mean(axis=1, keepdims=True)
    est = stats.paired_problems(d + 0.25, np.full((5, 100), 0.25))
    half = 2.776445 * np.sqrt(0.025) / np.sqrt(5)
    assert est.value == pytest.approx(0.3) and (est.seeds, est.problems) == (5, 100)
    assert (est.low, est.high) == pytest.approx((0.3 - half, 0.3 + half), abs=1e-5)
    assert est.sd == pytest.approx(np.sqrt(0.025))
    assert est.p == pytest.approx(2 * 0.0066169, abs=1e-5)  # t = 4.2426 on 4 degrees of freedom, two-sided


def test_one_seeds_level_is_over_its_problems_and_the_page_says_so():
    """A run stored for one seed so far (the grid runs seed by seed): its level's interval is Student's t over the
    problems alone, and its cell says so."""
    from scipy.stats import ttest_1samp

    table = (np.random.default_rng(3).random((1, 100)) < 0.4).astype(float)
    est = stats.grid_mean(table)
    low, high = ttest_1samp(table[0], 0).confidence_interval(0.95)
    assert (est.seeds, est.problems) == (1, 100) and est.value == pytest.approx(table.mean())
    assert (est.low, est.high) == pytest.approx((low, high))
    assert page.pct(est).endswith("(1 seed: over problems only)")


def test_a_seed_effect_widens_the_interval_and_problems_alone_would_miss_it():
    """Seeds that move every problem together: the interval must carry that spread (it is over the seeds)."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.2, (5, 100))
    flat = stats.grid_mean(noise)
    shifted = stats.grid_mean(noise + np.array([[-0.2], [-0.1], [0.0], [0.1], [0.2]]))
    assert shifted.half_width > 2 * flat.half_width


def test_constant_differences_give_the_value_itself():
    est = stats.paired_problems(np.full((3, 4), 0.75), np.full((3, 4), 0.5))
    assert (est.value, est.low, est.high, est.word) == (0.25, 0.25, 0.25, stats.HIGHER)
    same = stats.paired_problems(np.full((3, 4), 0.5), np.full((3, 4), 0.5))
    assert same.word == stats.TIED and (same.beats.value, same.beats.ties, same.p) == (0.5, 1.0, 1.0)


def test_p_beats_is_paired_by_seed_and_problem_with_its_ties_said():
    """Seed 0: a wins 2 of 4 problems, ties 2 (share 0.75); seed 1: wins 1, loses 1, ties 2 (0.5); seed 2: wins 3,
    ties 1 (0.875). Mean 0.70833; ties 5 of 12; the interval Student's t over the three shares."""
    from scipy.stats import ttest_1samp

    a = np.array([[1, 1, 0, 0.5], [1, 0, 0.5, 0.5], [1, 1, 1, 0]], dtype=float)
    b = np.array([[0, 0, 0, 0.5], [0, 1, 0.5, 0.5], [0, 0, 0, 0]], dtype=float)
    beats = stats.paired_problems(a, b).beats
    low, high = ttest_1samp([0.75, 0.5, 0.875], 0).confidence_interval(0.95)
    assert beats.value == pytest.approx(0.708333, abs=1e-6) and beats.ties == pytest.approx(5 / 12)
    assert (beats.low, beats.high) == (pytest.approx(max(low, 0.0)), pytest.approx(min(high, 1.0)))
    assert beats.text() == f"0.71 [{stats.shown(max(low, 0), 2)}, {stats.shown(min(high, 1), 2)}], ties 0.42"


def test_holm_against_a_worked_example():
    """p = 0.01, 0.04, 0.03, 0.005 (m = 4): sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06,
    0.04 x 1 = 0.04, raised to 0.06 to keep the order; capped at 1."""
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.4]) == pytest.approx([0.8, 0.8]) and stats.holm([0.9, 0.6, 0.7]) == [1.0, 1.0, 1.0]


def test_a_figure_of_the_training_gets_the_paired_t_interval():
    from scipy.stats import ttest_rel

    a, b = [0.30, 0.35, 0.32, 0.28, 0.31], [0.40, 0.45, 0.41, 0.39, 0.42]
    est = stats.paired_seeds(a, b)
    low, high = ttest_rel(a, b).confidence_interval(0.95)
    assert (est.low, est.high) == pytest.approx((low, high)) and est.word == stats.LOWER and est.problems == 1
    assert stats.paired_seeds([0.5, 0.6], [0.4, 0.5]).low == pytest.approx(0.1)  # no spread: the value


def test_estimate_words_and_text():
    e = stats.Estimate(-0.112, -0.169, -0.05, 5, 100)
    assert e.word == "lower" and e.text() == "-0.112 [-0.169, -0.050]" and e.half_width == pytest.approx(0.0595)
    assert stats.Estimate(0.01, -0.02, 0.04, 5, 100).word == stats.TIED


@pytest.mark.parametrize(
    "low, high, direction, says",
    [
        (0.01, 0.05, "higher", "supported"),
        (-0.05, -0.01, "higher", "contradicted"),
        (-0.05, -0.01, "lower", "supported"),
        (-0.01, 0.05, "higher", "not told apart"),
        (0.0, 0.05, "higher", "not told apart"),  # touching zero is not excluding it
    ],
)
def test_a_claims_verdict_is_its_interval_against_the_claimed_side(low, high, direction, says):
    assert verdicts.claim_word(stats.Estimate((low + high) / 2, low, high, 5, 100), direction) == says
    assert verdicts.claim_word(None, direction) == "not told apart"


def figures_of(p1: dict, problems: int = 20, seed: int = 0) -> dict:
    """{run: {seed: figures}} with per-problem held-out pass@1 near the given per-seed means (8 samples each)."""
    rng = np.random.default_rng(seed)
    out = {}
    for run, means in p1.items():
        out[run] = {}
        for s, m in enumerate(means):
            per = list(rng.binomial(8, m, problems) / 8)
            out[run][s] = {f"{P1}_problems": per, P1: float(np.mean(per)), "pass1_before": 0.2}
    return out


def test_the_detectable_difference_leaves_out_runs_that_answered_alike():
    """A run identical to GRPO (GSPO on-policy) has no spread: it says nothing of the design's reach."""
    figs = figures_of({BASE: [0.5] * 5, "egpo": [0.45] * 5, "cw_grpo": [0.3] * 5})
    figs["gspo"] = {s: dict(f) for s, f in figs[BASE].items()}
    reader = verdicts.Reader(figs)
    assert reader.diff("gspo", BASE).sd == 0
    found = [design.mdd(reader.diff(m, BASE).sd, 5) for m in ("egpo", "cw_grpo")]
    told = verdicts.detectable(reader, [(m, BASE, P1) for m in ("egpo", "cw_grpo", "gspo")])
    assert told == (pytest.approx(np.median(found)), min(found), max(found)) and min(found) > 0


def test_the_80_percent_power_difference_is_the_t_quantiles_formula_and_has_that_power():
    """(t(0.975, 4) + t(0.8, 4)) x sd / sqrt(5) = (2.776445 + 0.940965) x 0.02 / sqrt(5); the paired t-test's
    exact power there (the noncentral t) is 80% to within 2 points."""
    from scipy.stats import nct, t

    found = design.mdd(0.02, 5)
    assert found == pytest.approx((2.776445 + 0.940965) * 0.02 / np.sqrt(5), abs=1e-6)
    crit, ncp = t.ppf(0.975, 4), found / (0.02 / np.sqrt(5))
    assert nct.sf(crit, 4, ncp) + nct.cdf(-crit, 4, ncp) == pytest.approx(0.8, abs=0.02)
    assert design.mdd(0.02, 10) < found  # more seeds, a smaller difference found


def test_the_variance_components_are_recovered_from_a_simulated_table():
    """seed SD 0.05, problem SD 0.1, residual SD 0.2 over 40 seeds x 400 problems: the ANOVA estimates them."""
    rng = np.random.default_rng(2)
    d = rng.normal(0, 0.05, (40, 1)) + rng.normal(0, 0.1, (1, 400)) + rng.normal(0, 0.2, (40, 400))
    c = design.components(d)
    assert (c.seed, c.problem, c.residual) == pytest.approx((0.0025, 0.01, 0.04), rel=0.35)
    assert c.pool.var() == pytest.approx(c.residual, rel=0.01)


def test_the_t_interval_covers_near_nominal_and_the_check_can_fail():
    """Simulated from components like the stored runs' (seeds dominating, skewed residuals), the 95% t interval
    covers 95% at 5 and at 10 seeds (SIM_REPS designs: within 1.5 points); where the problems are taken as random
    and their variance dominates, the same interval under-covers: the simulation can tell."""
    rng = np.random.default_rng(0)
    pool = rng.choice([-0.25, 0.0, 0.0, 0.125, 0.375], (5, 100))
    c = design.Components(seed=4e-4, problem=0.05, residual=float(pool.var()), pool=pool - pool.mean())
    for seeds in (5, 10):
        assert design.coverage(c, seeds, np.random.default_rng(seeds)) == pytest.approx(0.95, abs=0.015)
    assert design.coverage(c, 5, np.random.default_rng(1), random_problems=True) < 0.9
    found = design.coverage_found([np.zeros((5, 100)), pool])  # a table with no spread: left out
    assert list(found) == [(5, False), (10, False), (5, True)] and all(len(v) == 1 for v in found.values())


def test_a_run_is_compared_on_the_seeds_both_have_and_needs_three():
    figs = figures_of({BASE: [0.5, 0.5, 0.5, 0.5], "egpo": [0.2, 0.2, 0.2, 0.2]})
    reader = verdicts.Reader(figs)
    est = reader.diff("egpo", BASE)
    assert est.seeds == 4 and est.word == stats.LOWER and est.value < -0.2
    del figs["egpo"][3], figs["egpo"][2]
    assert verdicts.Reader(figs).diff("egpo", BASE) is None  # 2 seeds: not compared
    assert verdicts.Reader(figs).level("egpo").seeds == 2  # a run's own level needs no pair


def test_the_reading_names_each_part_with_its_interval():
    figs = figures_of({BASE: [0.6] * 3, "cw_grpo": [0.2] * 3, "cw_grpo-off": [0.4] * 3}, problems=100)
    infos = {
        m: {s: {"script_flags": {"temperature": t, "cw": m == "cw_grpo"}} for s in range(3)}
        for m, t in ((BASE, 1.0), ("cw_grpo", 0.7), ("cw_grpo-off", 0.7))
    }
    infos[BASE] = {s: {"script_flags": {"temperature": 1.0}} for s in range(3)}
    line = verdicts.reading("cw_grpo", verdicts.Reader(figs), infos, set())[0]
    assert line.startswith("At T = 1.0, against GRPO -0.")
    assert "the idea (against the kernel off) costs accuracy (-0." in line
    assert "the rest of its settings (--temperature 0.7) costs accuracy (-0." in line
    assert verdicts.reading("cw_grpo", verdicts.Reader(figs), infos, set())[1].startswith(
        "At T = 0.6, top-p 0.95, against GRPO not compared"
    )


def test_only_runs_that_end_strictly_below_their_start_have_fallen():
    """A run whose held-out pass@1 stays where it started has not gained, and has not fallen either."""
    figs = {BASE: {0: {P1: 0.0, "pass1_before": 0.0}}, "egpo": {0: {P1: 0.0}}, "cw_grpo": {0: {P1: -0.1}}}
    assert verdicts.fell(verdicts.Reader(figs), [BASE, "egpo", "cw_grpo"]) == [("cw_grpo", 0, 0.0, -0.1)]


def test_a_comparison_short_of_seeds_is_listed_and_says_why():
    """A comparison whose runs have too few seeds is named in one line under the table, so what is missing shows;
    beside GRPO, such a run shows its gap over the seeds both ran, with no interval and no verdict."""
    figs = figures_of({BASE: [0.5] * 3, "cw_grpo": [0.3] * 3, "clip_cov": [0.4]})
    reader = verdicts.Reader(figs)
    assert not any(r.startswith("| CW-GRPO | Clip-Cov |") for r in page.comparison_table(reader))
    line = f"Not compared yet (fewer than {verdicts.MIN_SEEDS} seeds run by both): CW-GRPO against Clip-Cov."
    assert page.pending_comparisons(reader) == ["", line]
    section = page.ablation_section(reader, {})  # no ablation stored: the paper's baseline alone
    assert section[0].startswith("## Each method against") and line in section
    gap = figs["clip_cov"][0][P1] - figs[BASE][0][P1]  # seed 0, the one both ran
    assert page.diff_cell(None, reader.gap("clip_cov", BASE)) == (
        f"{gap:+.3f} over 1 seed both ran (no interval: a verdict needs {verdicts.MIN_SEEDS})"
    )
    assert "**In short**" in page.summary_line(reader) and "not compared yet" in page.summary_line(reader)


def flags_at(temperatures: dict, seeds: int = 3) -> dict:
    """run.json's as claims read them: each run's training temperature."""
    return {m: {s: {"script_flags": {"temperature": t}} for s in range(seeds)} for m, t in temperatures.items()}


def test_a_mechanism_claim_is_read_where_it_can_fail():
    """CW-GRPO trains at T = 0.7, GRPO at 1.0: its entropy claim is read against its own ablation (the same script
    and temperature), not GRPO; Pro-GRPO trains at GRPO's T: against GRPO, then against its ablation too;
    EDGE-GRPO's zero-advantage claim holds by construction: one line saying so, no verdict."""
    runs = {BASE: [0.30, 0.45, 0.38], "cw_grpo": [0.10, 0.12, 0.08], "cw_grpo-off": [0.20, 0.25, 0.15]}
    runs |= {"pro_grpo": [0.31, 0.36, 0.40], "pro_grpo-off": [0.20, 0.25, 0.31], "edge_grpo": [0.1, 0.2, 0.3]}
    figs = {
        run: {s: {"entropy_drift": v, "entropy_late": v, "zero_adv": v} for s, v in enumerate(vs)}
        for run, vs in runs.items()
    }
    infos = flags_at({BASE: 1.0, "cw_grpo": 0.7, "cw_grpo-off": 0.7, "pro_grpo": 1.0, "pro_grpo-off": 1.0})
    infos |= flags_at({"edge_grpo": 0.6})
    lines = page.claim_lines(verdicts.Reader(figs), infos)
    cw = next(x for x in lines if "stable entropy" in x)
    assert "minus CW-GRPO, the kernel off's (the same script and temperature): -0.100" in cw
    assert "**supported** (exploratory)" in cw and "Against its ablation" not in cw
    pro = next(x for x in lines if "exploration: higher policy entropy" in x)
    assert (
        "minus GRPO's: " in pro and "Against its ablation (the re-weighting off (alpha 0)), the idea alone: +0." in pro
    )
    edge = next(x for x in lines if "fewer groups with zero advantage" in x)
    assert "**not testable here**: true by construction" in edge and "minus" not in edge
    assert page.against_ablation(verdicts.Reader(figs), "edge_grpo", P1, "higher") == ""  # the ablation table's


def test_the_primary_family_is_holm_adjusted_and_its_word_follows_the_adjusted_p():
    """Each method and baseline against GRPO at T = 1: Holm over them; a difference whose own interval excludes
    zero is not told apart when its adjusted p is 0.05 or more."""
    figs = figures_of({BASE: [0.5] * 4, "egpo": [0.45] * 4, "cw_grpo": [0.3] * 4, "dapo": [0.52] * 4}, problems=40)
    reader = verdicts.Reader(figs)
    family = verdicts.primary(reader)
    assert list(family) == ["egpo", "cw_grpo", "dapo"]
    raw = [reader.diff(m, BASE).p for m in family]
    assert [p for _, p in family.values()] == pytest.approx(stats.holm(raw))
    e = stats.Estimate(-0.02, -0.03, -0.01, 5, 100, p=0.02)
    assert e.word == stats.LOWER and verdicts.primary_word(e, 0.06) == stats.TIED
    assert verdicts.primary_word(e, 0.01) == stats.LOWER
    assert (
        verdicts.claim_word(e, "higher", 0.06) == "not told apart"
        and verdicts.claim_word(e, "higher") == "contradicted"
    )
    infos = flags_at({m: 1.0 for m in figs}, 4)
    row = next(r for r in page.verdict_table(reader, infos) if r.startswith("| CW-GRPO |"))
    assert row.endswith(f"| {page.WORDS[verdicts.primary_word(*family['cw_grpo'])]} |")


def test_the_short_answer_splits_a_methods_difference_by_its_ablation():
    """'In short' names the runs worse than GRPO and, where the method's ablation is stored, how much of the
    difference is the idea and how much the method's other defaults."""
    figs = figures_of({BASE: [0.6] * 3, "cw_grpo": [0.2] * 3, "cw_grpo-off": [0.4] * 3}, problems=40)
    line = page.summary_line(verdicts.Reader(figs))
    assert "Holm-adjusted: better: none; worse: CW-GRPO." in line
    assert "CW-GRPO's idea -0." in line and ", its other defaults -0." in line


def test_a_figure_prints_alike_however_it_was_summed():
    """The verdict table's mean and the details' mean of the same per-seed numbers, summed in another order, differ
    in the 16th digit (0.5425 against 0.5425000000000001): both print half up, as one number."""
    from scripts.comparison.stats import shown

    assert shown(0.5425) == shown(sum([0.5975, 0.52875, 0.57125, 0.4725]) / 4) == "0.543"
    assert [shown(0.6375), shown(-0.0075, 3, "+"), shown(0.0, 3, "+"), shown(0.1 + 0.2, 1)] == [
        "0.638",
        "-0.008",
        "+0.000",
        "0.3",
    ]
