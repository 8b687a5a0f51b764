"""A rollout -> padded training tensors, and its split into micro-batches: their layout (padded, packed or
sharing prompts) and their token budget from the device's memory."""

import os
from dataclasses import dataclass

import torch


def pack(prompts: list[list[int]], completions: list, pad_id: int, device=None) -> dict[str, torch.Tensor]:
    """Prompts (token ids) and the engine's completions (`common.rollout.Completion`) -> a padded batch,
    [pad.. prompt | completion ..pad], so the completions' log-probs are the last C positions. "rollout_logp": the
    engine's (NaN where it did not sample); "prompt_lens", "completion_lens", "prompt_group" (`shared_prefix`): host
    lists, read without waiting for the device."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if not all(prompts):
        raise ValueError("a prompt has no tokens: nothing would predict its completion's first token")
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
        "prompt_group": prompt_groups(prompts),
    }


def prompt_groups(prompts: list[list[int]]) -> list[int]:
    """Per row, the index of the first row of its run of identical consecutive prompts."""
    groups = []
    for i, p in enumerate(prompts):
        groups.append(groups[-1] if i and p == prompts[i - 1] else i)
    return groups


def pad_right(rows: list[list[float]], width: int, value: float = 0.0, device=None) -> torch.Tensor:
    """Ragged per-token lists (e.g. the engine's log-probs) -> [N, width] tensor."""
    return torch.tensor(
        [r[:width] + [value] * (width - len(r[:width])) for r in rows], device=device, dtype=torch.float32
    )


def micro_batches(
    prompt_lens: list[int], completion_lens: list[int], rows: list[int], micro_batch_size: int, max_tokens: int = 0,
    count: int = 0, memory_tokens: int = 0,
) -> list[list[int]]:  # fmt: skip
    """Split `rows` (indices into the batch) into micro-batches of one forward/backward each: runs of up to
    `micro_batch_size` rows in order, within `memory_tokens` padded tokens (rows x longest sequence) when > 0; or,
    with `max_tokens`, sorted longest first and packed greedily within it, so little compute goes to padding. The
    largest are split until there are `count` (then empty lists): every rank of a sharded model runs as many."""
    sized = max_tokens > 0
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


def activation_bytes_per_token(config, bytes_per_value: int, checkpointing: bool, residual_bytes: int = 0) -> int:
    """Estimated activation bytes a training forward keeps per token: per layer ~6 hidden-sized values and ~3
    MLP-sized ones; with gradient checkpointing each layer's input only, plus one layer recomputed at a time. The
    residual stream takes `residual_bytes` a value (0: `bytes_per_value`; `common.models.Precision`)."""
    D = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or 4 * D
    layers = config.num_hidden_layers
    residual = residual_bytes or bytes_per_value
    per_layer = residual * D + bytes_per_value * (5 * D + 3 * inner)
    return layers * residual * D + per_layer if checkpointing else layers * per_layer


def micro_batch_tokens(
    config, bytes_per_value: int, prompt_len: int, completion_len: int, *, memory_gb: float, micro_batch_size: int,
    max_tokens_per_micro_batch: int, gradient_checkpointing: bool, say, residual_bytes: int = 0,
) -> int:  # fmt: skip
    """The padded tokens a micro-batch may hold in `memory_gb` of activations (0: 1/8 of this process's device),
    or 0 when --max_tokens_per_micro_batch plans by tokens. Says so when the cap binds."""
    if max_tokens_per_micro_batch:
        return 0
    per_token = activation_bytes_per_token(config, bytes_per_value, gradient_checkpointing, residual_bytes)
    budget = memory_gb * 2**30 or device_memory_bytes() / 8
    tokens = max(1, int(budget // per_token))
    longest = prompt_len + completion_len
    if tokens < micro_batch_size * longest:
        say(
            f"micro-batches: up to {micro_batch_size} sequences and {tokens:,} padded tokens each ("
            f"{budget / 2**30:.1f} GiB of activations at ~{per_token / 2**20:.2f} MiB a token for this model; "
            f"{max(1, tokens // longest)} sequences at the longest): --micro_batch_memory_gb sets the budget"
        )
    return tokens


def device_memory_bytes() -> int:
    """This process's share of its device: the GPU's memory, or the machine's RAM over its local processes."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def device_memory_gib(gpu: bool) -> float | None:
    """This GPU's total memory in GiB for the memory preflight; None without one (CPU memory is not planned)."""
    return device_memory_bytes() / 2**30 if gpu else None


# Attention that runs packed sequences without computing across them (varlen / block-sparse kernels).
PACKED_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")
# Attention that takes any [B, 1, T, T] mask as it is (the shared-prefix layout's).
MASKED_ATTENTION = ("sdpa", "eager")


def pass_layout(padding_free: str, share_prompts: bool, attn_implementation: str | None, sliding: bool) -> str:
    """The micro-batches' layout (`select`). "auto" packs only where the attention skips the pairs across
    sequences (SDPA and eager would be quadratic in the packed row). Shared prompts need a 4D mask, and no sliding
    window: transformers uses a given 4D mask as it is, so the window would be lost."""
    if padding_free == "on" or (padding_free == "auto" and attn_implementation in PACKED_ATTENTION):
        return "packed"
    return "shared" if share_prompts and attn_implementation in MASKED_ATTENTION and not sliding else "padded"


def sliding(config) -> bool:
    """Does any layer attend within a sliding window (Mistral's sliding_window; Qwen2's layer_types)?"""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return "sliding_attention" in layer_types
    return getattr(config, "sliding_window", None) is not None


def rows_with_loss(advantages: torch.Tensor, mask: torch.Tensor, every_row: bool, weight=None) -> list[bool]:
    """Per row: may its loss be non-zero? False where the advantage ([N] or [N, C]) or the correction's `weight`
    is 0 at every completion token and no other term (`every_row`: e.g. KL) acts: its surrogate and gradient are
    0, so the update may leave it out of its micro-batches (the denominators still count it). One host read."""
    if every_row:
        return [True] * len(mask)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    acts = (adv != 0) & (mask > 0)  # NaN != 0: a NaN row is trained and shows up
    if weight is not None:  # a completion the correction rejects at every token (sequence / geometric masks)
        acts = acts & (weight != 0)
    return acts.any(-1).tolist()


@dataclass
class SharedPrefix:
    """A micro-batch laid out one row per prompt, [prompt | its completions | pad], each prompt computed once
    (Prefix Grouper, arXiv 2506.05433). A completion attends to its prompt and its own earlier tokens, positions
    continuing from the prompt's: log-probs and gradients equal the padded layout's. `source` maps back: per row
    and column t of the padded [n, L] layout, the flat position in [R * T] that predicts column t + 1, or -1."""

    input_ids: torch.Tensor  # [R, T]
    position_ids: torch.Tensor  # [R, T]
    mask: torch.Tensor  # [R, 1, T, T] bool: query attends key
    source: torch.Tensor  # [n, L - 1] long, on the host: index tensors are made from it without a device sync


# The shared layout's [R, 1, T, T] mask, and the bias SDPA makes of it per layer, grow with T^2: beyond
# this many mask bytes (T ~ 8k for one row) the padded layout, which may need no mask at all, is kept.
MAX_MASK_BYTES = 2**26


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device` without blocking the host (pinned, asynchronous on CUDA)."""
    return t.pin_memory().to(device, non_blocking=True) if torch.device(device).type == "cuda" else t.to(device)


def shared_prefix(batch: dict, idx: list[int], device) -> SharedPrefix | None:
    """The `SharedPrefix` layout of the rows `idx` of a `pack`ed batch, or None unless it takes fewer token
    positions, no more attention pairs (long completions stay padded) and a mask within MAX_MASK_BYTES. No sync."""
    groups: dict[int, list[int]] = {}
    for j, r in enumerate(idx):
        groups.setdefault(batch["prompt_group"][r], []).append(j)
    p_lens = [batch["prompt_lens"][r] for r in idx]
    c_lens = [batch["completion_lens"][r] for r in idx]
    n, C = len(idx), max(1, max(c_lens))
    L = max(p_lens) + C
    lengths = [p_lens[js[0]] + sum(c_lens[j] for j in js) for js in groups.values()]
    R, T = len(lengths), max(lengths)
    if len(groups) == n or R * T >= n * L or R * T * T > min(n * L * L, MAX_MASK_BYTES):
        return None
    P, width = batch["prompt_mask"].shape[1], batch["input_ids"].shape[1]
    take = torch.zeros(R, T, dtype=torch.long)  # flat index into the batch's input_ids
    pos = torch.zeros(R, T, dtype=torch.long)
    segment = torch.full((R, T), -1, dtype=torch.long)  # 0: prompt, j + 1: completion j, -1: pad
    source = torch.full((n, L - 1), -1, dtype=torch.long)
    for g, js in enumerate(groups.values()):
        p, first = p_lens[js[0]], idx[js[0]]
        take[g, :p] = first * width + P - p + torch.arange(p)
        pos[g, :p] = torch.arange(p)
        segment[g, :p] = 0
        flat, lead = g * T, L - C - p  # row j's prompt starts at column lead of the padded micro-batch
        start = p
        for j in js:
            source[j, lead : lead + p - 1] = flat + torch.arange(p - 1)  # the prompt's own tokens
            c, r = c_lens[j], idx[j]
            take[g, start : start + c] = r * width + P + torch.arange(c)
            pos[g, start : start + c] = p + torch.arange(c)
            segment[g, start : start + c] = j + 1
            if c:  # the completion's first token is predicted by the prompt's last one (column L - C - 1)
                source[j, L - C - 1] = flat + p - 1
                source[j, L - C : L - C + c - 1] = flat + start + torch.arange(c - 1)
            start += c
    seg = to_device(segment, device)
    order = torch.arange(T, device=device)
    mask = (seg[:, None, :] == seg[:, :, None]) | (seg[:, None, :] == 0)  # [R, q, k]: own segment or the prompt
    mask &= order[:, None] >= order  # causal: k <= q
    mask &= seg[:, :, None] >= 0  # no pad query attends anything ...
    mask |= order[:, None] == order  # ... but itself (a fully masked row would be NaN)
    ids = batch["input_ids"].view(-1)[to_device(take, device)].masked_fill(seg < 0, 0)
    return SharedPrefix(ids, to_device(pos, device), mask[:, None], source)


@dataclass
class Packed:
    """A micro-batch's real tokens in one row [1, T], position ids restarting at 0 per sequence (padding-free:
    TRL's padding_free, verl's remove-padding; `common.logprobs._packed`). Built on the host, sent without a sync."""

    take: torch.Tensor  # [T] long: each packed token's flat place in the micro-batch's [n, L] input_ids
    position_ids: torch.Tensor  # [1, T] long
    flash: dict  # the sequence boundaries for flash-attention's varlen kernel (`flash_varlen_kwargs`)
    first: list[int]  # host, per row: the column of its first real token ([n, L] layout)
    end: list[int]  # host, per row: one past the column of its last real token
    start: list[int]  # host, per row: the packed position of its first token


def flash_varlen_kwargs(lengths: list[int], device) -> dict:
    """The packed row's sequence boundaries as transformers' flash-attention takes them (5.19,
    `_flash_attention_forward`): given all four, no layer infers them from the position ids, which costs a few
    device syncs per layer. The longest is a Python int (a tensor would be read back); other attention ignores them."""
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu = to_device(cu, device)
    longest = max(lengths, default=0)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def packed(first: list[int], end: list[int], width: int, device) -> Packed:
    """The `Packed` layout of n rows of `width` columns whose real tokens are columns first[j] .. end[j] - 1."""
    take, pos, start, at = [], [], [], 0
    for j, (a, b) in enumerate(zip(first, end)):
        take.append(j * width + torch.arange(a, b))
        pos.append(torch.arange(b - a))
        start.append(at)
        at += b - a
    lengths = [b - a for a, b in zip(first, end)]
    take, pos = torch.cat(take), torch.cat(pos)[None]
    return Packed(
        to_device(take, device), to_device(pos, device), flash_varlen_kwargs(lengths, device), first, end, start
    )


def select(batch: dict[str, torch.Tensor], idx: list[int], layout: str = "padded") -> dict[str, torch.Tensor]:
    """The rows `idx` of a `pack`ed batch, cut to columns P - p_max .. P + c_max - 1, without waiting for the
    device. An empty `idx` (a rank short of micro-batches) gives row 0 with nothing to train on. "layout", for
    `common.logprobs.sequence_logprobs`: "padded", their `Packed`, or their `shared_prefix` where it computes less."""
    device = batch["input_ids"].device
    rows = to_device(torch.tensor(idx or [0]), device)
    P = batch["prompt_mask"].shape[1]
    p_lens, c_lens = ([batch[k][i] for i in idx or [0]] for k in ("prompt_lens", "completion_lens"))
    p_max, c_max = max(p_lens), max(1, max(c_lens))
    cols = slice(P - p_max, P + c_max)
    if layout == "packed":
        layout = packed([p_max - p for p in p_lens], [p_max + c for c in c_lens], p_max + c_max, device)
    elif layout == "shared":
        layout = (idx and shared_prefix(batch, idx, device)) or "padded"
    return {
        "rows": rows,
        "input_ids": batch["input_ids"][rows, cols],
        "attention_mask": batch["attention_mask"][rows, cols],
        "completion_mask": batch["completion_mask"][rows, :c_max] * (1.0 if idx else 0.0),
        "prompt_mask": batch["prompt_mask"][rows, P - p_max :],
        "layout": layout,
    }
