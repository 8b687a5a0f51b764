"""A toy training run that reports what accelerate's engine really did: one JSON line per rank.

    accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2 \
        tests/engines/cpu_entry.py tests/engines/probe.py --out DIR [--tie 1] [--steps 2]

Rank 0 writes a tiny random Qwen2 checkpoint (fixed seed) to DIR/model before the
Accelerator exists; every rank then loads it with from_pretrained after the Accelerator
is built, so accelerate's loading hooks are the real ones (ZeRO-3 zero.Init partitioning,
FSDP cpu_ram_efficient_loading). AdamW is prepared with the model; each optimiser step is
`micro_batches` backward passes, all but the last under `accelerator.no_sync` and with
`accelerator.sync_gradients = False` (DeepSpeed's accumulation boundary), then
clip_grad_norm_ and step. A no-grad forward comes first, as a rollout / old-logprob pass
would. Each rank trains on its own data. Then save_state, get_state_dict, load_state.
Output: a line `ENGINE_FACTS {...}` per rank (tests/engines/launch.py `facts`).
"""

import argparse
import contextlib
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
from launch import write_facts  # tests/engines/ is on the path of the launched script

T0 = time.monotonic()
VOCAB, SEQ, ROWS = 512, 16, 2
LAUNCH_ENV = (  # what accelerate's launcher tells the engine through the environment
    "ACCELERATE_USE_FSDP",
    "FSDP_VERSION",
    "FSDP_RESHARD_AFTER_FORWARD",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "ACCELERATE_USE_CPU",
)


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tie", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--micro_batches", type=int, default=2)
    ap.add_argument("--extra_micro_batch_rank", type=int, default=-1, help="this rank does one micro-batch more")
    ap.add_argument("--mixed_precision", default="no")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--grad_clip", type=float, default=1.0)
    ap.add_argument("--collective_timeout", type=float, default=0, help="seconds; 0: torch's default")
    ap.add_argument("--no_save", action="store_true", help="skip save_state / get_state_dict / load_state")
    return ap.parse_args()


# Python-level collectives, counted per phase (DeepSpeed and FSDP2 call these; DDP's C++ reducer does not).
COLLECTIVES = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_reduce_coalesced",
    "barrier",
)
CALLS: dict[str, int] = {}


def count_collectives() -> None:
    """Wrap torch.distributed's collectives (before any engine captures them) to count calls."""
    import functools

    import torch.distributed as dist

    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        def wrapper(*a, _fn=fn, _name=name, **k):
            CALLS[_name] = CALLS.get(_name, 0) + 1
            return _fn(*a, **k)

        setattr(dist, name, functools.wraps(fn)(wrapper))


def calls_since(before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in CALLS.items() if v != before.get(k, 0)}


def build_checkpoint(path: Path, tie: bool) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    (path / "READY").write_text("ok")


def is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def describe(p: torch.Tensor) -> dict:
    d = {"type": type(p).__name__, "is_dtensor": is_dtensor(p), "has_ds_id": hasattr(p, "ds_id"), "numel": p.numel()}
    d["shape"] = list(p.shape)
    d["dtype"] = str(p.dtype).replace("torch.", "")
    if is_dtensor(p):
        d["local_numel"] = p.to_local().numel()
        d["placements"] = [str(x) for x in p.placements]
    if hasattr(p, "ds_id"):
        d["ds_numel"] = p.ds_numel
        d["ds_shape"] = list(p.ds_shape)
        d["ds_tensor_numel"] = p.ds_tensor.numel()
        d["ds_status"] = str(p.ds_status)
    return d


def local_view(p: torch.Tensor) -> torch.Tensor:
    """What this rank stores of a parameter: the ZeRO-3 partition, the FSDP2 shard, or the tensor."""
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor
    if is_dtensor(p):
        return p.to_local()
    return p


def fsdp_units(model) -> list[dict]:
    """accelerate's fully_shard units: the modules of each unit, its parameters, its resharding."""
    from torch.distributed.fsdp import FSDPModule

    names = {id(m): n or "<root>" for n, m in model.named_modules()}
    units: dict[int, dict] = {}
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        state = m._get_fsdp_state()
        unit = units.setdefault(id(state), {"modules": [], "params": [], "reshard_after_forward": None})
        unit["modules"].append(names[id(m)])
        for group in state._fsdp_param_groups:
            unit["params"] = [fp._param_fqn for fp in group.fsdp_params]
            unit["reshard_after_forward"] = bool(group._reshard_after_forward)
    return list(units.values())


