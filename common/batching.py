"""A rollout -> padded training tensors, and its split into micro-batches."""

import torch


def pack(prompts: list[list[int]], completions: list, pad_id: int, device=None) -> dict[str, torch.Tensor]:
    """Prompts (token ids) and the engine's completions (`common.rollout.Completion`) -> a padded batch.

    Prompts are left-padded to P and completions right-padded to C, then concatenated: the layout
    [pad.. prompt | completion ..pad] puts every completion at columns P..P+C-1, so its log-probs are
    the last C positions (`logits_to_keep=C`) and `completion_mask` is [N, C]. The batch also holds
    the engine's log-probs of the sampled tokens ("rollout_logp" [N, C]; NaN for tokens the engine
    did not sample), whether each completion ended on a stop token ("finished" [N]), and each row's
    prompt and completion lengths as host lists ("prompt_lens", "completion_lens"): micro-batch plans
    and cuts read them without waiting for the device.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    P = max(map(len, prompts))
    C = max(1, max(len(c.token_ids) for c in completions))
    ids, attn, cmask = [], [], []
    for p, c in zip(prompts, completions):
        c = c.token_ids
        ids.append([pad_id] * (P - len(p)) + p + c + [pad_id] * (C - len(c)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
        cmask.append([1] * len(c) + [0] * (C - len(c)))
    return {
        "input_ids": torch.tensor(ids, device=device),
        "attention_mask": torch.tensor(attn, device=device),
        "completion_mask": torch.tensor(cmask, device=device, dtype=torch.float32),
        "prompt_mask": torch.tensor(attn, device=device, dtype=torch.float32)[:, :P],
        "rollout_logp": pad_right([c.logprobs for c in completions], C, device=device),
        "finished": torch.tensor([c.finished for c in completions], device=device, dtype=torch.bool),
        "prompt_lens": [len(p) for p in prompts],
        "completion_lens": [len(c.token_ids) for c in completions],
    }


def pad_right(rows: list[list[float]], width: int, value: float = 0.0, device=None) -> torch.Tensor:
    """Ragged per-token lists (e.g. the engine's log-probs) -> [N, width] tensor."""
    return torch.tensor(
        [r[:width] + [value] * (width - len(r[:width])) for r in rows], device=device, dtype=torch.float32
    )


def micro_batches(
    prompt_lens: list[int],
    completion_lens: list[int],
    rows: list[int],
    micro_batch_size: int,
    max_tokens: int = 0,
    count: int = 0,
    memory_tokens: int = 0,
) -> list[list[int]]:
    """Split `rows` (indices into the batch) into the micro-batches of one forward/backward each.

    - `max_tokens == 0`: consecutive runs of up to `micro_batch_size` rows, in order; with
      `memory_tokens > 0` a run also ends before its padded size, rows x (its longest prompt +
      its longest completion), would pass `memory_tokens` (a longer sequence goes alone).
    - `max_tokens > 0`: rows sorted by length (longest first) and packed greedily so that each
      micro-batch's padded size stays within `max_tokens` (a longer sequence goes alone):
      similar lengths share a micro-batch, so little compute goes to padding whatever the
      length distribution.
    - `count`: split the largest micro-batches until there are at least `count` (empty lists
      once every row is alone), for sharded models, where every rank must run as many forwards.
    Each micro-batch is then cut to its own longest prompt and completion (`select`).
    """
    sized = max_tokens > 0  # sorted by length, packed under max_tokens; else in order, under memory_tokens
    order = sorted(rows, key=lambda r: (-completion_lens[r], -prompt_lens[r], r)) if sized else rows
    budget = max_tokens if sized else memory_tokens
    plan, p_max, c_max = [], 0, 0
    for r in order:
        p, c = max(p_max, prompt_lens[r]), max(c_max, completion_lens[r])
        fits = (len(plan[-1]) + 1) * (p + c) <= budget if plan and budget > 0 else bool(plan)
        if fits and (sized or len(plan[-1]) < micro_batch_size):
            plan[-1].append(r)
            p_max, c_max = p, c
        else:
            plan.append([r])
            p_max, c_max = prompt_lens[r], completion_lens[r]
    while len(plan) < count:
        largest = max(range(len(plan)), key=lambda i: len(plan[i]), default=None)
        if largest is None or len(plan[largest]) < 2:
            plan.append([])
        else:
            mb = plan.pop(largest)
            plan[largest:largest] = [mb[: len(mb) // 2], mb[len(mb) // 2 :]]
    return plan


def activation_bytes_per_token(config, bytes_per_value: int, checkpointing: bool) -> int:
    """Estimated activation memory a training forward keeps per token of a micro-batch, from the model's
    shape: per decoder layer ~6 hidden-sized values (norms, attention projections and output, residual)
    and ~3 MLP-sized ones (gate, up, their product); with gradient checkpointing each layer keeps its
    input only, and one layer's activations are recomputed at a time."""
    D = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or 4 * D
    layers = config.num_hidden_layers
    per_layer = 6 * D + 3 * inner
    return bytes_per_value * (layers * D + per_layer if checkpointing else layers * per_layer)


def rows_with_loss(advantages: torch.Tensor, mask: torch.Tensor, every_row: bool) -> list[bool]:
    """Per row of the batch: may its loss be non-zero? False where the advantage ([N] or [N, C]) is 0
    at every completion token and no other term (`every_row`: e.g. a KL penalty) acts on it: the
    clipped surrogate of such a row, and its gradient, are identically 0, so the update can leave it
    out of its micro-batches (the loss denominators still count it). One host read per call."""
    if every_row:
        return [True] * len(mask)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    return ((adv != 0) & (mask > 0)).any(-1).tolist()  # NaN != 0: a NaN row is trained and shows up


def select(batch: dict[str, torch.Tensor], idx: list[int]) -> dict[str, torch.Tensor]:
    """The rows `idx` of a `pack`ed batch, cut to their own longest prompt and completion.

    Prompts are left-padded and completions right-padded, so the cut keeps columns
    P - p_max .. P + c_max - 1. An empty `idx` (a rank with fewer micro-batches than
    its peers) gives row 0 with nothing to train on: the forward runs, its loss is 0.
    The lengths come from the batch's host lists and the row indices go to the device
    without blocking: cutting a micro-batch never waits for the device.
    """
    device = batch["input_ids"].device
    rows = torch.tensor(idx or [0])
    rows = rows.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else rows.to(device)
    P = batch["prompt_mask"].shape[1]
    p_max = max(batch["prompt_lens"][i] for i in idx or [0])
    c_max = max(1, max(batch["completion_lens"][i] for i in idx or [0]))
    cols = slice(P - p_max, P + c_max)
    return {
        "rows": rows,
        "input_ids": batch["input_ids"][rows, cols],
        "attention_mask": batch["attention_mask"][rows, cols],
        "completion_mask": batch["completion_mask"][rows, :c_max] * (1.0 if idx else 0.0),
        "prompt_mask": batch["prompt_mask"][rows, P - p_max :],
    }
