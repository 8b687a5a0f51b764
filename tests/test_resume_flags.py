"""`--resume` reads the run's flags from its run_config.json: no flag the run recorded is silently reset to its
default, and none has to be given again (issue 40, item 8). A table over every flag of every script: a resume with
no flags reproduces the recorded values, a changed resumable flag is taken, a changed non-resumable one refused,
naming it. Parsing only (no model loads); tests/test_checkpoint.py resumes a real run with no flags."""

import dataclasses
import importlib
import json
import subprocess
import sys
import typing

import pytest
from train_utils import BASELINES, ROOT, SCRIPTS, user_env

from common.cli import check_range, flag_record, is_resumable, parse_args
from common.run_dir import CONFIG, start_run_dir
from common.run_flags import RunFlags


def classes_of(script: str) -> tuple[type, type]:
    return importlib.import_module(script.removesuffix(".py").replace("/", ".")).Args, RunFlags


def other_value(cls: type, f: dataclasses.Field, current):
    """A value of field `f` other than `current`, within its choices and range."""
    kind = typing.get_type_hints(cls)[f.name]
    kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
    if kind is bool:
        return not current
    if choices := f.metadata.get("choices"):
        return next(c for c in choices if c != current)
    if kind is str:
        return f"{current or 'x'}-other"
    base = current if current is not None else 1
    tries = [base + 1, base + 2, base - 1, 1, 2] if kind is int else [base * 2, base + 0.5, base / 2, 0.5, 0.25, 0.9]
    return next(v for v in tries if v != current and check_range(f, v) is None)


def as_text(value) -> str:
    """A value as the command line gives it."""
    return (
        {True: "true", False: "false", None: "none"}.get(value, str(value))
        if not isinstance(value, float)
        else str(value)
    )


def recorded_run(tmp_path, script: str) -> tuple[dict, object]:
    """A run directory whose run_config.json records a value other than the default for every flag of `script`
    (as `start_run_dir` writes it), and that record."""
    classes = classes_of(script)
    values = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            values[f.name] = f.default if f.name in RunFlags.START_FLAGS else other_value(cls, f, f.default)
    start_run_dir(tmp_path, values, resumed=False, overwrite=False, launch={"script": script.removesuffix(".py")})
    return json.loads((tmp_path / CONFIG).read_text())["flags"], classes


def resume(classes, run_dir, *flags: str) -> dict:
    return flag_record(*parse_args(*classes, argv=["--output_dir", str(run_dir), "--resume", *flags]))[0]


@pytest.mark.parametrize("script", [*SCRIPTS, *BASELINES])
def test_a_resume_with_no_flags_goes_on_as_the_run_was(script, tmp_path, capsys):
    """Before: every flag not given again took its default; the non-resumable ones were then refused (all of them
    had to be typed again), the resumable ones (learning rate, saving, evaluation, systems) reset silently."""
    recorded, classes = recorded_run(tmp_path, script)
    got = resume(classes, tmp_path)
    differ = {k: (v, got[k]) for k, v in recorded.items() if k not in RunFlags.START_FLAGS and got[k] != v}
    assert not differ, f"{script}: resumed values differ from the record (recorded, resumed): {differ}"
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("--resume:")]
    assert line == f"--resume: the run's flags from {tmp_path / CONFIG}"


@pytest.mark.parametrize("script", [*SCRIPTS, *BASELINES])
def test_each_flag_changed_on_resume_is_taken_or_refused_by_its_declaration(script, tmp_path, capsys):
    """Each flag in turn given another value: a resumable one is taken and said, a non-resumable one refused in one
    line naming it."""
    recorded, classes = recorded_run(tmp_path, script)
    wrong = []
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.name in RunFlags.START_FLAGS:
                continue
            new = other_value(cls, f, recorded[f.name])
            argv = (f"--{f.name}", as_text(new))
            capsys.readouterr()
            if is_resumable(cls, f):
                got = resume(classes, tmp_path, *argv)
                said = capsys.readouterr().out
                if got[f.name] != new or f"--{f.name} {recorded[f.name]!r} -> {new!r}" not in said:
                    wrong.append(f"--{f.name} {new!r} (resumable): got {got[f.name]!r}; said {said.strip()!r}")
                continue
            with pytest.raises(SystemExit) as refused:
                resume(classes, tmp_path, *argv)
            message = str(refused.value)
            if not (message.startswith("error: --resume:") and f"--{f.name} {recorded[f.name]!r} -> " in message):
                wrong.append(f"--{f.name} {new!r} (not resumable): {message!r}")
    assert not wrong, f"{script}:\n" + "\n".join(wrong)


