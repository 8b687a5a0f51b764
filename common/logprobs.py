"""Per-token log-probs and full-vocabulary entropies from `logits / T`, never materialising [B, L, V] logits (20 GB
in fp32 at Qwen2.5's vocabulary and 4 x 8,192 tokens): for one call `sequence_logprobs` swaps the output layer for
`_ChunkedHead`, which keeps (log-prob, entropy) a chunk of rows at a time and recomputes the chunk in backward
(docs/SCALING.md#bf16-precision; tests/test_logprobs.py checks values and gradients, `benchmarks/memory.py` bytes).
"""

import contextlib
import functools
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common.batching import Packed, SharedPrefix, packed, to_device

# Bytes of one chunk's fp32 [rows, V] logits (a chunk holds ~4 such tensors). GPU: large enough that the chunk's
# GEMMs are not memory-bound (docs/SCALING.md#the-output-layers-chunk-size), at most 1/128 of the device.
CHUNK_BYTES = 2**26
GPU_CHUNK_BYTES = 2**29


def head_chunk_rows(vocab: int, device_type: str, device_memory: int = 0) -> int:
    """Rows of the output layer computed at once: as many `vocab`-wide fp32 rows as fit in the chunk's budget
    (`device_memory`: bytes, 0 unknown)."""
    budget = CHUNK_BYTES
    if device_type != "cpu":
        budget = min(GPU_CHUNK_BYTES, device_memory // 128) if device_memory else GPU_CHUNK_BYTES
    return max(1, budget // (4 * vocab))


def _device_memory(device: torch.device) -> int:
    """Total memory of a CUDA device in bytes (read without a sync); 0 elsewhere."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0


def _logp_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> torch.Tensor:
    """[n, V] logits of any dtype -> [n, 2] fp32: log pi(target) and H(pi), pi = softmax(logits / T).
    Each [n, V] temporary is made once (divided in place; H a row-wise dot product); autocast off, as it would
    run that bmm in bf16."""
    with torch.autocast(logits.device.type, enabled=False):
        z = logits.float() if logits.dtype != torch.float32 else logits
        if temperature != 1.0:
            z = z.div_(temperature) if z is not logits else z / temperature
        logp_all = F.log_softmax(z, dim=-1)
        del z
        logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        if not with_entropy:
            return torch.stack([logp, torch.zeros_like(logp)], -1)
        # From the same log-softmax: stable when p underflows (0 * -inf never occurs).
        ent = -torch.bmm(logp_all.exp().unsqueeze(1), logp_all.unsqueeze(2)).view(-1)
        return torch.stack([logp, ent], -1)


def _chunked(fn, rows: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """fn(rows[i:j], targets[i:j]) over row chunks, concatenated; recomputed per chunk in backward."""
    grad = torch.is_grad_enabled()
    outs = []
    for start in range(0, rows.shape[0], chunk):
        args = (rows[start : start + chunk], targets[start : start + chunk])
        outs.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    return torch.cat(outs) if outs else rows.new_zeros(0, 2, dtype=torch.float32)


@functools.cache
def _fp32_out_addmm(device_type: str) -> bool:
    """Can this device's addmm sum bf16 factors into fp32 in place (`out_dtype`: CUDA from torch 2.8)? Decided
    from the build: a trial in the first backward would make the host wait for the GPU."""
    return device_type == "cuda" and torch.version.cuda is not None and torch.__version__ >= (2, 8)


def _add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b in place, summed in acc's fp32 (the product is not rounded to a's and b's dtype)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif _fp32_out_addmm(acc.device.type):
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:  # CPU: an fp32 product of the upcast factors
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


class _ChunkedHead(torch.autograd.Function):
    """[N, D] hidden rows -> [N, 2] (log pi(target), H(pi)) of the linear output layer, `chunk` rows at a time in
    both passes. `compute`: the parameters in autocast's dtype, or None. The parameters are read when used, not
    saved: under ZeRO-3 / FSDP2 they are whole only while gathered. The weight's gradient sums in one fp32 buffer."""

    @staticmethod
    def forward(ctx, rows, targets, weight, bias, compute, temperature, with_entropy, chunk):
        w, b = compute or (weight, bias)
        with torch.autocast(rows.device.type, enabled=False):  # dtypes chosen here, not by autocast
            outs = [
                _logp_and_entropy(
                    F.linear(rows[i : i + chunk].to(w.dtype), w, b), targets[i : i + chunk], temperature, with_entropy
                )
                for i in range(0, rows.shape[0], chunk)
            ]
        ctx.save_for_backward(rows, targets)
        ctx.params, ctx.compute, ctx.args = (weight, bias), compute, (temperature, with_entropy, chunk)
        return torch.cat(outs) if outs else rows.new_zeros(0, 2, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_out):
        rows, targets = ctx.saved_tensors
        weight, bias = ctx.params
        temperature, with_entropy, chunk = ctx.args
        w, b = ctx.compute or (weight.detach(), None if bias is None else bias.detach())
        need_rows, _, need_w, need_b = ctx.needs_input_grad[:4]
        d_rows = torch.empty_like(rows) if need_rows else None
        d_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        d_b = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if need_b else None
        with torch.autocast(rows.device.type, enabled=False):
            for i in range(0, rows.shape[0], chunk):
                h = rows[i : i + chunk].to(w.dtype)
                with torch.enable_grad():
                    logits = F.linear(h, w, b).requires_grad_()
                    out = _logp_and_entropy(logits, targets[i : i + chunk], temperature, with_entropy)
                    (d_logits,) = torch.autograd.grad(out, logits, grad_out[i : i + chunk])
                if need_rows:
                    d_rows[i : i + chunk] = d_logits @ w
                if need_w:
                    _add_product(d_w, d_logits.T, h)
                if need_b:
                    d_b += d_logits.float().sum(0)
        d_w = None if d_w is None else d_w.to(weight.dtype)
        d_b = None if d_b is None else d_b.to(bias.dtype)
        return d_rows, None, d_w, d_b, None, None, None, None


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """fp32 log pi(token_t | <t) and, optionally, H(pi(. | <t)) shaped like `tokens`, from logits [..., V] that
    already exist; backward keeps nothing but the logits."""
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} do not line up")
    V = logits.shape[-1]
    out = _chunked(
        lambda x, t: _logp_and_entropy(x, t, temperature, with_entropy),
        logits.reshape(-1, V),
        tokens.reshape(-1),
        chunk_rows or head_chunk_rows(V, logits.device.type, _device_memory(logits.device)),
    )
    out = out.view(*tokens.shape, 2)
    return out[..., 0], out[..., 1] if with_entropy else None


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model inside DDP / DeepSpeed (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


@contextlib.contextmanager
def _head_returns_logprobs(model: torch.nn.Module, targets: torch.Tensor, pick, temperature, with_entropy, chunk_rows):
    """Within the block, the output layer maps hidden states [B, K, D] to [M, 2] (log-prob of `targets`, entropy)
    of the M rows `pick(hidden)` takes, instead of logits [B, K, V]. Its forward is swapped, not bypassed, so the
    hooks of ZeRO-3 and FSDP2 still gather its weight."""
    head = _unwrap(model).get_output_embeddings()
    if head is None or not isinstance(head, torch.nn.Linear):
        raise ValueError(f"{type(_unwrap(model)).__name__} has no linear output layer to score with")
    config = getattr(_unwrap(model), "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        raise ValueError("models that rescale their logits after the output layer are not supported")

    def scoring_forward(hidden: torch.Tensor) -> torch.Tensor:
        rows = pick(hidden)  # hidden states only: D values per row, not V
        V, device = head.out_features, hidden.device
        chunk = chunk_rows or head_chunk_rows(V, device.type, _device_memory(device))
        # Under autocast the weight is cast once, here, for both passes: a cast per chunk would copy the whole
        # V x D weight ~190 times per micro-batch at 7B.
        compute = None
        if torch.is_autocast_enabled(hidden.device.type):
            dtype = torch.get_autocast_dtype(hidden.device.type)
            if head.weight.dtype != dtype:
                compute = tuple(None if p is None else p.detach().to(dtype) for p in (head.weight, head.bias))
        return _ChunkedHead.apply(rows, targets, head.weight, head.bias, compute, temperature, with_entropy, chunk)

    saved = head.__dict__.get("forward")  # a wrapper's own patched forward, if any
    head.forward = scoring_forward
    try:
        yield
    finally:
        if saved is None:
            del head.forward  # back to the class's forward
        else:
            head.forward = saved


def sequence_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
    logits_to_keep: int | None = None, with_entropy: bool = False, chunk_rows: int | None = None,
    layout: str | SharedPrefix = "padded",
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """fp32 logp (and entropy) of `input_ids` [B, L] under a causal LM, never materialising its logits: [B, L - 1],
    or [B, K] for the last K tokens (`logits_to_keep`). `layout` (`common.batching.select`): "padded"; a `Packed`
    (or "packed", from the mask) or a `SharedPrefix` compute less and give 0 at padded positions."""
    K = input_ids.shape[1] - 1 if logits_to_keep is None else logits_to_keep
    if isinstance(layout, SharedPrefix):
        return _shared(model, input_ids, layout, temperature, K, with_entropy, chunk_rows)
    if layout == "packed":
        layout = _packed_from_mask(attention_mask)
    if isinstance(layout, Packed):
        return _packed(model, input_ids, layout, temperature, K, with_entropy, chunk_rows)
    # Left-padded prompts get the positions the unpadded prompt had in the rollout engine.
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    B = input_ids.shape[0]
    pick = lambda hidden: hidden[:, :-1].flatten(0, 1)  # noqa: E731  (the last position predicts past the row)
    with _head_returns_logprobs(model, input_ids[:, -K:].reshape(-1), pick, temperature, with_entropy, chunk_rows):
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=K + 1,
        ).logits
    out = out.view(B, K, 2).float()  # a few bytes per token
    return out[..., 0], out[..., 1] if with_entropy else None


def _shared(model, input_ids, prefix: SharedPrefix, temperature, K, with_entropy, chunk_rows):
    """`sequence_logprobs` in the shared-prefix layout: one forward over [R, T] rows with its 4D mask (0 / -inf
    for eager attention, which adds it), the output layer on the positions `prefix.source` names; no device sync."""
    B, device = input_ids.shape[0], input_ids.device
    source = prefix.source[:, -K:]
    kept = (source >= 0).flatten().nonzero().squeeze(1)  # host: flat places in [B, K]
    where, columns = to_device(source.flatten()[kept], device), to_device(kept, device)
    targets = input_ids[:, -K:].flatten()[columns]
    mask = prefix.mask
    if _unwrap(model).config._attn_implementation == "eager":
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
    pick = lambda hidden: hidden.reshape(-1, hidden.shape[-1])[where]  # noqa: E731
    with _head_returns_logprobs(model, targets, pick, temperature, with_entropy, chunk_rows):
        out = model(
            input_ids=prefix.input_ids,
            attention_mask=mask,
            position_ids=prefix.position_ids,
            use_cache=False,
            logits_to_keep=0,
        ).logits.float()
    logp = out.new_zeros(B * K).index_put((columns,), out[:, 0]).view(B, K)
    ent = out.new_zeros(B * K).index_put((columns,), out[:, 1]).view(B, K) if with_entropy else None
    return logp, ent


def _packed(model, input_ids, layout: Packed, temperature, K, with_entropy, chunk_rows):
    """`sequence_logprobs` padding-free (`common.batching.Packed`): transformers reads the position ids' restarts
    as sequence boundaries (flex: block-sparse; SDPA, eager: a dense [T, T] mask), flash-attention takes them from
    `layout.flash`. The output layer runs only on positions that predict a kept token; no device sync."""
    B, L = input_ids.shape
    device = input_ids.device
    # A kept token (one of the last K columns) is scored if it and the token before it are real.
    columns, source = [], []
    for j, (first, end, start) in enumerate(zip(layout.first, layout.end, layout.start)):
        t = torch.arange(max(L - K, first + 1), max(L - K, first + 1, end))
        columns.append(j * K + t - (L - K))  # its flat place in [B, K]
        source.append(start + t - 1 - first)  # the packed position that predicts it
    M = sum(len(c) for c in columns)
    columns, source = to_device(torch.cat(columns), device), to_device(torch.cat(source), device)
    keep = source if M else source.new_zeros(1)  # transformers keeps these positions only
    targets = input_ids[:, L - K :].flatten()[columns]
    with _head_returns_logprobs(model, targets, lambda h: h[0, :M], temperature, with_entropy, chunk_rows):
        out = model(
            input_ids=input_ids.reshape(-1)[layout.take][None],
            position_ids=layout.position_ids,
            use_cache=False,
            logits_to_keep=keep,
            **layout.flash,
        ).logits.float()
    logp = out.new_zeros(B * K).index_put((columns,), out[:, 0]).view(B, K)
    ent = out.new_zeros(B * K).index_put((columns,), out[:, 1]).view(B, K) if with_entropy else None
    return logp, ent


def _packed_from_mask(attention_mask: torch.Tensor) -> Packed:
    """The `Packed` layout of rows whose real tokens are contiguous, from the mask: one host read."""
    real = attention_mask.bool().cpu()
    first = real.int().argmax(1)
    end = (first + real.sum(1)).tolist()
    return packed(first.tolist(), end, attention_mask.shape[1], attention_mask.device)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over mask (per row with dim=-1); an empty row gives 0, not NaN."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def low_prob_mask(logp: torch.Tensor, mask: torch.Tensor, fraction: float = 0.2) -> torch.Tensor:
    """Bool [B, L]: the ceil(fraction * n_valid) lowest-logp valid positions of each row, at least one (Pro-GRPO,
    arXiv 2602.05281, appendix eq. 12); ties go to the earliest position."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    valid = mask.bool()
    n_valid = valid.sum(-1)
    # ceil in integers of the decimal as written (0.14 -> 7/50): in floats 0.14 * 50 = 7.000000000000001 -> 8.
    frac = Fraction(repr(float(fraction)))
    k = (n_valid * frac.numerator + frac.denominator - 1) // frac.denominator
    k = torch.where(n_valid > 0, k.clamp(min=1), 0)
    # Invalid positions sort last; a stable sort keeps earlier positions first among ties.
    keyed = logp.detach().float().masked_fill(~valid, float("inf"))
    order = torch.sort(keyed, dim=-1, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(logp.shape[-1], device=logp.device).expand_as(order))
    return (rank < k[:, None]) & valid
