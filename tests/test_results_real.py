"""scripts/compare_real.py: the page on a real model is what the scripts compute from the stored runs
(docs/real_compare/), the grid runs what its methods' pages say, and one comparison end to end on the tiny model.
The paired statistics themselves: tests/test_comparison_stats.py."""

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from train_utils import ROOT, run_cli, user_env

from common.evaluation import RECORDS_FILE
from common.models import SHIPPED_DIR
from common.run_flags import vllm_available

SPEC = importlib.util.spec_from_file_location("compare_real", ROOT / "scripts" / "compare_real.py")
compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare)  # puts the repository root on sys.path: scripts.comparison imports below

from scripts.comparison import alike, design, details, figures, grid, page, runs, trl_grpo, verdicts  # noqa: E402

DOCS = ROOT / "docs"
STORED = DOCS / page.STORE


@pytest.mark.skipif(not STORED.is_dir(), reason=f"{STORED} not there yet: `python scripts/compare_real.py` writes it")
def test_the_stored_runs_give_the_figure_and_their_logged_evaluations():
    """The page, the README's table and the method pages' blocks are rendered again from the stored runs by
    tests/test_docs.py; here, what the stored runs must hold besides."""
    figs, _ = figures.load(STORED)
    assert (DOCS / page.FIGURE).is_file()
    # The stored samples are the evaluations the runs logged: the same pass@1 before and after.
    for seeds in figs.values():
        for seed, f in seeds.items():
            before = figs[grid.BASE][seed]["logged_pass1"][0]  # logged by the seed's GRPO run only
            assert f["logged_pass1"][0] in (None, before)
            assert (before, f["logged_pass1"][1]) == pytest.approx((f["pass1_before"], f["pass1_after"]), abs=1e-9)


@pytest.mark.skipif(not STORED.is_dir(), reason=f"{STORED} not there yet: `python scripts/compare_real.py` writes it")
def test_the_stored_grids_intervals_cover_and_its_claims_are_read_where_they_can_fail():
    """On the stored runs: the t interval's coverage, simulated from each primary comparison's measured variance
    components (problems fixed), is within 1.5 points of 95% at 5 and 10 seeds; EDGE-GRPO's mechanism claims,
    true by construction, are said untestable; CW-GRPO's entropy (trained at T = 0.7) is read against its own
    ablation, every other claim against GRPO; the primary family is each method and baseline but GRPO."""
    figs, infos = figures.load(STORED)
    reader = verdicts.Reader(figs)
    family = verdicts.primary(reader)
    assert set(family) == set(grid.METHODS[1:] + grid.BASELINES)
    found = design.coverage_found([reader.differences(m, grid.BASE) for m in family])
    for seeds in design.SIM_SEEDS:
        assert all(abs(c - 0.95) < 0.015 for c in found[(seeds, False)]), (seeds, found[(seeds, False)])
    said = {(c.method, c.key): c for c in verdicts.claims(reader, infos)}
    assert said[("edge_grpo", "zero_adv")].untestable and said[("edge_grpo", "adv_var")].untestable
    assert said[("cw_grpo", "entropy_drift")].against == "cw_grpo-off"
    assert {c.against for k, c in said.items() if k != ("cw_grpo", "entropy_drift")} == {grid.BASE}


