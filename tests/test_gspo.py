"""baselines/gspo.py: the sequence-level, length-normalised ratio and its clipping (eq. 5, 7), and the token
gradients it gives, against oracles written from the paper's equations in fp64 (loops); its CPU demo off-policy."""

import math

import pytest
import torch
from train_utils import demo_learns

from baselines.gspo import Args, group_advantages, policy_loss


def oracle(logp, old_logp, adv, lengths, eps_low, eps_high):
    """Eq. (5) with s_i of eq. (7): the loss -1/n sum_i min(s_i A_i, clip(s_i) A_i), and its gradient
    d loss / d logp_it = -(1/n) A_i s_i / |y_i| where the unclipped term is the minimum, else 0."""
    n, C = logp.shape
    loss, grad = 0.0, torch.zeros(n, C, dtype=torch.float64)
    for i, n_i in enumerate(lengths):
        s = math.exp(sum(logp[i, t] - old_logp[i, t] for t in range(n_i)) / n_i)
        a = float(adv[i])
        unclipped, clipped = s * a, min(max(s, 1 - eps_low), 1 + eps_high) * a
        loss -= min(unclipped, clipped) / n
        if unclipped <= clipped:  # the ratio's own term is the minimum: its gradient flows
            grad[i, :n_i] = -a * s / n_i / n
    return loss, grad


def random_batch(groups, G, C, seed, scale):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (groups * G,), generator=g).double()
    lengths = torch.randint(1, C + 1, (groups * G,), generator=g)
    mask = (torch.arange(C)[None] < lengths[:, None]).double()
    old = -torch.rand(groups * G, C, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(groups * G, C, generator=g, dtype=torch.float64) * scale
    return group_advantages(rewards, G), lengths, mask, old, logp


@pytest.mark.parametrize(("G", "C", "scale"), [(2, 1, 2e-3), (4, 6, 5e-4), (8, 17, 1e-3), (6, 40, 1e-1)])
def test_loss_and_token_gradients_match_eq_5(G, C, scale):
    """Random batches whose sequence ratios fall on both sides of the paper's narrow range (3e-4, 4e-4): some
    responses clip, some do not; padding and the response length only enter through the mean of eq. (7)."""
    adv, lengths, mask, old, logp = random_batch(4, G, C, seed=G + C, scale=scale)
    args = Args()
    assert (args.eps_low, args.eps_high, args.loss_agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    ours = logp.clone().requires_grad_()
    loss, sums = policy_loss(ours, old, adv, mask, args, num_seqs=len(adv), num_tokens=mask.sum())
    loss.backward()
    expected, grad = oracle(logp, old, adv, lengths.tolist(), args.eps_low, args.eps_high)
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    torch.testing.assert_close(ours.grad, grad, rtol=1e-10, atol=1e-15)
    # The clip fractions count the tokens of clipped responses (the paper's "fraction of clipped tokens").
    s = torch.exp(((logp - old) * mask).sum(-1) / lengths)
    clipped = ((s < 1 - 3e-4) & (adv < 0)) | ((s > 1 + 4e-4) & (adv > 0))
    assert clipped.any() and (~clipped & (adv != 0)).any()  # both branches of eq. (5) are exercised
    clipped_tokens = clipped.double() @ lengths.double()
    assert (sums["clip_low"] + sums["clip_high"]).item() == clipped_tokens.item()


def test_the_ratio_is_one_per_response_and_length_normalised():
    """A 1-token and a 4-token response whose log-ratios average the same get the same s_i, hence the same
    gradient per token times 1/|y_i|; GRPO's token ratios would differ per token."""
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    old = torch.zeros(2, 4, dtype=torch.float64)
    logp = torch.tensor([[1e-4, 9, 9, 9], [4e-4, -2e-4, 0, 2e-4]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, _ = policy_loss(logp, old, adv, mask, Args(), num_seqs=2, num_tokens=5)
    loss.backward()
    s = math.exp(1e-4)
    assert loss.item() == pytest.approx(-s, rel=1e-12)  # -(s A + s A) / 2
    torch.testing.assert_close(logp.grad, -torch.tensor([[s / 2, 0, 0, 0], [s / 8] * 4], dtype=torch.float64))


@pytest.mark.slow
def test_demo_learns_where_its_ratio_acts(tmp_path):
    """Two optimiser steps per rollout: the second mini-batch's sequence ratios are no longer 1, some are clipped,
    and the demo still learns. (On-policy GSPO is GRPO: the test below; so was its stored real-model grid.)"""
    rows = demo_learns("baselines/gspo.py", tmp_path, "--num_minibatches", "2")
    assert any(r["train/clip_frac_low"] + r["train/clip_frac_high"] > 0 for r in rows)


@pytest.mark.parametrize(("G", "C"), [(4, 9), (8, 20)])
def test_on_policy_gspo_is_grpo(G, C):
    """At pi_theta = pi_old (one optimiser step per rollout) every s_i is 1 and nothing is clipped: GSPO's loss and
    gradient are grpo_base's under the same --loss_agg seq-mean-token-mean (docs/algorithms/gspo.md)."""
    import grpo_base

    g = torch.Generator().manual_seed(G * C)
    lengths = torch.randint(1, C + 1, (3 * G,), generator=g)
    mask = (torch.arange(C)[None] < lengths[:, None]).double()
    old = -torch.rand(3 * G, C, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(3 * G, generator=g, dtype=torch.float64)
    out = []
    for policy_loss_of, args in ((policy_loss, Args()), (grpo_base.policy_loss, grpo_base.Args())):
        logp = old.clone().requires_grad_()
        loss, _ = policy_loss_of(logp, old, adv, mask, args, num_seqs=len(adv), num_tokens=mask.sum())
        loss.backward()
        out.append((loss.detach(), logp.grad))
    torch.testing.assert_close(out[0], out[1], rtol=1e-12, atol=0)
