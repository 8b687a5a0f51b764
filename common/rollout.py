"""Rollout engines behind one interface (common/prompts.py's `RolloutEngine`, built by `make_engine`): `VLLMEngine`
(common/vllm_engine.py) or `HFEngine` (below); both return each sampled token's log-prob under logits / T.
Then the rollout side of a session (`Rollout`, `open_rollout`), and the trainer's weights for its sync
(`state_dict_for_sync`).
Each step's prompts come from `PromptSampler`: a seeded, resumable order, each rank's share of every step."""

import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from common.logprobs import RolloutCorrection, rollout_correction
from common.models import Precision
from common.prompts import Completion, RolloutEngine, completion_seed, prompt_seeds, stop_at, stop_token_ids
from common.run_flags import RunFlags
from common.vllm_engine import VLLMEngine


class PromptSampler:
    """`prompts_per_step` global prompts a step, epoch e shuffled with seed + e, each rank taking its contiguous
    share (a group stays on one rank). Batches run across epochs (each row once per epoch, none dropped); the
    cursor is global, so a run resumes on another world size."""

    def __init__(self, rows: list[dict], prompts_per_step: int, seed: int, rank: int = 0, world_size: int = 1):
        self.rows, self.prompts_per_step, self.seed = rows, prompts_per_step, seed
        self.rank, self.world_size = rank, world_size
        self._epoch, self._pos, self._step = 0, 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed + epoch).shuffle(order)
        return order

    @property
    def epoch(self) -> int:
        """Epoch (0-based) the next prompt is drawn from."""
        return self._epoch

    @property
    def step(self) -> int:
        """Number of batches drawn so far."""
        return self._step

    def next_batch(self) -> list[dict]:
        """This rank's prompts for the next step (prompts_per_step // world_size rows)."""
        indices = []
        while len(indices) < self.prompts_per_step:
            take = min(self.prompts_per_step - len(indices), len(self._order) - self._pos)
            indices += self._order[self._pos : self._pos + take]
            self._pos += take
            if self._pos == len(self._order):  # epoch done: reshuffle with seed + epoch
                self._epoch, self._pos = self._epoch + 1, 0
                self._order = self._permutation(self._epoch)
        self._step += 1
        share = self.prompts_per_step // self.world_size
        mine = indices[self.rank * share : (self.rank + 1) * share]
        return [dict(self.rows[i]) for i in mine]  # copies: callers may annotate rows

    def state_dict(self) -> dict:
        return dict(epoch=self._epoch, pos=self._pos, step=self._step, seed=self.seed, num_rows=len(self.rows))

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != len(self.rows) or state["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for {state['num_rows']} rows / seed {state['seed']}, but this run has "
                f"{len(self.rows)} rows / seed {self.seed}: resume with the same dataset and seed"
            )
        self._epoch, self._pos, self._step = state["epoch"], state["pos"], state["step"]
        self._order = self._permutation(self._epoch)


def count_steps(steps: int, epochs: float | None, num_rows: int, prompts_per_step: int) -> tuple[int, str]:
    """The run's length in steps, and why (for the start line): `steps`, or `epochs` passes over `num_rows`
    prompts rounded up to whole steps. ValueError when one step alone would hold more than `epochs` asks."""
    if epochs is None:
        return steps, f"{steps} steps (--steps)"
    if prompts_per_step > epochs * num_rows:
        raise ValueError(
            f"--epochs {epochs:g} of {num_rows} prompts is less than one step of --prompts_per_step "
            f"{prompts_per_step} ({prompts_per_step / num_rows:.2f} epochs); lower --prompts_per_step, "
            "or give --steps instead of --epochs"
        )
    total = math.ceil(round(epochs * num_rows / prompts_per_step, 6))
    covered = total * prompts_per_step / num_rows
    rounded = f", rounded up to whole steps: {covered:.2f} epochs" if abs(covered - epochs) > 1e-6 else ""
    why = f"{total} steps (--epochs {epochs:g} of {num_rows} prompts at --prompts_per_step {prompts_per_step}{rounded})"
    return total, why


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
    """The rollout engine `backend` names ("vllm" or "hf"). vLLM: its own copy of `model_path` in `dtype`
    ("auto": bf16 on GPU, fp32 on CPU), one per rank; 0 for `max_num_seqs`: vLLM's default. HF: `model` itself
    (loaded when None); `synced`: sharded parameters. `stop`: stop strings (`--stop`, `cut_at_stop`)."""
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


