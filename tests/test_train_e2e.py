"""The five scripts end to end, as a user runs them: two steps with each rollout engine, bad inputs, the console."""

import json
import math
import re

import pytest
from train_utils import SCRIPTS, TWO_STEPS, run_cli, run_script, script_flags

from common.run_flags import vllm_available

REQUIRED_METRICS = {
    *(f"train/{k}" for k in ("reward", "accuracy", "response_len", "entropy", "zero_adv_group_frac")),
    *(f"train/{k}" for k in ("adv_var_within_group", "clip_frac_low", "clip_frac_high", "approx_kl", "grad_norm")),
    *(f"train/{k}" for k in ("lr", "rollout_logp_gap", "skipped_steps", "skipped_rows", "loss", "epoch")),
    "train/truncated_frac",
    *(f"time/{k}" for k in ("rollout_s", "scoring_s", "old_logp_s", "update_s", "sync_s", "tokens_per_s")),
    "reward/timeouts",
    "reward/unchecked",
}
VLLM = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="no vllm")]
# Every script with the HF engine; with vLLM, grpo_base and edge_grpo (GEC samples through the engine too):
# the other three run the same rollout lines as grpo_base (tests/test_skeleton.py holds them to it).
# grpo_base's vLLM run is one run shared with the console's test (one vLLM start fewer): hence its group.
SHARED = pytest.mark.xdist_group("grpo_base_on_vllm")
RUNS = [(s, "hf") for s in SCRIPTS]
RUNS += [pytest.param("grpo_base.py", "vllm", marks=[*VLLM, SHARED]), pytest.param("edge_grpo.py", "vllm", marks=VLLM)]


@pytest.fixture(scope="module")
def grpo_base_on_vllm(tiny_random_dir, tmp_path_factory):
    """One two-step grpo_base run on vLLM (HF where vLLM is not installed), evaluated before and after and
    reported to TensorBoard: its process and output folder, read by test_two_steps and by the console's test."""
    out = tmp_path_factory.mktemp("grpo-base-vllm")
    rollout = "vllm" if vllm_available() else "hf"
    flags = ["--model", str(tiny_random_dir), "--rollout", rollout, *TWO_STEPS, "--eval_steps", "2"]
    return run_cli("grpo_base.py", "--output_dir", str(out), *flags, "--report_to", "tensorboard"), out


def check_edge(rows, out):
    for r in rows:
        edited = r["gec/reflection"] + r["gec/injection"] + r["gec/replacement"]
        assert (
            edited == round(16 * (1 - r["gec/rollout_accuracy"])) > 0
        )  # every wrong completion; a random model is wrong
        assert r["gec/fixed"] >= r["gec/injection"] + r["gec/replacement"]  # the synthetic solutions are right
        assert {"edge/adv_var_within_group_before_eda", "edge/entropy_P", "time/gec_s"} <= set(r)
    assert json.loads((out / "run_config.json").read_text())["flags"]["gec"] == "full"


def check_egpo(rows, out):
    for r in rows:
        # A random model is always wrong: every group is entirely incorrect, so GRPO would have no
        # signal; NSR gives every completion -w with w in [lambda_min, 1], and a positive loss.
        assert r["train/accuracy"] == 0 and r["egpo/nsr_group_frac"] == 1.0 and r["egpo/entropy_proxy_correct"] is None
        assert r["egpo/entropy_proxy_incorrect"] > 0 and 0.5 <= r["egpo/w_min"] <= r["egpo/w_max"] <= 1.0
        assert r["train/loss"] > 0 and r["train/grad_norm"] > 0


def check_cw(rows, out):
    for r in rows:
        cov = [v for k, v in r.items() if k.startswith("cw/")]
        assert len(cov) == 8
        # No group has a signal for a random model: the covariance statistics are null (not NaN, not a crash).
        if r["train/zero_adv_group_frac"] == 1.0:
            assert all(v is None for v in cov) and r["train/loss"] == 0
        else:
            assert all(isinstance(v, float) and math.isfinite(v) for v in cov)
    flags = json.loads((out / "run_config.json").read_text())["flags"]
    assert flags["cw"] is True and flags["temperature"] == 0.7


def check_pro(rows, out):
    for r in rows:
        assert 0 < r["pro/conf_prompt"] <= 1 and 0 < r["pro/lowprob_token_prob"] <= 1
        assert 0 <= r["pro/mixed_group_frac"] <= 1
        if r["train/accuracy"] < 1:  # the random model is wrong nearly always
            assert 0 < r["pro/conf_answer_incorrect"] <= 1


