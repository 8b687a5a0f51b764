"""Memory preflight: refuse, before any weight loads, a plan whose resident memory cannot fit a GPU.

Why before: vLLM measures free memory once, at start-up, and takes `--vllm_gpu_memory_utilization`
x the GPU's total; torch's AdamW allocates its state at the first optimiser step. A plan that does
not fit therefore starts, samples, trains one step, and dies at the next wake-up of vLLM (after
minutes of loading at 7B). What is resident on each GPU then, per parameter P of the policy:

- the training state: weights + gradients + AdamW's two moments, whole or sharded as the parallel
  mode says (docs/SCALING.md "Per-GPU budget"); `bytes_per_parameter` below;
- the reference model (`--beta > 0`): bf16, whole on every GPU (2 P);
- vLLM's share: utilisation x the GPU's total (its weights and KV cache; released during the update
  with `--vllm_sleep`, but taken back at the next rollout, beside the optimiser state); it must hold
  the whole model, as each rank's vLLM is colocated with no tensor parallelism;
- a margin for the CUDA context, workspaces and a checkpointed micro-batch's activations
  (`MARGIN_GIB`, a floor: the check refuses what cannot fit, it does not promise what will).

The update's own peak, beyond the state (activations, the output layer's buffers, the optimiser step's temporaries),
is not in the check (the margin is its floor); `update_phases` plans it phase by phase (docs/SCALING.md "Per-GPU
budget").

vLLM's share must also hold what vLLM 0.32 takes before its KV cache (`vllm_floor`): it sizes the cache
as share x total - (weights + the peak of its profile run's activations + non-torch memory) - its CUDA
graphs (vllm/v1/worker/gpu_worker.py `determine_available_memory`, vllm/utils/mem_utils.py
`memory_profiling`), then raises unless the cache holds one `max_model_len` sequence
(vllm/v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory`), after the policy has loaded.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

GIB = 2**30
MARGIN_GIB = 2.0
KV_BLOCK = 16  # tokens per KV page: vLLM 0.32's default (vllm/config/cache.py DEFAULT_BLOCK_SIZE)
# vLLM subtracts the CUDA graphs it captures from the KV cache (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, its
# default): it measures them by capturing, which no config predicts. The project's allowance, with the buffers
# outside torch (cuBLAS, attention workspaces); not measured here.
CUDA_GRAPHS_GIB = 1.0


def bytes_per_parameter(mode: str, world: int, precision: str) -> float:
    """Training-state bytes per policy parameter on one GPU.

    `mode`: single, ddp, fsdp2, zero2, zero3 (`common.distributed.parallel_mode`); `precision`: the
    run's --precision on a GPU (auto or bf16-mixed: fp32 weights + bf16 autocast; bf16: bf16 weights; fp32).
    torch AdamW (single, DDP, FSDP2): weights, gradients and both moments in the weights' dtype,
    4 x (4 or 2) bytes, whole (DDP's gradients are its buckets: no second copy) or over `world`
    (FSDP2). DeepSpeed in bf16 (auto, bf16) holds bf16 weights, whole (ZeRO-2) or sharded (ZeRO-3),
    beside sharded fp32 master weights, gradients and moments (16 / world); in fp32, fp32 weights and
    12 / world.
    """
    if mode in ("single", "ddp"):
        return 8.0 if precision == "bf16" else 16.0
    if mode == "fsdp2":
        return (8.0 if precision == "bf16" else 16.0) / world
    if mode not in ("zero2", "zero3"):
        raise ValueError(f"unknown parallel mode {mode!r}")
    weights, sharded = (4.0, 12.0) if precision == "fp32" else (2.0, 16.0)
    return (weights if mode == "zero2" else weights / world) + sharded / world


def update_phases(
    parameters: int, config, tokens: int, *, mode: str, world: int, precision: str, chunk_rows: int,
    scored: int | None = None, checkpointing: bool = True, autocast_cache: bool = False, fused_adamw: bool = True,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """GiB per term of each phase of one micro-batch's update on one GPU, at the phase's peak: the forward (at its
    end, the output layer's chunks), the output layer's backward, the layers' backward (one recomputed at a time),
    the embedding's backward, the optimiser step. `tokens`: the micro-batch's padded tokens, `scored` of them through
    the output layer (None: all), `chunk_rows` at a time (`common.logprobs.head_chunk_rows`). `autocast_cache`,
    `fused_adamw`: what the trainer does (`common.models.autocast_options`, `optimizer_options`: no cache; fused on
    CUDA). The state holds its gradients throughout (DDP's buckets; a later micro-batch of an accumulation), so each
    new gradient is summed into it. Under bf16 autocast over fp32 weights (single, DDP) the residual stream stays
    fp32 and the output layer is cast to bf16 once a forward (common/logprobs.py `scoring_forward`); FSDP2 and
    ZeRO-3 gather it. An estimate from the shapes: gpu_check/step.py measures each phase."""
    from common.batching import activation_bytes_per_token

    V, D, L = config.vocab_size, config.hidden_size, config.num_hidden_layers
    scored = tokens if scored is None else scored
    autocast = mode in ("single", "ddp") and precision in ("auto", "bf16-mixed")
    value = 4 if precision == "fp32" else 2  # inside a layer: the compute dtype
    residual = 4 if autocast or precision == "fp32" else 2
    head = V * D * (value if mode in ("fsdp2", "zero3") else 2 if autocast else 0)  # gathered, or cast once
    embeddings = V * D * (1 if getattr(config, "tie_word_embeddings", False) else 2)  # not cast by autocast
    shard = 1 if mode in ("single", "ddp") else world
    moment = parameters * (4 if mode.startswith("zero") or precision != "bf16" else 2) / shard  # AdamW's v
    state = parameters * bytes_per_parameter(mode, world, precision)
    per_token = activation_bytes_per_token(config, value, checkpointing, residual)
    inputs = tokens * (L * residual * D if checkpointing else per_token)
    layer = tokens * per_token - inputs  # with checkpointing, the layer recomputed at a time
    if autocast and checkpointing:
        layer = layer_backward_bytes(config, tokens, (parameters - embeddings) // L)
    rows, chunks = scored * D * residual, 4 * min(chunk_rows, scored) * V * 4  # ~4 fp32 [rows, V] tensors at once
    cache = 2 * (parameters - embeddings) if autocast and autocast_cache else 0
    grad = V * D * (4 if autocast or precision == "fp32" else 2)  # a [V, D] gradient
    # A tied output layer's gradient waits in autograd's buffer for the embedding's, to the end of the backward.
    waiting = grad if getattr(config, "tie_word_embeddings", False) else 0
    phases = {
        "forward": {"training state": state, "autocast's weight cache": cache, "layer inputs": inputs,
                    "output layer's input rows": rows, "output layer's compute copy": head, "output layer's chunks": chunks},
        "output layer's backward": {"training state": state, "layer inputs": inputs,
                                    "output layer's input rows and their gradient": 2 * rows,
                                    "output layer's compute copy": head, "output layer's chunks": chunks,
                                    "output layer's fp32 gradient sum": 4 * V * D},
        "layers' backward": {"training state": state, "layer inputs": inputs, "one layer's backward": layer,
                             "the hidden states' gradient": tokens * D * residual,
                             "the tied output layer's gradient, waiting": waiting},
        "embedding's backward": {"training state": state, "the hidden states' gradient": tokens * D * residual,
                                 "the tied output layer's gradient, waiting": waiting, "its dense gradient": grad},
        "optimiser step": {"training state": state, "AdamW's sqrt(v) (foreach)": 0 if fused_adamw else moment},
    }  # fmt: skip
    return {phase: {k: v / GIB for k, v in terms.items()} for phase, terms in phases.items()}


def layer_backward_bytes(config, tokens: int, layer_parameters: int) -> int:
    """What one decoder layer holds in its backward under gradient checkpointing and bf16 autocast over fp32 weights,
    counted on Qwen2's layer (the tensors its recompute saves for backward; tests/test_update_memory.py measures
    them): per token the two norms' fp32 outputs and the residual between them (3 D x 4 bytes), the bf16 casts of
    the norms' outputs that q, k, v, gate and up each read (5 D x 2), attention's q, output and o_proj's input
    (3 A x 2), k and v (2 K x 2), the MLP's gate, up, activation and product (4 I x 2) and two of their gradients
    in its backward (2 I x 2); and the layer's weights cast to bf16 (2 bytes a parameter)."""
    D, mlp = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or D // config.num_attention_heads
    A = config.num_attention_heads * head_dim
    K = (getattr(config, "num_key_value_heads", None) or config.num_attention_heads) * head_dim
    return tokens * (22 * D + 6 * A + 4 * K + 12 * mlp) + 2 * layer_parameters


@dataclass(frozen=True)
class ModelShape:
    """What vLLM's memory depends on besides the parameter count, from config.json. `mlp`: the values per
    token its MLP holds at once (dense: gate and up, 2 I, and their product, I; a mixture of experts:
    vLLM's fused-MoE caches, top-k x (max(2 I_e, D) + I_e), vllm/model_executor/layers/fused_moe/fused_moe.py);
    `context`: max_position_embeddings, the max_model_len vLLM takes when it is not told one."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    mlp: int
    context: int


def model_shape(config) -> ModelShape:
    """`ModelShape` of a transformers config (a PretrainedConfig or anything with its attributes)."""
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
    """(max_num_seqs, max_num_batched_tokens) vLLM 0.32 runs with: the given ones, else its offline defaults, 1,024
    sequences and 16,384 tokens on a GPU of >= 70 GiB, 256 and 8,192 below (and on an 80 GB A100, which vLLM
    tells by its name: there the estimate is high), the tokens at most max_num_seqs x max_model_len
    (vllm/engine/arg_utils.py `get_batch_defaults`, `_set_default_max_num_seqs_and_batched_tokens_args`)."""
    seqs, tokens = (1024, 16384) if total_gib >= 70 else (256, 8192)
    seqs = max_num_seqs or seqs
    return seqs, max_num_batched_tokens or min(tokens, seqs * max_model_len)


def vllm_activation_bytes(shape: ModelShape, dtype_bytes: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """An estimate of the peak of vLLM's profile run above its weights, the larger of its two parts
    (vllm/v1/worker/gpu_model_runner.py `profile_run`):
    - the forward of `max_num_batched_tokens` tokens T: per token the hidden state, the residual and a layer's
      output (3 D) beside the wider of attention (q, k, v and its output) and the MLP (`ModelShape.mlp`);
    - the sampler on one token of each of min(max_num_seqs, T) sequences N (`_dummy_sampler_run`): [N, V]
      logits in the model's dtype, their fp32 copy, the processed log-probs (logprobs_mode="processed_logprobs",
      common/rollout.py), the probabilities and the exponential noise, each fp32
      (vllm/v1/sample/sampler.py, vllm/v1/sample/ops/topk_topp_sampler.py `forward_native`, `random_sample`),
      beside the T hidden states. Not measured: an estimate from the config."""
    attention = (2 * shape.heads + 2 * shape.kv_heads) * shape.head_dim
    forward = max_num_batched_tokens * (3 * shape.hidden + max(attention, shape.mlp)) * dtype_bytes
    rows = min(max_num_seqs, max_num_batched_tokens)
    per_logit = dtype_bytes + (0 if dtype_bytes == 4 else 4) + 3 * 4
    sampler = rows * shape.vocab * per_logit + max_num_batched_tokens * shape.hidden * dtype_bytes
    return max(forward, sampler)


def vllm_floor(
    parameters: int,
    shape: ModelShape,
    *,
    precision: str,
    total_gib: float,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict[str, float]:
    """GiB per part of what vLLM's share must hold before it starts (module docstring): its weights and KV in
    the trainer's dtype (`precision`), its profile run's activations (`vllm_activation_bytes`), the KV of one
    `max_model_len` sequence (None: the model's own context, what vLLM takes untold), CUDA graphs."""
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


def kv_cache_tokens(floor: dict[str, float], shape: ModelShape, precision: str, share_gib: float) -> int:
    """Tokens vLLM's KV cache holds in `share_gib` GiB (utilisation x total) beside the rest of its `floor`
    (`vllm_floor`; the one sequence it reserves for is part of the cache), in whole blocks."""
    rest = sum(v for k, v in floor.items() if k != "one sequence's KV")
    page = KV_BLOCK * kv_bytes_per_token(shape, 4 if precision == "fp32" else 2)
    return max(0, int((share_gib - rest) * GIB // page)) * KV_BLOCK


def check_plan(
    parameters: int,
    *,
    mode: str,
    world: int,
    precision: str,
    reference_model: bool,
    vllm_utilization: float,
    total_gib: float,
    vllm_floor: dict[str, float],
    margin_gib: float = MARGIN_GIB,
) -> dict[str, float]:
    """GiB per item resident on one GPU at the rollout after the first optimiser step (module docstring);
    `vllm_utilization`: 0 when the rollout engine is not vLLM; `vllm_floor`: what its share must hold before
    any KV cache (`vllm_floor`). Stop with one line (the figures and the fix) if vLLM's share cannot hold its
    floor or the items exceed `total_gib`; else return them."""
    plan = {
        "training state": parameters * bytes_per_parameter(mode, world, precision) / GIB,
        "reference model": parameters * 2 / GIB if reference_model else 0.0,
        "vLLM": vllm_utilization * total_gib,
        "margin": margin_gib,
    }
    floor = sum(vllm_floor.values())
    if vllm_utilization and plan["vLLM"] < floor:  # colocated, no tensor parallelism: the whole model on each GPU
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


def count_parameters(model_path: str) -> int:
    """The policy's parameter count from its config.json alone (`model_config`)."""
    return model_config(model_path)[1]


def model_config(model_path: str) -> tuple:
    """(config, parameter count) from config.json alone: the model is built on the meta device (no weights read,
    no memory taken); tied embeddings count once. The same count under every engine: the build runs with
    transformers' ZeRO-3 hook off (`_without_zero3_init`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with _without_zero3_init(), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return config, sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _without_zero3_init():
    """transformers' ZeRO-3 hook off for the block, then back as it was. accelerate's DeepSpeed plugin (stage 3)
    keeps an HfDeepSpeedConfig alive from `make_accelerator` on, and while it lives `from_config` builds inside
    deepspeed.zero.Init (transformers/modeling_utils.py `_from_config`): on the meta device its weight init then
    stops on "Cannot copy out of meta tensor", and partitioned parameters would report numel() == 0."""
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
    model_path: str,
    *,
    mode: str,
    world: int,
    precision: str,
    reference_model: bool,
    vllm_utilization: float,
    total_gib: float | None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict[str, float] | None:
    """The session's check, before the policy loads (`check_plan` with the model's size and vLLM's floor), on a
    device of `total_gib` GiB (the session passes the GPU's total memory). None: no plan, CPU memory is not
    planned. `max_model_len`, `max_num_seqs`, `max_num_batched_tokens`: vLLM's (None: what vLLM takes untold,
    `vllm_floor`). Returns the plan (GiB per item) or None."""
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
