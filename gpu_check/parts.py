"""Two parts of gpu_check/first_run.py: "cuda_lines", the lines outside the step that docs/SCALING.md lists as
needing CUDA (memory reads, chunk rows, `to_device` and `select` without a host sync); "logp_gap", the demo
model's trainer-vs-engine log-prob gap per sampled token in the GPU's precision. `dry`: toy sizes (CPU)."""

import torch

from common.batching import Packed, SharedPrefix, device_memory_bytes, device_memory_gib, pack, select, to_device
from common.logprobs import GPU_CHUNK_BYTES, _device_memory, head_chunk_rows
from common.metrics import peak_memory_gb
from common.trainer import make_accelerator
from gpu_check.kernels import grouped_batch
from gpu_check.report import Findings
from gpu_check.sync_guard import SyncLog


def memory_lines(f: Findings, device) -> None:
    """`device_memory_bytes`, `device_memory_gib`, `peak_memory_gb`, `_device_memory` and `head_chunk_rows`."""
    cuda = device.type == "cuda"
    total = device_memory_bytes()
    f.figure("`device_memory_bytes()`", total)
    f.figure("`device_memory_gib(gpu)` (the preflight's device)", device_memory_gib(cuda))
    block = torch.empty(2**28, dtype=torch.uint8, device=device)  # 256 MiB
    f.figure("`peak_memory_gb()` after a 256 MiB allocation", peak_memory_gb())
    memory = _device_memory(device)
    rows = head_chunk_rows(151_936, device.type, memory)
    f.figure("`_device_memory(device)`", memory)
    f.figure("`head_chunk_rows(151,936, ...)`", rows)
    del block
    if cuda:
        reported = torch.cuda.mem_get_info()[1]  # the driver's total, asked another way
        f.check("`device_memory_bytes` is the GPU's total memory", abs(total - reported) <= reported / 100, reported)
        f.check("`peak_memory_gb` counts the allocation", peak_memory_gb() >= 0.25, peak_memory_gb())
        want = min(GPU_CHUNK_BYTES, memory // 128) // (4 * 151_936)
        f.check(
            "`head_chunk_rows` takes the GPU's budget from `_device_memory`", memory == total and rows == want, rows
        )


def copies_without_sync(f: Findings, device) -> None:
    """`to_device`'s pinned, non-blocking copy and the layouts `select` builds with it, under the sync detector."""
    cuda = device.type == "cuda"
    log = SyncLog(cuda)
    host = torch.arange(1 << 20, dtype=torch.long)
    batch, rows = grouped_batch(1024, device)
    with log.watch("to_device"):
        moved = to_device(host, device)
    with log.watch("select"):
        shared, packed = select(batch, rows, "shared"), select(batch, rows, "packed")
    f.check("`to_device` copies the tensor", torch.equal(moved.cpu(), host) and moved.device.type == device.type)
    f.check("`select` built the shared-prompt and packed layouts",
            isinstance(shared["layout"], SharedPrefix) and isinstance(packed["layout"], Packed))  # fmt: skip
    record = log.record()
    f.figure("host syncs in `to_device` and `select` (shared, packed)", record["by_kind"] or "none")
    f.figure("sync detector", record["detector"])
    for r in record["syncs"]:
        f.note(f"sync in {r['phase']}: {r['kind']} at {r['where']} x {r['count']}")
    if cuda:
        f.check("no host sync in `to_device` or `select`", not record["syncs"], record["syncs"])


def cuda_lines(dry: bool) -> Findings:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    f = Findings()
    f.attempt("memory lines", memory_lines, device)
    f.attempt("copies without sync", copies_without_sync, device)
    return f


def _trainer_logp(policy, batch: dict, layout: str) -> tuple[torch.Tensor, bool]:
    """pi_old's log-probs [N, C] as `old_logprobs` computes them, all rows in one micro-batch of `layout`, and
    whether that layout ran (`select` falls back to padded where it would not compute less)."""
    from common.logprobs import sequence_logprobs  # looked up here: tests/test_gpu_first_run.py records its calls

    rows = list(range(len(batch["input_ids"])))
    mb = select(batch, rows, layout)
    C = mb["completion_mask"].shape[1]
    with torch.no_grad():
        logp, _ = sequence_logprobs(policy, mb["input_ids"], mb["attention_mask"], 1.0, C, layout=mb["layout"])
    return logp, isinstance(mb["layout"], SharedPrefix) == (layout == "shared")


def gap_figures(f: Findings, label: str, engine, policy, prompts: list, G: int, max_tokens: int, pad: int) -> None:
    """Sample G completions a prompt with `engine`, score them with `policy`; |trainer - engine| per token."""
    groups = engine.generate(prompts, G, max_tokens, 1.0, seed=list(range(len(prompts))))
    completions = [c for g in groups for c in g]
    device = next(policy.parameters()).device
    batch = pack([p for p in prompts for _ in range(G)], completions, pad, device)
    mask = batch["completion_mask"].bool() & batch["rollout_logp"].isfinite()
    for layout in ("padded", "shared"):
        logp, ran = _trainer_logp(policy, batch, layout)
        f.check(f"{label}, {layout}: the {layout} layout ran", ran)
        gap = (logp - batch["rollout_logp"])[mask].abs().double()
        stats = {"mean": gap.mean(), "p99": gap.quantile(0.99), "max": gap.max()}
        stats = {"tokens": gap.numel()} | {k: float(f"{v.item():.4g}") for k, v in stats.items()}
        f.figure(f"{label}, {layout}: |gap| per token", stats)
        f.check(f"{label}, {layout}: every gap finite", bool(gap.isfinite().all()) and gap.numel() > 0)
        if device.type == "cpu":  # fp32 on both sides: they must agree
            f.check(f"{label}, {layout}: fp32 engine and trainer agree (mean < 1e-4)", gap.mean().item() < 1e-4)


def logp_gap(dry: bool) -> Findings:
    """The gap of `--rollout hf`'s engine (the policy) and of a bf16 weights copy (as vLLM samples), each scored as
    `old_logprobs` scores, 64 prompts x 2 completions of <= 48 tokens (dry: 8 x 2 x 16): at G = 2 the shared-prompt
    layout computes less and runs (gpu_check/first_run.py `command`). The demo model, not a random Qwen2: random
    logits are near zero, and bf16 rounds them little."""
    from transformers import AutoTokenizer

    from common.math_data import synthetic_eval_set
    from common.models import demo_model_dir, load_policy, precision_for
    from common.prompts import format_prompt
    from common.rollout import make_engine

    f = Findings()
    gpu = torch.cuda.is_available()
    precision = precision_for("auto", gpu)
    f.figure("precision", precision.record())
    path = str(demo_model_dir())
    accelerator = make_accelerator(precision.mixed)
    policy = accelerator.prepare(load_policy(path, precision.policy))  # fp32 weights; its forward autocasts on GPU
    tokenizer = AutoTokenizer.from_pretrained(path)
    n, G, max_tokens = (8, 2, 16) if dry else (64, 2, 48)
    prompts = [
        tokenizer(format_prompt(r["problem"]), add_special_tokens=False).input_ids for r in synthetic_eval_set()[:n]
    ]
    engines = [
        ("--rollout hf (the policy, bf16 autocast)" if gpu else "--rollout hf (the policy, fp32)",
         accelerator.unwrap_model(policy)),  # what the session hands the HF engine
        (f"{precision.engine} weights copy (as vLLM)", None),  # make_engine loads it onto the device
    ]  # fmt: skip
    for label, model in engines:
        engine = make_engine("hf", path, tokenizer, model, max_model_len=512, dtype=precision.engine)
        f.attempt(label, gap_figures, label, engine, policy, prompts, G, max_tokens, tokenizer.pad_token_id)
    return f