def full_named_weights(accelerator, model):
    """(name, full tensor) of every parameter, the same on every rank (a collective under ZeRO-3 / FSDP2)."""
    module = accelerator.unwrap_model(model)
    params = list(module.named_parameters())
    if any(hasattr(p, "ds_id") for _, p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
            return [(n, p.detach().clone()) for n, p in params]
    return [(n, p.detach().full_tensor() if is_dtensor(p) else p.detach().clone()) for n, p in params]


def checksum(named) -> list[float]:
    s = sum(t.double().sum().item() for _, t in named)
    sq = sum(t.double().square().sum().item() for _, t in named)
    return [s, sq]


def batch(rank: int, step: int, micro: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)


def engine_facts(accelerator, args) -> dict:
    """What accelerate built: its distributed type, the process group, the plugin's settings and the environment
    its launcher set. Under DeepSpeed, its config is also set for this run (batch sizes, clipping)."""
    from accelerate.utils import DistributedType

    dist = torch.distributed
    f: dict = {
        "shim": os.environ.get("ENGINES_CPU_SHIM"),
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "process_index": accelerator.process_index,
        "local_process_index": accelerator.local_process_index,
        "num_processes": accelerator.num_processes,
        "is_main_process": accelerator.is_main_process,
        "device": str(accelerator.device),
        "dist_world_size": dist.get_world_size() if dist.is_initialized() else None,
        "dist_rank": dist.get_rank() if dist.is_initialized() else None,
        "dist_backend": str(dist.get_backend()) if dist.is_initialized() else None,
        "is_fsdp2": accelerator.is_fsdp2,
        "mixed_precision": accelerator.mixed_precision,
        "env": {k: os.environ.get(k) for k in LAUNCH_ENV},
    }
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    if fsdp is not None:
        f["fsdp_version"] = fsdp.fsdp_version
        f["fsdp_reshard_after_forward"] = fsdp.reshard_after_forward
        f["fsdp_cpu_ram_efficient_loading"] = fsdp.cpu_ram_efficient_loading
    deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
    ds = getattr(accelerator.state, "deepspeed_plugin", None) if deepspeed else None
    if ds is not None:
        f["zero_stage"] = ds.zero_stage  # right after construction, before any config edit
        f["ds_config_stage"] = ds.deepspeed_config["zero_optimization"]["stage"]
        f["zero3_init_flag"] = ds.zero3_init_flag
        f["hf_ds_config_is_zero3"] = ds.hf_ds_config.is_zero3()
        config = ds.deepspeed_config
        config["gradient_accumulation_steps"] = 1  # the boundary is marked with sync_gradients instead
        config["train_micro_batch_size_per_gpu"] = ROWS
        config["train_batch_size"] = ROWS * accelerator.num_processes
        config["gradient_clipping"] = args.grad_clip
        if ds.zero_stage == 3:
            config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    return f


def loaded_facts(model) -> dict:
    """The embedding as from_pretrained left it under the engine's loading hooks (ZeRO-3: partitioned)."""
    emb = model.get_input_embeddings().weight
    return {
        "embed": describe(emb),
        "embed_device": str(emb.device),
        "embed_local_abs_sum": local_view(emb).detach().abs().sum().item() if emb.device.type != "meta" else None,
        "tied": model.get_output_embeddings().weight is emb,
    }


def prepared_facts(accelerator, model) -> dict:
    """The prepared model: its wrapper and parameters after prepare, and again after a no-grad forward (a rollout /
    old log-prob pass), which FSDP2 and ZeRO-3 may leave gathered."""
    from torch.distributed.fsdp import FSDPModule

    module = accelerator.unwrap_model(model)
    f = {
        "wrapper": type(model).__name__,
        "is_fsdp_module": isinstance(model, FSDPModule),
        "first_param_name": next(iter(module.named_parameters()))[0],
        "first_param_after_prepare": describe(next(model.parameters())),
        "tied_after_prepare": module.get_output_embeddings().weight is module.get_input_embeddings().weight,
        "all_dtensor_after_prepare": all(is_dtensor(p) for p in model.parameters()),
        "all_ds_id_after_prepare": all(hasattr(p, "ds_id") for p in model.parameters()),
        "numel_sum_after_prepare": sum(p.numel() for p in model.parameters()),
        "local_numel_sum": sum(local_view(p).numel() for p in model.parameters()),
    }
    model.eval()
    with torch.no_grad():
        model(input_ids=batch(accelerator.process_index, -1, 0))
    model.train()
    f["first_param_after_nograd_forward"] = describe(next(model.parameters()))
    f["not_dtensor_after_nograd_forward"] = [n for n, p in model.named_parameters() if not is_dtensor(p)]
    f["numel_zero_after_nograd_forward"] = sum(p.numel() == 0 for p in model.parameters())
    if accelerator.is_fsdp2:
        f["fsdp_units"] = fsdp_units(model)
    return f


def train(accelerator, model, opt, args) -> dict:
    """`args.steps` optimiser steps of `micro_batches` backward passes each (all but the last under no_sync and
    sync_gradients False): each step's loss (this rank's and the mean over ranks), grad norm and collectives."""
    f = {"losses": [], "global_losses": [], "grad_norms": [], "collectives": []}
    for step in range(args.steps):
        n = args.micro_batches + (accelerator.process_index == args.extra_micro_batch_rank)
        total, calls = 0.0, []
        for i in range(n):
            last = i == n - 1
            accelerator.sync_gradients = last
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                ids = batch(accelerator.process_index, step, i)
                before = dict(CALLS)
                loss = model(input_ids=ids, labels=ids).loss / n
                forward, mid = calls_since(before), dict(CALLS)
                accelerator.backward(loss)
                calls.append({"last": last, "forward": forward, "backward": calls_since(mid)})
            total += loss.item()
        f["collectives"].append(calls)
        accelerator.sync_gradients = True
        norm = accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad()
        f["losses"].append(total)
        f["grad_norms"].append(float(norm) if norm is not None else None)
        t = torch.tensor([total], device=accelerator.device)
        f["global_losses"].append(accelerator.reduce(t, reduction="mean").item())
    return f


def finiteness_facts(model, weights) -> dict:
    """Finiteness of the trained weights: local shards, gathered, and as a naive check sees them. Under ZeRO-3, a
    NaN put into a partition: what a naive check and the partition's own check see."""
    f = {
        "all_finite_local": all(torch.isfinite(local_view(p)).all().item() for p in model.parameters()),
        "all_finite_full": all(torch.isfinite(t).all().item() for _, t in weights),
        "naive_isfinite_all": all(torch.isfinite(p).all().item() for p in model.parameters()),
    }
    zero3 = [p for p in model.parameters() if hasattr(p, "ds_tensor")]
    if zero3:
        p = zero3[0]
        saved = p.ds_tensor.data[0].item()
        p.ds_tensor.data[0] = float("nan")
        f["nan_in_partition_naive_isfinite"] = bool(torch.isfinite(p).all().item())
        f["nan_in_partition_ds_tensor_isfinite"] = bool(torch.isfinite(p.ds_tensor).all().item())
        p.ds_tensor.data[0] = saved
    return f


def save_and_reload_facts(accelerator, model, weights, ckpt: Path) -> dict:
    """save_state's files, get_state_dict against the gathered weights, and load_state restoring perturbed
    weights (the checksum after it)."""
    accelerator.save_state(str(ckpt))
    accelerator.wait_for_everyone()
    f = {"saved_files": sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())}
    sd = accelerator.get_state_dict(model)  # a collective under ZeRO-3 / FSDP2: every rank calls it
    f["state_dict_returned"] = type(sd).__name__
    sd = sd or {}
    f["state_dict_keys"] = len(sd)
    f["state_dict_has_lm_head"] = "lm_head.weight" in sd
    f["state_dict_types"] = sorted({type(v).__name__ for v in sd.values()})
    full = dict(weights)
    f["state_dict_max_diff"] = max(
        ((sd[k].float() - full[k].float()).abs().max().item() for k in sd if k in full), default=None
    )
    with torch.no_grad():  # perturb: load_state must restore the saved weights
        for p in model.parameters():
            local_view(p).add_(1.0)
    accelerator.load_state(str(ckpt))
    f["checksum_after_load_state"] = checksum(full_named_weights(accelerator, model))
    return f


