"""grpo_base.py end to end: the real CLI with each rollout backend, and learning on the synthetic task."""

import json
import os
import re
import subprocess
import sys

import pytest
from train_utils import ROOT, TWO_STEPS, run_script

from common.rollout import vllm_available

REQUIRED_METRICS = {
    *(
        f"train/{k}"
        for k in ("reward", "accuracy", "response_len", "entropy", "zero_adv_group_frac", "adv_var_within_group")
    ),
    *(
        f"train/{k}"
        for k in (
            "clip_frac_low",
            "clip_frac_high",
            "approx_kl",
            "grad_norm",
            "lr",
            "rollout_logp_gap",
            "skipped_steps",
        )
    ),
    *(f"time/{k}" for k in ("rollout_s", "scoring_s", "update_s", "sync_s", "tokens_per_s")),
    "reward/timeouts",
}


@pytest.mark.parametrize(
    "rollout",
    [
        "hf",
        pytest.param(
            "vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vllm not installed")]
        ),
    ],
)
def test_two_steps_write_metrics_and_checkpoint(rollout, tiny_random_dir, tmp_path):
    rows = run_script("grpo_base.py", tmp_path, "--model", str(tiny_random_dir), "--rollout", rollout, *TWO_STEPS)
    assert [r["step"] for r in rows] == [1, 2]
    assert REQUIRED_METRICS <= set(rows[-1]), REQUIRED_METRICS - set(rows[-1])
    assert rows[-1]["train/rollout_logp_gap"] < 1e-3  # the engine samples from the policy being trained
    ckpt = tmp_path / "checkpoint-2"
    assert (ckpt / "COMPLETE").exists() and (ckpt / "model" / "config.json").exists()
    # The final model at the run's root, hard links to the last checkpoint's files: loadable as it is.
    from transformers import AutoModelForCausalLM

    assert (tmp_path / "model" / "model.safetensors").stat().st_ino == (
        ckpt / "model" / "model.safetensors"
    ).stat().st_ino
    AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4
    assert {"problem", "completion", "reward", "advantage"} <= set(samples[0])
    assert json.loads((tmp_path / "run_config.json").read_text())["flags"]["rollout"] == rollout


