"""Multi-process training with accelerate: the pieces every script needs.

One process per GPU (or one CPU process); each rank owns whole prompt groups,
has its own colocated rollout engine, and averages gradients with the others.
"""

from collections.abc import Iterator

import torch
from accelerate import Accelerator


def make_accelerator(mixed_precision: str = "no") -> Accelerator:
    return Accelerator(mixed_precision=mixed_precision)


def global_sum(accelerator: Accelerator, value: float) -> float:
    """Sum of a per-rank number over all ranks (e.g. token counts for loss denominators)."""
    t = torch.tensor(float(value), device=accelerator.device)
    return accelerator.reduce(t, reduction="sum").item() if accelerator.num_processes > 1 else t.item()


def reduce_metrics(accelerator: Accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """Mean of each metric over ranks (every rank holds the same number of groups)."""
    if accelerator.num_processes == 1:
        return metrics
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], device=accelerator.device)
    t = accelerator.reduce(t, reduction="mean")
    return dict(zip(keys, t.tolist()))


def state_dict_for_sync(accelerator: Accelerator, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) pairs of the policy, for the rollout engine's reload."""
    for name, param in accelerator.unwrap_model(model).state_dict().items():
        yield name, param.detach()
