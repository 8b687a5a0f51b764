"""The transformers rollout engine: `generate` on the training model itself (CPU runs, or no vLLM), always in
sync. Each prompt is prefilled once for its n rows, and each row samples under its own seeded generator.
"""

import math
from collections.abc import Callable, Iterable

import torch

from common.prompts import Completion, CutEngine, completion_seed, stop_at


class _RowSampler:
    """A logits processor that samples each row from softmax(logits / T) (top-p applied; T = 0: greedy) under
    its own generator and forces generate's greedy pick onto it. HF's sampler draws every row from one RNG (a
    row's sample depends on its neighbours), and `output_scores` keeps [rows, V] fp32 per token."""

    def __init__(self, generators: list[torch.Generator], temperature: float, top_p: float):
        self.generators, self.temperature, self.top_p = generators, temperature, top_p
        self.logprobs: list[torch.Tensor] = []  # [rows] per step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        greedy = self.temperature == 0  # as vLLM: the most likely token, its log-prob under the logits themselves
        z = scores.float() / (1.0 if greedy else self.temperature)
        if not torch.isfinite(z).all():  # a diverged policy: sample what is finite (uniform if nothing is);
            z = z.nan_to_num(nan=-math.inf, posinf=torch.finfo(z.dtype).max)  # the trainer's guard stops the run
            z[(z == -math.inf).all(-1)] = 0.0
        if self.top_p < 1.0 and not greedy:  # keep the smallest set of tokens whose probability reaches top_p
            sorted_z, order = z.sort(-1, descending=True)
            cum = sorted_z.softmax(-1).cumsum(-1)
            drop = (cum - sorted_z.softmax(-1)) >= self.top_p  # the top token always stays
            z = z.scatter(-1, order, sorted_z.masked_fill(drop, -math.inf))
        logp = z.log_softmax(-1)
        if greedy:
            tokens = logp.argmax(-1, keepdim=True)[:, 0]
        else:
            probs = logp.exp()
            tokens = torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        self.logprobs.append(logp.gather(-1, tokens[:, None]).squeeze(-1))
        return scores.fill_(-math.inf).scatter_(-1, tokens[:, None], 0.0)  # greedy now picks the sample


class _StopStrings:
    """A stopping criterion: a row ends once its text holds a `stop` string; `ended[row]`: its length then. The
    last few tokens' text is looked at first, the whole completion decoded only when that holds one."""

    def __init__(self, stop: tuple[str, ...], decode: Callable[[list[int]], str], prompt_width: int):
        self.stop, self.decode, self.width = stop, decode, prompt_width
        self.tail = max(map(len, stop)) + 8  # tokens: each gives at least a character, bar partial bytes
        self.ended: dict[int, int] = {}

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        new = input_ids[:, self.width :]
        for row, tail in enumerate(new[:, -self.tail :].tolist()):
            if row not in self.ended and stop_at(self.decode(tail), self.stop) is not None:
                if stop_at(self.decode(new[row].tolist()), self.stop) is not None:
                    self.ended[row] = new.shape[1]
        done = torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device)
        done[list(self.ended)] = True
        return done


class HFEngine(CutEngine):
    """`common.rollout.RolloutEngine` on transformers' `generate`."""

    kv_cache_tokens = None  # generate's own cache, sized per call
    weight_dtype = None  # load_weights takes nothing

    def __init__(
        self,
        model: torch.nn.Module,
        stop_token_ids: list[int],
        pad_token_id: int,
        batch_size: int = 256,
        synced: bool = False,
        stop: Iterable[str] = (),
        decode: Callable[[list[int]], str] | None = None,
    ):
        super().__init__(stop, decode)
        self.model = model
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size  # rows per `generate` call
        # Sharded parameters (ZeRO-3, FSDP2): every forward is a collective, so all ranks step together.
        self.synced = synced

    @torch.no_grad()
    def sample(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | list[int] | None = None,
    ) -> list[list[Completion]]:
        """`generate` before the cut: each row ends on the token that completes a stop string. Calls of whole
        groups; each row's generator is seeded by (its prompt's seed, its index): a prompt's samples do not depend
        on the call or the rank (None: the global RNG)."""
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        per_call = max(1, self.batch_size // n)  # whole groups: a prompt's n rows share one prefill
        pairs = list(zip(prompts, seeds))
        calls = math.ceil(len(pairs) / per_call)
        if self.synced:  # every rank makes the most calls any rank makes (an idle rank steps on a dummy row)
            count = torch.tensor(calls, device=device)
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
            calls = int(count)
        results: list[Completion] = []
        for c in range(calls):
            chunk = pairs[c * per_call : (c + 1) * per_call]
            rows = self._sample(chunk or [([self.pad_token_id], 0)], n, max_tokens, temperature, top_p, device)
            results += rows[: len(chunk) * n]
        self.model.train(was_training)
        return [results[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """The prompts' KV cache but for their last token, computed once and repeated for each prompt's n rows."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1],
                   past_key_values=cache, use_cache=True, logits_to_keep=1)  # fmt: skip
        cache.batch_repeat_interleave(n)
        return cache

    def _sample(self, prompts, n: int, max_tokens: int, temperature: float, top_p: float, device) -> list[Completion]:
        """One `generate` call over (prompt, seed) pairs, n rows each."""
        generators = []
        for _, s in prompts:
            for j in range(n):
                row_seed = int(torch.randint(0, 2**62, ())) if s is None else completion_seed(s, j)
                generators.append(torch.Generator(device=device).manual_seed(row_seed))
        sampler = _RowSampler(generators, temperature, top_p)
        width = max(2, *(len(p) for p, _ in prompts))  # a token to prefill, on every rank (a synced forward)
        stops = _StopStrings(self.stop, self.decode, width) if self.stop else None
        # Left padding: every prompt ends where generation starts.
        ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p, _ in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in prompts], device=device)
        cache = self._prefill(ids, mask, n)
        ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        from transformers import GenerationConfig, StoppingCriteriaList

        # Every setting explicit: `generate` fills unset ones from the model's generation_config.json.
        config = GenerationConfig(
            do_sample=False,  # the sampling is _RowSampler's
            temperature=1.0,
            top_p=1.0,
            top_k=50,  # transformers' default, unused by greedy decoding
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            max_new_tokens=max_tokens,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.pad_token_id,
        )
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            logits_processor=[sampler],
            stopping_criteria=StoppingCriteriaList([stops] if stops else []),
            synced_gpus=self.synced,
            past_key_values=cache,
        )
        new = out[:, width:].tolist()
        logps = torch.stack(sampler.logprobs, 1).tolist() if sampler.logprobs else [[] for _ in new]
        results = []
        for i, (row, row_logp) in enumerate(zip(new, logps)):
            stop = next((j for j, t in enumerate(row) if t in self.stop_token_ids), None)
            end, finished = (len(row), False) if stop is None else (stop + 1, True)  # keep the stop token
            if stops and stops.ended.get(i, end) < end:  # ended on a stop string first (generate padded it after)
                end, finished = stops.ended[i], True
            results.append(Completion(row[:end], row_logp[:end], finished))
        return results

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass  # generates with the training model itself

    def sleep(self) -> None:
        pass  # nothing to release: it is the training model

    def close(self) -> None:
        pass

    def kv_cache_note(self, *_) -> None:
        return None  # no cache to outgrow
