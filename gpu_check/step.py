"""The part "gpu_step" of gpu_check/first_run.py: one update micro-batch at Qwen2.5-Math-1.5B's shape (random
weights; 4 x (512 + 4,096) tokens), trained as the scripts train (bf16 autocast over fp32 weights, gradient
checkpointing, fused AdamW), for the textbook log-prob path and the chunked head: step time, tokens/s, MFU, and
each phase's peak memory, checked on a GPU against `benchmarks/memory.py` `update_phases` with no margin.

MFU (nanoGPT's `estimate_mfu`, after PaLM, arXiv 2204.02311, appendix B): model FLOPs 6 N S (body) + 6 V D K
(output layer, K scored tokens) + 12 L D S^2 (attention) a sequence, over the step's time over the GPU's peak dense
bf16 FLOP/s (NVIDIA's datasheets, half the "with sparsity" figures; PEAK_BF16); checkpointing's recompute uncounted.
"""

import contextlib
import tempfile
import time

import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM

from benchmarks.memory import AllocationTracker, update_phases
from common.logprobs import head_chunk_rows, sequence_logprobs
from common.models import autocast_options, optimizer_options, preflight_memory
from gpu_check.report import Findings

# Qwen2.5-Math-1.5B's config.json (the fields that set the shape).
QWEN25_MATH_15B = dict(
    vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, max_position_embeddings=4096, rope_theta=10_000.0, tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(
    vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
)  # fmt: skip
# The first name the device's contains wins: variants (NVL, PCIe) before the plain name ("H200 NVL" contains "H200").
PEAK_BF16 = [("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200 NVL", 835e12), ("H200", 989e12)]
STATED_GIB = 79.2  # the device the prediction is made for where no GPU is: an 80 GB GPU, as tests/test_preflight.py


def textbook(model, ids, attn, K):
    logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=K + 1).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -K:, None]).squeeze(-1)


def chunked(model, ids, attn, K):
    return sequence_logprobs(model, ids, attn, 1.0, logits_to_keep=K)[0]


def model_flops(config, parameters: int, batch: int, seq: int, scored: int) -> float:
    """Model FLOPs of one forward + backward, `batch` sequences of `seq` tokens, `scored` each (module docstring)."""
    V, D, L = config.vocab_size, config.hidden_size, config.num_hidden_layers
    body = parameters - V * D  # the embedding table is a lookup; a tied output layer is counted below
    return batch * (6 * body * seq + 6 * V * D * scored + 12 * L * D * seq**2)


def peak_bf16_flops(device_name: str | None) -> float | None:
    """The GPU's peak dense bf16 FLOP/s from its name, or None (an unknown GPU, or none)."""
    for key, flops in PEAK_BF16:
        if device_name and key in device_name:
            return flops
    return None


def predicted_memory(config, parameters: int, batch: int, prompt: int, completion: int, total_gib: float, device):
    """(the preflight's plan, GiB per term of each phase of this step), on a device of `total_gib` GiB."""
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        plan = preflight_memory(
            d, mode="single", world=1, precision="bf16-mixed", reference_model=False, vllm_utilization=0.0,
            total_gib=total_gib,
        )  # fmt: skip
    rows = head_chunk_rows(config.vocab_size, device.type, int(total_gib * 2**30) if device.type == "cuda" else 0)
    phases = update_phases(
        parameters, config, batch * (prompt + completion), mode="single", world=1, precision="bf16-mixed",
        chunk_rows=rows, scored=batch * completion, autocast_cache=autocast_options()["cache_enabled"],
        fused_adamw=optimizer_options("cuda").get("fused", False),
    )  # fmt: skip
    return plan, phases


class Meter:
    """Peak GiB allocated since the last `lap`: CUDA's allocator counter, or on CPU the `AllocationTracker` given,
    entered before the model is made (so both count the weights, gradients and optimiser state)."""

    def __init__(self, tracker: AllocationTracker | None):
        self.tracker, self.gpu = tracker, tracker is None

    def lap(self) -> float:
        if self.gpu:
            peak = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
            return peak
        peak, self.tracker.peak = self.tracker.peak, self.tracker.live
        return peak / 2**30


def one_step(model, optimizer, path, ids, attn, K: int, meter: Meter) -> dict[str, float]:
    """One forward + backward + optimiser step and each phase's peak GiB: a phase of the backward ends when the
    output it runs back to has its gradient."""
    peaks = {}

    def ends(phase: str, module):
        def on_grad(grad):
            peaks[phase] = meter.lap()

        def on_forward(m, inputs, out):
            out.register_hook(on_grad)

        return module.register_forward_hook(on_forward)

    hooks = [ends("output layer's backward", model.model.norm), ends("layers' backward", model.model.embed_tokens)]
    meter.lap()
    try:
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, **autocast_options()):
            logp = path(model, ids, attn, K)
        peaks["forward"] = meter.lap()
        F.mse_loss(logp, torch.zeros_like(logp)).backward()
    finally:
        for h in hooks:
            h.remove()
    del logp
    peaks["embedding's backward"] = meter.lap()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)  # kept, as DDP's buckets and an accumulation keep them
    peaks["optimiser step"] = meter.lap()
    return peaks