def test_runs_that_trained_alike_are_named_and_one_reward_apart_are_not():
    """On-policy, GSPO is GRPO, and KL-Cov and Pro-GRPO's and EGPO's ablations are one run (the page's "Runs that
    trained alike"): the stored runs show it, step for step, and the page names both groups; a run one step's reward
    or gradient norm apart on one seed leaves its group, and runs whose gradients were all zero (the tiny model's:
    nothing learned) are in none."""
    import copy

    figs, infos = figures.load(STORED)
    found = [group for group, _ in alike.groups(verdicts.Reader(figs))]
    assert found == [["grpo_base", "gspo"], ["kl_cov", "pro_grpo-off", "egpo-off"]]
    grpo, three = alike.lines(verdicts.Reader(figs), infos, page.BOOKKEEPING)[::2]
    assert grpo.startswith("**GSPO trained as GRPO did**: on each of the ") and "(#runs-that-trained-alike)" in grpo
    assert grpo.endswith("So here GSPO's row and claims compare GRPO with itself.")
    assert three.startswith("**Three runs trained alike**, *KL-Cov*, *Pro-GRPO, the re-weighting off (alpha 0)* and ")
    assert "all of them change one: `--loss_agg token-mean` (" in three
    assert three.endswith(
        "So here KL-Cov's rows and claims read that setting, not its own idea; Pro-GRPO against KL-Cov is Pro-GRPO "
        "against its own ablation."
    )
    reader = verdicts.Reader(figs)
    tags = [alike.tag(alike.groups(reader), m) for m in ("gspo", "kl_cov", "grpo_base", "dapo")]
    assert tags == [" (trained as GRPO did)", " (trained as 2 other runs did)", "", ""]
    assert alike.alike_claims(alike.groups(reader), ["gspo", "kl_cov", "kl_cov", "dapo"]).startswith(
        " 3 of them are claims of runs"
    )
    for key, change in (("reward_curve", 1 / 48), ("grad_norm_curve", 1e-3)):  # one more right answer of 48
        apart = copy.deepcopy(figs)
        for run in ("gspo", "kl_cov"):
            apart[run][0][key][-1] += change
        assert [g for g, _ in alike.groups(verdicts.Reader(apart))] == [["pro_grpo-off", "egpo-off"]], key
    still = copy.deepcopy(figs)  # no gradient at all: the same rewards say nothing
    for f in (f for seeds in still.values() for f in seeds.values()):
        f["grad_norm_curve"] = [0.0] * len(f["grad_norm_curve"])
    assert alike.groups(verdicts.Reader(still)) == [] and alike.section(verdicts.Reader(still), infos) == []


def test_why_runs_trained_alike_is_read_from_their_flags():
    """The on-policy reason is given only when every run took one optimiser step per rollout, and the weight decay
    only when a group's runs decay their weights differently."""
    import copy

    figs, infos = figures.load(STORED)
    reader = verdicts.Reader(figs)
    [_, _, why, _] = alike.section(reader, infos)
    assert why.startswith("Every run here takes one optimiser step per rollout") and "A weight decay of 0.01 " in why
    same_decay = copy.deepcopy(infos)
    for r in same_decay["kl_cov"].values():
        r["script_flags"]["weight_decay"] = 0.01
    assert "weight decay" not in alike.section(reader, same_decay)[2]
    several = copy.deepcopy(infos)
    several["dapo"][0]["script_flags"]["num_minibatches"] = 4
    assert "by the data" in alike.section(reader, several)[2]


def test_readme_names_the_page_the_figure_and_the_command():
    readme = (ROOT / "README.md").read_text()
    assert "`docs/results_real.md`" in readme and "`docs/compare_real.png`" in readme
    assert "python scripts/compare_real.py" in readme
    assert compare.README_BEGIN in readme and compare.README_END in readme
    assert page.readme_block({}, {}).startswith("[docs/results_real.md](docs/results_real.md)")


def test_the_task_is_described_from_the_held_out_sums():
    assert compare.task_text().startswith(
        'sums "What is a + b?" with a and b whole numbers from 0 to 99 (19 of the 100 held-out sums have a '
        "one-digit operand)"
    )


# -- AUROC -------------------------------------------------------------------------------------------------------


def test_auroc_known_cases_and_ties():
    auroc = figures.auroc
    assert auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0  # every right one above every wrong one
    assert auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 0.0
    assert auroc([0.8, 0.4, 0.5, 0.3], [1, 1, 0, 0]) == 0.75  # 3 of the 4 (right, wrong) pairs in order
    assert auroc([0.3, 0.8, 0.5, 0.4], [0, 1, 0, 1]) == 0.75  # the input's order does not matter
    assert auroc([0.7, 0.5, 0.5, 0.7], [1, 1, 0, 0]) == 0.5  # ties count 1/2
    assert auroc([1.0, 1.0, 1.0, 0.0], [1, 1, 0, 0]) == 0.75


def test_auroc_matches_the_pair_count_on_random_data():
    import random

    rng = random.Random(0)
    scores = [round(rng.random(), 1) for _ in range(60)]  # many ties
    labels = [rng.random() < 0.4 for _ in scores]
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    pairs = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    assert figures.auroc(scores, labels) == pytest.approx(pairs / (len(pos) * len(neg)))