CHECKS = {
    "grpo_base.py": None,
    "edge_grpo.py": check_edge,
    "egpo.py": check_egpo,
    "cw_grpo.py": check_cw,
    "pro_grpo.py": check_pro,
}
EXTRA_FLAGS = {"edge_grpo.py": ("--gec_max_new_tokens", "8")}


@pytest.mark.parametrize("script, rollout", RUNS)
def test_two_steps(script, rollout, tiny_random_dir, tmp_path, request):
    """Two steps as a user runs them: the metrics, a complete checkpoint, the exported model, samples."""
    if (script, rollout) == ("grpo_base.py", "vllm"):
        proc, tmp_path = request.getfixturevalue("grpo_base_on_vllm")
        assert proc.returncode == 0, proc.stderr[-4000:]
        rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        rows = [r for r in rows if "train/reward" in r]  # its evaluations have rows of their own
    else:
        flags = ("--model", str(tiny_random_dir), "--rollout", rollout, *TWO_STEPS, *EXTRA_FLAGS.get(script, ()))
        rows = run_script(script, tmp_path, *flags)
    assert [r["step"] for r in rows] == [1, 2]
    assert REQUIRED_METRICS <= set(rows[-1]), REQUIRED_METRICS - set(rows[-1])
    assert rows[-1]["train/rollout_logp_gap"] < 1e-3  # the engine samples from the policy being trained
    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / "COMPLETE").exists() and (checkpoint / "model" / "config.json").exists()
    # The final model at the run's root: hard links to the last checkpoint's files, its own manifest, loadable.
    from transformers import AutoModelForCausalLM

    weights = "model.safetensors"
    assert (tmp_path / "model" / weights).stat().st_ino == (checkpoint / "model" / weights).stat().st_ino
    assert (tmp_path / "model" / "MANIFEST.json").is_file()
    AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4
    assert set(samples[0]) == {"step", "prompt", "completion", "reward", "advantage"}  # what --log_samples says
    assert len({s["prompt"] for s in samples if s["step"] == 1}) == 4  # one from each of the step's 4 groups
    assert json.loads((tmp_path / "run_config.json").read_text())["flags"]["rollout"] == rollout
    if CHECKS[script]:
        CHECKS[script](rows, tmp_path)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"dataset": "no/such/file.jsonl"}, "--dataset"),
        ({"dataset": "DATA_WITHOUT_ANSWERS"}, "--answer_field"),
        ({"model": "no/such/model-dir"}, "--model: no/such/model-dir does not exist"),
        ({"model": "tiny2"}, "--model: tiny2 does not exist"),
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
        ({"max_prompt_len": 8000, "max_completion_len": 8000}, "more than .* context of 8192 tokens"),
        ({"rewards": "accuracy,lenght"}, "--rewards: unknown term"),
        ({"reward_fn": "no_such_module:fn"}, "--reward_fn: cannot import 'no_such_module'"),
        ({"reward_fn": "json:no_such_fn"}, "--reward_fn: 'json' has no function 'no_such_fn'"),
        # a reward of your own is called on a few completions before any model loads
        (
            {"reward_fn": "test_rewards:none_on_empty"},
            "--reward_fn: none_on_empty returned NoneType None for completion 3",
        ),
        ({"reward_fn": "test_rewards:raises_on_empty"}, "--reward_fn: raises_on_empty raised ZeroDivisionError"),
        ({"reward_fn": "test_rewards:two_args"}, r"--reward_fn: two_args raised TypeError: .*positional argument"),
        (
            {"epochs": 1, "prompts_per_step": 128},
            "--epochs 1 of 100 prompts is less than one step of --prompts_per_step 128",
        ),
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
    values = {"model": str(tiny_random_dir), "rollout": "hf", "output_dir": str(tmp_path / "run"), **flags}
    with pytest.raises(SystemExit, match=message) as stop:
        grpo_base.main(*script_flags("grpo_base.py", **values))
    assert str(stop.value).startswith("error: ")
    assert not (tmp_path / "run" / "run_config.json").exists(), "a run that failed to start leaves no run behind"


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--group_size", "1"], "--group_size"),
        (["--lr=-1e-4"], "--lr"),
        (["--steps", "0"], "--steps"),
        (["--epochs", "0"], "--epochs"),
        (["--save_steps", "-1"], "--save_steps"),
        (["--keep_last", "-1"], "--keep_last"),
        (["--top_p", "1.5"], "--top_p"),
        (["--num_minibatches", "5"], "--num_minibatches"),
        (["--resume", "--overwrite"], "--resume"),
        (["--report_to", "tensorbored"], "--report_to"),
        (["--grup_size", "8"], "--grup_size"),  # unrecognised
        (["--rollout", "sglang"], "rollout"),
        (["--attn_implementation", "flash_attention_2"], "--attn_implementation"),
    ],
)
def test_flag_errors_are_one_line_before_anything_loads(argv, flag, tmp_path, capsys):
    """A bad flag stops parsing or validation with one line naming it; the run directory stays untouched (the
    scripts' subprocesses: tests/test_first_contact.py)."""
    import grpo_base
    from common.cli import parse_args
    from common.run_flags import RunFlags

    with pytest.raises(SystemExit) as stop:
        grpo_base.validate(*parse_args(grpo_base.Args, RunFlags, argv=[*argv, "--output_dir", str(tmp_path / "run")]))
    said = capsys.readouterr().err + (stop.value.code if isinstance(stop.value.code, str) else "")
    lines = [line for line in said.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], said
    assert not (tmp_path / "run").exists()


