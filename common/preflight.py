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
"""

from __future__ import annotations

import contextlib
import math

GIB = 2**30
MARGIN_GIB = 2.0


def bytes_per_parameter(mode: str, world: int, precision: str) -> float:
    """Training-state bytes per policy parameter on one GPU.

    `mode`: single, ddp, fsdp2, zero2, zero3 (`common.distributed.parallel_mode`); `precision`: the
    run's --precision on a GPU (auto: fp32 weights + bf16 autocast; bf16: bf16 weights; fp32).
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


def check_plan(
    parameters: int,
    *,
    mode: str,
    world: int,
    precision: str,
    reference_model: bool,
    vllm_utilization: float,
    total_gib: float,
    margin_gib: float = MARGIN_GIB,
) -> dict[str, float]:
    """GiB per item resident on one GPU at the rollout after the first optimiser step (module docstring);
    `vllm_utilization`: 0 when the rollout engine is not vLLM. Stop with one line (the figures and the
    fix) if they exceed `total_gib`; else return them."""
    plan = {
        "training state": parameters * bytes_per_parameter(mode, world, precision) / GIB,
        "reference model": parameters * 2 / GIB if reference_model else 0.0,
        "vLLM": vllm_utilization * total_gib,
        "margin": margin_gib,
    }
    weights = parameters * (4 if precision == "fp32" else 2) / GIB  # vLLM's copy, in the trainer's dtype
    if vllm_utilization and plan["vLLM"] <= weights:  # colocated, no tensor parallelism: the whole model on each GPU
        raise SystemExit(
            f"error: memory: vLLM's share of each GPU, {plan['vLLM']:.1f} GiB (--vllm_gpu_memory_utilization "
            f"{vllm_utilization} x {total_gib:.1f}), cannot hold the model's {weights:.1f} GiB of weights: raise it "
            f"well above {weights / total_gib:.2f} (the rest is its KV cache), or use GPUs with more memory"
        )
    need = sum(plan.values())
    if need <= total_gib:
        return plan
    items = " + ".join(f"{v:.1f} {k}" for k, v in plan.items() if v)
    where = f"{mode} over {world} GPUs" if world > 1 else mode
    fixes = []
    room = total_gib - (need - plan["vLLM"])  # what vLLM could take with everything else in place
    if plan["vLLM"] and room / total_gib >= 0.1:
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
    """The policy's parameter count from its config.json alone: the model is built on the meta device
    (no weights read, no memory taken); tied embeddings count once. The same count under every engine:
    the build runs with transformers' ZeRO-3 hook off (`_without_zero3_init`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with _without_zero3_init(), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


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
) -> dict[str, float] | None:
    """The session's check, before the policy loads (`check_plan` with the model's size), on a device of
    `total_gib` GiB (the session passes the GPU's total memory). None: no plan, CPU memory is not planned.
    Returns the plan (GiB per item) or None."""
    if total_gib is None:
        return None
    return check_plan(
        count_parameters(model_path), mode=mode, world=world, precision=precision, reference_model=reference_model,
        vllm_utilization=vllm_utilization, total_gib=total_gib,
    )  # fmt: skip
