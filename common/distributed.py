"""Multi-process training with accelerate (docs/SCALING.md): one process per GPU, each owning whole prompt groups
and its own colocated rollout engine; gradient accumulation, metric reduction, and full weights for the sync, one
parameter at a time. Process-wide change: under ZeRO-3, `confine_zero3_linear` gives F.linear back to the process.
"""

import atexit
import contextlib
import ctypes
import functools
import os
import resource
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import AutocastKwargs, DistributedDataParallelKwargs, InitProcessGroupKwargs

from common.batching import micro_batches
from common.models import autocast_options

# Module-name segments that wrappers insert (FSDP1, torch.compile, activation checkpointing), and DDP / DeepSpeed's
# leading `module.`: none is in an HF checkpoint.
_WRAPPER_SEGMENTS = {"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"}

# NCCL's default is 10 minutes: ranks drift apart in long generations, and rank 0 writes checkpoints alone.
COLLECTIVE_TIMEOUT = timedelta(hours=2)

# DeepSpeed under bf16 accumulates and reduces gradients in bf16 unless told otherwise; fp32 costs 2 bytes per
# parameter / ranks and twice the gradient traffic.
ZERO_BF16_GRADIENTS = {"data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"}

# How reduce_metrics combines a metric over ranks (anything else: the mean).
SUM_METRICS = {"time/tokens_per_s", "reward/timeouts", "train/skipped_rows"}
MAX_METRICS = {"time/peak_mem_gb", "train/rollout_logp_gap_p99", "train/rollout_is_ratio_max"}  # the worst rank


