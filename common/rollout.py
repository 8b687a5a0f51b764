"""Rollout engines: sample completions from token ids, and take the policy's new weights.

Two backends behind one interface (`generate`, `load_weights`):
- `VLLMEngine`: vLLM in the training process (colocated, `vllm.LLM`). Its
  weights are a copy, so `load_weights` pushes the trainer's parameters in
  after every optimiser step and resets the prefix cache (cached KV blocks
  were computed by the old weights: keeping them costs nats of log-prob error).
- `HFEngine`: transformers `generate` on the training model itself, for CPU
  runs or when vLLM is absent; it is always in sync, `load_weights` is a no-op.

Both return the engine's log-prob of each sampled token under logits / T,
which the scripts compare with the trainer's (the `rollout_logp_gap` metric).
"""

import importlib.util
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # engine's log pi_old(token | prefix) under logits / T
    finished: bool  # ended on a stop token (False: cut at max_tokens)


def vllm_available() -> bool:
    """Is vLLM installed? (Checked without importing it: that takes seconds.)"""
    return importlib.util.find_spec("vllm") is not None


def _reload_weights(worker, items):
    """Runs inside each vLLM worker (collective_rpc)."""
    worker.model_runner.reload_weights(weights_iterator=iter(items))


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
            enable_prefix_caching=True, enforce_eager=True,
            logprobs_mode="processed_logprobs",  # log-probs after temperature, as the trainer computes them
            **kwargs,
        )
        self.stop_token_ids = list(stop_token_ids)
        self.sleep_mode = enable_sleep_mode and torch.cuda.is_available()

    def generate(
        self, prompts: list[list[int]], n: int, max_tokens: int, temperature: float, top_p: float = 1.0, seed: int | None = None
    ) -> list[list[Completion]]:
        """n completions for each prompt (a list of token ids)."""
        from vllm import SamplingParams, TokensPrompt

        if not torch.cuda.is_available():
            # vLLM 0.32 CPU: a seeded request that is split by chunked prefill
            # crashes (CPU generators have no offset); the engine-wide seed
            # given at construction still makes runs reproducible.
            seed = None
        params = SamplingParams(
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            logprobs=0,  # the sampled token's own log-prob
            stop_token_ids=self.stop_token_ids,
            detokenize=False,
        )
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

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push HF-named parameters into vLLM's copy of the model."""
        self.llm.collective_rpc(_reload_weights, args=(list(named_tensors),))
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

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], n: int, max_tokens: int, temperature: float, top_p: float = 1.0, seed: int | None = None
    ) -> list[list[Completion]]:
        if seed is not None:
            torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        flat = [p for p in prompts for _ in range(n)]
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
            )
            new = out.sequences[:, width:]
            logp = torch.stack(out.scores, 1).float().log_softmax(-1).gather(-1, new[..., None]).squeeze(-1)
            for row, row_logp in zip(new.tolist(), logp.tolist()):
                stop = next((j for j, t in enumerate(row) if t in self.stop_token_ids), None)
                end = len(row) if stop is None else stop + 1  # keep the stop token
                results.append(Completion(row[:end], row_logp[:end], finished=stop is not None))
        self.model.train(was_training)
        return [results[i * n : (i + 1) * n] for i in range(len(prompts))]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass  # generates with the training model itself

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass
