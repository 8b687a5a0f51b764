"""tools.evaluate's output folders (issue 40, item 8: `--n 2` on one's own benchmark and `--n 2` on the default both
wrote eval-n2/). The table: evaluations that differ in any setting (benchmarks, n, temperature, top_p, max_tokens,
limit, seed, template, k, ...) never share a folder, for a training run, its checkpoint and a plain model; the same
settings reuse theirs; a folder holding an evaluation made with other settings is refused before anything loads."""

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

import tools.evaluate as tool
from common.evaluation import RESULTS_FILE, write_results
from common.run_dir import write_jsonl

# Each setting's default first, then other values; some chosen to collide once made into a name (a dash, a comma,
# a path, a long list cut short).
VALUES = {
    "limit": [None, 10, 2],
    "n": [8, 2, 4],
    "max_tokens": [4096, 8],
    "temperature": [0.6, 1.0, 0.0, 1e-05],
    "top_p": [1.0, 0.95],
    "seed": [0, 3],
    "k": [None, "1,4", "1,2", "1_4"],
    "benchmarks": [
        "synthetic", "math500", "math500,aime24", "aime24,math500", "mine=a.jsonl", "mine=b.jsonl", "my-n2", "my",
        "mine=a.jsonl:problem=q:answer=a", "math500,aime24,aime25,amc23,amc,minerva,olympiadbench,gsm8k",
        "math500,aime24,aime25,amc23,amc,minerva,olympiadbench,gsm8k,synthetic",
    ],
    "data_dir": [None, "d1", "d2"],
    "problem_field": [None, "q", "question"],
    "answer_field": [None, "gold"],
    "few_shot_dataset": [None, "x.jsonl", "y.jsonl"],
    "template": ["qwen_math", "r1", "plain", "Q: {problem}\nA:", "Q: {problem}\nA: "],
    "few_shot": [0, 2],
    "stop": [None, "\\nEnd", "\\nQ", "_nEnd"],
}  # fmt: skip
RUN_RECORDED = {"template": "plain", "few_shot": 2, "stop": "\\nEnd"}


def cases() -> list[dict]:
    """The default; every single change; every pair of changes to two settings (their first other values)."""
    singles = [{k: v} for k, values in VALUES.items() for v in values[1:]]
    pairs = [{a: VALUES[a][1], b: VALUES[b][1]} for a, b in itertools.combinations(VALUES, 2)]
    return [{}, *singles, *pairs, {"benchmarks": "my", "n": 2}, {"template": "plain", "n": 2}]


def folder(context: str, tmp: Path, changes: dict) -> tuple[Path, dict]:
    """(the folder tools.evaluate picks, the settings it records) for `changes` given on the command line."""
    run = tmp / "run"
    model = {"run": str(run / "model"), "checkpoint": str(run / "checkpoint-4" / "model"), "model": "org/model"}
    flags = RUN_RECORDED if context != "model" else {}
    if flags:
        run.mkdir(exist_ok=True)
        (run / "run_config.json").write_text(json.dumps({"flags": flags}))
    args = dataclasses.replace(tool.Args(), **changes)
    args, overridden, _ = tool.follow_run(args, flags, given=set(changes))
    out, _ = tool.folder_for(args, overridden, model[context], run if flags else None)
    return out, tool.settings_of(args)


@pytest.mark.parametrize("context", ["run", "checkpoint", "model"])
def test_different_settings_never_share_a_folder(context, tmp_path):
    owner: dict[Path, dict] = {}
    for changes in cases():
        out, settings = folder(context, tmp_path, changes)
        assert owner.setdefault(out, settings) == settings, f"{out}: {owner[out]} and {settings}"
        assert folder(context, tmp_path, changes)[0] == out  # the same settings: the same folder
    names = {out.name for out in owner}
    assert all(len(name) <= 100 for name in names)
    if context == "run":  # the run's own settings given again are its own evaluation
        assert folder(context, tmp_path, RUN_RECORDED)[0] == folder(context, tmp_path, {})[0] == tmp_path / "run"


def test_the_users_two_quick_checks(tmp_path):
    """--n 2 on one's own benchmark, then --n 2 on the default: two folders, each named by what sets it apart."""
    mine, _ = folder("run", tmp_path, {"n": 2, "benchmarks": "mine=my.jsonl:problem=question:answer=gold"})
    default, _ = folder("run", tmp_path, {"n": 2})
    assert default == tmp_path / "run" / "eval-n2"
    assert mine != default and mine.name.startswith("eval-n2-benchmarks-mine-")


def test_a_folder_of_another_evaluation_is_refused_and_the_same_settings_reuse_it(tmp_path):
    settings = tool.settings_of(tool.Args())
    write_results(tmp_path, {}, [], {"settings": settings})
    tool.check_folder(tmp_path, settings)  # the same evaluation again: in place
    with pytest.raises(SystemExit) as e:
        tool.check_folder(tmp_path, settings | {"n": 2, "benchmarks": "math500"})
    message = str(e.value)
    assert message.startswith(f"error: --output_dir: {tmp_path} holds an evaluation made with other settings")
    assert "--n 8 there, 2 here" in message and "--benchmarks 'synthetic' there, 'math500' here" in message
    assert "--output_dir sets the folder" in message and "\n" not in message
    # An evaluation written before settings were recorded: its flags are its settings.
    write_results(tmp_path, {}, [], tool.dataclasses.asdict(tool.Args()))
    with pytest.raises(SystemExit, match="--temperature 0.6 there, 1.0 here"):
        tool.check_folder(tmp_path, settings | {"temperature": 1.0})
    # A training run's own evaluation (the run directory's): the tool's default evaluation replaces it, as documented.
    write_results(tmp_path, {}, [], {"step": 30, "benchmarks": "synthetic"})
    tool.check_folder(tmp_path, settings | {"n": 2})


def test_end_to_end_two_settings_two_folders_and_a_refusal(tmp_path, monkeypatch, capsys):
    """The user's commands on the demo model (HF engine): two quick checks land apart; a third sent with
    --output_dir into the first with other settings stops before the model loads."""
    monkeypatch.chdir(tmp_path)
    write_jsonl([{"question": f"What is {a} + 1?", "gold": str(a + 1)} for a in range(3)], tmp_path / "my.jsonl")
    common = dict(model="tiny", rollout="hf", limit=2, max_tokens=4, n=2, dtype="float32")
    mine = "mine=my.jsonl:problem=question:answer=gold"
    tool.main(dataclasses.replace(tool.Args(), benchmarks=mine, **common), None)
    tool.main(dataclasses.replace(tool.Args(), **common), None)
    made = sorted(p.parent for p in (tmp_path / "runs" / "eval").rglob(RESULTS_FILE))
    assert len(made) == 2, made
    first = next(p for p in made if "mine" in p.name)
    assert json.loads((first / RESULTS_FILE).read_text())["config"]["settings"]["benchmarks"] == mine
    capsys.readouterr()
    with pytest.raises(SystemExit, match=r"--output_dir: .* holds an evaluation made with other settings"):
        tool.main(dataclasses.replace(tool.Args(), output_dir=str(first), **common), None)
    assert "evaluating" in capsys.readouterr().out and not list(first.glob("*.tmp"))
