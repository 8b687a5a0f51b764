"""The trainer of a session (`Trainer`, built by `open_trainer`): the accelerator, the policy (and the reference
model), the optimiser and its learning-rate schedule, the micro-batches of a pass and the optimiser step. The
scripts' one seam is `Trainer.micro_batches`, which cuts, lays out and (in training) accumulates each forward's rows.

Then multi-process training with accelerate (docs/SCALING.md): one process per GPU, each owning whole prompt groups
and its own colocated rollout engine; the parallel mode, gradient accumulation, and a rank's end. Process-wide
change: under ZeRO-3, `confine_zero3_linear` gives F.linear back to the process.
"""

import atexit
import contextlib
import ctypes
import functools
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import AutocastKwargs, DistributedDataParallelKwargs, InitProcessGroupKwargs

from common.batching import micro_batches, select
from common.logprobs import sequence_logprobs
from common.metrics import UpdateGuard, global_sum
from common.models import Precision, autocast_options, check_memory
from common.run_flags import RunFlags


@dataclass
class OptimizerStep:
    loss: float  # the mini-batch's loss, over all ranks
    grad_norm: float  # before clipping (NaN when DeepSpeed clips inside its own step)
    applied: bool  # False: skipped (not finite, or a gradient-norm spike)
    sums: dict  # the micro-batches' sums over all ranks, as floats (the loss summed, not averaged)


class MicroBatch(dict):
    """One forward's rows of a `pack`ed batch (`common.batching.select`'s tensors) and `n`, how many are real: 0 for
    the filler a rank runs to keep step with its peers."""

    def __init__(self, tensors: dict, n: int):
        super().__init__(tensors)
        self.n = n

    def logprobs(self, model, temperature: float, with_entropy: bool = False, whole: bool = False):
        """(log pi(o_t | o_<t), entropy or None) of its completion tokens [rows, C] under `model`, from logits / T;
        `whole`: of every token after the first, [rows, L - 1]."""
        C = None if whole else self["completion_mask"].shape[1]
        return sequence_logprobs(
            model, self["input_ids"], self["attention_mask"], temperature, logits_to_keep=C,
            with_entropy=with_entropy, layout=self["layout"],
        )  # fmt: skip


