"""Memory preflight: refuse, before any weight loads, a plan whose resident memory cannot fit a GPU; else it would
train one step and die at vLLM's next wake-up, beside AdamW's state. Resident on each GPU (docs/SCALING.md "Per-GPU
budget"): the training state, the bf16 reference model, vLLM's share (the whole model: colocated, no tensor
parallelism; it must hold `vllm_floor` and one `max_model_len` sequence) and `MARGIN_GIB`, a floor, not a promise.
The update's own peak is estimated phase by phase in benchmarks/memory.py (`update_phases`)."""

import contextlib
import math
from dataclasses import asdict, dataclass

GIB = 2**30
MARGIN_GIB = 2.0
KV_BLOCK = 16  # tokens per KV page: vLLM 0.32's default (vllm/config/cache.py DEFAULT_BLOCK_SIZE)
# vLLM subtracts the CUDA graphs it captures from the KV cache, measured by capturing, which no config predicts:
# an allowance, with the buffers outside torch (cuBLAS, attention workspaces); not measured here.
CUDA_GRAPHS_GIB = 1.0


def bytes_per_parameter(mode: str, world: int, precision: str) -> float:
    """Training-state bytes per policy parameter on one GPU (`mode`: `common.distributed.parallel_mode`'s).
    torch AdamW: weights, gradients, both moments in the weights' dtype, whole or over `world` (FSDP2). DeepSpeed
    in bf16: bf16 weights (whole under ZeRO-2) beside sharded fp32 master weights, gradients and moments."""
    if mode in ("single", "ddp"):
        return 8.0 if precision == "bf16" else 16.0
    if mode == "fsdp2":
        return (8.0 if precision == "bf16" else 16.0) / world
    if mode not in ("zero2", "zero3"):
        raise ValueError(f"unknown parallel mode {mode!r}")
    weights, sharded = (4.0, 12.0) if precision == "fp32" else (2.0, 16.0)
    return (weights if mode == "zero2" else weights / world) + sharded / world


