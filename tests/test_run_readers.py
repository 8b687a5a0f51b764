"""What reads a run directory follows the flags the run recorded (issue 33, item 1 and its class).

The table: every reader of a run directory (tools.evaluate's settings and its output folder,
tools.plot's table, --resume, the few-shot examples) against each recorded flag that changes
prompts or scoring. `test_every_shared_flag_is_classified` finds new members of the class: a flag
tools.evaluate shares with the training scripts must be followed from the run or named as the
evaluation's own choice.
"""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import grpo_base
import tools.evaluate as tool
import tools.plot as plot
from common.checkpoint import write_manifest
from common.cli import flag_record
from common.run_dir import check_run_dir, write_jsonl
from common.run_flags import RunFlags

# What a run recorded (run_config.json "flags"), and another value of each, for the table.
RECORDED = {"template": "plain", "few_shot": 2, "stop": "\\nEnd"}
OTHER = {"template": "qwen_math", "few_shot": 0, "stop": "\\nQuestion:"}


def training_flags(**changes) -> tuple[dict, set[str]]:
    return flag_record(dataclasses.replace(grpo_base.Args(), **changes), RunFlags())


def test_every_shared_flag_is_classified():
    """A flag of tools.evaluate named as a training flag is either followed from the run (FROM_RUN) or
    the evaluation's own choice (EVALUATION_OWN, with its reason): nothing falls between."""
    training = {f.name for f in dataclasses.fields(grpo_base.Args)} | {f.name for f in dataclasses.fields(RunFlags)}
    shared = {f.name for f in dataclasses.fields(tool.Args)} & training
    assert shared == set(tool.FROM_RUN) | set(tool.EVALUATION_OWN)
    assert not set(tool.FROM_RUN) & set(tool.EVALUATION_OWN)
    assert set(tool.FROM_RUN.values()) <= training


@pytest.mark.parametrize("flag", sorted(RECORDED))
def test_evaluate_follows_the_recorded_flag(flag):
    args, overridden, lines = tool.follow_run(tool.Args(), {**training_flags()[0], **RECORDED}, given=set())
    assert getattr(args, flag) == RECORDED[flag] and not overridden
    assert f"--{flag}" in lines[0] and "run_config.json" in lines[0]
    assert tool.check_tag(args, overridden) == ""  # the run's own evaluation: it goes in the run directory


@pytest.mark.parametrize("flag", sorted(RECORDED))
def test_evaluate_a_given_flag_overrides_says_so_and_is_a_check(flag):
    args = dataclasses.replace(tool.Args(), **{flag: OTHER[flag]})
    args, overridden, lines = tool.follow_run(args, RECORDED, given={flag})
    assert getattr(args, flag) == OTHER[flag]
    assert overridden == {flag: (RECORDED[flag], OTHER[flag])}
    assert any(line.startswith(f"--{flag} ") and "over the run's" in line for line in lines)
    tag = tool.check_tag(args, overridden)
    assert tag.startswith(flag)  # its own folder: not the run's evaluation
    run = Path("runs/r")
    assert tool.output_dir(args, "runs/r/model", run, tag) == run / f"eval-{tag}"


@pytest.mark.parametrize("flag", [*sorted(RECORDED), "dataset", "seed", "rewards"])
def test_resume_refuses_a_change_to_the_recorded_flag(tmp_path, flag):
    values, resumable = training_flags(**{k: v for k, v in RECORDED.items() if k != "stop"})
    values["stop"] = RECORDED["stop"]
    (tmp_path / "run_config.json").write_text(json.dumps({"flags": values, "history": []}))
    changed = {"dataset": "other.jsonl", "seed": 7, "rewards": "dapo"}.get(flag, OTHER.get(flag))
    assert flag not in resumable
    with pytest.raises(SystemExit, match=f"--{flag} "):
        check_run_dir(tmp_path, values | {flag: changed}, resumable, resume=True, overwrite=False)


def test_the_few_shot_examples_follow_the_runs_dataset_and_seed(tmp_path):
    rows = [{"problem": f"{a} + 1?", "answer": str(a + 1), "solution": f"\\boxed{{{a + 1}}}"} for a in range(20)]
    write_jsonl(rows, tmp_path / "train.jsonl")
    run = tmp_path / "run"
    run.mkdir()
    flags = {"dataset": str(tmp_path / "train.jsonl"), "seed": 5, "few_shot": 2}
    (run / "run_config.json").write_text(json.dumps({"flags": flags}))
    from common.prompts import few_shot_pool

    pool = tool.few_shot_pool_for(dataclasses.replace(tool.Args(), few_shot=2), run)
    assert pool == few_shot_pool(rows, 2, 5)


