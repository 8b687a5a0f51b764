"""Rollout engines: sample completions from token ids, and take the policy's new weights.

Two backends behind one interface, `RolloutEngine`, built by `make_engine`:
- `VLLMEngine` (common/vllm_engine.py): vLLM in the training process (colocated, `vllm.LLM`). Its
  weights are a copy, so `load_weights` pushes the trainer's parameters in after every optimiser step,
  a bounded batch at a time, and resets the prefix cache (common/vllm_engine.py). Under accelerate each
  rank has its own engine (vLLM's external_launcher, TRL's colocate mode).
- `HFEngine` (common/hf_engine.py): transformers `generate` on the training model itself, for CPU
  runs or when vLLM is absent; it is always in sync, `load_weights` is a no-op.

Both return the engine's log-prob of each sampled token under logits / T, which the scripts compare
with the trainer's (the `rollout_logp_gap` metric), and both stop a sequence at the run's stop strings
while sampling (common/completion.py). Seeds: common/seeds.py. This module's names are the ones the
scripts, tools and tests import.
"""

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import torch

from common.completion import Completion, cut_at_stop, cut_groups, stop_at, stop_token_ids
from common.hf_engine import HFEngine, _RowSampler
from common.seeds import SEED_STRIDE, completion_seed, prompt_seeds
from common.vllm_engine import (
    CPU_KV_CACHE_GIB,
    VLLMEngine,
    cpu_kv_cache_space,
    kv_cache_note,
    tensor_batches,
    vllm_engine_args,
)

_batches = tensor_batches  # its name before the split (tests/test_distributed.py)

__all__ = [
    "CPU_KV_CACHE_GIB", "SEED_STRIDE", "Completion", "HFEngine", "RolloutEngine", "VLLMEngine", "_RowSampler",
    "_batches", "completion_seed", "cpu_kv_cache_space", "cut_at_stop", "cut_groups", "kv_cache_note", "make_engine",
    "prompt_seeds", "stop_at", "stop_token_ids", "tensor_batches", "vllm_engine_args",
]  # fmt: skip


@runtime_checkable
class RolloutEngine(Protocol):
    """What the scripts, the session, evaluation and data selection use of a rollout engine."""

    stop: tuple[str, ...]  # stop strings: a completion ends before the first (`cut_at_stop`)
    decode: Callable[[list[int]], str] | None  # token ids -> text, for the stop strings
    stop_token_ids: list[int]  # tokens that end a completion (kept in it)
    weight_dtype: torch.dtype | None  # the dtype `load_weights` is best given (None: any)
    kv_cache_tokens: int | None  # tokens its KV cache holds at once (None: sized per call)

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | list[int] | None = None,
    ) -> list[list[Completion]]:
        """n completions per prompt, each cut at the stop strings; `seed`: one for the call or one per prompt."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take the policy's new weights (HF names), consumed lazily."""
        ...

    def sleep(self) -> None:
        """Release what can be released during the update (it wakes by itself when used)."""
        ...

    def close(self) -> None: ...

    def kv_cache_note(self, prompt_lens: list[int], prompts: int, group_size: int, added_len: int) -> str | None:
        """One line when a step's rollout may not fit the engine's KV cache at once, else None."""
        ...


def make_engine(
    backend: str,
    model_path: str,
    tokenizer,
    model: torch.nn.Module | None = None,
    *,
    seed: int = 0,
    max_model_len: int,
    dtype: str = "auto",
    world: int = 1,
    gpu_memory_utilization: float = 0.3,
    sleep: bool = False,
    max_num_seqs: int = 0,
    max_num_batched_tokens: int = 0,
    synced: bool = False,
    batch_size: int = 256,
    per_prompt_seeds: bool = True,
    stop: Iterable[str] = (),
) -> RolloutEngine:
    """The rollout engine `backend` names ("vllm" or "hf"), for training, evaluation and data selection.

    vLLM: its own copy of `model_path`, colocated (one engine per rank when `world` > 1), holding
    `max_model_len` tokens per sequence in `dtype` ("auto": bf16 on GPU, fp32 on CPU), decoding
    `max_num_seqs` sequences at once (0: vLLM's default). HF: `model` itself (loaded from
    `model_path` in `dtype` when None), `batch_size` rows per generate call; `synced`: every rank
    steps together (parameters sharded over ranks: ZeRO-3, FSDP2). `per_prompt_seeds`: False makes vLLM
    ignore the seeds `generate` is given (the engine's own `seed` alone; docs/SCALING.md). `stop`: stop
    strings (`--stop`): sampling stops at them, and completions are cut as `cut_at_stop` says.
    """
    stop_ids = stop_token_ids(tokenizer, model_path)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    gpu = torch.cuda.is_available()
    dtype = ("bfloat16" if gpu else "float32") if dtype == "auto" else dtype
    if backend == "hf":
        if model is None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
            model = model.to("cuda" if gpu else "cpu").eval()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        return HFEngine(model, stop_ids, pad, batch_size=batch_size, synced=synced, stop=stop, decode=decode)
    return VLLMEngine(
        model_path,
        stop_ids,
        max_model_len=max_model_len,
        seed=seed,
        dtype=dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        enable_sleep_mode=sleep,
        distributed=world > 1,
        max_num_seqs=max_num_seqs or None,
        max_num_batched_tokens=max_num_batched_tokens or None,
        per_prompt_seeds=per_prompt_seeds,
        stop=stop,
        decode=decode,
    )