def test_steps_given_on_resume_drops_the_recorded_epochs(tmp_path, capsys):
    """--steps and --epochs set the same thing: a recorded --epochs would otherwise win over the --steps given."""
    classes = classes_of("grpo_base.py")
    values = flag_record(*parse_args(*classes, argv=["--epochs", "2"]))[0]
    start_run_dir(tmp_path, values, resumed=False, overwrite=False)
    got = resume(classes, tmp_path, "--steps", "50")
    assert got["steps"] == 50 and got["epochs"] is None
    assert "--epochs 2.0 -> None" in capsys.readouterr().out


def test_a_record_from_another_version_is_said_or_refused(tmp_path, capsys):
    """A flag the record lacks (new since the run started) takes its default, or the value given, said; a recorded
    flag this version lacks is named; a recorded choice it no longer takes is refused."""
    classes = classes_of("grpo_base.py")
    values = flag_record(*parse_args(*classes, argv=[]))[0]
    old = {k: v for k, v in values.items() if k != "group_size"} | {"retired_flag": 1}
    start_run_dir(tmp_path, old, resumed=False, overwrite=False)
    assert resume(classes, tmp_path)["group_size"] == values["group_size"]
    assert "recorded but not flags of this script, left out: retired_flag" in capsys.readouterr().out
    assert resume(classes, tmp_path, "--group_size", "4")["group_size"] == 4
    assert "not in the record, taken as given: --group_size;" in capsys.readouterr().out
    config = json.loads((tmp_path / CONFIG).read_text())
    config["flags"]["loss_agg"] = "retired-aggregation"
    (tmp_path / CONFIG).write_text(json.dumps(config))
    with pytest.raises(SystemExit, match=r"records --loss_agg 'retired-aggregation', which this version does not"):
        resume(classes, tmp_path)
    (tmp_path / CONFIG).write_text('{"flags": ')
    with pytest.raises(SystemExit, match=r"^error: --resume: .*run_config.json is unreadable .*--overwrite$"):
        resume(classes, tmp_path)


def test_a_resume_by_another_script_is_refused_before_anything_loads(tmp_path):
    """The script is checked as the flags are read: egpo.py on a grpo_base run names the script that started it."""
    values = flag_record(*parse_args(*classes_of("grpo_base.py"), argv=[]))[0]
    start_run_dir(tmp_path, values, resumed=False, overwrite=False, launch={"script": "grpo_base"})
    proc = subprocess.run(
        [sys.executable, str(ROOT / "egpo.py"), "--output_dir", str(tmp_path), "--resume"],
        cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"error: --resume: {tmp_path} is a run of grpo_base.py, not egpo.py; resume it with python grpo_base.py "
        f"--resume --output_dir {tmp_path}, or start egpo.py in another --output_dir"
    )


def test_a_recorded_vllm_rollout_where_vllm_is_missing_is_one_line(monkeypatch):
    """A run recorded on a machine with vLLM, resumed on one without: --rollout vllm comes from the record, and
    used to end in a ModuleNotFoundError traceback from inside the engine. Now validate names the fix."""
    import common.run_flags

    monkeypatch.setattr(common.run_flags, "vllm_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^error: --rollout vllm: vLLM is not installed here .* --rollout hf"):
        RunFlags(rollout="vllm").validate()
    RunFlags(rollout="hf").validate()
