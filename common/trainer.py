"""The trainer of a session (`Trainer`, built by `open_trainer`): the accelerator, the policy (and the reference
model), the optimiser and its learning-rate schedule, the micro-batches of a pass and the optimiser step. The
scripts' one seam is `Trainer.micro_batches`, which cuts, lays out and (in training) accumulates each forward's rows."""

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from common.batching import select
from common.logprobs import sequence_logprobs
from common.metrics import UpdateGuard
from common.models import Precision, check_memory
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
    mode: object  # common.distributed.ParallelMode: how the policy is laid out over the ranks
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
        """The micro-batches of `rows` of `batch`, as many on every rank (`common.distributed.micro_batch_plan`)."""
        from common.distributed import micro_batch_plan

        return micro_batch_plan(
            self.accelerator, batch, rows, self.micro_batch_size, self.max_tokens_per_micro_batch, self.memory_tokens
        )

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
        from common.distributed import micro_batch

        return micro_batch(self.accelerator, self.model, self.mode, last)

    def optimizer_step(self, step: int, local_sums: dict) -> OptimizerStep:
        """Clip the gradient, apply the update unless `common.metrics.UpdateGuard` skips it, step the schedule and
        clear the gradients; every rank calls it. `local_sums`: this rank's sums ("loss", statistics), numbers or
        device tensors, summed over ranks and read with the gradient norm in one wait for the device."""
        from common.distributed import global_sum

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
    import torch
    from accelerate.utils import set_seed

    from common.batching import device_memory_gib, micro_batch_tokens, pass_layout, sliding
    from common.distributed import confine_zero3_linear
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
    opt = spec.optimizer(policy.parameters(), **optimizer_options(accelerator.device.type))  # fused on CUDA
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
    from common.distributed import make_accelerator, parallel_mode
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
