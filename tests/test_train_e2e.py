"""grpo_base.py end to end: the real CLI with each rollout backend, and learning on the synthetic task."""

import json
import subprocess
import sys

import pytest
from train_utils import ROOT, run_script

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
    rows = run_script(
        "grpo_base.py",
        tmp_path,
        "--model",
        str(tiny_random_dir),
        "--rollout",
        rollout,
        "--steps",
        "2",
        "--prompts_per_step",
        "4",
        "--group_size",
        "4",
        "--max_completion_len",
        "16",
    )
    assert [r["step"] for r in rows] == [1, 2]
    assert REQUIRED_METRICS <= set(rows[-1]), REQUIRED_METRICS - set(rows[-1])
    assert rows[-1]["train/rollout_logp_gap"] < 1e-3  # the engine samples from the policy being trained
    ckpt = tmp_path / "checkpoint-2"
    assert (ckpt / "COMPLETE").exists() and (ckpt / "model" / "config.json").exists()
    assert json.loads((tmp_path / "config.json").read_text())["rollout"] == rollout


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
        ({"model": "no/such/model-dir"}, "--model"),
        ({"rewards": "accuracy,lenght"}, "--rewards: unknown term"),
        ({"eval_steps": 1, "eval_benchmarks": "nosuchbench"}, "--eval_benchmarks"),
    ],
)
def test_bad_inputs_stop_with_a_message_naming_the_flag(flags, message, tiny_random_dir, tmp_path):
    import grpo_base

    if flags.get("dataset") == "DATA_WITHOUT_ANSWERS":
        flags["dataset"] = str(tmp_path / "q.jsonl")
        (tmp_path / "q.jsonl").write_text(json.dumps({"problem": "1 + 1?", "result": "2"}) + "\n")
    args = grpo_base.Args(
        **{"model": str(tiny_random_dir), "rollout": "hf", "output_dir": str(tmp_path / "run"), **flags}
    )
    with pytest.raises(SystemExit, match=message) as stop:
        grpo_base.main(args)
    assert str(stop.value).startswith("error: ")
