"""Two parts of gpu_check/first_run.py, on the device there is:

- "cuda_lines": each line docs/SCALING.md lists as needing CUDA that runs outside the scripts' step, called
  as the code calls it: `device_memory_bytes`, `peak_memory_gb`, `_device_memory` and the chunk rows it
  gives, the pinned non-blocking copy of `to_device` and the shared-prompt and padding-free layouts that
  `select` builds with it (under the sync detector: neither may make the host wait);
- "logp_gap": the trainer-vs-engine log-prob gap of the demo model in the GPU's precision, per sampled
  token: the engine of `--rollout hf` (the policy itself, under the trainer's bf16 autocast) and a bf16
  copy of the weights (as vLLM samples), each scored by the trainer (fp32 weights, bf16 autocast) as
  `old_logprobs` scores, in the padded and the shared-prompt layout.

`dry`: toy sizes, for the CPU dry run.
"""

import torch

from gpu_check.report import Findings


def memory_lines(f: Findings, device) -> None:
    """`device_memory_bytes`, `device_memory_gib`, `peak_memory_gb`, `_device_memory` and `head_chunk_rows`."""
    from common.batching import device_memory_bytes, device_memory_gib
    from common.distributed import peak_memory_gb
    from common.logprobs import GPU_CHUNK_BYTES, _device_memory, head_chunk_rows

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
    from common.batching import Packed, SharedPrefix, select, to_device
    from gpu_check.kernels import grouped_batch
    from gpu_check.sync_guard import SyncLog

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
    whether that layout ran (`select` falls back to padded where "shared" would not compute less)."""
    from common.batching import SharedPrefix, select
    from common.logprobs import sequence_logprobs

    rows = list(range(len(batch["input_ids"])))
    mb = select(batch, rows, layout)
    C = mb["completion_mask"].shape[1]
    with torch.no_grad():
        logp, _ = sequence_logprobs(
            policy, mb["input_ids"], mb["attention_mask"], 1.0, logits_to_keep=C, layout=mb["layout"]
        )
    return logp, isinstance(mb["layout"], SharedPrefix) == (layout == "shared")


def gap_figures(f: Findings, label: str, engine, policy, prompts: list, G: int, max_tokens: int, pad: int) -> None:
    """Sample G completions a prompt with `engine`, score them with `policy`; |trainer - engine| per token."""
    from common.batching import pack

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
        f.figure(
            f"{label}, {layout}: |gap| per token",
            {"tokens": gap.numel()} | {k: float(f"{v.item():.4g}") for k, v in stats.items()},
        )
        f.check(f"{label}, {layout}: every gap finite", bool(gap.isfinite().all()) and gap.numel() > 0)
        if device.type == "cpu":  # fp32 on both sides: they must agree
            f.check(f"{label}, {layout}: fp32 engine and trainer agree (mean < 1e-4)", gap.mean().item() < 1e-4)


def logp_gap(dry: bool) -> Findings:
    """The demo model's gap (module docstring), 64 prompts x 2 completions of up to 48 tokens (dry: 8 x 2 x 16):
    2 a prompt, so that the shared-prompt layout computes less than the padded one and runs (as in the scripts'
    parts, gpu_check/first_run.py)."""
    from transformers import AutoTokenizer

    from common.distributed import make_accelerator
    from common.models import demo_model_dir, load_policy, precision_for
    from common.prompts import format_prompt
    from common.rollout import make_engine
    from common.synthetic import synthetic_eval_set

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
    # Not a random-weight Qwen2: its logits are near zero (init std 0.02), so bf16 rounds them little.
    return f