def main():
    args = parse_args()
    out = Path(args.out)
    model_dir = out / "model"
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0 and not (model_dir / "READY").exists():
        build_checkpoint(model_dir, bool(args.tie))

    count_collectives()
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
    from transformers import AutoModelForCausalLM

    from common.trainer import end_run

    handlers = []
    if args.collective_timeout:
        handlers.append(InitProcessGroupKwargs(timeout=timedelta(seconds=args.collective_timeout)))
    accelerator = Accelerator(mixed_precision=args.mixed_precision, kwargs_handlers=handlers)
    f = engine_facts(accelerator, args)

    accelerator.wait_for_everyone()  # rank 0 has written the checkpoint
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    f["loaded"] = loaded_facts(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, opt = accelerator.prepare(model, opt)
    f |= prepared_facts(accelerator, model)

    f["initial_checksum"] = checksum(full_named_weights(accelerator, model))
    f |= train(accelerator, model, opt, args)
    weights = full_named_weights(accelerator, model)
    f["final_checksum"] = checksum(weights)
    f |= finiteness_facts(model, weights)
    if not args.no_save:
        f |= save_and_reload_facts(accelerator, model, weights, out / "ckpt")

    f["seconds"] = round(time.monotonic() - T0, 1)
    write_facts(out, accelerator.process_index, f)
    end_run(accelerator)


if __name__ == "__main__":
    main()
