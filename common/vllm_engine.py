"""The vLLM rollout engine: vLLM in the training process (`vllm.LLM`, one per rank under accelerate), and the
weight sync that pushes the trainer's parameters into its copy after every optimiser step (`push_weights`).
Sets VLLM_ENABLE_V1_MULTIPROCESSING=0: the sync hands tensors to an engine core in this process.
"""

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from functools import partial

import torch

from common.cli import require
from common.metrics import quiet_libraries
from common.models import kv_bytes_per_token, model_shape
from common.prompts import Completion, RolloutEngine, stop_at

CPU_KV_CACHE_GIB = 2  # the most a run's own sizing gives vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE: any size)
VLLM_CPU_MAX_NUM_SEQS = 256  # vLLM 0.32's CPU default for `LLM` (engine/arg_utils.py, default_max_num_seqs)
VLLM_CPU_BLOCK = 32  # tokens per KV block on CPU: the smallest vLLM 0.32's CPU attention takes (its default: 128)


def kv_cache_per_token(config, dtype: str) -> int | None:
    """Bytes of K and V per token of `config`'s model in `dtype` ("auto": 4, the most vLLM may pick on CPU); None
    for a cache of another kind (latent, state-space, linear attention) or missing fields: CPU_KV_CACHE_GIB then."""
    try:
        text = config.get_text_config()
        shape = model_shape(text)
        other_layers = set(getattr(text, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    except Exception:  # a field missing, or a per-layer one read as one (transformers' heterogeneous configs)
        return None
    if not shape.layers or other_layers or getattr(text, "kv_lora_rank", None):
        return None
    return kv_bytes_per_token(shape, 4 if dtype == "auto" else getattr(torch, dtype).itemsize)


def cpu_kv_cache_bytes(bytes_per_token: int | None, max_model_len: int, max_num_seqs: int | None) -> int:
    """vLLM's CPU KV cache: every sequence decoded at once at its longest, in whole MiB, at most CPU_KV_CACHE_GIB.
    vLLM zeroes it at start-up (seconds per GiB), so a tiny model's engine starts in megabytes."""
    cap = CPU_KV_CACHE_GIB * 2**30
    if bytes_per_token is None:
        return cap
    need = kv_tokens(max_model_len, max_num_seqs or VLLM_CPU_MAX_NUM_SEQS) * bytes_per_token
    return min(cap, -(-need // 2**20) * 2**20)


def kv_tokens(max_model_len: int, sequences: int) -> int:
    """KV cache tokens for `sequences` of `max_model_len`: whole blocks each, and one more (vLLM keeps one empty)."""
    return sequences * (-(-max_model_len // VLLM_CPU_BLOCK) + 1) * VLLM_CPU_BLOCK


def engine_kv_cache_bytes(
    environ: dict, model_path: str, dtype: str, max_model_len: int, max_num_seqs: int | None
) -> int | None:
    """The CPU KV cache the engine gives vLLM: None when VLLM_CPU_KVCACHE_SPACE sets it, else `cpu_kv_cache_bytes`."""
    if environ.get("VLLM_CPU_KVCACHE_SPACE", "").strip():
        return None
    environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # a blank value: vLLM would int() it
    from transformers import AutoConfig

    try:
        per_token = kv_cache_per_token(AutoConfig.from_pretrained(model_path), dtype)
    except Exception:  # a model vLLM reads and transformers does not: vLLM says what is wrong, if anything
        per_token = None
    one = kv_tokens(max_model_len, 1) * (per_token or 0)
    require(
        one <= CPU_KV_CACHE_GIB * 2**30,
        f"one sequence of {max_model_len:,} tokens needs {one / 2**30:.1f} GiB of KV cache, more than the "
        f"{CPU_KV_CACHE_GIB} GiB vLLM gets on CPU by default: set VLLM_CPU_KVCACHE_SPACE (whole GiB), e.g. "
        f"VLLM_CPU_KVCACHE_SPACE={math.ceil(one / 2**30)}",
    )
    return cpu_kv_cache_bytes(per_token, max_model_len, max_num_seqs)


def sampling_context(gpu: bool) -> contextlib.AbstractContextManager:
    """Where vLLM samples. On CPU, torch.compile off: vLLM compiles its sampler's rank count
    (`batched_count_greater_than`) at the first call, seconds of every run, and eager counts the same."""
    return contextlib.nullcontext() if gpu else torch._dynamo.config.patch(disable=True)


def vllm_engine_args(
    model_path: str, *, max_model_len: int, seed: int, dtype: str, gpu: bool, gpu_memory_utilization: float = 0.3,
    enable_sleep_mode: bool = False, distributed: bool = False, max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None, detokenize: bool = False, kv_cache_bytes: int | None = None,
) -> dict:  # fmt: skip
    """The arguments of `vllm.LLM`, on a GPU or not, so a CPU test can check the GPU's without vLLM. `detokenize`:
    load the tokenizer (stop strings need it); `kv_cache_bytes`: the CPU KV cache (`cpu_kv_cache_bytes`)."""
    kwargs = {}
    if distributed:  # one engine per accelerate rank, TRL's colocate mode
        kwargs["distributed_executor_backend"] = "external_launcher"
    if gpu:
        kwargs |= {"gpu_memory_utilization": gpu_memory_utilization, "enable_sleep_mode": enable_sleep_mode}
    if max_num_seqs:  # sequences decoded together; a step's whole rollout at once if the KV cache holds it
        kwargs["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens:  # tokens per forward (chunked prefill budget)
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    if not gpu:
        # vLLM 0.32 CPU cannot rewind a seeded request's generator after a chunk of a split prompt (and unseeded,
        # one token rounded differently shifts every sequence's samples): whole prompts only.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(max_num_batched_tokens or 0, max_model_len, 2048)
        # A prompt's n samples share its prefill in whole prefix-cache blocks: at 128 tokens a shorter prompt is
        # computed n times (SmolLM2's evaluation: 139 s of prefill against 17 s at 32; docs/SCALING.md).
        kwargs["block_size"] = VLLM_CPU_BLOCK
        if kv_cache_bytes:
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
    return dict(
        model=model_path,
        skip_tokenizer_init=not detokenize,  # we tokenise and detokenise ourselves
        dtype=dtype,
        max_model_len=max_model_len,
        seed=seed,
        enable_prefix_caching=True,
        # CPU: torch.compile's warm-up costs ~a minute for nothing; GPU: CUDA graphs stay valid (in-place reloads).
        enforce_eager=not gpu,
        logprobs_mode="processed_logprobs",  # log-probs after temperature, as the trainer computes them
        use_tqdm_on_load=False,  # one progress bar per run: ours
        **kwargs,
    )


class VLLMEngine(RolloutEngine):
    """`common.prompts.RolloutEngine` on vLLM, which stops each sequence once its text holds a stop string."""

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
        stop: Iterable[str] = (),
        decode: Callable[[list[int]], str] | None = None,
    ):
        super().__init__(stop, decode)
        # In-process engine core: collective_rpc reaches the model without serialising the weights.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.gpu = torch.cuda.is_available()
        kv_cache_bytes = None
        if not self.gpu:  # vLLM alone would reserve 92% of the machine's memory
            kv_cache_bytes = engine_kv_cache_bytes(os.environ, model_path, dtype, max_model_len, max_num_seqs)
        quiet_libraries()  # before vLLM is imported: its log lines go through our filter
        from vllm import LLM

        # Every reload warns that RotaryEmbedding got no weights: its cos/sin cache is computed. Expected.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            lambda record: "RotaryEmbedding" not in record.getMessage()
        )

        self.llm = LLM(**vllm_engine_args(
            model_path, max_model_len=max_model_len, seed=seed, dtype=dtype, gpu=self.gpu,
            gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode, distributed=distributed,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, detokenize=bool(self.stop),
            kv_cache_bytes=kv_cache_bytes,
        ))  # fmt: skip
        self.stop_token_ids = list(stop_token_ids)
        self.weight_dtype = None if dtype == "auto" else getattr(torch, dtype)  # what load_weights is best given
        self.per_prompt_seeds = per_prompt_seeds
        self.sleep_mode = enable_sleep_mode and self.gpu
        self.asleep: set[str] = set()  # the parts released by sleep() and not woken yet

    def sample(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | list[int] | None = None,
    ) -> list[list[Completion]]:
        """`generate` before the cut: each sequence ends on the token that completes a stop string. A prompt
        whose vLLM text held one that `decode`'s lacks is sampled again without them: the cut is `decode`'s."""
        if not prompts:
            return []
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        if not self.per_prompt_seeds:
            # Unseeded: the engine's own generator, seeded at construction (--per_prompt_seeds false: docs/SCALING.md).
            seeds = [None] * len(prompts)
        args = (n, max_tokens, temperature, top_p)
        groups = self._sample(prompts, seeds, *args, stop=self.stop)
        redo = [i for i, g in enumerate(groups) if any(self._stopped_early(c) for c in g)]
        if redo:
            again = self._sample([prompts[i] for i in redo], [seeds[i] for i in redo], *args, stop=())
            for i, group in zip(redo, again):
                groups[i] = group
        return groups

    def _stopped_early(self, c: Completion) -> bool:
        """Did vLLM end `c` on a stop string (finished, not on a stop token) that `decode`'s text of it lacks?"""
        on_string = c.finished and c.token_ids and c.token_ids[-1] not in self.stop_token_ids
        return bool(on_string) and stop_at(self.decode(c.token_ids), self.stop) is None

    def _sample(self, prompts, seeds, n, max_tokens, temperature, top_p, stop) -> list[list[Completion]]:
        from vllm import SamplingParams, TokensPrompt

        self._wake("weights", "kv_cache")
        params = [
            SamplingParams(
                n=n,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=s,
                logprobs=0,  # the sampled token's own log-prob
                stop_token_ids=self.stop_token_ids,
                stop=list(stop),
                detokenize=bool(stop),  # the text only where a stop string is looked for
            )
            for s in seeds
        ]
        with sampling_context(self.gpu):
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
        """Push HF-named parameters into vLLM, `batch_bytes` at a time, consumed lazily (ZeRO-3 / FSDP2: one batch
        of full tensors at once). A slept engine wakes its weights only: the KV cache waits for `generate`."""
        self._wake("weights")
        push_weights(self.llm, named_tensors, batch_bytes)

    def close(self) -> None:
        """Shut down while the process group still exists (at exit, vLLM's teardown prints a traceback)."""
        self.llm.llm_engine.engine_core.shutdown()

    def sleep(self) -> None:
        """Free vLLM's GPU memory during the update: level 2 discards the weights (the sync overwrites them) and
        the KV cache. `load_weights` wakes the weights, `generate` the KV cache; it must not sample in between."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = {"weights", "kv_cache"}

    def _wake(self, *tags: str) -> None:
        """Wake only what is asleep: vLLM warns (and reallocates nothing) on an awake engine."""
        todo = [t for t in tags if t in self.asleep]
        if todo:
            self.llm.wake_up(tags=todo)
            self.asleep -= set(todo)


# The weight sync, run inside vLLM's worker (`LLM.collective_rpc`, in this process: tensors are handed over).
# `reload_weights` cannot be called per batch: a fused layer (qkv_proj) given some of its tensors is processed
# half empty (NaN log-probs). So the layer-wise reload is opened once (`begin_reload`), fed batch by batch
# (`load_batch`), and closed once (`end_reload`). On a weight update vLLM 0.32's unquantized MoE method skips
# its experts kernel's post-load step (`_setup_kernel`: `is_weight_update`), which on CPU pads and prepacks the
# experts: without it a tiny Qwen3-MoE was off by 0.6-1.2 nats per token (tests/test_moe_sync.py).
# `_experts_step_on_update` runs it.


def begin_reload(worker) -> None:
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    model = worker.model_runner.get_model()
    initialize_layerwise_reload(model)
    for method in _moe_methods(model):
        method.process_weights_after_loading = partial(_experts_step_on_update, method)


def load_batch(worker, items: list[tuple[str, torch.Tensor]]) -> None:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        worker.model_runner.get_model().load_weights(iter(items))


def end_reload(worker) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    runner = worker.model_runner
    model = runner.get_model()
    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(model, runner.model_config)
    for method in _moe_methods(model):
        vars(method).pop("process_weights_after_loading", None)  # the class's own again
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as reload_weights does
        getattr(runner, reset, lambda: None)()


def _moe_methods(model: torch.nn.Module) -> list:
    """The unquantized MoE methods of `model` whose experts kernel is built (vLLM built it at the first load)."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    methods = (getattr(m, "quant_method", None) for m in model.modules())
    return [m for m in methods if isinstance(m, UnquantizedFusedMoEMethod) and m.moe_kernel is not None]


def _experts_step_on_update(method, layer: torch.nn.Module) -> None:
    """`method.process_weights_after_loading(layer)` as at the first load: vLLM's own, then the experts kernel's
    post-load step if vLLM skipped it (not twice, should a later vLLM run it)."""
    experts = method.moe_kernel.fused_experts
    ran = []
    experts.process_weights_after_loading = lambda lay: ran.append(
        type(experts).process_weights_after_loading(experts, lay)
    )
    try:
        type(method).process_weights_after_loading(method, layer)
    finally:
        del experts.process_weights_after_loading
    if not ran and method.moe_kernel.fused_experts is experts:  # a rebuilt kernel was set up by vLLM itself
        experts.process_weights_after_loading(layer)


def tensor_batches(
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


def push_weights(llm, named_tensors: Iterable[tuple[str, torch.Tensor]], batch_bytes: int) -> None:
    """The tensors into `llm`'s model, then its prefix cache reset: blocks of the old weights cost nats of error."""
    llm.collective_rpc(begin_reload)
    for batch in tensor_batches(named_tensors, batch_bytes):
        llm.collective_rpc(load_batch, args=(batch,))
    llm.collective_rpc(end_reload)
    llm.reset_prefix_cache()