@dataclass
class Rollout:
    """The rollout side of a session: the engine, each step's prompts and their seeds, the engine's sleep and
    its wake-up with the new weights. Built by `open_rollout`."""

    engine: RolloutEngine  # VLLMEngine or HFEngine
    sampler: PromptSampler  # each step's prompts, this rank's share
    tokenizer: object  # the policy's: prompts in, completions out
    seed: int  # --seed
    prompts_per_step: int  # over all ranks
    rank: int
    correction: RolloutCorrection  # pi_old / pi_rollout weights on the loss (--rollout_correction, auto resolved)

    def seeds(self, step: int, n: int) -> list[int]:
        """One seed per prompt of this rank's `n` at `step` (`prompt_seeds`)."""
        return prompt_seeds(self.seed, step, self.prompts_per_step, self.rank, n)

    def texts(self, completions: list) -> list[str]:
        """The completions as text (special tokens left out): what the rewards read."""
        return self.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)

    def sleep(self) -> None:
        """Give the engine's GPU memory to the trainer (--vllm_sleep); it must not sample until `sync_weights`."""
        self.engine.sleep()

    def sync_weights(self, trainer) -> None:
        """Wake the engine with the trainer's new weights (a no-op for the HF engine)."""
        self.engine.load_weights(state_dict_for_sync(trainer.accelerator, trainer.model, self.engine.weight_dtype))

    def resume(self, state: dict, trainer) -> None:
        """After `common.trainer.Trainer.resume`: the data order, and the engine's copy of the weights."""
        self.sampler.load_state_dict(state["sampler"])
        self.sync_weights(trainer)


@dataclass(frozen=True)
class EngineSize:
    """How each rank's engine is sized (vLLM's arguments), for the memory preflight and `open_rollout`."""

    max_model_len: int  # prompt + completion + any extra context (EDGE-GRPO's reflections)
    max_num_seqs: int  # sequences sampled at once: a step's rollout or an evaluation on this rank, at most 1,024
    max_num_batched_tokens: int | None  # None: vLLM's own


def engine_size(spec, run: RunFlags, world: int, eval_sets: dict) -> EngineSize:
    """The engine size of `spec` (`common.session.TrainSpec`) for a step's rollout or an evaluation of `eval_sets`,
    whichever samples more sequences at once."""
    rows_per_rank = spec.prompts_per_step // world * spec.group_size
    eval_rows_per_rank = max((len(r) for r in eval_sets.values()), default=0) * run.eval_n // world
    return EngineSize(
        spec.max_prompt_len + spec.max_completion_len + spec.extra_context,
        run.vllm_max_num_seqs or min(1024, max(rows_per_rank, eval_rows_per_rank)),
        run.vllm_max_num_batched_tokens or None,
    )


def open_rollout(spec, run: RunFlags, model_path: str, tokenizer, trainer, precision: Precision, rows: list[dict],
                 size: EngineSize, stop: list[str]) -> Rollout:  # fmt: skip
    """The rollout side of `spec` (`common.session.TrainSpec`): the sampler over `rows`, the engine of --rollout,
    and the correction of its log-probs' difference from the trainer's."""
    sampler = PromptSampler(rows, spec.prompts_per_step, seed=spec.seed, rank=trainer.rank, world_size=trainer.world)
    mode = trainer.mode
    engine = make_engine(
        run.rollout, model_path, tokenizer, trainer.accelerator.unwrap_model(trainer.model),
        seed=spec.seed + trainer.rank, world=mode.world, max_model_len=size.max_model_len, dtype=precision.engine,
        gpu_memory_utilization=run.vllm_gpu_memory_utilization, sleep=run.vllm_sleep, max_num_seqs=size.max_num_seqs,
        max_num_batched_tokens=run.vllm_max_num_batched_tokens, synced=mode.sharded,
        per_prompt_seeds=run.per_prompt_seeds, stop=stop,
    )  # fmt: skip
    correction = rollout_correction(
        spec.rollout_correction, spec.rollout_correction_min, spec.rollout_correction_max, precision, spec.top_p
    )
    return Rollout(engine, sampler, tokenizer, spec.seed, spec.prompts_per_step, trainer.rank, correction)


# The transformers rollout engine: `generate` on the training model itself (CPU runs, or no vLLM), always in
# sync. Each prompt is prefilled once for its n rows, and each row samples under its own seeded generator.


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


class HFEngine(RolloutEngine):
    """`common.prompts.RolloutEngine` on transformers' `generate`."""

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
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        per_call = max(1, self.batch_size // n)  # whole groups: a prompt's n rows share one prefill
        pairs = list(zip(prompts, seeds, strict=True))
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


# Module-name segments that wrappers insert (FSDP1, torch.compile, activation checkpointing), and DDP / DeepSpeed's
# leading `module.`: none is in an HF checkpoint.
_WRAPPER_SEGMENTS = {"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"}


def hf_name(name: str) -> str:
    """A parameter name without wrapper segments: the name in the HF checkpoint."""
    parts = [p for p in name.split(".") if p not in _WRAPPER_SEGMENTS]
    while parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "full_tensor")


def state_dict_for_sync(
    accelerator, model: torch.nn.Module, dtype: torch.dtype | None = None
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