def test_auroc_is_undefined_when_all_right_or_all_wrong():
    assert figures.auroc([0.1, 0.5, 0.9], [1, 1, 1]) is None
    assert figures.auroc([], []) is None
    assert figures.auroc([None, 0.5, 0.2], [0, 1, 0]) == 1.0  # a sample without a confidence is left out
    assert details.cell([None, 0.7]) == "undefined / 0.700 (per seed)" and details.cell([0.5, 0.7]) == (
        "0.600 (0.500–0.700)"
    )


# -- the grid ------------------------------------------------------------------------------------------------------


def test_every_run_is_a_script_with_a_name_a_colour_and_claims():
    """Methods, baselines (run from baselines/; Clip-Cov is KL-Cov's script with its variant) and ablations; a name
    it does not know is a one-line error naming them."""
    assert set(grid.SCRIPT) == set(grid.ORDER) <= set(grid.NAMES) & set(grid.COLORS)
    assert set(grid.METHODS[1:] + grid.BASELINES) <= {m for m, *_ in grid.CLAIMS}
    assert all((ROOT / script).is_file() for script in grid.SCRIPT.values()), grid.SCRIPT
    assert grid.SCRIPT["clip_cov"] == "baselines/kl_cov.py" and grid.SCRIPT["egpo"] == "egpo.py"
    assert grid.settings("clip_cov", 0, grid.Budget("smollm2", 8))["flags"][len(grid.FLAGS) :][:2] == [
        "--variant",
        "clip_cov",
    ]
    bad = run_cli("scripts/compare_real.py", "--methods", "grpo_base,gpso", "--render_only")
    assert bad.returncode != 0 and "--methods takes" in bad.stderr and "gspo" in bad.stderr.splitlines()[-1]


def test_each_ablation_is_its_method_with_flags_its_script_takes():
    """An ablation runs its method's own script with the idea's flags off: the flags are that script's, they reach
    the stored settings (a run with other flags is not reused), and it is named and coloured after its method."""
    assert set(grid.PART_OFF) | set(grid.STABILISERS) <= set(grid.ABLATIONS)
    for name, (method, flags, _) in grid.ABLATIONS.items():
        assert grid.SCRIPT[name] == grid.SCRIPT[method] and grid.COLORS[name] == grid.COLORS[method]
        assert grid.NAMES[name].startswith(grid.NAMES[method] + ", ")
        source = (ROOT / grid.SCRIPT[method]).read_text()
        assert all(f"    {f[2:]}: " in source for f in flags[::2]), (name, flags)
        stored = grid.settings(name, 0, grid.Budget("smollm2", 8))["flags"]
        assert stored[len(grid.FLAGS) : len(grid.FLAGS) + len(flags)] == flags
    assert {f"{m}-off" for m in grid.METHODS[1:]} <= set(grid.ABLATIONS)  # every method has its whole ablation


def test_each_run_is_evaluated_at_its_own_setting_and_at_those_of_the_methods_that_read_it():
    """A method and its ablations at the method's setting; a baseline at its own and at that of each method whose
    paper compares with it; GRPO at all; greedy takes one sample per problem."""
    es = lambda run, runs: grid.eval_settings(run, runs, grid.Budget())  # noqa: E731
    assert es("edge_grpo", ["grpo_base", "edge_grpo"]) == [(0.1, 1.0)] == es("edge_grpo-gec", [])
    assert es("edge_grpo", ["egpo"]) == [(0.1, 1.0), (0.6, 0.95)]  # EGPO's Table 1 compares with EDGE-GRPO
    assert es("dapo", ["dapo"]) == [(1.0, 0.7)] and es("dapo", ["dapo", "egpo"]) == [(0.6, 0.95), (1.0, 0.7)]
    assert es("clip_cov", ["cw_grpo"]) == [(0.0, 1.0), (0.6, 0.95)] and es("gspo", list(grid.ORDER)) == []
    assert es("grpo_base", ["grpo_base", "cw_grpo-off"]) == [(0.6, 0.95)]
    assert es("grpo_base", list(grid.ORDER)) == [(0.0, 1.0), (0.1, 1.0), (0.6, 0.95), (1.0, 0.7)]
    assert grid.samples_at((0.0, 1.0)) == 1 and grid.samples_at((0.6, 0.95)) == grid.EVAL_N
    assert grid.label((0.1, 1.0)) == "after-T0.1-p1.0" and grid.setting_text((0.0, 1.0)) == "greedy"
    assert grid.setting_text((0.6, 0.95)) == "T = 0.6, top-p 0.95"