def check_launch(env: dict, argv: list[str]) -> None:
    """Stop, with the command that works, when `accelerate launch` was asked for several processes and started one:
    its --cpu launcher exports MASTER_ADDR then, but neither starts them nor sets WORLD_SIZE (torchrun does)."""
    launched = any(k.startswith("ACCELERATE_") for k in env) and "MASTER_ADDR" in env
    started = any(k in env for k in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"))
    if launched and not started:
        raise SystemExit(
            "error: accelerate launch was asked for several processes but started one (its --cpu launcher needs "
            "MPI); start them through torchrun: ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes N "
            f"{' '.join(argv)} (docs/SCALING.md). The traceback below is accelerate's own report of a failed "
            "process (`accelerate launch -q` leaves it out)"
        )


def end_process_group() -> None:
    """At exit with the process group still up (a run that did not end cleanly): abort it. A graceful destroy would
    wait COLLECTIVE_TIMEOUT for collectives that may never be matched, instead of letting the launcher stop the rest."""
    if torch.distributed.is_initialized():
        torch.distributed.distributed_c10d._abort_process_group()


def end_rank(code: int, num_processes: int) -> None:
    """End a finished rank of a multi-process run with exit status `code`, skipping the interpreter's teardown; with
    one process, return. gloo's threads outlive `destroy_process_group` (pytorch#107298), and tearing the C++ statics
    down around them aborted finished ranks (exit -6). So the teardown's work is done here while the interpreter is
    whole (threads, atexit handlers, Python's and C's streams), then os._exit."""
    if num_processes <= 1:
        return
    threading._shutdown()  # what Py_Finalize does first; a bare join would wait forever on an idle pool's worker
    atexit._run_exitfuncs()
    with contextlib.suppress(Exception):  # a closed pipe must not turn the exit into a teardown
        sys.stdout.flush()
        sys.stderr.flush()
        ctypes.CDLL(None).fflush(None)  # C libraries' buffered stdio
    os._exit(code)


def end_run(accelerator) -> None:
    """The end of a harness's or benchmark's run: every rank done, `end_training`, then `end_rank` (a training
    script ends in `Session.close`)."""
    accelerator.wait_for_everyone()
    accelerator.end_training()
    end_rank(0, accelerator.num_processes)


def make_accelerator(
    mixed_precision: str = "no", grad_clip: float | None = None, micro_batch_size: int = 1, report_to: str = "none",
    output_dir: str | None = None,
) -> Accelerator:  # fmt: skip
    """The Accelerator, with DeepSpeed told what the scripts do themselves: its micro-batch size, `--grad_clip` (it
    clips in its own step), ZeRO-3's 16-bit weights for `get_state_dict`, fp32 gradients under bf16; FSDP2 reduces
    in fp32 too. `report_to`: accelerate's trackers (comma-separated), logging under `output_dir`."""
    handlers = [
        DistributedDataParallelKwargs(gradient_as_bucket_view=True),
        InitProcessGroupKwargs(timeout=COLLECTIVE_TIMEOUT),
        AutocastKwargs(**autocast_options()),  # no bf16 copy of every weight held to the forward's end
    ]
    trackers = [] if report_to == "none" else report_to.split(",")
    accelerator = Accelerator(
        mixed_precision=mixed_precision, kwargs_handlers=handlers, log_with=trackers or None, project_dir=output_dir
    )
    if torch.distributed.is_initialized():  # torn down on every way out, an error's too (`end_process_group`)
        atexit.register(end_process_group)
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    if fsdp is not None and getattr(fsdp, "fsdp_version", 1) == 2 and mixed_precision == "bf16":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        fsdp.mixed_precision_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    ds = getattr(accelerator.state, "deepspeed_plugin", None)
    if ds is not None:
        config = ds.deepspeed_config
        # Bookkeeping only, but it must be consistent; `micro_batch` marks the accumulation boundary.
        config["gradient_accumulation_steps"] = 1
        config["train_micro_batch_size_per_gpu"] = micro_batch_size
        config["train_batch_size"] = micro_batch_size * (
            torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        )
        if grad_clip is not None:
            config["gradient_clipping"] = grad_clip
        if ds.zero_stage == 3:
            config.setdefault("zero_optimization", {})["stage3_gather_16bit_weights_on_model_save"] = True
        if mixed_precision == "bf16":
            for key, value in ZERO_BF16_GRADIENTS.items():
                config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return accelerator


@dataclass(frozen=True)
class ParallelMode:
    """How the policy is laid out over the ranks, decided once from accelerate's state (not from a parameter's
    type, which FSDP2 swaps between sharded and whole)."""

    kind: str  # "single", "ddp", "fsdp2", "zero1", "zero2" or "zero3"
    world: int

    @property
    def sharded(self) -> bool:
        """Parameters split over ranks (FSDP2, ZeRO-3): every forward is a collective that all ranks run."""
        return self.kind in ("fsdp2", "zero3")


def parallel_mode(accelerator: Accelerator) -> ParallelMode:
    """The layout accelerate was launched with. FSDP1 is refused: the sync and checkpoints need FSDP2's DTensors."""
    from accelerate.utils import DistributedType

    world = accelerator.num_processes
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return ParallelMode(f"zero{accelerator.state.deepspeed_plugin.zero_stage}", world)
    if accelerator.distributed_type == DistributedType.FSDP:
        if getattr(accelerator.state.fsdp_plugin, "fsdp_version", 1) != 2:
            raise SystemExit(
                "error: FSDP1 is not supported: set `fsdp_version: 2` in the accelerate config (configs/accelerate/fsdp2.yaml)"
            )
        return ParallelMode("fsdp2", world)
    return ParallelMode("ddp" if world > 1 else "single", world)


@contextlib.contextmanager
def micro_batch(accelerator: Accelerator, model: torch.nn.Module, mode: ParallelMode, last: bool):
    """Gradient accumulation over one optimiser step's micro-batches; the `last` is its boundary (accelerate's
    `sync_gradients`, DeepSpeed's step). Only DDP defers its all-reduce (no_sync): FSDP2 (deferring would keep
    unsharded gradients) and ZeRO-2/3 reduce every backward, so every rank runs as many (`micro_batch_plan`).
    """
    accelerator.sync_gradients = last
    try:
        with accelerator.no_sync(model) if mode.kind == "ddp" and not last else contextlib.nullcontext():
            yield
    finally:
        accelerator.sync_gradients = True


def global_sum(accelerator: Accelerator, value):
    """Sum over ranks of a number, or of each value of a dict, in one collective; 0-dim device tensors are read
    in one wait for the device."""
    values = value if isinstance(value, dict) else {"": value}
    if accelerator.num_processes == 1 and not any(torch.is_tensor(v) for v in values.values()):
        out = {k: float(v) for k, v in values.items()}
    else:
        device = accelerator.device
        t = torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=device).detach().reshape(()) for v in values.values()]
        )
        if accelerator.num_processes > 1:
            t = accelerator.reduce(t, reduction="sum")
        out = dict(zip(values, t.tolist()))
    return out if isinstance(value, dict) else out[""]


