"""Faults a long run meets: a scheduler's SIGTERM, Ctrl-C, divergence, a kill during the final export, a full
disk, a damaged exported model, a checkpoint half deleted. Real signals, real processes, a real full disk."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file
from train_utils import ROOT, run_cli, user_env

from common.metrics import UpdateGuard
from common.models import model_to_load

pytestmark = pytest.mark.xdist_group("faults")  # the finished run is shared: one worker

SMALL = ["--rollout", "hf", "--prompts_per_step", "4", "--group_size", "4", "--max_completion_len", "8"]


def start(script, out, *flags):
    cmd = [sys.executable, str(ROOT / script), "--output_dir", str(out), *flags]
    return subprocess.Popen(cmd, cwd=ROOT, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(out, proc, step=1, timeout=180):
    """Until metrics.jsonl has a row for `step` (the run is inside its loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = out / "metrics.jsonl"
        if log.exists() and any(
            json.loads(line)["step"] >= step for line in log.read_text().splitlines() if line.strip()
        ):
            return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    raise AssertionError("the run never reached its first step")


# The signal handling is the session's, which all five scripts share; edge_grpo.py has a step of its own shape.
# Each signal once (SIGINT on grpo_base.py: tests/test_interrupted_writes.py's two quick Ctrl-Cs).
@pytest.mark.parametrize(
    "script, signum",
    [("grpo_base.py", signal.SIGTERM), ("edge_grpo.py", signal.SIGINT)],
    ids=["grpo_base.py-SIGTERM", "edge_grpo.py-SIGINT"],
)
def test_a_signal_stops_after_the_step_with_a_checkpoint_and_resume_goes_on(script, signum, tiny_random_dir, tmp_path):
    """Before: SIGTERM killed the run in 0.4 s with nothing saved (the default saves only at the end), SIGINT
    printed a 111-line traceback. Now: the step under way finishes, a checkpoint is saved, one line says
    how to go on, and the exit code says which signal (128 + its number)."""
    out = tmp_path / "run"
    gec = ["--gec_max_new_tokens", "8"] if script == "edge_grpo.py" else []  # a random model's reflections are long
    flags = ["--model", str(tiny_random_dir), *SMALL, *gec, "--steps", "500"]
    proc = start(script, out, *flags)
    wait_for_step(out, proc)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr + stdout
    [line] = [line for line in stdout.splitlines() if line.startswith("stopped by")]
    step = int(line.split("after step ")[1].split(":")[0])
    name = signal.Signals(signum).name
    assert (
        line
        == f"stopped by {name} after step {step}: saved checkpoint-{step}; to continue, run the same command with --resume"
    )
    assert (out / f"checkpoint-{step}" / "COMPLETE").exists() and not (out / "model").exists()
    if script == "grpo_base.py" and signum == signal.SIGTERM:  # the advice works as written
        proc = run_cli(script, "--output_dir", str(out), *flags[:-1], str(step + 1), "--resume")
        assert proc.returncode == 0 and f"resumed from {out / f'checkpoint-{step}'} (step {step})" in proc.stdout
        assert [json.loads(r)["step"] for r in (out / "metrics.jsonl").read_text().splitlines()][-1] == step + 1


def test_a_second_signal_stops_at_once(tiny_random_dir, tmp_path):
    out = tmp_path / "run"
    proc = start(
        "grpo_base.py", out, "--model", str(tiny_random_dir), *SMALL, "--steps", "500", "--max_completion_len", "64"
    )
    wait_for_step(out, proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM) and "Traceback" not in stderr
    assert "send it again to stop at once" in stderr


def test_a_diverging_run_stops_and_its_advice_works(tmp_path):
    """--lr 1e3: the run stops after --max_nonfinite_steps skipped updates with advice that names the
    checkpoint from before the trouble; before, that advice was refused (the learning rate could not
    change on --resume) and keep_last had deleted the checkpoint it meant. The demo model: a random one
    is always wrong, so it gets no gradient to diverge with."""
    from common.models import demo_model_dir

    out = tmp_path / "run"
    flags = ["--model", str(demo_model_dir()), *SMALL[:6], "--steps", "8", "--save_steps", "1"]
    proc = run_cli("grpo_base.py", "--output_dir", str(out), *flags, "--lr", "1e3")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error: step")] or [proc.stderr[-2000:]]
    assert "not finite for 3 optimiser steps in a row" in line, line
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    first_skip = next(r["step"] for r in rows if r["train/skipped_steps"])
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert saved and max(saved) < first_skip, "no checkpoint is written on schedule once updates are skipped"
    assert f"to go on from checkpoint-{max(saved)}" in line and "--resume --lr <lower>" in line
    for ckpt in out.glob("checkpoint-*"):
        assert all(t.isfinite().all() for t in load_file(ckpt / "model" / "model.safetensors").values())
    proc = run_cli(
        "grpo_base.py",
        "--output_dir",
        str(out),
        *flags[:-4],
        "--steps",
        str(max(saved) + 1),
        "--resume",
        "--lr",
        "1e-4",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {out / f'checkpoint-{max(saved)}'}" in proc.stdout
    config = json.loads((out / "run_config.json").read_text())
    assert config["history"][-1]["changed"]["lr"] == 1e-4 and config["flags"]["lr"] == 1e-4


def test_gradient_norm_spikes_are_skipped():
    said = []
    guard = UpdateGuard(patience=3, spike_factor=10.0, say=said.append)
    assert all(guard.check(s, 0.1, 1.0 + 0.01 * s, 1e-6) for s in range(1, 12))  # history of ~1
    assert not guard.check(12, 0.1, 50.0, 1e-6) and "over 10x the median" in said[-1]
    assert guard.check(13, 0.1, 1.2, 1e-6)  # back to normal
    assert guard.check(14, 0.1, float("nan"), 1e-6)  # DeepSpeed reports no norm: the loss decides
    off = UpdateGuard(patience=3)
    assert all(off.check(s, 0.1, n, 1e-6) for s, n in enumerate([1.0] * 20 + [1e6]))  # 0: off


@pytest.fixture(scope="module")
def finished_run(tiny_random_dir, tmp_path_factory):
    """A finished two-step run with a checkpoint per step and its exported model, copied for each test."""
    out = tmp_path_factory.mktemp("finished") / "run"
    flags = ["--model", str(tiny_random_dir), *SMALL, "--save_steps", "1", "--keep_last", "0", "--steps", "2"]
    proc = run_cli("grpo_base.py", "--output_dir", str(out), *flags)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, flags


def copy_of(finished_run, tmp_path):
    out, flags = finished_run
    shutil.copytree(out, tmp_path / "run", copy_function=shutil.copy2)  # no hard links shared with the original
    return tmp_path / "run", flags


def test_a_kill_during_the_final_export_is_repaired_by_resume(finished_run, tmp_path):
    """Before: no model/, a model.tmp left, and `--resume` said done without a model path."""
    out, flags = copy_of(finished_run, tmp_path)
    shutil.rmtree(out / "model")
    (out / "model.tmp").mkdir()
    (out / "model.tmp" / "config.json").write_text("{half")
    proc = run_cli("grpo_base.py", "--output_dir", str(out), *flags, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].endswith(f"model: {out / 'model'}")
    assert not (out / "model.tmp").exists() and (out / "model" / "MANIFEST.json").exists()
    from common.checkpoint import manifest_problem

    assert manifest_problem(out / "model") is None


def test_a_damaged_exported_model_is_refused_where_model_points(finished_run, tmp_path):
    out, _ = copy_of(finished_run, tmp_path)
    weights = out / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    weights.write_bytes(data)
    proc = run_cli(
        "grpo_base.py", "--output_dir", str(tmp_path / "again"), "--model", str(out / "model"), *SMALL, "--steps", "1"
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "does not match its SHA-256" in proc.stderr, proc.stderr[-2000:]
    with pytest.raises(SystemExit, match="does not match its SHA-256") as refused:  # never checkpoint-2 silently
        model_to_load(str(out))
    assert f"pass its newest good checkpoint {out / 'checkpoint-2'}" in str(refused.value)


def test_a_run_s_model_is_hashed_once(finished_run, monkeypatch):
    """Every byte of the exported model is read once on the way to loading it (a 7B model is 15 GB)."""
    import common.checkpoint

    out, _ = finished_run
    calls = []
    real = common.checkpoint.manifest_problem
    monkeypatch.setattr(common.checkpoint, "manifest_problem", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert model_to_load(str(out)) == (str(out / "model"), out)
    assert len(calls) == 1


def test_a_half_deleted_checkpoint_is_removed_on_resume(finished_run, tmp_path):
    """The resume names only the run and its new length: the model, the rollout engine, the batch and the saving
    flags come from its run_config.json."""
    out, _ = copy_of(finished_run, tmp_path)
    next((out / "checkpoint-1" / "accelerate").glob("optimizer*")).unlink()  # killed mid-delete: COMPLETE stays
    (out / "checkpoint-9.deleting").mkdir()  # a delete under the new scheme, killed
    proc = run_cli("grpo_base.py", "--output_dir", str(out), "--steps", "3", "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"the run's flags from {out / 'run_config.json'}; changed here: --steps 2 -> 3\n" in proc.stdout
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]


def tmpfs_mount_prefix():
    """A command prefix running its command with a 24 MB tmpfs at /mnt/full (a private mount namespace)."""
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    prefix = ["unshare", "--user", "--map-root-user", "--mount"] if probe.returncode == 0 else None
    if prefix is None and os.geteuid() == 0:
        prefix = ["unshare", "--mount"]
    return prefix


@pytest.mark.skipif(tmpfs_mount_prefix() is None, reason="no mount namespace here to make a small filesystem")
def test_a_full_disk_stops_with_one_line_and_keeps_the_earlier_checkpoint(tiny_random_dir, tmp_path):
    """Before: a 26-line traceback ending in "basic_ios::clear: iostream error", the .tmp left behind."""
    full = tmp_path / "full"
    full.mkdir()
    run = full / "run"
    train = [sys.executable, str(ROOT / "grpo_base.py"), "--output_dir", str(run), "--model", str(tiny_random_dir)]
    train += [*SMALL, "--steps", "3", "--save_steps", "1", "--keep_last", "0"]
    # The filesystem lives as long as its namespace: what is left on it is listed from inside.
    shell = (
        f"mount -t tmpfs -o size=24m tmpfs {full} && {{ {' '.join(train)}; rc=$?; echo LEFT $(ls {run}); exit $rc; }}"
    )
    proc = subprocess.run(
        [*tmpfs_mount_prefix(), "sh", "-c", shell],
        cwd=ROOT,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "No space left on device" in line and str(full / "run") in line, line
    assert "The partial checkpoint was removed; earlier checkpoints are untouched" in line
    [left] = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("LEFT")]
    assert "checkpoint-1" in left and not [name for name in left if name.endswith(".tmp")], left