def test_the_few_shot_examples_follow_the_runs_columns_and_bad_rows(tmp_path):
    """A run trained on its own columns (--problem_field q --answer_field gold --solution_field worked), some rows
    without a usable answer dropped (--bad_rows drop): the evaluation draws its examples from the same rows."""
    from common.math_data import load_prompts
    from common.prompts import pool_of

    rows = [{"q": f"{a} + 1?", "gold": None if a % 3 == 0 else str(a + 1), "worked": f"so {a + 1}"} for a in range(30)]
    write_jsonl(rows, tmp_path / "mine.jsonl")
    flags = {"dataset": str(tmp_path / "mine.jsonl"), "seed": 4, "few_shot": 2, "problem_field": "q"}
    flags |= {"answer_field": "gold", "solution_field": "worked"}
    run = tmp_path / "run"
    run.mkdir()
    (run / "run_config.json").write_text(json.dumps({"flags": flags}))

    class Tok:  # load_prompts tokenises; one id per character is enough here
        def __call__(self, text, add_special_tokens=False):
            return type("T", (), {"input_ids": [ord(c) for c in text]})()

    trained, _ = load_prompts(flags["dataset"], Tok(), "plain", 10_000, problem_field="q", answer_field="gold",
                              solution_field="worked", bad_rows="drop", say=lambda _: None, few_shot=2, seed=4)  # fmt: skip
    pool = tool.few_shot_pool_for(dataclasses.replace(tool.Args(), few_shot=2), run)
    assert [(r["problem"], r["solution"]) for r in pool] == [(r["problem"], r["solution"]) for r in pool_of(trained, 2)]


def test_a_dapo_run_is_noted():
    _, _, lines = tool.follow_run(tool.Args(), {"rewards": "dapo"}, given=set())
    assert any("DAPO" in line and "boxed" in line for line in lines)


@pytest.mark.parametrize(
    "changes, tag",
    [
        ({}, ""),
        ({"limit": 10, "n": 2, "max_tokens": 8}, "limit10-n2-max_tokens8"),
        ({"temperature": 0.0}, "temperature0.0"),
        ({"k": "1,4"}, "k1_4"),
    ],
)
def test_a_quick_check_gets_its_own_folder(changes, tag):
    args = dataclasses.replace(tool.Args(), **changes)
    assert tool.check_tag(args, {}) == tag
    run = Path("runs/r")
    assert tool.output_dir(args, "runs/r/model", run, tag) == (run / f"eval-{tag}" if tag else run)
    ckpt = "runs/r/checkpoint-4/model"
    assert tool.output_dir(args, ckpt, run, tag) == run / ("eval-checkpoint-4" + (f"-{tag}" if tag else ""))


def test_end_to_end_a_quick_check_follows_the_run_and_leaves_its_evaluation(tiny_random_dir, tmp_path, capsys):
    """Issue 33 items 1 and 2 as reported: a run trained with few-shot under `plain`, evaluated with
    --limit / --n / --max_tokens: the run's template, few-shot and stop are used, and the run's own
    eval_results.json (what tools.plot --table reads) is left as it was."""
    rows = [{"problem": f"What is {a} + 1?", "answer": str(a + 1), "solution": f"\\boxed{{{a + 1}}}"} for a in range(6)]
    write_jsonl(rows, tmp_path / "train.jsonl")
    run = tmp_path / "run"
    shutil.copytree(tiny_random_dir, run / "model")
    write_manifest(run / "model")
    flags = training_flags(dataset=str(tmp_path / "train.jsonl"), template="plain", few_shot=2, seed=1)[0]
    (run / "run_config.json").write_text(json.dumps({"flags": flags | {"stop": "\\nEnd"}, "history": []}))
    (run / "metrics.jsonl").write_text('{"step": 1, "train/reward": 0.5}\n')
    own = {"summary": {"eval/synthetic/pass@1": 0.41}, "config": {"step": 30}}
    (run / "eval_results.json").write_text(json.dumps(own))

    tool.main(
        dataclasses.replace(
            tool.Args(), model=str(run), limit=2, n=2, max_tokens=8, temperature=1.0, rollout="hf", dtype="float32"
        ),
        None,
        given={"model", "limit", "n", "max_tokens", "temperature", "rollout", "dtype"},
    )
    printed = capsys.readouterr().out
    assert "settings from the run's run_config.json: --template 'plain' --few_shot 2 --stop '\\\\nEnd'" in printed
    assert "stop strings: '\\nQuestion:', implied by --few_shot 2 under --template plain" in printed
    check = run / "eval-limit2-n2-max_tokens8-temperature1.0"
    assert f"its results are in {check}, not over the run's own evaluation" in printed
    config = json.loads((check / "eval_results.json").read_text())["config"]
    assert (config["template"], config["few_shot"], config["stop_strings"]) == ("plain", 2, ["\nEnd", "\nQuestion:"])
    assert json.loads((run / "eval_results.json").read_text()) == own
    assert plot.read_eval(run)[0] == own["summary"]


def test_a_run_whose_template_the_evaluation_cannot_read_is_refused(tiny_random_dir, tmp_path):
    """Following the run's template must not score a run trained on "Answer:" lines with the \\boxed{} reader
    (every answer wrong): refused in one line, before the engine starts."""
    run = tmp_path / "run"
    shutil.copytree(tiny_random_dir, run / "model")
    write_manifest(run / "model")
    answer_line = "Solve it. The last line of your response is Answer: X.\n{problem}"
    (run / "run_config.json").write_text(json.dumps({"flags": {"template": answer_line, "rewards": "dapo"}}))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    args = dataclasses.replace(tool.Args(), model=str(run), limit=1, n=1, rollout="hf")
    with pytest.raises(SystemExit, match=r"this evaluation reads \\boxed\{\}, but the prompt .* asks for an 'Answer"):
        tool.main(args, None, given={"model", "limit", "n", "rollout"})
