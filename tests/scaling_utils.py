"""Helpers for the multi-process and resume tests: a model that earns mixed rewards, launchers.

A random tiny model never writes `\\boxed{...}`, so every reward is 0, every
advantage 0 and training changes nothing: useless for comparing runs. The
"coin" model below is a bigram model written by hand (attention and MLP
outputs zeroed, so the logits depend on the current token only): after the
prompt it writes `\\boxed{1}` or `\\boxed{2}` with about even odds, so groups
are mixed and every step moves the weights. Building it takes a second.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from train_utils import ROOT

CHAIN_LOGIT = 10.0  # the intended next token gets ~98% of the mass (vocab 512)


def build_coin_model(random_dir: Path, out: Path, digits: tuple[int, ...] = (1, 2)) -> tuple[Path, Path]:
    """(model directory, dataset .jsonl): prompts "Toss coin i." whose gold answer is 1. The model writes
    `\\boxed{d}` for a d of `digits`, with about even odds: (1,) makes it always right on this data."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.prompts import format_prompt

    tok = AutoTokenizer.from_pretrained(random_dir)
    model = AutoModelForCausalLM.from_pretrained(random_dir)
    model.config.tie_word_embeddings = False
    seqs = [tok(f"\\boxed{{{d}}}", add_special_tokens=False).input_ids + [tok.eos_token_id] for d in digits]
    successors: dict[int, set[int]] = {}  # token -> allowed next tokens
    for seq in seqs:
        for a, b in zip(seq, seq[1:]):
            successors.setdefault(a, set()).add(b)
    last_prompt_token = tok(format_prompt("Toss coin 0.", "qwen_math"), add_special_tokens=False).input_ids[-1]
    assert last_prompt_token not in successors, "the prompt must not end inside the answer chain"
    direction = {t: i + 1 for i, t in enumerate(sorted(successors))}  # every other token: direction 0
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = torch.zeros_like(model.model.embed_tokens.weight)
        emb[:, 0] = 1.0
        for t, d in direction.items():
            emb[t] = 0.0
            emb[t, d] = 1.0
        model.model.embed_tokens.weight.copy_(emb)
        # RMSNorm turns a unit basis vector e_d into sqrt(hidden) * e_d.
        head = torch.zeros(model.config.vocab_size, hidden)
        head[seqs[0][0], 0] = CHAIN_LOGIT / hidden**0.5  # anything else -> the first answer token
        for t, nexts in successors.items():
            for n in nexts:
                head[n, direction[t]] = CHAIN_LOGIT / hidden**0.5
        model.lm_head = torch.nn.Linear(hidden, model.config.vocab_size, bias=False)
        model.lm_head.weight.copy_(head)
    model_dir = out / ("coin-model" if len(digits) > 1 else "sure-model")
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    for name in ("generation_config.json", "tiny_model.json"):
        if (random_dir / name).exists():
            shutil.copy(random_dir / name, model_dir / name)
    data = out / "coin.jsonl"
    data.write_text("".join(json.dumps({"problem": f"Toss coin {i}.", "answer": "1"}) + "\n" for i in range(32)))
    return model_dir, data


def launch(
    script: Path, out_dir: Path, *flags: str, num_processes: int = 1, timeout: int = 300
) -> tuple[list[dict], str]:
    """Run a training script on 1 process, or N CPU processes (gloo) via accelerate launch.

    Returns its metrics rows and its console output. `accelerate launch --cpu
    --num_processes N` would start ONE process here (its CPU multi-process launcher
    is mpirun); `--multi_gpu` with ACCELERATE_USE_CPU=true starts N via torchrun.
    """
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [sys.executable, str(script)]
    if num_processes > 1:
        env["ACCELERATE_USE_CPU"] = "true"
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(num_processes),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(_free_port()),
            str(script),
        ]
    proc = subprocess.run(
        [*cmd, "--output_dir", str(out_dir), *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{script.name} x{num_processes} failed:\n{proc.stderr[-4000:]}"
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, proc.stdout + proc.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkpoint_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(ckpt / "model" / "model.safetensors")


# A short run on the coin model: 4 prompts x 4 completions a step, uneven
# micro-batches, token-mean loss (global token denominators) and two passes
# (so the second has ratios != 1: clipping and KL are exercised).
RUN_FLAGS = (
    "--rollout",
    "hf",
    "--prompts_per_step",
    "4",
    "--group_size",
    "4",
    "--max_completion_len",
    "8",
    "--micro_batch_size",
    "3",
    "--loss_agg",
    "token-mean",
    "--mu",
    "2",
    "--lr",
    "1e-2",
    "--seed",
    "3",
    "--keep_last",
    "0",
)


_BASELINE: dict[str, Path] = {}


def baseline_run(tmp_path_factory, random_dir: Path) -> Path:
    """One uninterrupted single-process run of 3 steps, a checkpoint after each (built once per session).

    Both the 2-process comparison and the resume test compare against it.
    """
    if "dir" not in _BASELINE:
        root = tmp_path_factory.mktemp("scaling")
        model_dir, data = build_coin_model(random_dir, root)
        run = root / "baseline"
        launch(ROOT / "grpo_base.py", run, *coin_flags(root), "--steps", "3", "--save_steps", "1")
        _BASELINE["dir"] = run
    return _BASELINE["dir"]


def coin_flags(root: Path) -> tuple[str, ...]:
    """RUN_FLAGS plus the coin model and data built under `root`."""
    return ("--model", str(root / "coin-model"), "--dataset", str(root / "coin.jsonl"), *RUN_FLAGS)
