"""The training step at real size: peak memory, step time and tokens/s of one update micro-batch.

    python benchmarks/gpu_step.py                 # on a GPU: Qwen2.5-Math-1.5B's shape, 512 + 4,096 tokens, 4 sequences
    python benchmarks/gpu_step.py --size tiny     # anywhere: the same code on a toy shape (a smoke run)

A randomly initialised model with Qwen2.5-Math-1.5B's exact configuration (no download: the
shape is all that matters for memory and time), bf16 autocast over fp32 weights as the scripts
train (`--precision auto`), gradient checkpointing, AdamW. For each log-prob path, the textbook
one (the model's full logits, an fp32 log-softmax) and the scripts' chunked head
(`common.logprobs.sequence_logprobs`), it times forward + backward + optimiser step of one
micro-batch and reports the peak memory. The figures belong in docs/SCALING.md beside the
estimates.
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.logprobs import sequence_logprobs  # noqa: E402

# Qwen2.5-Math-1.5B's config.json (the fields that set the shape).
QWEN25_MATH_15B = dict(
    vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, max_position_embeddings=4096, rope_theta=10_000.0, tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(
    vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
)  # fmt: skip


def textbook(model, ids, attn, K):
    logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=K + 1).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -K:, None]).squeeze(-1)


def chunked(model, ids, attn, K):
    return sequence_logprobs(model, ids, attn, 1.0, logits_to_keep=K)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="qwen2.5-math-1.5b", choices=["qwen2.5-math-1.5b", "tiny"])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--completion", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    if a.size == "tiny":
        a.prompt, a.completion = min(a.prompt, 32), min(a.completion, 96)
    config = Qwen2Config(**(QWEN25_MATH_15B if a.size != "tiny" else TINY))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device)  # fp32 master weights
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, config.vocab_size, (a.batch, a.prompt + a.completion), device=device)
    attn = torch.ones_like(ids)
    tokens = a.batch * (a.prompt + a.completion)
    print(
        f"{a.size}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, {a.batch} x ({a.prompt} + {a.completion}) tokens, {device}\n"
    )
    print("| log-prob path | peak memory GiB | step s | tokens/s |\n|---|---|---|---|")
    for name, path in [("textbook (full logits)", textbook), ("chunked head (the scripts')", chunked)]:
        times = []
        if gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            for _ in range(a.repeats + 1):  # the first is a warm-up
                if gpu:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
                    logp = path(model, ids, attn, a.completion)
                F.mse_loss(logp, torch.zeros_like(logp)).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if gpu:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            step = sum(times[1:]) / len(times[1:])
            peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan")
            print(f"| {name} | {peak:.1f} | {step:.2f} | {tokens / step:,.0f} |", flush=True)
        except torch.OutOfMemoryError:
            print(f"| {name} | out of memory | - | - |", flush=True)
            optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
