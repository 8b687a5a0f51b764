"""Per-token log-probs and full-vocabulary entropies from `logits / T`, never materialising [B, L, V] logits (20 GB
in fp32 at Qwen2.5's vocabulary and 4 x 8,192 tokens): for one call `sequence_logprobs` swaps the output layer for
`_ChunkedHead`, which keeps (log-prob, entropy) a chunk of rows at a time and recomputes the chunk in backward
(docs/SCALING.md#bf16-precision; tests/test_logprobs.py checks values and gradients, `benchmarks/memory.py` bytes).

Rollout correction (--rollout_correction): the engine samples from pi_rollout, pi_old only up to its arithmetic
(in bf16 they never agree), so an importance weight re-weights each token's clipped surrogate, truncated or masked
where large. Each mode's source: docs/algorithms/grpo_base.md#rollout-correction.

    d_t   = log pi_old(o_t) - log pi_rollout(o_t)              (per sampled token; engine-inserted tokens: 0)
    token:      rho_t = exp(d_t)
    sequence:   rho_t = exp(sum_t d_t)                         (the same for every token of a completion)
    geometric:  rho_t = exp(mean_t d_t)
    truncate:   w_t = min(rho_t, max)                          (TIS: Yao et al. 2025; verl Token-TIS / Seq-TIS)
    mask:       w_t = rho_t if min <= rho_t <= max, else 0     (MIS / IcePop; TRL's sequence_mask)
    geometric_mask: w_t = 1 if min <= rho_t <= max, else 0     (verl's Geo-RS: a rejection, not a re-weighting)

The weight has no gradient and applies before any KL term; a token weighted 0 still counts in the denominators."""

import contextlib
import functools
import math
from dataclasses import dataclass
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


def _logits_grad(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, grad: torch.Tensor, with_entropy: bool
) -> torch.Tensor:
    """The gradient in `logits` [n, V] of grad[:, 0] log pi(target) (+ grad[:, 1] H(pi)), pi = softmax(logits / T),
    in closed form, without an autograd graph (two [n, V] fp32 temporaries, a third briefly for H; `logits`' dtype
    at the end):
        d log pi(y) / dz = onehot(y) - pi,    dH / dz = -pi (log pi + H),    z = logits / T."""
    dtype = logits.dtype
    with torch.autocast(logits.device.type, enabled=False):
        z = logits.float() if dtype != torch.float32 else logits  # `logits` is this call's own: changed in place
        del logits
        if temperature != 1.0:
            z.div_(temperature)
        logp = F.log_softmax(z, dim=-1)
        del z
        g_logp = grad[:, :1].float()
        pi = logp.exp()
        if with_entropy:  # -pi (g_logp + g_H (log pi + H)), in logp's buffer
            ent = -(pi * logp).sum(-1, keepdim=True)  # not bmm's: its fp32 sum over V drifts (1e-3 at 152k)
            factor = logp.add_(ent).mul_(grad[:, 1:].float()).add_(g_logp)
        else:
            factor = g_logp
        d = pi.mul_(factor).neg_().scatter_add_(-1, targets[:, None], g_logp)
        del logp, factor
        if temperature != 1.0:
            d.div_(temperature)
    return d.to(dtype)


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
    @torch.autograd.function.once_differentiable  # in-place steps: no graph of the gradient
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
                d_logits = _logits_grad(  # the chunk's logits, recomputed: freed inside
                    F.linear(h, w, b), targets[i : i + chunk], temperature, grad_out[i : i + chunk], with_entropy
                )
                if need_rows:
                    d_rows[i : i + chunk] = d_logits @ w
                if need_w:
                    _add_product(d_w, d_logits.T, h)
                if need_b:
                    d_b += d_logits.float().sum(0)
        d_w = None if d_w is None else d_w.to(weight.dtype)
        d_b = None if d_b is None else d_b.to(bias.dtype)
        return d_rows, None, d_w, d_b, None, None, None, None


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


# mode: (level, action, default min, default max). Sources: docs/algorithms/grpo_base.md#rollout-correction.
MODES = {
    "none": ("token", "none", 0.0, math.inf),
    "token_truncate": ("token", "truncate", 0.0, 2.0),  # Yao et al. (TIS, cap 2); verl's Token-TIS preset
    "token_mask": ("token", "mask", 0.5, 5.0),  # IcePop's bounds; verl's decoupled_token_icepop preset
    "sequence_truncate": ("sequence", "truncate", 0.0, 2.0),  # verl's Seq-TIS preset
    "sequence_mask": ("sequence", "mask", 0.0, 3.0),  # TRL's default (vllm_importance_sampling_clip_max 3.0)
    "geometric_mask": ("geometric", "reject", 0.999, 1.001),  # verl's Geo-RS preset
}
CORRECTIONS = ["auto", *MODES]  # the flag's choices
AUTO_MODE = "token_truncate"  # auto's choice where the trainer and the engine differ in precision (the page says why)
SAFE_LOG = 20.0  # |log rho| beyond this is clamped before exp (as verl): the weight is then its bound or 0 anyway


