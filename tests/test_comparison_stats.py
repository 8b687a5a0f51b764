"""scripts/comparison/stats.py and verdicts.py: the paired intervals the comparison's verdicts come from, checked
against their definitions on synthetic runs (no training here)."""

import importlib.util

import numpy as np
import pytest
from train_utils import ROOT

SPEC = importlib.util.spec_from_file_location("compare_real", ROOT / "scripts" / "compare_real.py")
compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare)  # puts the repository root on sys.path: scripts.comparison imports below

from scripts.comparison import page, stats, verdicts  # noqa: E402
from scripts.comparison.grid import BASE, P1  # noqa: E402


def crossed_bootstrap(d: np.ndarray, draws: int, seed: int) -> tuple[float, float]:
    """The oracle: seeds and problems drawn with replacement, independently, the mean of the paired differences
    over the drawn grid; the 2.5th and 97.5th percentiles."""
    rng = np.random.default_rng(seed)
    S, J = d.shape
    means = [d[rng.integers(0, S, S)][:, rng.integers(0, J, J)].mean() for _ in range(draws)]
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def test_the_interval_is_the_crossed_bootstrap_of_seeds_and_problems():
    rng = np.random.default_rng(1)
    a = rng.random((5, 100)) + rng.normal(0, 0.1, (5, 1))  # a seed effect shared by every problem
    b = rng.random((5, 100))
    est = stats.paired_problems(a, b)
    assert est.value == pytest.approx((a - b).mean()) and (est.seeds, est.problems) == (5, 100)
    low, high = crossed_bootstrap(a - b, 4000, 2)
    assert est.low == pytest.approx(low, abs=0.01) and est.high == pytest.approx(high, abs=0.01)


def test_one_seeds_level_resamples_its_problems_and_the_page_says_so():
    """A run stored for one seed so far (the grid runs seed by seed): its level's interval is over the problems alone,
    the crossed bootstrap with the one seed always drawn, and its cell says so."""
    table = (np.random.default_rng(3).random((1, 100)) < 0.4).astype(float)
    est = stats.grid_mean(table)
    low, high = crossed_bootstrap(table, 4000, 4)
    assert (est.seeds, est.problems) == (1, 100) and est.value == pytest.approx(table.mean())
    assert est.low == pytest.approx(low, abs=0.015) and est.high == pytest.approx(high, abs=0.015)
    assert page.pct(est).endswith("(1 seed: over problems only)")


def test_a_seed_effect_widens_the_interval_and_resampling_problems_alone_would_miss_it():
    """Seeds that move every problem together: the interval must carry that spread (it resamples seeds)."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.2, (5, 100))
    flat = stats.grid_mean(noise)
    shifted = stats.grid_mean(noise + np.array([[-0.2], [-0.1], [0.0], [0.1], [0.2]]))
    assert shifted.half_width > 2 * flat.half_width


def test_constant_differences_give_the_value_itself():
    est = stats.paired_problems(np.full((3, 4), 0.75), np.full((3, 4), 0.5))
    assert (est.value, est.low, est.high, est.word) == (0.25, 0.25, 0.25, stats.HIGHER)
    same = stats.paired_problems(np.full((3, 4), 0.5), np.full((3, 4), 0.5))
    assert same.word == stats.TIED and same.improve == 0.5


def test_probability_of_improvement_is_rliables_mann_whitney_over_runs_averaged_over_problems():
    a = np.array([[1.0, 0.0], [1.0, 0.5], [1.0, 0.0]])
    b = np.array([[0.0, 0.0], [0.0, 0.5], [0.0, 0.0]])
    # Problem 0: every run of a beats every run of b (1); problem 1: of the 9 pairs, (0.5 vs 0) twice wins,
    # (0 vs 0.5) twice loses, the other 5 tie: (2 + 5 / 2) / 9 = 0.5. Mean: 0.75.
    assert stats.paired_problems(a, b).improve == pytest.approx(0.75)


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


def test_the_smallest_difference_told_leaves_out_runs_that_answered_alike():
    """A run identical to GRPO (GSPO on-policy) has a zero-width interval: it says nothing of the design's reach."""
    figs = figures_of({BASE: [0.5] * 5, "egpo": [0.45] * 5, "cw_grpo": [0.3] * 5})
    figs["gspo"] = {s: dict(f) for s, f in figs[BASE].items()}
    reader = verdicts.Reader(figs)
    assert reader.diff("gspo", BASE).half_width == 0
    widths = [reader.diff(m, BASE).half_width for m in ("egpo", "cw_grpo")]
    told = verdicts.smallest_told(reader, [(m, BASE, P1) for m in ("egpo", "cw_grpo", "gspo")])
    assert told == (pytest.approx(np.median(widths)), min(widths), max(widths)) and min(widths) > 0


def test_a_run_is_compared_on_the_seeds_both_have_and_needs_three():
    figs = figures_of({BASE: [0.5, 0.5, 0.5, 0.5], "egpo": [0.2, 0.2, 0.2, 0.2]})
    reader = verdicts.Reader(figs)
    est = reader.diff("egpo", BASE)
    assert est.seeds == 4 and est.word == stats.LOWER and est.value < -0.2
    del figs["egpo"][3], figs["egpo"][2]
    assert verdicts.Reader(figs).diff("egpo", BASE) is None  # 2 seeds: not compared
    assert verdicts.Reader(figs).level("egpo").seeds == 2  # a run's own level needs no pair


def test_the_reading_names_each_part_with_its_interval():
    figs = figures_of({BASE: [0.6] * 3, "cw_grpo": [0.2] * 3, "cw_grpo-off": [0.4] * 3})
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


def test_a_mechanism_claim_is_read_against_the_methods_ablation_too():
    """GRPO differs from EDGE-GRPO in its defaults as well: the zero-advantage claim is read again against EDGE-GRPO
    with GEC and EDA off (the idea alone), which here is supported while the reading against GRPO is not told apart."""
    zero_adv = {BASE: [0.30, 0.45, 0.38], "edge_grpo": [0.31, 0.36, 0.40], "edge_grpo-off": [0.62, 0.66, 0.71]}
    figs = {run: {s: {"zero_adv": v} for s, v in enumerate(values)} for run, values in zero_adv.items()}
    reader = verdicts.Reader(figs)
    line = next(x for x in page.claim_lines(reader) if "fewer groups with zero advantage" in x)
    assert "**not told apart**" in line.split("Against")[0]
    assert "Against its ablation (GEC and EDA off), the idea alone: -0." in line and line.endswith("**supported**.")
    assert page.against_ablation(reader, "edge_grpo", P1, "higher") == ""  # accuracy: the ablation table's


def test_the_short_answer_splits_a_methods_difference_by_its_ablation():
    """'In short' names the runs worse than GRPO and, where the method's ablation is stored, how much of the
    difference is the idea and how much the method's other defaults."""
    figs = figures_of({BASE: [0.6] * 3, "cw_grpo": [0.2] * 3, "cw_grpo-off": [0.4] * 3}, problems=40)
    line = page.summary_line(verdicts.Reader(figs))
    assert "better: none; worse: CW-GRPO." in line
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
