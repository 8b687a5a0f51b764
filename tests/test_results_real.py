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
    figure; a second call skips the stored run, runs the missing ones; --render_only gives the same page."""
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
    mtime = (stored / compare.RUN_FILE).stat().st_mtime

    methods = "grpo_base,cw_grpo,cw_grpo-off"
    second = run_cli("scripts/compare_real.py", *common, "--methods", methods, "--readme", "", timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "grpo_base, seed 0: stored in" in second.stdout and "skipped" in second.stdout
    assert (stored / compare.RUN_FILE).stat().st_mtime == mtime
    page = (out / compare.PAGE).read_text()
    assert "| CW-GRPO |" in page and (out / compare.FIGURE).stat().st_size > 10_000
    assert "## Each method against its own ablation" in page and "**CW-GRPO** (T = 0.7)" in page
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
    assert "Of 2 claims:" in page  # CW-GRPO's two; its ablation makes none
    assert readme.read_text().startswith(f"intro\n{compare.README_BEGIN}\n[docs/results_real.md](docs/results_real.md)")

    (out / compare.PAGE).unlink()
    shutil.rmtree(runs)  # render_only needs only the stored results
    again = run_cli("scripts/compare_real.py", "--render_only", "--out", str(out), "--readme", "", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / compare.PAGE).read_text() == page

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
    assert rel("cannot decide at this scale", "X's", ([0.5], [0.45])) == "within the seeds' spread of X's"
