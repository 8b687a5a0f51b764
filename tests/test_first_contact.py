"""A newcomer's first contact: a bad flag in one line, the tools' --help without the heavy libraries, an unreachable hub said in one line, a run
folder that failed to start is not stuck, schedules, your own reward, console lines at an interval."""

import json
import math
import re
import shutil
import time

import pytest
from train_utils import SCRIPTS, run_cli, user_env

from common.trainer import lr_lambda

CLIS = [*SCRIPTS, "tools/evaluate.py", "tools/plot.py", "data/prepare.py", "data/hard_subset.py"]
SMALL = ["--rollout", "hf", "--prompts_per_step", "4", "--group_size", "4", "--max_completion_len", "8"]


@pytest.mark.parametrize("cli", CLIS)
def test_a_bad_flag_is_one_line_and_the_tools_help_loads_no_heavy_library(cli):
    """A bad flag: exit 2 with one error line, before any model loads. The training scripts import torch at
    their top, as CleanRL's do; the tools parse their flags first, so --help answers in a fraction of a second."""
    tool = cli not in SCRIPTS
    for argv in (["--help"], ["--no_such_flag", "1"]) if tool else (["--no_such_flag", "1"],):
        proc = run_cli(cli, *argv, timeout=60, env=user_env(PYTHONPROFILEIMPORTTIME="1"))  # the profile: on stderr
        imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
        heavy = {m for m in imported if m.split(".")[0] in ("torch", "transformers", "vllm", "accelerate", "datasets")}
        assert not (tool and heavy), f"{cli} {argv[0]} imported {sorted(heavy)[:5]}"
        if argv == ["--help"]:
            assert proc.returncode == 0 and "usage:" in proc.stdout
            assert "(default: None) (default: None)" not in proc.stdout
        else:
            errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
            assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]


def test_help_is_grouped_as_the_flags_are():
    out = run_cli("grpo_base.py", "--help", timeout=60).stdout
    titles = re.findall(r"^(\S[^\n:]*):$", out, re.M)
    for group in ("What to train", "Optimiser", "The method", "Run directory and checkpoints", "Systems"):
        assert group in titles, titles
    flag_at = {m.group(1): m.start() for m in re.finditer(r"^  --(\w+)", out, re.M)}
    assert flag_at["group_size"] > out.index("\nThe method:") > flag_at["lr"]  # each flag in its own group