def test_a_run_without_learning_signal_says_so(tiny_random_dir, tmp_path):
    """A near-greedy temperature makes every group's completions (and rewards) equal: nothing can be learned."""
    flags = ["--model", str(tiny_random_dir), "--rollout", "hf", "--temperature", "1e-6", "--warn_flat_steps", "2"]
    proc = run_cli("grpo_base.py", "--output_dir", str(tmp_path), *flags, *TWO_STEPS[:2], "--prompts_per_step", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: step 2: for 2 steps every group's rewards were all equal" in proc.stderr + proc.stdout
    assert "--temperature" in proc.stderr + proc.stdout


@SHARED
def test_a_successful_run_prints_our_lines_only(grpo_base_on_vllm):
    """The progress bar, an evaluation line, and one closing line saying where the model is; the one line
    left is torch's own C++ note when vLLM's CPU build binds memory to a NUMA node (printed below Python).
    DeepSpeed is installed in the test environment: its CPU notice must not show either."""
    import importlib.util

    assert importlib.util.find_spec("deepspeed") is not None, "the console is tested with deepspeed installed"
    proc, tmp_path = grpo_base_on_vllm
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in (proc.stdout + proc.stderr).replace("\r", "\n").splitlines() if line.strip()]
    # The start lines (how many steps and why; what is loading; the evaluation before training), the bar, the end.
    start = (
        r"grpo_base: 2 steps \(--steps\), 4 prompts x 4 completions a step|loading .*: the policy and the |evaluating "
    )
    ours = [line for line in lines if re.match(rf"({start}|{tmp_path.name}:|done: |eval at step \d+: pass@1)", line)]
    other = [line for line in lines if line not in ours and "NUMA binding" not in line]
    assert not other, "\n".join(other)
    assert len([line for line in ours if line.startswith("eval at step")]) == 2  # before the first step, after the last
    done = [line for line in ours if line.startswith("done: ")]
    assert len(done) == 1 and done[0].startswith(f"done: {tmp_path / 'metrics.jsonl'} (last step: reward ")
    assert done[0].endswith(f"model: {tmp_path / 'model'}")


def test_metrics_reach_tensorboard_and_wandb(tiny_random_dir, tmp_path):
    """--report_to sends every row to accelerate's trackers as well as metrics.jsonl, under --project / --run_name."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from train_utils import user_env

    env = user_env(WANDB_MODE="offline", WANDB_SILENT="true")  # no network: W&B writes its run files locally
    flags = ["--model", str(tiny_random_dir), "--rollout", "hf", "--steps", "2", "--prompts_per_step", "4"]
    flags += ["--report_to", "tensorboard,wandb", "--project", "my-project", "--run_name", "try-1"]
    proc = run_cli("grpo_base.py", "--output_dir", str(tmp_path), *flags, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = EventAccumulator(str(tmp_path / "my-project"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/reward")] == [1, 2]
    [wandb_run] = (tmp_path / "wandb").rglob("*.wandb")
    assert b"train/reward" in wandb_run.read_bytes() and b"try-1" in wandb_run.read_bytes()