@pytest.mark.parametrize("run", sorted(grid.EVAL_SETTINGS))
def test_each_setting_is_the_one_its_page_states_and_says_whose_it_is(run):
    (t, top_p), whose, papers = grid.EVAL_SETTINGS[run]
    text = (DOCS / "algorithms" / f"{grid.VARIANTS.get(run, (run,))[0]}.md").read_text()
    assert f"--temperature {t:g}" in text and (top_p == 1.0 or f"--top_p {top_p}" in text), run
    assert papers == whose.startswith("its paper's"), run  # "the paper's" only where the page sources it there


def test_the_machine_lines_read_the_runs_records():
    rec = {"cpu": "Xeon", "bf16_units": ["avx512_bf16"], "cores": 2, "threads": 2, "load_1min": 1.3}
    rec["precision"] = {"weights": "float32", "autocast": "no", "engine": "float32"}
    infos = {"grpo_base": {0: {"machine": rec}, 1: {"machine": rec | {"load_1min": 3.5}}}, "egpo": {0: {}}}
    lines = details.machine_lines(infos)
    assert lines[0] == (
        "2 runs on Xeon (bf16 units: avx512_bf16), 2 cores, 2 compute threads, float32 weights, no autocast, vLLM "
        "in float32"
    )
    assert "start: 1.3 to 3.5" in lines[1] and lines[2].startswith("1 runs were made before")


def test_a_rerun_says_whether_its_answers_are_the_stored_runs_and_how_far_confidences_moved():
    stored = [{"correct": [1, 0] + [0] * 6, "confidence": [-0.5, -1.25] + [-1.0] * 6}]
    same = [{"correct": [1, 0] + [0] * 6, "confidence": [-0.500012, -1.25] + [-1.0] * 6}]
    assert runs.rerun(stored, same) == "the same answers, right and wrong, in all 8 samples; confidence within 1.2e-05"
    other = [{"correct": [0, 1] + [0] * 6, "confidence": [-0.5, -1.25] + [-1.0] * 6}]
    assert runs.rerun(stored, other).startswith("OTHER answers than the stored run in 2 of 8 samples")