@dataclass(frozen=True)
class ModelShape:
    """What vLLM's memory depends on besides the parameter count. `mlp`: values per token its MLP holds at once
    (dense: 3 I; MoE: fused_moe's caches, top-k x (max(2 I_e, D) + I_e)); `context`: max_position_embeddings."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    mlp: int
    context: int


def model_shape(config) -> ModelShape:
    """`ModelShape` of a transformers config (or anything with its attributes)."""
    heads, hidden = config.num_attention_heads, config.hidden_size
    experts = getattr(config, "num_experts_per_tok", 0) or 0
    if experts:
        inner = config.moe_intermediate_size
        mlp = experts * (max(2 * inner, hidden) + inner)
    else:
        mlp = 3 * config.intermediate_size
    return ModelShape(
        layers=config.num_hidden_layers, hidden=hidden, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or hidden // heads, vocab=config.vocab_size, mlp=mlp,
        context=config.max_position_embeddings,
    )  # fmt: skip


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """K and V of every layer for one token (vLLM's FullAttentionSpec page over its block size)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes


def vllm_batch(
    total_gib: float, max_model_len: int, max_num_seqs: int | None, max_num_batched_tokens: int | None
) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM 0.32 runs with: the given ones, else its offline defaults
    (vllm/engine/arg_utils.py `get_batch_defaults`; on an 80 GB A100, told by its name, the estimate is high)."""
    seqs, tokens = (1024, 16384) if total_gib >= 70 else (256, 8192)
    seqs = max_num_seqs or seqs
    return seqs, max_num_batched_tokens or min(tokens, seqs * max_model_len)


def vllm_activation_bytes(shape: ModelShape, dtype_bytes: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """An estimate from the config of the peak of vLLM's profile run above its weights (gpu_model_runner.py
    `profile_run`), the larger of: the forward of T = `max_num_batched_tokens` tokens (3 D per token beside the
    wider of attention and the MLP), and the sampler's [N, V] logits, their fp32 copy, processed log-probs,
    probabilities and noise for N = min(max_num_seqs, T) (`_dummy_sampler_run`)."""
    attention = (2 * shape.heads + 2 * shape.kv_heads) * shape.head_dim
    forward = max_num_batched_tokens * (3 * shape.hidden + max(attention, shape.mlp)) * dtype_bytes
    rows = min(max_num_seqs, max_num_batched_tokens)
    per_logit = dtype_bytes + (0 if dtype_bytes == 4 else 4) + 3 * 4
    sampler = rows * shape.vocab * per_logit + max_num_batched_tokens * shape.hidden * dtype_bytes
    return max(forward, sampler)


def vllm_floor(
    parameters: int, shape: ModelShape, *, precision: str, total_gib: float, max_model_len: int | None = None,
    max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
) -> dict[str, float]:  # fmt: skip
    """GiB per part of what vLLM's share must hold before it starts: weights, profile-run activations, the KV of one
    `max_model_len` sequence (None: the model's context, what vLLM takes untold), CUDA graphs."""
    dtype_bytes = 4 if precision == "fp32" else 2
    max_model_len = max_model_len or shape.context
    seqs, tokens = vllm_batch(total_gib, max_model_len, max_num_seqs, max_num_batched_tokens)
    blocks = math.ceil(max_model_len / KV_BLOCK)
    return {
        "weights": parameters * dtype_bytes / GIB,
        "activations": vllm_activation_bytes(shape, dtype_bytes, seqs, tokens) / GIB,
        "one sequence's KV": blocks * KV_BLOCK * kv_bytes_per_token(shape, dtype_bytes) / GIB,
        "CUDA graphs": CUDA_GRAPHS_GIB,
    }


def check_plan(
    parameters: int, *, mode: str, world: int, precision: str, reference_model: bool, vllm_utilization: float,
    total_gib: float, vllm_floor: dict[str, float], margin_gib: float = MARGIN_GIB,
) -> dict[str, float]:  # fmt: skip
    """GiB per item resident on one GPU at the rollout after the first optimiser step (`vllm_utilization`: 0
    without vLLM). Stop with the figures and the fix if vLLM's share cannot hold its floor or the items exceed
    `total_gib`."""
    plan = {
        "training state": parameters * bytes_per_parameter(mode, world, precision) / GIB,
        "reference model": parameters * 2 / GIB if reference_model else 0.0,
        "vLLM": vllm_utilization * total_gib,
        "margin": margin_gib,
    }
    floor = sum(vllm_floor.values())
    if vllm_utilization and plan["vLLM"] < floor:
        parts = " + ".join(f"{v:.1f} {k}" for k, v in vllm_floor.items())
        raise SystemExit(
            f"error: memory: vLLM's share of each GPU, {plan['vLLM']:.1f} GiB (--vllm_gpu_memory_utilization "
            f"{vllm_utilization} x {total_gib:.1f}), cannot hold what it needs before its KV cache, {floor:.1f} GiB "
            f"({parts}; vLLM would stop after the policy loads): raise it to at least "
            f"{math.ceil(100 * floor / total_gib) / 100:.2f} (the rest is its KV cache), shorten --max_prompt_len + "
            "--max_completion_len, or use GPUs with more memory"
        )
    need = sum(plan.values())
    if need <= total_gib:
        return plan
    items = " + ".join(f"{v:.1f} {k}" for k, v in plan.items() if v)
    where = f"{mode} over {world} GPUs" if world > 1 else mode
    fixes = []
    room = total_gib - (need - plan["vLLM"])  # what vLLM could take with everything else in place
    if plan["vLLM"] and room >= floor and room / total_gib >= 0.1:
        fixes.append(f"lower --vllm_gpu_memory_utilization to {math.floor(100 * room / total_gib) / 100:.2f}")
    if reference_model:
        fixes.append("--beta 0 (no reference model)")
    if mode in ("single", "ddp", "zero2"):
        fixes.append("shard the model (configs/accelerate/zero3.yaml or fsdp2.yaml)")
    else:
        fixes.append("more GPUs to shard over")
    raise SystemExit(
        f"error: memory: each GPU would hold {need:.1f} GiB of its {total_gib:.1f} ({items}; {where}, "
        f"{parameters / 1e9:.2f}B parameters, --precision {precision}): {', or '.join(fixes)}"
    )


def model_config(model_path: str) -> tuple:
    """(config, parameter count) from config.json alone, built on the meta device; tied embeddings count once."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with _without_zero3_init(), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return config, sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _without_zero3_init():
    """transformers' ZeRO-3 hook off for the block. While accelerate's stage-3 HfDeepSpeedConfig lives,
    `from_config` builds inside deepspeed.zero.Init: on the meta device it stops on "Cannot copy out of meta
    tensor", and partitioned parameters would report numel() == 0."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref  # a weakref to the live config, or None
    live = ref() if ref is not None else None
    if live is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(live)


def preflight_memory(
    model_path: str, *, mode: str, world: int, precision: str, reference_model: bool, vllm_utilization: float,
    total_gib: float | None, max_model_len: int | None = None, max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict[str, float] | None:  # fmt: skip
    """The session's check before the policy loads (`check_plan` with the model's size and vLLM's floor) on a GPU
    of `total_gib` GiB; None: CPU, not planned. The last three: vLLM's (None: its own). Returns the plan or None."""
    if total_gib is None:
        return None
    config, parameters = model_config(model_path)
    floor = vllm_floor(
        parameters, model_shape(config), precision=precision, total_gib=total_gib, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
    )  # fmt: skip
    return check_plan(
        parameters, mode=mode, world=world, precision=precision, reference_model=reference_model,
        vllm_utilization=vllm_utilization, total_gib=total_gib, vllm_floor=floor,
    )  # fmt: skip


def check_memory(
    run, model_path: str, mode, reference_model: bool, device_gib: float | None, engine_size=None
):  # fmt: skip
    """`preflight_memory` of this run's flags (`common.run_flags.RunFlags`) under `mode`
    (`common.distributed.ParallelMode`; `engine_size` None: vLLM's defaults, which err high), after the one layout
    no memory makes work. Returns the plan (GiB per item) or None."""
    if reference_model and mode.kind == "zero3":
        raise SystemExit(
            "error: --beta > 0 under DeepSpeed ZeRO-3: the reference model would be partitioned and never wrapped; "
            "use configs/accelerate/fsdp2.yaml (the reference model is then loaded whole on each GPU) or --beta 0"
        )
    return preflight_memory(
        model_path, mode=mode.kind, world=mode.world, precision=run.precision, reference_model=reference_model,
        vllm_utilization=run.vllm_gpu_memory_utilization if run.rollout == "vllm" else 0.0, total_gib=device_gib,
        **(asdict(engine_size) if engine_size is not None else {}),
    )  # fmt: skip
