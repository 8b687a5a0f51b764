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


def build_coin_model(random_dir: Path, out: Path) -> tuple[Path, Path]:
    """(model directory, dataset .jsonl): prompts "Toss coin i." whose gold answer is 1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.data import format_prompt

    tok = AutoTokenizer.from_pretrained(random_dir)
    model = AutoModelForCausalLM.from_pretrained(random_dir)
    model.config.tie_word_embeddings = False
    seqs = [tok(f"\\boxed{{{d}}}", add_special_tokens=False).input_ids + [tok.eos_token_id] for d in (1, 2)]
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
    model_dir = out / "coin-model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    for name in ("generation_config.json", "tiny_model.json"):
        if (random_dir / name).exists():
            shutil.copy(random_dir / name, model_dir / name)
    data = out / "coin.jsonl"
    data.write_text("".join(json.dumps({"problem": f"Toss coin {i}.", "answer": "1"}) + "\n" for i in range(32)))
    return model_dir, data


# The skeleton edits the scaling work asks of the five scripts (per-prompt
# seeds, the micro-batch boundary, DeepSpeed settings, peak memory). Until
# grpo_base.py has them, the tests run a patched copy; once it has them,
# skeleton_script returns grpo_base.py itself.
SKELETON_EDITS = [
    (
        "from common.distributed import global_sum, make_accelerator, reduce_metrics, state_dict_for_sync",
        "from common.distributed import global_sum, make_accelerator, micro_batch, peak_memory_gb, reduce_metrics, state_dict_for_sync",
    ),
    (
        "from common.rollout import HFEngine, VLLMEngine, stop_token_ids, vllm_available",
        "from common.rollout import HFEngine, VLLMEngine, prompt_seeds, stop_token_ids, vllm_available",
    ),
    (
        'accelerator = make_accelerator("bf16" if gpu and args.precision != "fp32" else "no")',
        'accelerator = make_accelerator("bf16" if gpu and args.precision != "fp32" else "no", args.grad_clip, args.micro_batch_size)',
    ),
    (
        '            groups = engine.generate([r["prompt_ids"] for r in batch_rows], G, args.max_completion_len, args.temperature, args.top_p, seed=args.seed + 1000 * step + rank)',
        '            seeds = prompt_seeds(args.seed, step, args.prompts_per_step, rank, len(batch_rows))  # the same samples on any number of ranks\n'
        '            groups = engine.generate([r["prompt_ids"] for r in batch_rows], G, args.max_completion_len, args.temperature, args.top_p, seed=seeds)',
    ),
    (
        """                    for i in range(0, len(idx_mb), args.micro_batch_size):
                        idx = idx_mb[i : i + args.micro_batch_size]
                        logp, _ = sequence_logprobs(model, batch["input_ids"][idx], batch["attention_mask"][idx], args.temperature, logits_to_keep=mask.shape[1])
                        ref = old["ref_logp"][idx] if ref_model is not None else None
                        loss, stats = policy_loss(logp, old["logp"][idx], advantages[idx], mask[idx], args, len(idx_mb), num_tokens, ref)
                        accelerator.backward(loss)
                        update_stats.append(stats | {"loss": loss.item()})
""",
        """                    for i in range(0, len(idx_mb), args.micro_batch_size):
                        idx = idx_mb[i : i + args.micro_batch_size]
                        with micro_batch(accelerator, model, last=i + args.micro_batch_size >= len(idx_mb)):  # grads sync on the last
                            logp, _ = sequence_logprobs(model, batch["input_ids"][idx], batch["attention_mask"][idx], args.temperature, logits_to_keep=mask.shape[1])
                            ref = old["ref_logp"][idx] if ref_model is not None else None
                            loss, stats = policy_loss(logp, old["logp"][idx], advantages[idx], mask[idx], args, len(idx_mb), num_tokens, ref)
                            accelerator.backward(loss)
                        update_stats.append(stats | {"loss": loss.item()})
""",
    ),
    (
        '            "tokens_per_s": lengths.sum() / step_s,\n',
        '            "tokens_per_s": lengths.sum() / step_s,\n            "peak_mem_gb": peak_memory_gb(),\n',
    ),
]


def skeleton_script(tmp: Path) -> Path:
    """grpo_base.py, or a copy of it with SKELETON_EDITS applied where it does not have them yet."""
    source = (ROOT / "grpo_base.py").read_text()
    patched = source
    for old, new in SKELETON_EDITS:
        if new not in patched:
            assert old in patched, f"grpo_base.py changed: cannot apply the skeleton edit {old[:80]!r}"
            patched = patched.replace(old, new)
    if patched == source:
        return ROOT / "grpo_base.py"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "grpo_base.py").write_text(patched)
    return tmp / "grpo_base.py"


def launch(script: Path, out_dir: Path, *flags: str, num_processes: int = 1, timeout: int = 300) -> tuple[list[dict], str]:
    """Run a training script on 1 process, or N CPU processes (gloo) via accelerate launch.

    Returns its metrics rows and its console output. `accelerate launch --cpu
    --num_processes N` would start ONE process here (its CPU multi-process launcher
    is mpirun); `--multi_gpu` with ACCELERATE_USE_CPU=true starts N via torchrun.
    """
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(script)]
    if num_processes > 1:
        env["ACCELERATE_USE_CPU"] = "true"
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
            str(script),
        ]
    proc = subprocess.run([*cmd, "--output_dir", str(out_dir), *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
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
    "--rollout", "hf", "--prompts_per_step", "4", "--group_size", "4", "--max_completion_len", "8",
    "--micro_batch_size", "3", "--loss_agg", "token-mean", "--mu", "2", "--lr", "1e-2", "--seed", "3", "--keep_last", "0",
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
        launch(skeleton_script(root / "script"), run, *coin_flags(root), "--steps", "3", "--save_steps", "1")
        _BASELINE["dir"] = run
    return _BASELINE["dir"]


def coin_flags(root: Path) -> tuple[str, ...]:
    """RUN_FLAGS plus the coin model and data built under `root`."""
    return ("--model", str(root / "coin-model"), "--dataset", str(root / "coin.jsonl"), *RUN_FLAGS)
