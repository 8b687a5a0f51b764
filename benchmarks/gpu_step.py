"""The training step at real size: peak memory, step time, tokens/s and MFU of one update micro-batch.

    python benchmarks/gpu_step.py                 # on a GPU: Qwen2.5-Math-1.5B's shape, 512 + 4,096 tokens, 4 sequences
    python benchmarks/gpu_step.py --size tiny     # anywhere: the same code on a toy shape (a smoke run)
    python benchmarks/gpu_step.py --json FILE     # the figures as JSON too (benchmarks/gpu_first_run.py reads them)

A randomly initialised model with Qwen2.5-Math-1.5B's exact configuration (no download: the
shape is all that matters for memory and time), bf16 autocast over fp32 weights as the scripts
train (`--precision auto`), gradient checkpointing, AdamW. For each log-prob path, the textbook
one (the model's full logits, an fp32 log-softmax) and the scripts' chunked head
(`common.logprobs.sequence_logprobs`), it times forward + backward + optimiser step of one
micro-batch and reports the peak memory (`torch.cuda.max_memory_allocated`).

MFU: the step's model FLOPs over its time, over the GPU's peak dense bf16 FLOP/s. Model FLOPs per
sequence of S tokens whose last K are scored (nanoGPT's `estimate_mfu`, after PaLM, arXiv 2204.02311,
appendix B): 6 N S for the body's matrices (N: the parameters less the embedding table, a lookup),
6 V D K for the output layer on the K scored positions, and 12 L D S^2 for attention's scores and
values (the whole S x S matrix, as PaLM counts it; a causal kernel computes about half). Gradient
checkpointing's recompute is not counted (MFU, not hardware FLOPs). Peak dense bf16: H100 SXM 989
TFLOP/s, H100 NVL 835, H100 PCIe 756 (NVIDIA H100 datasheet, half its "with sparsity" figures), H200
989 and H200 NVL 835 (NVIDIA H200 datasheet); another GPU gets no MFU.

Predicted peak: the memory preflight's plan for this process (`common.preflight.preflight_memory`, as
`start_session` calls it: mode single, --precision auto, no reference model, no vLLM share: the training
state and the 2 GiB margin), plus what it leaves to the margin: the micro-batch's activations
(`common.batching.activation_bytes_per_token`, as the micro-batch budget estimates them) and the log-prob
path's four chunk tensors (docs/SCALING.md "Per-GPU budget"). The figures belong in docs/SCALING.md
beside the estimates.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.logprobs import CHUNK_BYTES, GPU_CHUNK_BYTES, sequence_logprobs  # noqa: E402

# Qwen2.5-Math-1.5B's config.json (the fields that set the shape).
QWEN25_MATH_15B = dict(
    vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, max_position_embeddings=4096, rope_theta=10_000.0, tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(
    vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
)  # fmt: skip
# Peak dense bf16 FLOP/s by the device's name (module docstring). The first name the device's contains wins, so a
# part's variants (NVL, PCIe) come before its plain name: "NVIDIA H200 NVL" contains "H200".
PEAK_BF16 = [("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200 NVL", 835e12), ("H200", 989e12)]
STATED_GIB = 79.2  # the device the prediction is made for where no GPU is: an 80 GB GPU, as tests/test_preflight.py


def textbook(model, ids, attn, K):
    logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=K + 1).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -K:, None]).squeeze(-1)


def chunked(model, ids, attn, K):
    return sequence_logprobs(model, ids, attn, 1.0, logits_to_keep=K)[0]


def model_flops(config, batch: int, seq: int, scored: int) -> float:
    """Model FLOPs of one forward + backward over `batch` sequences of `seq` tokens, `scored` of each through
    the output layer (module docstring)."""
    V, D, L = config.vocab_size, config.hidden_size, config.num_hidden_layers
    body = _parameters(config) - V * D  # the embedding table is a lookup; a tied output layer is counted below
    return batch * (6 * body * seq + 6 * V * D * scored + 12 * L * D * seq**2)


def _parameters(config) -> int:
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())


def peak_bf16_flops(device_name: str | None) -> float | None:
    """The GPU's peak dense bf16 FLOP/s from its name, or None (an unknown GPU, or none)."""
    for key, flops in PEAK_BF16:
        if device_name and key in device_name:
            return flops
    return None


def predicted_memory(config, tokens: int, total_gib: float, gpu: bool) -> dict[str, float]:
    """GiB per item of this step's predicted peak (module docstring), on a device of `total_gib` GiB."""
    from common.batching import activation_bytes_per_token
    from common.preflight import preflight_memory

    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        plan = preflight_memory(
            d, mode="single", world=1, precision="auto", reference_model=False, vllm_utilization=0.0,
            total_gib=total_gib,
        )  # fmt: skip
    chunk = GPU_CHUNK_BYTES if gpu else CHUNK_BYTES
    return {
        "training state (preflight)": plan["training state"],
        "margin (preflight)": plan["margin"],
        "activations (estimate)": activation_bytes_per_token(config, 2, checkpointing=True) * tokens / 2**30,
        "log-prob path (4 chunks)": 4 * chunk / 2**30,
    }