def test_bad_flags_get_a_clear_message(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "grpo_base.py"), "--group_size", "1", "--output_dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "--group_size must be >= 2" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"dataset": "no/such/file.jsonl"}, "--dataset"),
        ({"dataset": "DATA_WITHOUT_ANSWERS"}, "--answer_field"),
        ({"model": "no/such/model-dir"}, "--model: no/such/model-dir does not exist"),
        ({"model": "MODEL_WITHOUT_TOKENIZER"}, "--model: .* has no tokenizer files"),
        ({"dataset": "ROWS:[]"}, "--dataset: .* has no rows"),
        (
            {"dataset": 'ROWS:[{"problem": "1 + 1?", "answer": "2"}, {"problem": "2 + 2?", "answer": null}]'},
            r"--dataset: 1 of 2 rows have no problem or no usable gold answer \(row 1",
        ),
        (
            {"dataset": 'ROWS:[{"problem": "1 + 1?", "answer": {"value": 2}}]'},
            "--dataset: 1 of 1 rows .* --bad_rows drop",
        ),
        (
            {"dataset": 'ROWS:[{"problem": "1 + 1?", "answer": true}]', "bad_rows": "drop"},
            "--dataset: no usable row left",
        ),
        ({"max_prompt_len": 1}, "--max_prompt_len: all 100 prompts are longer than 1 tokens"),
        ({"rewards": "accuracy,lenght"}, "--rewards: unknown term"),
        ({"eval_steps": 1, "eval_benchmarks": "nosuchbench"}, "--eval_benchmarks"),
    ],
)
def test_bad_inputs_stop_with_a_message_naming_the_flag(flags, message, tiny_random_dir, tmp_path):
    import grpo_base

    if flags.get("dataset") == "DATA_WITHOUT_ANSWERS":
        flags["dataset"] = str(tmp_path / "q.jsonl")
        (tmp_path / "q.jsonl").write_text(json.dumps({"problem": "1 + 1?", "result": "2"}) + "\n")
    if flags.get("dataset", "").startswith("ROWS:"):  # a data file with these rows
        rows = json.loads(flags["dataset"][5:])
        (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        flags["dataset"] = str(tmp_path / "rows.jsonl")
    if flags.get("model") == "MODEL_WITHOUT_TOKENIZER":
        import shutil

        shutil.copytree(tiny_random_dir, tmp_path / "model", ignore=shutil.ignore_patterns("tokenizer*"))
        flags["model"] = str(tmp_path / "model")
    args = grpo_base.Args(
        **{"model": str(tiny_random_dir), "rollout": "hf", "output_dir": str(tmp_path / "run"), **flags}
    )
    with pytest.raises(SystemExit, match=message) as stop:
        grpo_base.main(args)
    assert str(stop.value).startswith("error: ")


def _run(tmp_path, *flags):
    """grpo_base.py as a user starts it: in a shell without the variables vLLM sets inside this test process."""
    cmd = [sys.executable, str(ROOT / "grpo_base.py"), "--output_dir", str(tmp_path), "--rollout", "hf", *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_DIST")}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_diverging_run_is_stopped_and_its_checkpoints_stay_finite(tmp_path):
    """--lr 1e3 used to train on NaN for every remaining step, save all-NaN checkpoints and exit 0.
    (The demo model: a random one is always wrong, so it gets no gradient to diverge with.)"""
    from safetensors.torch import load_file

    from common.tiny_model import ensure_tiny_model

    proc = _run(tmp_path, "--model", str(ensure_tiny_model()), "--lr", "1e3", "--steps", "8", "--save_steps", "2")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert re.search(r"error: step \d+: .* not finite for 3 optimiser steps in a row .* --lr", proc.stderr), (
        proc.stderr[-2000:]
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/skipped_steps"] == 1 and rows[-1]["step"] < 8
    checkpoints = sorted(tmp_path.glob("checkpoint-*"))
    assert checkpoints, "the finite checkpoint before the divergence is kept"
    for ckpt in checkpoints:
        for name, t in load_file(ckpt / "model" / "model.safetensors").items():
            assert t.isfinite().all(), (ckpt.name, name)


def test_a_run_without_learning_signal_says_so(tiny_random_dir, tmp_path):
    """A near-greedy temperature makes every group's completions (and rewards) equal: nothing can be learned."""
    flags = ["--model", str(tiny_random_dir), "--temperature", "1e-6", "--steps", "2", "--warn_flat_steps", "2"]
    proc = _run(tmp_path, *flags, "--prompts_per_step", "4", "--group_size", "4", "--max_completion_len", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: step 2: for 2 steps every group's rewards were all equal" in proc.stderr + proc.stdout
    assert "--temperature" in proc.stderr + proc.stdout


def test_a_successful_run_prints_our_lines_only(tiny_random_dir, tmp_path):
    """Before: 41 lines around the progress bar, a 15-line vLLM traceback among them. Now the bar, and one
    closing line saying where the model is; the one line left is torch's own C++ note when vLLM's CPU
    build binds memory to a NUMA node (printed below Python, on CPU only)."""
    rollout = "vllm" if vllm_available() else "hf"
    proc = _run(
        tmp_path, "--model", str(tiny_random_dir), "--rollout", rollout, "--steps", "2", "--prompts_per_step", "4"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in (proc.stdout + proc.stderr).replace("\r", "\n").splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith(f"{tmp_path.name}:") or line.startswith("done: ")]
    other = [line for line in lines if line not in ours and "NUMA binding" not in line]
    assert not other, "\n".join(other)
    done = [line for line in ours if line.startswith("done: ")]
    assert len(done) == 1 and done[0].startswith(f"done: {tmp_path / 'metrics.jsonl'} (last step: reward ")
    assert done[0].endswith(f"model: {tmp_path / 'model'}")


def test_metrics_reach_tensorboard_and_wandb(tiny_random_dir, tmp_path, monkeypatch):
    """--report_to sends every row to accelerate's trackers as well as metrics.jsonl."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: W&B writes its run files locally
    monkeypatch.setenv("WANDB_SILENT", "true")
    flags = [
        "--model",
        str(tiny_random_dir),
        "--steps",
        "2",
        "--prompts_per_step",
        "4",
        "--report_to",
        "tensorboard,wandb",
    ]
    proc = _run(tmp_path, *flags)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = EventAccumulator(str(tmp_path / "grpo-zoo"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/reward")] == [1, 2]
    [wandb_run] = (tmp_path / "wandb").rglob("*.wandb")
    assert b"train/reward" in wandb_run.read_bytes()
