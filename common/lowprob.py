"""Low-probability token selection: for each sequence, the ceil(fraction * n) valid positions (at least
one) whose sampled token has the lowest probability (Pro-GRPO, arXiv 2602.05281, appendix eq. 12;
its confidences over that set are pro_grpo.py's)."""

from fractions import Fraction

import torch


def low_prob_mask(logp: torch.Tensor, mask: torch.Tensor, fraction: float = 0.2) -> torch.Tensor:
    """Bool [B, L]: the ceil(fraction * n_valid) lowest-logp valid positions of each row.

    Rows with no valid position select nothing. Ties are broken by position
    (earliest first) so the selection is deterministic.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    valid = mask.bool()
    n_valid = valid.sum(-1)
    # ceil(fraction * n) in integers, with fraction read as the decimal it was written as
    # (0.14 -> 7/50): in floats, 0.14 * 50 = 7.000000000000001 would round up to 8.
    frac = Fraction(repr(float(fraction)))
    k = (n_valid * frac.numerator + frac.denominator - 1) // frac.denominator
    k = torch.where(n_valid > 0, k.clamp(min=1), 0)
    # Invalid positions sort last; a stable sort keeps earlier positions first among ties.
    keyed = logp.detach().float().masked_fill(~valid, float("inf"))
    order = torch.sort(keyed, dim=-1, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(logp.shape[-1], device=logp.device).expand_as(order))
    return (rank < k[:, None]) & valid
