"""scripts/compare_real.py: the page of the five methods on a real model is what the script computes from the stored
runs (docs/real_compare/), its AUROC and its verdict rule, and one end-to-end comparison on the tiny model."""

import importlib.util
import json
import shutil

import pytest
from train_utils import ROOT, run_cli

SPEC = importlib.util.spec_from_file_location("compare_real", ROOT / "scripts" / "compare_real.py")
compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare)

DOCS = ROOT / "docs"
STORED = DOCS / compare.STORE


@pytest.mark.skipif(
    not STORED.is_dir(), reason=f"{STORED} not there yet: `python scripts/compare_real.py` (the real runs) writes it"
)
def test_page_and_readme_are_what_the_script_computes_from_the_stored_runs():
    figures, infos = compare.load(STORED)
    assert (DOCS / compare.PAGE).read_text() == compare.page(figures, infos)
    assert (DOCS / compare.FIGURE).is_file()
    readme = (ROOT / "README.md").read_text()
    assert f"{compare.README_BEGIN}\n{compare.readme_block(figures, infos)}\n{compare.README_END}" in readme
    for m in compare.ablation_groups(figures):  # each ablated method's page reads its ablation as the script does
        block = f"{compare.READING_BEGIN}\n{compare.reading_block(m, figures, infos)}\n{compare.READING_END}"
        assert block in (DOCS / "algorithms" / f"{m}.md").read_text(), m
    # The stored samples are the evaluations the runs logged: the same pass@1 before and after.
    for runs in figures.values():
        for seed, f in runs.items():
            before = figures[compare.BASE][seed]["logged_pass1"][0]  # logged by the seed's GRPO run only
            assert f["logged_pass1"][0] in (None, before)
            assert (before, f["logged_pass1"][1]) == pytest.approx((f["pass1_before"], f["pass1_after"]), abs=1e-9)


def test_readme_names_the_page_the_figure_and_the_command():
    readme = (ROOT / "README.md").read_text()
    assert "`docs/results_real.md`" in readme and "`docs/compare_real.png`" in readme
    assert "python scripts/compare_real.py" in readme
    assert compare.README_BEGIN in readme and compare.README_END in readme
    assert "[docs/results_real.md](docs/results_real.md)" in compare.readme_block({}, {})  # the links, once written


# -- AUROC -------------------------------------------------------------------------------------------------------


def test_auroc_known_cases():
    assert compare.auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0  # every right one above every wrong one
    assert compare.auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 0.0
    # 3 of the 4 (right, wrong) pairs ordered right: 0.8 > 0.5, 0.8 > 0.3, 0.4 > 0.3; 0.4 < 0.5.
    assert compare.auroc([0.8, 0.4, 0.5, 0.3], [1, 1, 0, 0]) == 0.75
    # Order of the input does not matter.
    assert compare.auroc([0.3, 0.8, 0.5, 0.4], [0, 1, 0, 1]) == 0.75


def test_auroc_ties_count_half():
    assert compare.auroc([0.5, 0.5], [1, 0]) == 0.5
    # Pairs: (0.7 vs 0.5) 1, (0.7 vs 0.7) 1/2, (0.5 vs 0.5) 1/2, (0.5 vs 0.7) 0 -> 2 / 4.
    assert compare.auroc([0.7, 0.5, 0.5, 0.7], [1, 1, 0, 0]) == 0.5
    assert compare.auroc([1.0, 1.0, 1.0, 0.0], [1, 1, 0, 0]) == 0.75  # (1 vs 1) 1/2 twice, (1 vs 0) 1 twice


def test_auroc_matches_the_pair_count_on_random_data():
    import random

    rng = random.Random(0)
    scores = [round(rng.random(), 1) for _ in range(60)]  # many ties
    labels = [rng.random() < 0.4 for _ in scores]
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    pairs = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    assert compare.auroc(scores, labels) == pytest.approx(pairs / (len(pos) * len(neg)))


def test_auroc_is_undefined_when_all_right_or_all_wrong():
    assert compare.auroc([0.1, 0.5, 0.9], [1, 1, 1]) is None
    assert compare.auroc([0.1, 0.5, 0.9], [0, 0, 0]) is None
    assert compare.auroc([], []) is None
    # A sample without a confidence (a prompt too long to generate) is left out, not scored.
    assert compare.auroc([None, 0.5, 0.2], [0, 1, 0]) == 1.0
    assert compare.auroc([None, 0.5], [0, 1]) is None