@dataclass
class Trainer:
    accelerator: object  # accelerate.Accelerator
    mode: "ParallelMode"  # how the policy is laid out over the ranks
    model: object  # the policy, prepared by accelerate
    optimizer: object
    scheduler: object  # the learning-rate schedule, stepped once per optimiser step
    guard: UpdateGuard  # decides per optimiser step whether its update is applied
    grad_clip: float
    micro_batch_size: int  # --micro_batch_size
    max_tokens_per_micro_batch: int = 0  # > 0: micro-batches by padded tokens (common.batching.micro_batches)
    memory_tokens: int = 0  # the padded tokens --micro_batch_memory_gb allows a micro-batch (0: no cap)
    layout: str = "padded"  # how passes run a micro-batch (common.batching.select)
    ref_model: object = None  # the initial model, frozen (--beta > 0)
    device_sync: Callable[[], None] | None = None  # torch.cuda.synchronize on a GPU: phase times wait for it
    skipped_this_step: bool = False  # an update was skipped since `take_skipped` last asked
    precision: Precision | None = None  # the run's dtypes (common.models.precision_for)

    @property
    def device(self):
        return self.accelerator.device

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    def micro_batch_plan(self, batch: dict, rows: list[int]) -> list[list[int]]:
        """`common.batching.micro_batches` of `rows` of `batch`, at least one (empty: the optimiser still steps, as
        the full pass would), and as many on every rank as the most any has: under FSDP2 and ZeRO-2/3 unequal counts
        would hang."""
        lens = batch["prompt_lens"], batch["completion_lens"]
        size, tokens = self.micro_batch_size, self.max_tokens_per_micro_batch
        plan = micro_batches(*lens, rows, size, tokens, memory_tokens=self.memory_tokens)
        count = len(plan)
        if self.world > 1:
            count = int(self.accelerator.reduce(torch.tensor(count, device=self.device), reduction="max"))
        if len(plan) < max(1, count):
            plan = micro_batches(*lens, rows, size, tokens, max(1, count), self.memory_tokens)
        return plan

    def micro_batches(self, batch: dict, rows: Iterable[int], train: bool = False) -> Iterator[MicroBatch]:
        """The micro-batches of `rows` of `batch`, each cut to its own lengths in the passes' layout; with `train`,
        each inside its gradient-accumulation context, so that the caller's backwards are reduced at the last."""
        plan = self.micro_batch_plan(batch, list(rows))
        for i, idx in enumerate(plan):
            mb = MicroBatch(select(batch, idx, self.layout), len(idx))
            if not train:
                yield mb
                continue
            with self.accumulate(last=i == len(plan) - 1):
                yield mb

    def accumulate(self, last: bool):
        """Context of one micro-batch's forward/backward; gradients are reduced over ranks on the `last`."""
        return micro_batch(self.accelerator, self.model, self.mode, last)

    def optimizer_step(self, step: int, local_sums: dict) -> OptimizerStep:
        """Clip the gradient, apply the update unless `common.metrics.UpdateGuard` skips it, step the schedule and
        clear the gradients; every rank calls it. `local_sums`: this rank's sums ("loss", statistics), numbers or
        device tensors, summed over ranks and read with the gradient norm in one wait for the device."""
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if grad_norm is None:  # DeepSpeed clips in its own step
            grad_norm = math.nan
        elif hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        # The norm is the same on every rank: each rank's share of the sum is norm / world.
        sums = global_sum(self.accelerator, dict(local_sums) | {"grad_norm": grad_norm / self.world})
        grad_norm, loss = sums.pop("grad_norm"), sums["loss"] / self.world
        applied = self.guard.check(step, loss, grad_norm, self.learning_rate())
        if applied:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad()
        self.skipped_this_step |= not applied
        return OptimizerStep(loss, grad_norm, applied, sums)

    def learning_rate(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def take_skipped(self) -> bool:
        """Was an update skipped since the last call? (Such a step is not saved on schedule.)"""
        skipped, self.skipped_this_step = self.skipped_this_step, False
        return skipped

    def resume(self, run_dir: Path) -> dict | None:
        """Load the newest good checkpoint (`common.checkpoint.load_checkpoint`) at this run's learning rate;
        returns its trainer state, or None when there is none."""
        from common.checkpoint import load_checkpoint

        base_lrs = list(self.scheduler.base_lrs)
        state = load_checkpoint(self.accelerator, run_dir)
        if state is not None:  # this run's --lr is the schedule's base, not the checkpoint's
            self.scheduler.base_lrs = list(base_lrs)
            for group, lr, schedule in zip(self.optimizer.param_groups, base_lrs, self.scheduler.lr_lambdas):
                group["initial_lr"] = lr
                group["lr"] = lr * schedule(self.scheduler.last_epoch)
            self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        return state


def open_trainer(spec, run: RunFlags, model_path: str, precision: Precision, run_dir: Path, total_steps: int,
                 gpu: bool, say, engine_size=None) -> Trainer:  # fmt: skip
    """The trainer of `spec` (`common.session.TrainSpec`) under `run`'s flags: the accelerator and its checks, this
    rank's seed, the models, the passes' layout, the micro-batch token budget, and the optimiser with the schedule
    over `total_steps`; `engine_size` (`common.rollout.engine_size`) for the memory preflight."""
    from accelerate.utils import set_seed

    from common.batching import device_memory_gib, micro_batch_tokens, pass_layout, sliding
    from common.models import load_policy, load_reference_model, optimizer_options

    # The schedule counts optimiser steps (--mu x --num_minibatches a step), as the scheduler is stepped.
    schedule = lr_lambda(spec.lr_schedule, spec.warmup_steps, total_steps * spec.optimizer_steps_per_step)
    accelerator, mode = open_accelerator(
        run, spec.grad_clip, precision, run_dir, model_path, spec.reference_model, device_memory_gib(gpu), engine_size
    )
    set_seed(spec.seed + accelerator.process_index)
    policy = load_policy(model_path, precision.policy, run.gradient_checkpointing)
    ref_model = None
    if spec.reference_model:  # only then: all four papers train without it
        ref_model = load_reference_model(model_path, precision.reference, accelerator.device)
    for m in filter(None, (policy, ref_model)):
        if run.attn_implementation != "auto":
            m.set_attn_implementation(run.attn_implementation)
    layout = pass_layout(
        run.padding_free, run.share_prompts, policy.config._attn_implementation, sliding(policy.config)
    )
    memory_tokens = micro_batch_tokens(
        policy.config, precision.activation_bytes, spec.max_prompt_len + spec.extra_context, spec.max_completion_len,
        memory_gb=run.micro_batch_memory_gb, micro_batch_size=run.micro_batch_size,
        max_tokens_per_micro_batch=run.max_tokens_per_micro_batch, gradient_checkpointing=run.gradient_checkpointing,
        say=say, residual_bytes=precision.residual_bytes,
    )  # fmt: skip
    opt = spec.optimizer(policy.parameters(), **optimizer_options(accelerator.device.type))  # fused
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    policy, opt = accelerator.prepare(policy, opt)
    confine_zero3_linear(policy)  # DeepSpeed's F.linear for the policy only, not the rollout engine's layers
    accelerator.register_for_checkpointing(scheduler)  # stepped once per optimiser step, on every rank
    return Trainer(
        accelerator, mode, policy, opt, scheduler, UpdateGuard(run.max_nonfinite_steps, run.grad_spike_factor),
        spec.grad_clip, run.micro_batch_size, max_tokens_per_micro_batch=run.max_tokens_per_micro_batch,
        memory_tokens=memory_tokens, layout=layout, ref_model=ref_model,
        device_sync=torch.cuda.synchronize if gpu else None, precision=precision,
    )  # fmt: skip


def open_accelerator(
    run: RunFlags, grad_clip: float, precision: Precision, run_dir: Path, model_path: str, reference_model: bool,
    device_gib: float | None, engine_size=None,
):  # fmt: skip
    """(accelerator, parallel mode), then the checks that need them before any weight loads: every rank sees the
    run directory, and the memory preflight (`device_gib` None: CPU, not planned)."""
    from common.run_dir import check_shared

    accelerator = make_accelerator(precision.mixed, grad_clip, run.micro_batch_size, run.report_to, str(run_dir))
    check_shared(run_dir, accelerator)  # multi-node: before minutes of loading
    mode = parallel_mode(accelerator)
    check_memory(run, model_path, mode, reference_model, device_gib, engine_size)
    return accelerator, mode


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The learning-rate multiplier at optimiser step s: a linear warm-up over `warmup_steps`, then constant, or
    decaying to 0 at `total_steps` along a cosine or a line."""

    def factor(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return factor


# --- Multi-process training with accelerate (docs/SCALING.md) ---------------------------------------------------

# NCCL's default is 10 minutes: ranks drift apart in long generations, and rank 0 writes checkpoints alone.
COLLECTIVE_TIMEOUT = timedelta(hours=2)

# DeepSpeed under bf16 accumulates and reduces gradients in bf16 unless told otherwise; fp32 costs 2 bytes per
# parameter / ranks and twice the gradient traffic.
ZERO_BF16_GRADIENTS = {"data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"}


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
    unsharded gradients) and ZeRO-2/3 reduce every backward, so every rank runs as many (`Trainer.micro_batch_plan`).
    """
    accelerator.sync_gradients = last
    try:
        with accelerator.no_sync(model) if mode.kind == "ddp" and not last else contextlib.nullcontext():
            yield
    finally:
        accelerator.sync_gradients = True


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