def time_path(model, optimizer, path, ids, attn, K: int, repeats: int, gpu: bool) -> dict:
    """One log-prob path's step: mean time of `repeats` steps after a warm-up, and the peak memory."""
    device = ids.device.type
    if gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
            logp = path(model, ids, attn, K)
        F.mse_loss(logp, torch.zeros_like(logp)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step = sum(times[1:]) / len(times[1:])
    return {"step_s": step, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else None}


def measure(size: str, prompt: int, completion: int, batch: int, repeats: int) -> dict:
    """Both paths' figures at `size`'s shape, with the MFU and the predicted peak."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    config = Qwen2Config(**(QWEN25_MATH_15B if size != "tiny" else TINY))
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it trains: no host copy of 6 GB of weights
        model = Qwen2ForCausalLM(config)  # fp32 master weights
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)  # as the scripts build it (foreach on CUDA)
    ids = torch.randint(0, config.vocab_size, (batch, prompt + completion), device=device)
    attn = torch.ones_like(ids)
    tokens = batch * (prompt + completion)
    name = torch.cuda.get_device_name() if gpu else None
    peak = peak_bf16_flops(name)
    flops = model_flops(config, batch, prompt + completion, completion)
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if gpu else STATED_GIB
    out = {
        "size": size, "device": name or "cpu", "parameters": sum(p.numel() for p in model.parameters()),
        "batch": batch, "prompt": prompt, "completion": completion, "tokens": tokens, "model_flops": flops,
        "peak_flops": peak, "device_gib": total_gib, "paths": {},
        "predicted_gib": predicted_memory(config, tokens, total_gib, gpu),
    }  # fmt: skip
    for label, path in [("textbook (full logits)", textbook), ("chunked head (the scripts')", chunked)]:
        try:
            figures = time_path(model, optimizer, path, ids, attn, completion, repeats, gpu)
        except torch.OutOfMemoryError:
            figures = {"step_s": None, "peak_gib": None, "error": "out of memory"}
            optimizer.zero_grad(set_to_none=True)
        step = figures["step_s"]
        figures["tokens_per_s"] = tokens / step if step else None
        figures["mfu"] = flops / step / peak if step and peak else None
        out["paths"][label] = figures
    return out


def findings(r: dict) -> dict:
    """`measure`'s result as the first GPU run reports a part (benchmarks/findings.py's record)."""
    from findings import Findings

    f = Findings()
    f.figure(
        "shape",
        f"{r['size']}: {r['parameters'] / 1e9:.3f}B parameters, {r['batch']} x ({r['prompt']} + {r['completion']}) tokens",
    )
    f.figure("device", r["device"])
    f.figure("model TFLOPs a step (6 N S + 6 V D K + 12 L D S^2, per sequence)", r["model_flops"] / 1e12)
    f.figure("peak dense bf16 TFLOP/s of the device", r["peak_flops"] / 1e12 if r["peak_flops"] else None)
    for label, p in r["paths"].items():
        f.figure(label, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in p.items()})
    predicted = r["predicted_gib"]
    for k, v in predicted.items():
        f.figure(f"predicted GiB: {k}", v)
    f.figure("predicted GiB, total", sum(predicted.values()))
    chunked = r["paths"]["chunked head (the scripts')"]
    f.check("the chunked head's step ran", chunked["step_s"] is not None, chunked.get("error", ""))
    if chunked["peak_gib"] is not None:
        ratio = chunked["peak_gib"] / sum(predicted.values())
        f.figure("measured / predicted peak (chunked head)", ratio)
        f.check(
            "the preflight's plan plus the activation estimate holds the measured peak", ratio <= 1.0, f"{ratio:.2f}"
        )
    return f.record()


def print_figures(r: dict) -> None:
    print(
        f"{r['size']}: {r['parameters'] / 1e9:.2f}B parameters, {r['batch']} x ({r['prompt']} + {r['completion']}) "
        f"tokens, {r['device']}; {r['model_flops'] / 1e12:.1f} model TFLOPs a step\n"
    )
    print("| log-prob path | peak memory GiB | step s | tokens/s | MFU |\n|---|---|---|---|---|")
    fmt = lambda v, spec: "-" if v is None else format(v, spec)
    for label, f in r["paths"].items():
        peak = f.get("error") or fmt(f["peak_gib"], ".1f")
        print(
            f"| {label} | {peak} | {fmt(f['step_s'], '.2f')} | {fmt(f['tokens_per_s'], ',.0f')} | {fmt(f['mfu'], '.1%')} |"
        )
    predicted = r["predicted_gib"]
    items = " + ".join(f"{v:.2f} {k}" for k, v in predicted.items())
    print(f"\npredicted peak of the chunked head's step: {sum(predicted.values()):.1f} GiB ({items})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="qwen2.5-math-1.5b", choices=["qwen2.5-math-1.5b", "tiny"])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--completion", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args()
    if a.size == "tiny":
        a.prompt, a.completion = min(a.prompt, 32), min(a.completion, 96)
    result = measure(a.size, a.prompt, a.completion, a.batch, a.repeats)
    print_figures(result)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
