"""common/run_dir.py: one run per --output_dir, locked while it runs; a resume cannot silently change what is trained."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from train_utils import ROOT, run_cli, script_flags

import grpo_base
from common.run_dir import CONFIG, LOCK, RunLock, check_run_dir, check_writable, start_run_dir

FLAGS = {"dataset": "a.jsonl", "lr": 1e-6, "steps": 10, "output_dir": "x"}
RESUMABLE = {"lr", "steps", "output_dir"}


def test_a_fresh_run_refuses_a_directory_holding_a_run_with_a_checkpoint(tmp_path):
    check_run_dir(tmp_path / "new", FLAGS, RESUMABLE, resume=False, overwrite=False)  # nothing there: fine
    (tmp_path / "unrelated.txt").write_text("x")
    check_run_dir(tmp_path, FLAGS, RESUMABLE, resume=False, overwrite=False)  # no run there: fine
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    check_run_dir(tmp_path, FLAGS, RESUMABLE, resume=False, overwrite=False)  # a run that never saved: restartable
    (tmp_path / "model").mkdir()  # ... one that finished and exported its model is not
    with pytest.raises(SystemExit, match=r"already holds a run \(metrics.jsonl, model\); pass --resume .* --overwrite"):
        check_run_dir(tmp_path, FLAGS, RESUMABLE, resume=False, overwrite=False)
    check_run_dir(tmp_path, FLAGS, RESUMABLE, resume=False, overwrite=True)


def test_overwrite_leaves_nothing_of_the_old_run(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "checkpoint-6" / "model").mkdir(parents=True)
    (tmp_path / "checkpoint-8.tmp").mkdir()
    (tmp_path / "eval_results.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("the user's own file stays")
    start_run_dir(tmp_path, FLAGS, resumed=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CONFIG, "notes.txt"])
    saved = json.loads((tmp_path / CONFIG).read_text())
    assert saved["flags"] == FLAGS and [h["event"] for h in saved["history"]] == ["start"]


def test_a_resume_keeps_the_history_and_refuses_changes_to_what_is_trained(tmp_path):
    start_run_dir(tmp_path, FLAGS, resumed=False, overwrite=False)
    lower = FLAGS | {"steps": 20, "lr": 1e-7, "output_dir": "y"}  # how long, how fast, where: may change
    check_run_dir(tmp_path, lower, RESUMABLE, resume=True, overwrite=False)
    start_run_dir(tmp_path, lower, resumed=True, overwrite=False)
    saved = json.loads((tmp_path / CONFIG).read_text())
    assert [h["event"] for h in saved["history"]] == ["start", "resume"]
    assert saved["history"][1]["changed"] == {"steps": 20, "lr": 1e-7, "output_dir": "y"}
    assert saved["flags"]["lr"] == 1e-7  # the values in force now
    other_data = FLAGS | {"dataset": "b.jsonl"}
    with pytest.raises(SystemExit, match=r"other settings \(--dataset 'a.jsonl' -> 'b.jsonl'\)"):
        check_run_dir(tmp_path, other_data, RESUMABLE, resume=True, overwrite=False)


def test_the_scripts_resumable_flags_are_declared_where_the_flags_are():
    """What --resume may change comes from the flags' own declarations: the learning rate and its schedule,
    clipping, the run's length and every RunFlags flag but the data columns and precision."""
    from common.cli import flag_record

    _, resumable = flag_record(*script_flags("grpo_base.py"))
    assert {
        "lr",
        "lr_schedule",
        "warmup_steps",
        "grad_clip",
        "steps",
        "epochs",
        "save_steps",
        "eval_steps",
    } <= resumable
    assert not {"dataset", "model", "group_size", "temperature", "loss_agg", "answer_field", "precision"} & resumable


def test_bad_output_dirs_are_refused_before_anything_loads(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit, match="--output_dir: .* is a file"):
        grpo_base.main(*script_flags("grpo_base.py", model="no/such/model", output_dir=str(tmp_path / "file")))
    with pytest.raises(SystemExit, match=r"--output_dir: .*file/run cannot be created: .*file is a file, not a dir"):
        grpo_base.main(*script_flags("grpo_base.py", model="no/such/model", output_dir=str(tmp_path / "file" / "run")))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # root may write anyway
        with pytest.raises(SystemExit, match=r"run cannot be created in .*locked \(Permission denied\)"):
            grpo_base.main(*script_flags("grpo_base.py", model="no/such/model", output_dir=str(locked / "run")))


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_directory_that_cannot_be_created_is_one_line_even_for_root(tmp_path):
    """/proc accepts no directory, whoever asks: the check tries, it does not trust permission bits."""
    with pytest.raises(SystemExit, match=r"^error: --output_dir: /proc/myrun cannot be created in /proc \("):
        check_writable("/proc/myrun")
    with pytest.raises(SystemExit, match="cannot be created"):
        RunLock(Path("/proc/myrun")).acquire()


HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from common.run_dir import RunLock
RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def hold_lock(run_dir):
    """A second real process that holds the run directory's lock, as a live run does."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(root=str(ROOT)), str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_live_run_locks_its_directory_against_any_second_run(tiny_random_dir, tmp_path):
    """Before: a second run with --overwrite deleted a live run's directory and both said done."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    holder = hold_lock(run)
    try:
        for flags in ([], ["--overwrite"], ["--resume"]):
            proc = run_cli(
                "grpo_base.py", "--model", str(tiny_random_dir), "--output_dir", str(run), *flags, timeout=120
            )
            assert proc.returncode != 0, flags
            assert f"is in use by another run (pid {holder.pid} on" in proc.stderr, proc.stderr[-1000:]
            assert "Traceback" not in proc.stderr
        assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_runs_lock_is_taken_over_with_a_line(tmp_path, capsys):
    holder = hold_lock(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)  # kill -9: no chance to release it
    holder.wait()
    assert (tmp_path / LOCK).exists()
    lock = RunLock(tmp_path)
    lock.acquire()
    out = capsys.readouterr().out
    assert f"locked by pid {holder.pid}" in out and "taking it over" in out
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK).exists()


def test_a_resume_by_another_script_says_whose_run_it_is(tmp_path, tiny_random_dir):
    """egpo.py --resume on a grpo_base run: one line naming the script that started it, before any flag diff."""
    import egpo

    start_run_dir(tmp_path, FLAGS, resumed=False, overwrite=False, launch={"processes": 1, "script": "grpo_base"})
    check_run_dir(tmp_path, FLAGS, RESUMABLE, resume=True, overwrite=False, script="grpo_base")
    values = {"model": str(tiny_random_dir), "rollout": "hf", "output_dir": str(tmp_path), "resume": True}
    with pytest.raises(SystemExit, match=r"is a run of grpo_base.py, not egpo.py; resume it with python grpo_base.py"):
        egpo.main(*script_flags("egpo.py", **values))
