"""common/logprobs.py: low-probability token selection (Pro-GRPO appendix eq. 12)."""

import pytest
import torch

from common.logprobs import low_prob_mask


def test_selects_ceil_fraction_of_valid_positions():
    torch.manual_seed(0)
    logp = -torch.rand(3, 12) * 5
    mask = torch.zeros(3, 12)
    mask[0, :10] = 1  # ceil(0.2 * 10) = 2
    mask[1, :3] = 1  # ceil(0.6) = 1
    mask[2, :11] = 1  # ceil(2.2) = 3
    sel = low_prob_mask(logp, mask, 0.2)
    assert sel.sum(-1).tolist() == [2, 1, 3]
    assert not (sel & ~mask.bool()).any()  # never a padding position
    for row in range(3):
        valid = logp[row][mask[row].bool()]
        chosen = logp[row][sel[row]]
        assert chosen.max() <= valid.sort().values[len(chosen) - 1]  # the lowest ones


def test_at_least_one_and_empty_rows():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 0, 0], [0, 0, 0]])
    sel = low_prob_mask(logp, mask, 0.2)
    assert sel.tolist() == [[True, False, False], [False, False, False]]


def test_ties_and_bad_fraction():
    logp = torch.full((1, 5), -1.0)
    assert low_prob_mask(logp, torch.ones(1, 5), 0.4)[0].tolist() == [True, True, False, False, False]
    with pytest.raises(ValueError, match="fraction"):
        low_prob_mask(logp, torch.ones(1, 5), 0.0)


@pytest.mark.parametrize(
    ("fraction", "n", "k"), [(0.14, 50, 7), (0.28, 25, 7), (0.55, 100, 55), (0.2, 10, 2), (0.2, 11, 3), (0.2, 1, 1)]
)
def test_count_is_exact_ceil_of_the_written_fraction(fraction, n, k):
    # Float products round up for some fractions (0.14 * 50 = 7.000000000000001): the count must not.
    logp = -torch.arange(n, dtype=torch.float32)[None]
    assert low_prob_mask(logp, torch.ones(1, n), fraction).sum().item() == k