# -- one comparison end to end, on the tiny model -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm
def test_compare_real_end_to_end_on_the_tiny_model_and_resumes(tmp_path, monkeypatch):
    """GRPO, CW-GRPO and the baseline its paper compares with (Clip-Cov), one seed, two steps: the runs, each
    evaluated where it is read (Clip-Cov greedy and at CW-GRPO's setting, GRPO at both), the stored results, the
    page, the figure and the README's block; --render_only gives the same page. A second call keeps what is
    stored: a run lacking an evaluation is evaluated on its kept model (not trained again), one whose evaluation
    is already in its run directory takes it, one whose model is gone is trained again (seeded: the same answers)."""
    out, run_dirs = tmp_path / "docs", tmp_path / "runs"
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{compare.README_BEGIN}\nold\n{compare.README_END}\nrest\n")
    common = ["--model", "tiny", "--steps", "2", "--seeds", "0", "--out", str(out), "--runs_dir", str(run_dirs)]
    common += ["--eval_n", "2"]  # the grid's logic; its sampling is the scripts' and tools.evaluate's own tests'
    common += ["--methods", "grpo_base,cw_grpo,clip_cov", "--regime", "on_policy"]
    first = run_cli("scripts/compare_real.py", *common, "--readme", str(readme), timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    stored = out / page.STORE / "grpo_base-seed0"
    info = json.loads((stored / runs.RUN_FILE).read_text())
    assert info["steps"] == 2 and info["model"] == "tiny" and info["data"] == {"train": 400, "held_out": 100}
    assert info["machine"]["cores"] >= 1 and info["machine"]["precision"]["weights"] == "float32"
    samples = [json.loads(line) for line in (stored / runs.SAMPLES_FILE).read_text().splitlines()]
    trained = [s for s in samples if s["eval"] in ("before", "after")]
    assert len(trained) == 200 and all(len(s["correct"]) == len(s["confidence"]) == 2 for s in trained)
    assert not list((run_dirs / "grpo_base-seed0").glob("checkpoint-*"))  # the model stays, the checkpoint goes
    both = [(0.0, 1.0), (0.6, 0.95)]
    for name, want in (("grpo_base", both), ("cw_grpo", [(0.6, 0.95)]), ("clip_cov", both)):
        info = json.loads((out / page.STORE / f"{name}-seed0" / runs.RUN_FILE).read_text())
        assert sorted(info["evals"]) == sorted(grid.label(s) for s in want), name
    lines = [json.loads(x) for x in (out / page.STORE / "clip_cov-seed0" / runs.SAMPLES_FILE).read_text().splitlines()]
    greedy = [x for x in lines if x["eval"] == grid.label((0.0, 1.0))]
    assert len(greedy) == 100 and all(len(x["correct"]) == 1 for x in greedy)
    text = (out / page.PAGE).read_text()
    assert "| Clip-Cov |" in text and "CW-GRPO against Clip-Cov" in text  # one seed: not compared yet
    assert (out / page.FIGURE).stat().st_size > 10_000
    figs, infos = figures.load(out / page.STORE)
    assert text == page.page(figs, infos, compare.task_text())
    assert readme.read_text().startswith(f"intro\n{compare.README_BEGIN}\n[docs/results_real.md](docs/results_real.md)")

    (out / page.PAGE).unlink()
    shutil.rmtree(run_dirs / "cw_grpo-seed0")  # render_only needs only the stored results
    monkeypatch.setattr("sys.argv", ["compare_real.py", "--render_only", "--out", str(out), "--readme", ""])
    compare.main()  # in this process: the first call above ran it as a user does
    assert (out / page.PAGE).read_text() == text

    def forget(name: str, setting: tuple | None, keep_folder: bool = True) -> None:
        """Takes an evaluation (all when `setting` is None) out of a stored run's run.json."""
        path = out / page.STORE / f"{name}-seed0" / runs.RUN_FILE
        info = json.loads(path.read_text())
        info["evals"] = {} if setting is None else {k: v for k, v in info["evals"].items() if k != grid.label(setting)}
        path.write_text(json.dumps(info))
        if not keep_folder:
            shutil.rmtree(run_dirs / f"{name}-seed0" / "eval-T{}-p{}".format(*setting))

    forget("cw_grpo", None)  # its model is gone: trained again, then evaluated
    forget("grpo_base", (0.6, 0.95), keep_folder=False)  # evaluated again on its kept model
    forget("clip_cov", (0.0, 1.0))  # its evaluation is still in its run directory: taken
    mtime = (stored / runs.METRICS_FILE).stat().st_mtime  # evaluations add to run.json, never to the metrics
    second = run_cli("scripts/compare_real.py", *common, "--readme", "", timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    said = second.stdout
    assert "grpo_base, seed 0: stored in" in said and "skipped" in said
    assert "cw_grpo, seed 0: trained again; its evaluation at T = 1.0: the same answers, right and wrong" in said
    assert said.count("trained again;") == 1  # the others were evaluated: their models are not needed
    assert "grpo_base, seed 0: evaluated at T = 0.6, top-p 0.95: --model" in said
    assert f"clip_cov, seed 0: evaluated at greedy in {run_dirs / 'clip_cov-seed0' / 'eval-T0.0-p1.0'}, taken" in said
    assert (stored / runs.METRICS_FILE).stat().st_mtime == mtime
    figs, infos = figures.load(out / page.STORE)
    assert (out / page.PAGE).read_text() == page.page(figs, infos, compare.task_text())
    for name, want in (("grpo_base", both), ("cw_grpo", [(0.6, 0.95)]), ("clip_cov", both)):
        info = json.loads((out / page.STORE / f"{name}-seed0" / runs.RUN_FILE).read_text())
        assert sorted(info["evals"]) == sorted(grid.label(s) for s in want), name

    argv = ["compare_real.py", *common[:2], "--steps", "3", *common[4:], "--methods", "grpo_base", "--readme", ""]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit, match="--fresh"):  # other settings than the stored runs': refused
        compare.main()


@pytest.mark.slow
@pytest.mark.vllm
def test_the_primary_regime_and_trls_row_end_to_end_on_the_tiny_model(tmp_path):
    """--regime primary: 4 optimiser steps per rollout and 300 held-out sums reach the stored runs; TRL's
    GRPOTrainer runs as a script of the grid, its log holds every figure the page reads, and its evaluation command
    gives GRPO's model the very completions of GRPO's own evaluation (like for like); the page opens with the
    primary table, the grid said under way, and the README keeps the on-policy table until the grid is complete."""
    out, run_dirs, readme = tmp_path / "docs", tmp_path / "runs", tmp_path / "README.md"
    shutil.copytree(STORED, out / page.STORE)  # the page always has the stored first grid
    readme.write_text(f"{compare.README_BEGIN}\n{compare.README_END}\n")
    flags = ["--regime", "primary", "--model", "tiny", "--steps", "2", "--eval_n", "2", "--seeds", "0"]
    flags += ["--methods", "grpo_base,trl", "--out", str(out), "--runs_dir", str(run_dirs), "--readme", str(readme)]
    done = run_cli("scripts/compare_real.py", *flags, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    figs, infos = figures.load(out / page.PRIMARY.store)
    for name in ("grpo_base", "trl"):
        info = infos[name][0]
        assert info["data"]["held_out"] == 300 and info["script_flags"]["num_minibatches"] == 4, name
        assert len(figs[name][0]["pass1_after_problems"]) == 300 and len(figs[name][0]["reward_curve"]) == 2
    assert infos["trl"][0]["script_flags"]["trl"] == "1.16.0"
    ours = [json.loads(x) for x in (run_dirs / "grpo_base-seed0" / RECORDS_FILE).read_text().splitlines()]
    data = run_dirs / "data"
    cmd = trl_grpo.eval_command(
        run_dirs / "grpo_base-seed0" / "model", run_dirs / "check", data / "sums_train.jsonl",
        f"sums={data / 'sums_eval.jsonl'}", 0, 2, 32,
    )  # fmt: skip
    assert subprocess.run(cmd, cwd=ROOT, env=user_env(), capture_output=True, timeout=600).returncode == 0
    again = [json.loads(x) for x in (run_dirs / "check" / RECORDS_FILE).read_text().splitlines()]
    assert [r["completions"] for r in again] == [r["completions"] for r in ours]
    text = (out / page.PAGE).read_text()
    assert text.index("(the primary regime)") < text.index("(the on-policy regime)")
    assert "2 of its 130 runs stored so far" in text and "| TRL's GRPOTrainer | T = 1.0 | 1 |" in text
    assert "the primary regime's grid (4 steps per rollout) is under way" in readme.read_text()


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="no vllm")
def test_settings_evaluated_in_one_process_draw_what_their_own_processes_draw(tiny_random_dir, tmp_path, monkeypatch):
    """scripts/comparison/evaluate_settings.py: a setting evaluated on the engine that sampled another setting
    first, after another model's engine came and went in the same process (one engine made per model), gets the
    samples its own process gives it (each problem's seed is --seed and its place)."""
    import common.rollout
    from scripts.comparison import evaluate_settings

    made, make = [], common.rollout.make_engine
    monkeypatch.setattr(common.rollout, "make_engine", lambda *a, **k: made.append(a[1]) or make(*a, **k))

    def line(setting: tuple, folder: str, model: Path = tiny_random_dir) -> list[str]:
        flags = ["--model", str(model), "--limit", "6", "--n", "4", "--max_tokens", "12", "--seed", "3"]
        return ["--", *flags, "--temperature", str(setting[0]), "--top_p", str(setting[1]), "--output_dir", folder]

    alone, after = str(tmp_path / "alone"), str(tmp_path / "after")
    evaluate_settings.main(line((0.6, 0.95), alone))
    other = line((1.0, 1.0), str(tmp_path / "other"), SHIPPED_DIR)  # another model's engine first, then closed
    evaluate_settings.main(other + line((1.0, 1.0), str(tmp_path / "first")) + line((0.6, 0.95), after))
    records = [(Path(d) / RECORDS_FILE).read_text().splitlines() for d in (alone, after)]
    assert records[0] == records[1] and len(records[0]) == 6
    assert made == [str(tiny_random_dir), str(SHIPPED_DIR), str(tiny_random_dir)]
    with pytest.raises(SystemExit, match="usage"):
        evaluate_settings.main(["--model", "x"])


@pytest.mark.parametrize(
    "a, b, reads",
    [
        ("edge_grpo-off", "grpo_base", "the rest of its settings"),
        ("cw_grpo", "clip_cov", "its paper's baseline"),
        ("edge_grpo", "edge_grpo-bound", "the stabiliser"),  # was read as "the part turned off"
        ("edge_grpo-gec", "edge_grpo-off", "the part left on"),
        ("pro_grpo", "pro_grpo-off", "the idea"),
        ("edge_grpo", "edge_grpo-eda", "the part turned off"),
    ],
)
def test_each_comparison_says_what_it_reads(a, b, reads):
    assert page.what_it_reads(a, b) == reads
