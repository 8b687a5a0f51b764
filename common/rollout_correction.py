"""Rollout correction (--rollout_correction): the engine samples from pi_rollout, pi_old only up to its arithmetic
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

import math
from dataclasses import dataclass

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

    def describe(self) -> str:
        """In words: 'token_truncate at 2', 'token_mask within [0.5, 5]'."""
        action = MODES[self.mode][1]
        if action == "truncate" and self.low == 0:
            return f"{self.mode} at {self.high:g}"
        return f"{self.mode} within [{self.low:g}, {self.high:g}]" if action != "none" else "none"

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
        from common.distributed import global_sum

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