def time_path(model, optimizer, path, ids, attn, K: int, repeats: int, meter: Meter) -> dict:
    """One log-prob path's step: mean time of `repeats` steps after a warm-up, the peak memory of the step and of
    each phase (the largest over the timed steps)."""
    sync = torch.cuda.synchronize if meter.gpu else lambda: None
    if meter.gpu:
        torch.cuda.empty_cache()
    times, phases = [], {}
    for i in range(repeats + 1):  # the first is a warm-up (AdamW's state is made at its step)
        sync()
        t0 = time.perf_counter()
        peaks = one_step(model, optimizer, path, ids, attn, K, meter)
        sync()
        times.append(time.perf_counter() - t0)
        if i:
            phases = {k: max(v, phases.get(k, 0.0)) for k, v in peaks.items()}
    step = sum(times[1:]) / len(times[1:])
    return {"step_s": step, "peak_gib": max(phases.values()), "phases_gib": phases}


def measure(size: str, prompt: int, completion: int, batch: int, repeats: int) -> dict:
    """Both paths' figures at `size`'s shape, with the MFU and the predicted phases."""
    gpu = torch.cuda.is_available()
    with contextlib.nullcontext() if gpu else AllocationTracker() as tracker:  # it must see the model made
        return _measure(size, prompt, completion, batch, repeats, Meter(tracker))


def _measure(size: str, prompt: int, completion: int, batch: int, repeats: int, meter: Meter) -> dict:
    device = torch.device("cuda" if meter.gpu else "cpu")
    config = Qwen2Config(**(QWEN25_MATH_15B if size != "tiny" else TINY))
    torch.manual_seed(0)
    with device:  # initialised where it trains: no host copy of 6 GB of weights
        model = Qwen2ForCausalLM(config)  # fp32 master weights
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, **optimizer_options("cuda"))  # the GPU's, anywhere
    ids = torch.randint(0, config.vocab_size, (batch, prompt + completion), device=device)
    attn = torch.ones_like(ids)
    tokens = batch * (prompt + completion)
    name = torch.cuda.get_device_name() if meter.gpu else None
    peak = peak_bf16_flops(name)
    parameters = sum(p.numel() for p in model.parameters())
    flops = model_flops(config, parameters, batch, prompt + completion, completion)
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if meter.gpu else STATED_GIB
    plan, phases = predicted_memory(config, parameters, batch, prompt, completion, total_gib, device)
    out = {
        "size": size, "device": name or "cpu", "parameters": parameters, "batch": batch, "prompt": prompt,
        "completion": completion, "tokens": tokens, "model_flops": flops, "peak_flops": peak, "device_gib": total_gib,
        "paths": {}, "preflight_gib": plan, "predicted_phases_gib": phases,
    }  # fmt: skip
    for label, path in [("textbook (full logits)", textbook), ("chunked head (the scripts')", chunked)]:
        try:
            figures = time_path(model, optimizer, path, ids, attn, completion, repeats, meter)
        except torch.OutOfMemoryError:
            figures = {"step_s": None, "peak_gib": None, "phases_gib": {}, "error": "out of memory"}
            optimizer.zero_grad(set_to_none=False)
        step = figures["step_s"]
        figures["tokens_per_s"] = tokens / step if step else None
        figures["mfu"] = flops / step / peak if step and peak else None
        out["paths"][label] = figures
    return out


def findings(r: dict) -> Findings:
    f = Findings()
    f.figure(
        "shape",
        f"{r['size']}: {r['parameters'] / 1e9:.3f}B parameters, {r['batch']} x ({r['prompt']} + {r['completion']}) tokens",
    )
    f.figure("device", r["device"])
    f.figure("model TFLOPs a step (6 N S + 6 V D K + 12 L D S^2, per sequence)", r["model_flops"] / 1e12)
    f.figure("peak dense bf16 TFLOP/s of the device", r["peak_flops"] / 1e12 if r["peak_flops"] else None)
    for label, p in r["paths"].items():
        f.figure(label, _rounded(p))
    f.figure("predicted GiB: training state (preflight)", r["preflight_gib"]["training state"])
    chunked = r["paths"]["chunked head (the scripts')"]
    f.check("the chunked head's step ran", chunked["step_s"] is not None, chunked.get("error", ""))
    rows = []
    for phase, terms in r["predicted_phases_gib"].items():
        predicted, measured = sum(terms.values()), chunked["phases_gib"].get(phase)
        f.figure(f"predicted GiB: {phase}", _rounded(terms))
        ratio = None if measured is None else measured / predicted
        rows.append([phase, measured, predicted, ratio])
        # No margin: a term the plan leaves out shows here. Checked on a GPU only, the device the terms are for: a
        # CPU's kernels allocate otherwise (attention, the embedding's backward) and a toy's constant terms dominate.
        if ratio is not None and r["device"] != "cpu":
            f.check(f"the {phase}'s measured peak is within its predicted terms", ratio <= 1.0, f"{ratio:.2f}")
    f.table("chunked head: each phase's peak (GiB)", ["phase", "measured", "predicted", "measured / predicted"], rows)
    return f


def _rounded(figures):
    """Floats to 4 significant digits, in nested dicts too."""
    if isinstance(figures, dict):
        return {k: _rounded(v) for k, v in figures.items()}
    return float(f"{figures:.4g}") if isinstance(figures, float) else figures


def run(dry: bool) -> Findings:
    """The part's findings: the toy shape in the dry run, Qwen2.5-Math-1.5B's otherwise."""
    return findings(measure("tiny", 32, 96, 4, 1) if dry else measure("qwen2.5-math-1.5b", 512, 4096, 4, 3))