def micro_batch_plan(
    accelerator: Accelerator, batch: dict, rows: list[int], micro_batch_size: int, max_tokens: int,
    memory_tokens: int = 0,
) -> list[list[int]]:  # fmt: skip
    """`common.batching.micro_batches` of `rows`, at least one (empty: the optimiser still steps, as the full pass
    would), and as many on every rank as the most any has: under FSDP2 and ZeRO-2/3 unequal counts would hang."""
    lens = batch["prompt_lens"], batch["completion_lens"]
    plan = micro_batches(*lens, rows, micro_batch_size, max_tokens, memory_tokens=memory_tokens)
    count = len(plan)
    if accelerator.num_processes > 1:
        count = int(accelerator.reduce(torch.tensor(count, device=accelerator.device), reduction="max"))
    if len(plan) < max(1, count):
        plan = micro_batches(*lens, rows, micro_batch_size, max_tokens, max(1, count), memory_tokens)
    return plan


def reduce_metrics(accelerator: Accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """Each metric over ranks, on every rank: the mean, the sum for SUM_METRICS, the max for MAX_METRICS. A rank's
    NaN (nothing to measure) is left out; all NaN stays NaN."""
    if accelerator.num_processes == 1:
        return metrics
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], device=accelerator.device, dtype=torch.float64)
    gathered = accelerator.gather(t[None]).view(accelerator.num_processes, len(keys))
    out = {}
    for i, k in enumerate(keys):
        column = gathered[:, i][~gathered[:, i].isnan()]
        reduce = torch.sum if k in SUM_METRICS else torch.max if k in MAX_METRICS else torch.mean
        out[k] = reduce(column).item() if column.numel() else float("nan")
    return out


def peak_memory_gb() -> float:
    """Peak memory of this process in GiB: torch's GPU allocations (vLLM's included), or the max RSS on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


def hf_name(name: str) -> str:
    """A parameter name without wrapper segments: the name in the HF checkpoint."""
    parts = [p for p in name.split(".") if p not in _WRAPPER_SEGMENTS]
    while parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "full_tensor")


def state_dict_for_sync(
    accelerator: Accelerator, model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) pairs of the policy, one at a time, for the rollout engine's reload: the parameters
    themselves (plain, DDP), or each gathered alone in `dtype` (ZeRO-3; FSDP2 casts its shards first, halving the
    traffic to a bf16 engine). A collective under ZeRO-3 / FSDP2: every rank consumes it all, in order. A tied
    weight comes under each name: vLLM 0.32 would put back its stale lm_head otherwise."""
    module = accelerator.unwrap_model(model)
    if type(module).__name__ == "FullyShardedDataParallel":
        raise ValueError("FSDP1 is not supported for the weight sync: set `fsdp_version: 2` in the accelerate config")
    for name, param in module.named_parameters(remove_duplicate=False):
        if hasattr(param, "ds_id"):  # ZeRO-3 partitioned
            import deepspeed

            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                full = param.data.detach().to(dtype or param.dtype, copy=True)
        elif _is_dtensor(param):  # FSDP2
            full = param.detach().to(dtype or param.dtype).full_tensor()
        else:
            full = param.detach()
        yield hf_name(name), full
    # Persistent buffers are checkpoint tensors too; ZeRO-3 / FSDP2 leave them whole.
    for mod_name, mod in module.named_modules():
        for buf_name, buf in mod.named_buffers(recurse=False):
            if buf is not None and buf_name not in mod._non_persistent_buffers_set:
                full = buf.detach().full_tensor() if _is_dtensor(buf) else buf.detach()
                yield hf_name(f"{mod_name}.{buf_name}" if mod_name else buf_name), full


def confine_zero3_linear(model: torch.nn.Module) -> bool:
    """Give torch.nn.functional.linear back to the rest of the process (the rollout engine's layers), keeping
    DeepSpeed's ZeRO-3 version, which saves the parameter rather than the gathered weight for backward, for
    `model`'s own Linear layers. zero.Init replaces it process-wide, for good. Call it after `accelerator.prepare`
    and before the engine exists. Returns whether anything changed."""
    try:
        from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as init
    except ImportError:
        return False
    original, current = getattr(init, "linear_bk", None), torch.nn.functional.linear
    if original is None or current is original:
        return False
    torch.nn.functional.linear = original
    for module in model.modules():
        if type(module) is torch.nn.Linear:  # its forward is F.linear(input, weight, bias), nothing else
            module.forward = functools.partial(_zero3_linear, current, module)
    return True


def _zero3_linear(linear_fn, module: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    return linear_fn(input, module.weight, module.bias)
