"""What every script does to its method's advantages: a group holding an answer the verifier had no time to
check gets none (`without_unchecked_groups`)."""

import torch


def without_unchecked_groups(advantages: torch.Tensor, checked: torch.Tensor, G: int) -> torch.Tensor:
    """`advantages` ([N] or [N, C]) with every group of G that holds an unchecked answer (`checked` [N] False)
    set to 0: its rewards would score that answer wrong, a guess; no advantage is better than a wrong one."""
    keep = checked.view(-1, G).all(1).repeat_interleave(G).float()
    return advantages * keep.view(-1, *[1] * (advantages.dim() - 1))
