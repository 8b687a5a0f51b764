"""Dynamic sampling: more prompts drawn within a step until every rank holds enough groups worth training on.

    got = fill_groups(draw, rollout, keep, need, max_batches, fewest=partial(fewest_over_ranks, accelerator))
    got.groups    # exactly `need` groups on every rank; got.batches, got.gave_up, got.kept: what it took

DAPO's (arXiv 2503.14476, Sec. 3.2, the constraint of eq. 8) over-sampling, with verl's cap on the
generation batches a step may draw (`max_num_gen_batches`). Which groups to keep is the caller's
decision (`keep`); this module draws, generates and counts, and keeps the ranks in step: every rank
draws and makes an engine call each round, a rank that is already full with no prompts (the engine's
own collectives, ZeRO-3's and FSDP's sharded generation, still see it), and all stop together once the
fewest groups any rank holds reaches `need` (one all-reduce a round).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Filled:
    groups: list  # `need` groups: the kept ones, then (only when it gave up) the first dropped ones
    kept: int  # how many of `groups` were kept (`need` unless it gave up)
    batches: int  # generation batches drawn this step, the same on every rank
    generated: int  # groups this rank generated
    kept_seen: int  # groups this rank kept, past `need` too (the surplus of the last batch is dropped)
    gave_up: bool  # `max_batches` reached before every rank held `need` kept groups


def fill_groups(
    draw: Callable[[], list],
    rollout: Callable[[list], list],
    keep: Callable[[list], list[bool]],
    need: int,
    max_batches: int,
    fewest: Callable[[int], int] = lambda n: n,
) -> Filled:
    """Rounds of: `draw()` this rank's prompts of the next generation batch; `rollout(prompts)` one group per
    prompt (an empty list once this rank holds `need`: the call is still made); `keep(groups)` one bool per
    group. Stops when `fewest(kept)` (the minimum over ranks) reaches `need`, or after `max_batches`
    rounds (0: no limit). Having given up, a rank short of `need` fills the remaining places with the
    first groups it dropped, so every rank trains on `need` groups (a caller whose dropped groups carry no
    advantage thus trains as if no group had been filtered there). The first round gives every rank
    len(draw()) groups, so `draw` must give at least `need` prompts."""
    kept, dropped, batches, generated, seen = [], [], 0, 0, 0
    while True:
        batches += 1
        prompts = draw()
        if batches == 1 and len(prompts) < need:
            raise ValueError(f"draw() gave {len(prompts)} prompts, fewer than the {need} groups a rank must hold")
        groups = rollout(prompts if len(kept) < need else [])
        generated += len(groups)
        for group, ok in zip(groups, keep(groups), strict=True):
            seen += bool(ok)
            if ok and len(kept) < need:
                kept.append(group)
            elif not ok and len(dropped) < need:  # enough to fill with; the rest is let go
                dropped.append(group)
        full = fewest(len(kept)) >= need
        if full or (max_batches and batches >= max_batches):
            break
    return Filled((kept + dropped)[:need], len(kept), batches, generated, seen, gave_up=not full)


def fewest_over_ranks(accelerator, n: int) -> int:
    """The smallest `n` over all ranks (every rank gets it); `n` itself on one process."""
    if accelerator.num_processes == 1:
        return n
    import torch
    import torch.distributed as dist

    t = torch.tensor(n, device=accelerator.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)
