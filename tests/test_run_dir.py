"""common/run_dir.py: one run per --output_dir, a resume that cannot silently change what is trained."""

import json

import pytest

import grpo_base
from common.run_dir import CONFIG, check_run_dir, start_run_dir

FLAGS = {"dataset": "a.jsonl", "lr": 1e-6, "steps": 10, "output_dir": "x"}


def test_a_fresh_run_refuses_a_directory_holding_a_run(tmp_path):
    check_run_dir(str(tmp_path / "new"), FLAGS, resume=False, overwrite=False)  # nothing there: fine
    (tmp_path / "unrelated.txt").write_text("x")
    check_run_dir(str(tmp_path), FLAGS, resume=False, overwrite=False)  # no run there: fine
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "checkpoint-6").mkdir()
    with pytest.raises(
        SystemExit, match=r"already holds a run \(checkpoint-6, metrics.jsonl\); pass --resume .* --overwrite"
    ):
        check_run_dir(str(tmp_path), FLAGS, resume=False, overwrite=False)
    check_run_dir(str(tmp_path), FLAGS, resume=False, overwrite=True)


def test_overwrite_leaves_nothing_of_the_old_run(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "checkpoint-6" / "model").mkdir(parents=True)
    (tmp_path / "checkpoint-8.tmp").mkdir()
    (tmp_path / "notes.txt").write_text("the user's own file stays")
    start_run_dir(str(tmp_path), FLAGS, resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CONFIG, "notes.txt"])
    saved = json.loads((tmp_path / CONFIG).read_text())
    assert saved["flags"] == FLAGS and [h["event"] for h in saved["history"]] == ["start"]


def test_a_resume_keeps_the_history_and_refuses_changes_to_what_is_trained(tmp_path):
    start_run_dir(str(tmp_path), FLAGS, resume=False, overwrite=False)
    longer = FLAGS | {"steps": 20, "output_dir": "y"}  # how long, where: may change
    check_run_dir(str(tmp_path), longer, resume=True, overwrite=False)
    start_run_dir(str(tmp_path), longer, resume=True, overwrite=False)
    history = json.loads((tmp_path / CONFIG).read_text())["history"]
    assert [h["event"] for h in history] == ["start", "resume"] and history[1]["changed"] == {
        "steps": 20,
        "output_dir": "y",
    }
    other_data = FLAGS | {"dataset": "b.jsonl", "lr": 2e-6}
    with pytest.raises(SystemExit, match=r"other settings \(--dataset 'a.jsonl' -> 'b.jsonl'; --lr 1e-06 -> 2e-06\)"):
        check_run_dir(str(tmp_path), other_data, resume=True, overwrite=False)
    with pytest.raises(SystemExit, match="holds no run"):
        check_run_dir(str(tmp_path / "empty"), FLAGS, resume=True, overwrite=False)


def test_bad_output_dirs_are_refused_before_anything_loads(tmp_path):
    (tmp_path / "file").write_text("x")
    args = grpo_base.Args(model="no/such/model", output_dir=str(tmp_path / "file"), rollout="hf")
    with pytest.raises(SystemExit, match="--output_dir: .* is a file"):
        grpo_base.main(args)  # before the (missing) model is looked for
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not __import__("os").access(locked, __import__("os").W_OK):  # root may write anyway
        with pytest.raises(SystemExit, match="not writable"):
            grpo_base.main(grpo_base.Args(model="no/such/model", output_dir=str(locked / "run"), rollout="hf"))