# -- the verdict rule --------------------------------------------------------------------------------------------


def test_verdict_rule():
    v = compare.verdict
    assert v([0.6, 0.7], [0.4, 0.5], "higher") == compare.SUPPORTED  # both seeds above both of GRPO's
    assert v([0.3, 0.35], [0.4, 0.5], "higher") == compare.CONTRADICTED
    assert v([0.45, 0.7], [0.4, 0.5], "higher") == compare.UNDECIDED  # the ranges overlap
    assert v([0.5, 0.7], [0.4, 0.5], "higher") == compare.UNDECIDED  # touching is not beyond
    assert v([0.3, 0.35], [0.4, 0.5], "lower") == compare.SUPPORTED
    assert v([0.6, 0.7], [0.4, 0.5], "lower") == compare.CONTRADICTED
    assert v([0.6, None], [0.4, 0.5], "higher") == compare.UNDECIDED  # undefined in a seed: no verdict
    assert v([0.6], [0.5], "higher") == compare.SUPPORTED


def test_page_reports_an_undefined_auroc_as_undefined():
    assert compare.cell([None, 0.7]) == "undefined / 0.700 (per seed)"
    assert compare.cell([0.5, 0.7]) == "0.600 (0.500–0.700)"


# -- one comparison end to end, on the tiny model -----------------------------------------------------------------


def test_the_baselines_are_methods_it_takes():
    """--methods takes the baselines (run from baselines/), each named, coloured and with its claims; a name it
    does not know is a one-line error naming them."""
    assert set(compare.BASELINES) <= set(compare.NAMES) & set(compare.COLORS)
    assert set(compare.BASELINES) <= {m for m, *_ in compare.CLAIMS}
    assert all((ROOT / script).is_file() for script in compare.SCRIPT.values()), compare.SCRIPT
    assert compare.SCRIPT["gspo"] == "baselines/gspo.py" and compare.SCRIPT["egpo"] == "egpo.py"
    bad = run_cli("scripts/compare_real.py", "--methods", "grpo_base,gpso", "--render_only")
    assert bad.returncode != 0 and "--methods takes" in bad.stderr and "gspo" in bad.stderr.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.vllm