@dataclass(frozen=True)
class RolloutCorrection:
    mode: str  # a key of MODES
    low: float  # the ratio's lower bound (mask modes; truncation has none unless given)
    high: float  # its upper bound

    @property
    def level(self) -> str:
        return MODES[self.mode][0]

    def weights(self, old_logp, batch: dict):
        """The per-token weights [N, C] (None under mode none) and their statistics for `figures` (on the device).
        batch["rollout_logp"] is NaN where the engine did not sample the token (EDGE-GRPO's insertions: weight 1)."""
        import torch

        rollout_logp, mask = batch["rollout_logp"], batch["completion_mask"]
        sampled = mask.bool() & rollout_logp.isfinite()
        d = torch.where(sampled, old_logp - rollout_logp.nan_to_num(), 0.0)
        raw = ratio_at(d, sampled, self.level)
        action = MODES[self.mode][1]
        if action == "truncate":
            weight = raw.clamp(min=self.low, max=self.high)
        elif action == "mask":
            weight = torch.where((raw >= self.low) & (raw <= self.high), raw, 0.0)
        elif action == "reject":
            weight = ((raw >= self.low) & (raw <= self.high)).to(raw.dtype)
        else:
            weight = raw
        weight = torch.where(sampled, weight, 1.0).detach()
        stats = {
            "tokens": sampled.sum(),
            "gap": (d.abs() * sampled).sum(),
            "raw": (raw * sampled).sum(),
            "weight": (weight * sampled).sum() if self.mode != "none" else sampled.sum(),
            "changed": (((weight == 0) if action == "reject" else (weight != raw)) & sampled).sum(),
            "gap_p99": percentile(d.abs(), sampled, 0.99),  # this rank's; over ranks, the largest
            "raw_max": torch.where(sampled, raw, -torch.inf).max(),
        }
        return (None if self.mode == "none" else weight), stats

    def figures(self, accelerator, stats: dict) -> dict:
        """The step's figures over every rank, one wait for the device (docs/algorithms/grpo_base.md#metrics)."""
        from common.metrics import global_sum

        sums = global_sum(accelerator, {k: v for k, v in stats.items() if k not in ("gap_p99", "raw_max")})
        tokens = max(sums["tokens"], 1.0)
        return {
            "train/rollout_logp_gap": sums["gap"] / tokens,
            "train/rollout_logp_gap_p99": stats["gap_p99"],
            "train/rollout_is_ratio_mean": sums["raw"] / tokens,
            "train/rollout_is_ratio_max": stats["raw_max"],
            "train/rollout_is_weight_mean": sums["weight"] / tokens,
            "train/rollout_is_corrected_frac": sums["changed"] / tokens,
        }


def percentile(values, valid, q: float):
    """The q-quantile of `values` where `valid` (as torch.quantile; NaN if none), by a sort: torch.quantile
    refuses more than 2^24 elements."""
    import torch

    ordered = torch.where(valid, values, torch.inf).flatten().sort().values  # the valid ones first
    n = valid.sum()
    pos = q * (n - 1).clamp(min=0)
    low, high = ordered.gather(0, torch.stack([pos.floor(), pos.ceil()]).long())  # gather: a tensor index would sync
    value = low + (high - low) * (pos - pos.floor())
    return torch.where(n > 0, value, torch.nan)


def ratio_at(d, sampled, level: str):
    """rho_t [N, C] at `level` from the per-token log-ratios d (0 where not sampled)."""
    if level == "token":
        return d.clamp(-SAFE_LOG, SAFE_LOG).exp()
    total = d.sum(-1, keepdim=True)
    if level == "geometric":
        total = total / sampled.sum(-1, keepdim=True).clamp(min=1)
    return total.clamp(-SAFE_LOG, SAFE_LOG).exp().expand_as(d)


def rollout_correction(mode: str, low: float | None, high: float | None, precision, top_p: float) -> RolloutCorrection:
    """The correction of `mode` with its bounds (None: the mode's defaults). auto: AUTO_MODE where either side is in
    bf16, else none (fp32 agrees to ~1e-6 per token); none under top-p < 1 (log-probs renormalised on the nucleus)."""
    if mode == "auto":
        mode = AUTO_MODE if not precision.exact and top_p == 1.0 else "none"
    _, _, default_low, default_high = MODES[mode]
    return RolloutCorrection(mode, default_low if low is None else low, default_high if high is None else high)