def test_an_unreachable_hub_is_one_line(tmp_path):
    env = user_env(HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens there: refused at once, network or not
    for flags, message in (
        (
            ["--model", "Qwen/Qwen2.5-Math-1.5B"],
            "--model: Qwen/Qwen2.5-Math-1.5B is a hub name, but the Hugging Face hub cannot be reached",
        ),
        (
            ["--dataset", "agentica-org/DeepScaleR-Preview-Dataset"],
            "--dataset: could not load 'agentica-org/DeepScaleR-Preview-Dataset'",
        ),
    ):
        proc = run_cli(
            "grpo_base.py", "--output_dir", str(tmp_path / "run"), "--rollout", "hf", *flags, env=env, timeout=120
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode != 0 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    proc = run_cli("tools/evaluate.py", "--model", "Qwen/Qwen2.5-Math-7B", "--output_dir", str(tmp_path / "e"), env=env)
    assert proc.returncode != 0 and "cannot be reached" in proc.stderr and "Traceback" not in proc.stderr


def test_data_prepare_without_the_hub_fails_at_once(tmp_path):
    """`python -m data.prepare edge` offline retried for 25 s before its one-line error; the hub check first
    (common/models.py, without importing torch) takes it to the time of its imports."""
    env = user_env(HF_ENDPOINT="http://127.0.0.1:9")
    start = time.monotonic()
    proc = run_cli("data/prepare.py", "edge", "--output", str(tmp_path / "d.jsonl"), env=env, timeout=120)
    took = time.monotonic() - start
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and "could not load 'agentica-org/" in lines[0], proc.stderr[-2000:]
    assert took < 12, f"{took:.1f} s"  # ~3 s on 2 loaded cores; 25 s of retries before


def test_a_typo_in_a_local_path_is_named_as_one(tmp_path, monkeypatch):
    """`runs/typo` reads as a hub name org/name; when runs/ is a local folder the line says what is missing there."""
    from common.models import hub_error, model_to_load

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert model_to_load("runs/typo") == ("runs/typo", None)  # a hub name may share a local folder's name
    assert "if you meant a local path: there is no runs/typo in runs/" in str(hub_error("--model", "runs/typo"))
    assert "local path" not in str(hub_error("--model", "Qwen/Qwen2.5-Math-7B")).split("pass the local path")[1]


def test_a_folder_whose_run_saved_nothing_starts_over(tiny_random_dir, tmp_path):
    """Before: a plain rerun said "already holds a run; pass --resume", and --resume said "no usable
    checkpoint; run without --resume": the folder was stuck after any failed start."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run_config.json").write_text(json.dumps({"flags": {}, "history": [{"event": "start"}]}))
    (run / "metrics.jsonl").write_text('{"step": 1, "train/reward": 0.5}\n')
    flags = ["--model", str(tiny_random_dir), *SMALL, "--steps", "1"]
    proc = run_cli("grpo_base.py", "--output_dir", str(run), *flags)
    assert proc.returncode == 0 and "held a run with no usable checkpoint: starting over" in proc.stdout, proc.stderr[
        -2000:
    ]
    assert [json.loads(r)["step"] for r in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = run_cli("grpo_base.py", "--output_dir", str(other), *flags, "--resume")
    assert proc.returncode == 0 and "no usable checkpoint" in proc.stdout and "starting from step 0" in proc.stdout


@pytest.mark.parametrize(
    "schedule, expected",
    [  # 2 warm-up steps, 10 in all: the multiplier of the learning rate at optimiser steps 0..10
        ("constant", [0.5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]),
        ("linear", [0.5, 1, 1, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8, 0]),
        ("cosine", [0.5, 1] + [0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(9)]),
    ],
)
def test_learning_rate_schedules(schedule, expected):
    factor = lr_lambda(schedule, warmup_steps=2, total_steps=10)
    assert [factor(s) for s in range(11)] == pytest.approx(expected)


def test_your_own_reward_and_console_lines_at_an_interval(tiny_random_dir, tmp_path):
    """examples/length_penalty.py, as the README shows it; --log_every 1 prints each step's figures."""
    flags = ["--model", str(tiny_random_dir), *SMALL, "--steps", "2", "--log_every", "1"]
    proc = run_cli(
        "grpo_base.py",
        "--output_dir",
        str(tmp_path),
        *flags,
        "--reward_fn",
        "examples/length_penalty.py:length_penalty",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    texts = [json.loads(r)["completion"] for r in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert all(r["train/accuracy"] == 0 and r["train/reward"] < 0 for r in rows)  # a random model: wrong, and penalised
    assert rows[0]["train/reward"] == pytest.approx(-0.001 * sum(map(len, texts[:4])) / 4, abs=0.02)
    console = proc.stdout + proc.stderr
    assert re.search(r"step 1: reward -?[\d.e-]+, acc 0", console) and "step 2: reward" in console
    # Before the progress bar: how many steps and why, then what is loading.
    start = "grpo_base: 2 steps (--steps), 4 prompts x 4 completions a step\nloading "
    assert start + f"{tiny_random_dir}: the policy and the hf rollout engine\n" in proc.stdout


def test_the_demo_model_is_the_shipped_one_and_a_damaged_copy_says_how_to_restore_it(tmp_path):
    """`--model tiny` is models/tiny-arith, the same weights on every machine (a build's depend on its CPU kernels
    and threads); its manifest is checked at load, and its recipe names the command that made it."""
    from common.models import SHIPPED_DIR, demo_model_dir, model_to_load
    from tools.tiny_model import VERSION

    assert model_to_load("tiny") == (str(SHIPPED_DIR), None)
    recipe = json.loads((SHIPPED_DIR / "tiny_model.json").read_text())
    assert recipe["version"] == VERSION and recipe["command"].startswith("python -m tools.tiny_model --output ")
    copy = tmp_path / "tiny-arith"
    shutil.copytree(SHIPPED_DIR, copy)
    with open(copy / "model.safetensors", "r+b") as f:  # one byte altered, the size unchanged
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(
        SystemExit, match=r"model.safetensors does not match its SHA-256.*git checkout -- models/tiny-arith"
    ):
        demo_model_dir(copy)


def test_a_rebuilt_demo_model_records_its_recipe_and_loads(tmp_path):
    """`python -m tools.tiny_model` (3 SFT steps here): a manifest, the recipe with its command and threads, a
    loadable model; an existing output is refused rather than overwritten."""
    from transformers import AutoModelForCausalLM

    from common.models import model_to_load
    from tools.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny", sft_steps=3, threads=1)
    recipe = json.loads((path / "tiny_model.json").read_text())
    assert recipe["threads"] == 1 and recipe["sft_steps"] == 3
    assert (
        recipe["command"]
        == f"python -m tools.tiny_model --output {path} --sft_steps 3 --sft_noise 0.5 --seed 0 --threads 1"
    )
    assert model_to_load(str(path)) == (str(path), None)  # its MANIFEST.json matches
    assert AutoModelForCausalLM.from_pretrained(path).config.vocab_size > 100
    with pytest.raises(SystemExit, match="exists; remove it or choose another directory"):
        build_tiny_model(path, sft_steps=0)