def test_compare_real_end_to_end_on_the_tiny_model_and_resumes(tmp_path):
    """GRPO, then CW-GRPO and its ablation, one seed, two steps: the runs, the stored results, the page and the
    figure; a second call skips the stored run, runs the missing ones and evaluates each at CW-GRPO's paper setting
    (GRPO's from its kept model); --render_only gives the same page; a run whose model is gone is trained again to
    be evaluated, and gives the same answers."""
    out, runs = tmp_path / "docs", tmp_path / "runs"
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{compare.README_BEGIN}\nold\n{compare.README_END}\nrest\n")
    common = ["--model", "tiny", "--steps", "2", "--seeds", "0", "--out", str(out), "--runs_dir", str(runs)]
    first = run_cli("scripts/compare_real.py", *common, "--methods", "grpo_base", "--readme", str(readme), timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    stored = out / compare.STORE / "grpo_base-seed0"
    info = json.loads((stored / compare.RUN_FILE).read_text())
    assert info["steps"] == 2 and info["model"] == "tiny" and info["data"] == {"train": 400, "held_out": 100}
    samples = [json.loads(line) for line in (stored / compare.SAMPLES_FILE).read_text().splitlines()]
    assert sorted({s["eval"] for s in samples}) == ["after", "before"] and len(samples) == 200
    assert all(len(s["correct"]) == len(s["confidence"]) == compare.EVAL_N for s in samples)
    assert all(c is None or c <= 0 for s in samples for c in s["confidence"])  # mean log-probs
    mtime = (stored / compare.METRICS_FILE).stat().st_mtime  # evaluations add to run.json, never to the metrics

    methods = "grpo_base,cw_grpo,cw_grpo-off"
    second = run_cli("scripts/compare_real.py", *common, "--methods", methods, "--readme", "", timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "grpo_base, seed 0: stored in" in second.stdout and "skipped" in second.stdout
    assert (stored / compare.METRICS_FILE).stat().st_mtime == mtime  # not trained again: its model was kept
    page = (out / compare.PAGE).read_text()
    assert "| CW-GRPO |" in page and (out / compare.FIGURE).stat().st_size > 10_000
    assert "## Each method against its own ablation" in page and "**CW-GRPO** (trained at T = 0.7)" in page
    paper = compare.label((0.6, 0.95))
    for name in ("grpo_base-seed0", "cw_grpo-seed0", "cw_grpo-off-seed0"):
        lines = (out / compare.STORE / name / compare.SAMPLES_FILE).read_text().splitlines()
        assert sum(json.loads(line)["eval"] == paper for line in lines) == 100, name
        assert json.loads((out / compare.STORE / name / compare.RUN_FILE).read_text())["evals"][paper]["top_p"] == 0.95
    assert (
        "| CW-GRPO | T = 0.6, top-p 0.95 |" in page and "Evaluated at the paper's setting, T = 0.6, top-p 0.95" in page
    )
    assert (
        json.loads((out / compare.STORE / "cw_grpo-off-seed0" / compare.RUN_FILE).read_text())["script_flags"]["cw"]
        is False
    )
    figures, infos = compare.load(out / compare.STORE)
    assert page == compare.page(figures, infos)
    for runs_of in figures.values():  # the stored samples are the logged evaluations
        for seed, f in runs_of.items():
            before = figures[compare.BASE][seed]["logged_pass1"][0]
            assert (before, f["logged_pass1"][1]) == pytest.approx((f["pass1_before"], f["pass1_after"]), abs=1e-9)
    assert "Of 3 claims:" in page  # CW-GRPO's two, accuracy read at both evaluations; its ablation makes none

    # The evaluation of a saved model gives, at the run's own setting, the samples the run's evaluation gave.
    copy = tmp_path / "store"
    shutil.copytree(out / compare.STORE, copy)
    held_out = runs / "data" / "sums_eval.jsonl"
    compare.evaluate_at("cw_grpo", 0, (compare.EVAL_TEMPERATURE, 1.0), held_out, runs, copy)
    samples = [json.loads(line) for line in (copy / "cw_grpo-seed0" / compare.SAMPLES_FILE).read_text().splitlines()]
    again = [s | {"eval": "after"} for s in samples if s["eval"] == compare.label((compare.EVAL_TEMPERATURE, 1.0))]
    assert again == [s for s in samples if s["eval"] == "after"]
    assert readme.read_text().startswith(f"intro\n{compare.README_BEGIN}\n[docs/results_real.md](docs/results_real.md)")

    (out / compare.PAGE).unlink()
    shutil.rmtree(runs)  # render_only needs only the stored results
    again = run_cli("scripts/compare_real.py", "--render_only", "--out", str(out), "--readme", "", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / compare.PAGE).read_text() == page

    # A stored run lacking an evaluation, its model gone, is trained again (seeded: the same answers) and evaluated.
    info_path = out / compare.STORE / "cw_grpo-off-seed0" / compare.RUN_FILE
    info_path.write_text(json.dumps({k: v for k, v in json.loads(info_path.read_text()).items() if k != "evals"}))
    third = run_cli("scripts/compare_real.py", *common, "--methods", methods, "--readme", "", timeout=900)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (
        "cw_grpo-off, seed 0: trained again; its evaluation at T = 1.0: the same answers, right and wrong, in all 800"
        in third.stdout
    )
    assert third.stdout.count("trained again;") == 1  # the others were evaluated: their models are not needed

    # Other settings over stored results are refused, naming the fix.
    other = run_cli("scripts/compare_real.py", *common[:2], "--steps", "3", *common[4:], "--methods", "grpo_base")
    assert other.returncode != 0 and "--fresh" in other.stderr


def test_each_ablation_is_its_method_with_flags_its_script_takes():
    """An ablation runs its method's own script with the idea's flags off: the flags are that script's, they reach
    the stored settings (a run with other flags is not reused), and it is named and coloured after its method."""
    assert set(compare.PART_OFF) <= set(compare.ABLATIONS) and set(compare.DEFAULT_ABLATIONS) <= set(compare.ABLATIONS)
    for name, (method, flags, _) in compare.ABLATIONS.items():
        assert compare.SCRIPT[name] == compare.SCRIPT[method] and compare.COLORS[name] == compare.COLORS[method]
        assert compare.NAMES[name].startswith(compare.NAMES[method] + ", ")
        source = (ROOT / compare.SCRIPT[method]).read_text()
        assert all(f"    {f[2:]}: " in source for f in flags[::2]), (name, flags)
        assert (
            flags
            == compare.settings(name, 0, "smollm2", 8)["flags"][len(compare.FLAGS) : len(compare.FLAGS) + len(flags)]
        )
    assert compare.settings("edge_grpo", 0, "smollm2", 8)["flags"][: len(compare.FLAGS) + 1] == compare.FLAGS + [
        "--eval_steps"
    ]


S, C, U = "supported", "contradicted", "cannot decide at this scale"


@pytest.mark.parametrize(
    "whole, idea, rest, says",
    [
        (C, C, C, "the idea costs accuracy; its other settings (--temperature 0.6) cost accuracy at this scale. Its loss against GRPO comes with the idea and its other settings"),
        (C, C, U, "the idea costs accuracy; its other settings' (--temperature 0.6) effect is within the seeds' spread at this scale. Its loss against GRPO comes with the idea"),
        (C, U, C, "the idea's effect is within the seeds' spread; its other settings (--temperature 0.6) cost accuracy at this scale. Its loss against GRPO comes with its other settings"),
        (C, U, U, "the idea's effect is within the seeds' spread; its other settings' (--temperature 0.6) effect is within the seeds' spread at this scale. Its loss against GRPO comes with neither alone"),
        (U, C, S, "the idea costs accuracy; its other settings (--temperature 0.6) gain accuracy at this scale"),
        (S, S, U, "the idea gains accuracy; its other settings' (--temperature 0.6) effect is within the seeds' spread at this scale. Its gain against GRPO comes with the idea"),
        (U, U, U, "the idea's effect is within the seeds' spread; its other settings' (--temperature 0.6) effect is within the seeds' spread at this scale"),
    ],
)  # fmt: skip
def test_the_cause_read_off_a_method_its_ablation_and_grpo(whole, idea, rest, says):
    """Each part gets its own clause from its own verdict; a loss (gain) against GRPO is pinned only on the parts
    that lose (gain) too, and only when there is one."""
    line = compare.cause_of(whole, idea, rest, "--temperature 0.6")
    assert line == says, line


def test_a_relation_within_the_spread_says_when_every_seed_still_lies_on_one_side():
    rel = compare.relation
    assert rel("contradicted", "GRPO's", ([0.3, 0.35], [0.5, 0.6])) == "lower than GRPO's"
    assert rel("cannot decide at this scale", "X's", ([0.35, 0.13, 0.32], [0.45, 0.28, 0.4])) == (
        "within the seeds' spread of X's (lower in each of the 3 seeds, seed by seed)"
    )
    assert rel("cannot decide at this scale", "X's", ([0.5, 0.13], [0.45, 0.28])) == "within the seeds' spread of X's"
    assert rel("cannot decide at this scale", "X's", ([0.5], [0.45])) == (
        "not compared with X's (1 seed evaluated in both; the rule needs 2)"
    )
    assert rel("cannot decide at this scale", "X's", ([], [])).startswith("not compared with X's (0 seeds")


# -- the papers' evaluation settings ------------------------------------------------------------------------------


def test_each_run_is_evaluated_at_its_papers_setting_and_grpo_at_those_compared():
    """A method and its ablations at the method's paper setting (from its page), GRPO at the settings of the
    methods compared, a baseline at none; the stored label and figure name the setting."""
    ps = compare.paper_settings
    assert ps("edge_grpo", ["grpo_base", "edge_grpo"]) == [(0.1, 1.0)] == ps("edge_grpo-gec", [])
    assert ps("cw_grpo-off", []) == [(0.6, 0.95)] and ps("dapo", ["dapo"]) == []
    assert ps("grpo_base", ["grpo_base", "cw_grpo", "cw_grpo-off"]) == [(0.6, 0.95)]
    assert ps("grpo_base", list(compare.METHODS)) == [(0.1, 1.0), (0.6, 0.95)]
    assert ps("grpo_base", ["grpo_base", "dapo"]) == []
    assert compare.label((0.1, 1.0)) == "after-T0.1-p1.0" and compare.setting_text((0.6, 0.95)) == "T = 0.6, top-p 0.95"
    for m, (t, top_p) in compare.PAPER_EVAL.items():  # each setting is the one its method's page states
        page = (DOCS / "algorithms" / f"{m}.md").read_text()
        assert f"--temperature {t}" in page and (top_p == 1.0 or f"--top_p {top_p}" in page), m


def synthetic(p1: dict, paper: dict) -> tuple[dict, dict]:
    """figures and infos of three seeds each: {run: per-seed pass@1 at T = 1} and {run: at T = 0.1}."""
    key = f"pass1_{compare.label((0.1, 1.0))}"
    figures = {m: {s: {compare.P1: v, key: paper[m][s]} for s, v in enumerate(vs)} for m, vs in p1.items()}
    temps = {"grpo_base": 1.0, "edge_grpo": 0.6, "edge_grpo-off": 0.6}
    infos = {m: {s: {"script_flags": {"temperature": temps[m]}} for s in range(3)} for m in p1}
    return figures, infos


def test_a_method_is_read_against_its_ablation_and_grpo_at_both_evaluations():
    """The reading and the accuracy claim at T = 1 and again at the paper's setting, each from its own figure."""
    figures, infos = synthetic(
        {"grpo_base": [0.5, 0.55, 0.52], "edge_grpo": [0.28, 0.2, 0.25], "edge_grpo-off": [0.4, 0.3, 0.35]},
        {"grpo_base": [0.6, 0.62, 0.58], "edge_grpo": [0.7, 0.72, 0.75], "edge_grpo-off": [0.5, 0.55, 0.52]},
    )
    line = compare.reading("edge_grpo", ["edge_grpo-off"], figures, infos)
    assert line.startswith("(trained at T = 0.6). Evaluated at T = 1.0: held-out pass@1 lower than GRPO's, and lower")
    assert (
        "Evaluated at the paper's setting, T = 0.1: held-out pass@1 higher than GRPO's, and higher than its own with "
        "GEC and EDA off; that ablation's is lower than GRPO's. So the idea gains accuracy; its other settings "
        "(--temperature 0.6) cost accuracy at this scale. Its gain against GRPO comes with the idea."
    ) in line
    claimed = [(text, v) for m, text, key, *_, v in compare.claims(figures) if m == "edge_grpo" and "accuracy" in text]
    assert claimed == [
        ("higher accuracy", "contradicted"),
        ("higher accuracy, at the paper's setting, T = 0.1", "supported"),
    ]


def test_a_run_not_evaluated_at_the_papers_setting_is_left_out_of_those_comparisons():
    figures, infos = synthetic(
        {"grpo_base": [0.5, 0.55, 0.52], "edge_grpo": [0.3, 0.2, 0.25], "edge_grpo-off": [0.4, 0.3, 0.35]},
        {"grpo_base": [0.6, None, 0.58], "edge_grpo": [0.7, 0.72, 0.75], "edge_grpo-off": [0.5, 0.55, 0.52]},
    )
    key = f"pass1_{compare.label((0.1, 1.0))}"
    del figures["grpo_base"][1][key]
    assert compare.shared(figures, "edge_grpo", "grpo_base", key) == ([0.7, 0.75], [0.6, 0.58])
    assert compare.seeds_cell(figures["grpo_base"], key) == "0.590 (0.580–0.600) (seeds 0, 2)"
    assert compare.seeds_cell(figures["grpo_base"], "absent") == "-"


def test_a_rerun_says_whether_its_answers_are_the_stored_runs_and_how_far_confidences_moved():
    """Seeded, a run trained again gives the same answers; its log-probs may differ in the last digits (the CPU's
    float reductions), which the message measures rather than calling the run other."""
    stored = [{"correct": [1, 0] + [0] * 6, "confidence": [-0.5, -1.25] + [-1.0] * 6}]
    same = [{"correct": [1, 0] + [0] * 6, "confidence": [-0.500012, -1.25] + [-1.0] * 6}]
    assert (
        compare.rerun(stored, same) == "the same answers, right and wrong, in all 8 samples; confidence within 1.2e-05"
    )
    other = [{"correct": [0, 1] + [0] * 6, "confidence": [-0.5, -1.25] + [-1.0] * 6}]
    assert compare.rerun(stored, other).startswith("OTHER answers than the stored run in 2 of 8 samples")
