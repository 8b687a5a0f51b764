"""baselines/kl_cov.py: the token covariance, KL-Cov's top-k penalty and Clip-Cov's random cut (Sec. 4.2), against
oracles written from the paper's definitions in fp64 (loops over tokens); its flags; its CPU and real-model runs."""

import math

import pytest
import torch
from train_utils import demo_learns

from baselines.kl_cov import Args, kl_cov_advantages, policy_loss, token_covariance, validate
from common.run_flags import RunFlags


def valid_tokens(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] > 0]


def oracle_covariance(logp, adv, mask) -> dict:
    """cov_t = (logp_t - mean logp) * (A_t - mean A), means over the valid tokens."""
    tokens = valid_tokens(mask)
    mean_lp = sum(float(logp[i, t]) for i, t in tokens) / len(tokens)
    mean_a = sum(float(adv[i]) for i, _ in tokens) / len(tokens)
    return {(i, t): (float(logp[i, t]) - mean_lp) * (float(adv[i]) - mean_a) for i, t in tokens}


def oracle_kl_cov_loss(logp, old, adv, mask, k, kl_coef):
    """Token-mean of -rho_t A_t (no clip), plus kl_coef |log pi - log pi_old| on the max(1, floor(k N)) tokens
    with the largest covariance."""
    cov = oracle_covariance(logp.detach(), adv, mask)
    top = sorted(cov, key=cov.get, reverse=True)[: max(1, math.floor(k * len(cov)))]
    total = 0.0
    for i, t in cov:
        d = logp[i, t] - old[i, t]
        total = total - torch.exp(d) * adv[i] + (kl_coef * d.abs() if (i, t) in top else 0.0)
    return total / len(cov), set(top)


def random_batch(groups, G, C, seed, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (groups * G,), generator=g).double()
    rewards[::G], rewards[1::G] = 1.0, 0.0  # every group mixed: every row reaches the loss
    lengths = torch.randint(1, C + 1, (groups * G,), generator=g)
    mask = (torch.arange(C)[None] < lengths[:, None]).double()
    old = -torch.rand(groups * G, C, generator=g, dtype=torch.float64) * spread
    logp = old + torch.randn(groups * G, C, generator=g, dtype=torch.float64) * 0.3
    adv, _ = kl_cov_advantages(rewards, {"logp": old}, {"completion_mask": mask}, G, Args())
    return adv, mask, old, logp


@pytest.mark.parametrize(("G", "C", "k"), [(2, 3, 2e-3), (4, 9, 0.05), (8, 20, 0.1), (5, 31, 2e-3)])
def test_kl_cov_matches_the_oracle(G, C, k):
    adv, mask, old, logp = random_batch(3, G, C, seed=G * C)
    cov = token_covariance(logp, adv[:, None], mask)
    for (i, t), c in oracle_covariance(logp, adv, mask).items():
        assert cov[i, t].item() == pytest.approx(c, rel=1e-12, abs=1e-14)
    assert (cov[mask == 0] == 0).all()

    args = Args(kl_cov_ratio=k)
    assert (args.variant, args.kl_coef, args.loss_agg) == ("kl_cov", 1.0, "token-mean")
    ours = logp.clone().requires_grad_()
    loss, sums = policy_loss(ours, old, adv, mask, args, num_seqs=len(adv), num_tokens=mask.sum())
    theirs = logp.clone().requires_grad_()
    expected, top = oracle_kl_cov_loss(theirs, old, adv, mask, k, args.kl_coef)
    torch.testing.assert_close(loss, expected)
    loss.backward(), expected.backward()
    torch.testing.assert_close(ours.grad, theirs.grad)
    assert sums["cov_chosen"] == len(top) == max(1, math.floor(k * mask.sum().item()))
    assert sums["clip_low"] == sums["clip_high"] == 0  # KL-Cov has no ratio clip


@pytest.mark.parametrize(("G", "C", "r"), [(4, 9, 0.05), (8, 20, 0.02), (6, 33, 0.3)])
def test_clip_cov_cuts_random_band_tokens_from_the_gradient(G, C, r):
    """The random draw is recovered from the gradient: the tokens the clip leaves alone whose gradient is 0.
    They lie in the band (lb, ub), there are min(max(1, floor(r N)), band size) of them, and the loss is the
    clipped surrogate's token-mean over the other tokens."""
    adv, mask, old, logp = random_batch(3, G, C, seed=G + C, spread=12.0)  # covariances of order 1-10
    args = Args(variant="clip_cov", clip_cov_ratio=r)
    assert (args.clip_cov_ratio, args.clip_cov_lb, args.clip_cov_ub) == (r, 1.0, 5.0)
    ours = logp.clone().requires_grad_()
    torch.manual_seed(0)
    loss, sums = policy_loss(ours, old, adv, mask, args, num_seqs=len(adv), num_tokens=mask.sum())
    loss.backward()

    cov = oracle_covariance(logp, adv, mask)
    total, cut, band = 0.0, set(), set()
    for i, t in cov:
        rho = math.exp(logp[i, t] - old[i, t])
        a = float(adv[i])
        clipped = min(max(rho, 1 - args.eps_low), 1 + args.eps_high) * a < rho * a
        if not clipped and args.clip_cov_lb < cov[i, t] < args.clip_cov_ub:
            band.add((i, t))
        if not clipped and ours.grad[i, t] == 0:
            cut.add((i, t))
        else:
            total -= min(rho * a, min(max(rho, 1 - args.eps_low), 1 + args.eps_high) * a)
    assert len(band) > 1 and cut <= band
    assert len(cut) == sums["cov_chosen"] == min(max(1, math.floor(r * len(cov))), len(band))
    assert loss.item() == pytest.approx(total / len(cov), rel=1e-12)


def test_clip_cov_draws_a_different_subset_each_call():
    adv, mask, old, logp = random_batch(3, 8, 20, seed=1, spread=12.0)
    args = Args(variant="clip_cov", clip_cov_ratio=0.02)
    draws = set()
    for _ in range(6):
        x = logp.clone().requires_grad_()
        policy_loss(x, old, adv, mask, args, num_seqs=len(adv), num_tokens=mask.sum())[0].backward()
        draws.add(tuple((x.grad == 0).flatten().tolist()))
    assert len(draws) > 1


def test_rollout_statistics():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])  # the second group has A = 0 and is left out
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    old = torch.tensor([[-1.0, -3.0], [-2.0, -9.0], [-0.5, -0.1], [-7.0, -4.0]])
    adv, info = kl_cov_advantages(rewards, {"logp": old}, {"completion_mask": mask}, 2, Args(kl_cov_ratio=0.5))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO's advantage, kept by the paper
    torch.testing.assert_close(adv, torch.tensor([a, -a, 0.0, 0.0]))
    # Tokens of rows 0-1: logp -1, -3, -2 (mean -2); A a, a, -a (mean a/3) -> cov 2a/3, -2a/3, 0.
    assert info["kl_cov/cov_mean"].item() == pytest.approx(0.0, abs=1e-7)
    assert info["kl_cov/cov_top_k"].item() == pytest.approx(2 * a / 3)  # k = 0.5 of 3 tokens: the largest
    assert info["kl_cov/band_frac"].item() == 0.0  # |cov| < 1: none in Clip-Cov's band
    _, empty = kl_cov_advantages(torch.ones(4), {"logp": old}, {"completion_mask": mask}, 2, Args())
    assert all(math.isnan(v) for v in empty.values())


def test_an_empty_band_is_a_one_line_error():
    validate(Args(), RunFlags())
    with pytest.raises(SystemExit, match="--clip_cov_lb must be below --clip_cov_ub"):
        validate(Args(clip_cov_lb=5.0, clip_cov_ub=1.0), RunFlags())


@pytest.mark.parametrize(
    "variant, flags",
    [
        ("kl_cov", {"eps_low": 0.0, "eps_high": 0.0}),
        ("kl_cov", {"clip_cov_ratio": 1e-3}),
        ("clip_cov", {"kl_coef": 2.0}),
    ],
)
def test_the_other_variants_flags_are_refused_not_ignored(variant, flags):
    """KL-Cov's loss has no clip (the authors' code), so its run ignored --eps_low / --eps_high (issue 40): every
    flag of the variant not run is refused, naming it, wherever it differs from its default."""
    validate(Args(variant=variant), RunFlags())
    with pytest.raises(SystemExit, match=f"only, nothing under --variant {variant}") as e:
        validate(Args(variant=variant, **flags), RunFlags())
    assert all(f"--{name}" in str(e.value) for name in flags)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["kl_cov", "clip_cov"])
def test_demo_learns(variant, tmp_path):
    """The CPU demo's accuracy rises over 8 steps with each variant (as tests/test_learning.py holds the five scripts
    to). No real-model step: the variants choose tokens by the covariance of their log-probs and advantages, which
    meets nothing a real model shapes that GRPO's own real-model steps (tests/test_real_model.py) do not run."""
    rows = demo_learns("baselines/kl_cov.py", tmp_path, "--variant", variant)
    if variant == "kl_cov":  # at least one token per micro-batch (Clip-Cov's band may be empty on the demo)
        assert all(r["kl_cov/chosen_frac"] > 0 for r in rows if r["train/skipped_rows"] < 16 * 8)


@pytest.mark.parametrize(("G", "C"), [(4, 9), (8, 20)])
def test_on_policy_kl_cov_is_grpo_under_token_mean(G, C):
    """At pi_theta = pi_old (one optimiser step per rollout) the penalty and its gradient are 0 and nothing is clipped:
    KL-Cov's loss and gradient are grpo_base's under --loss_agg token-mean (docs/algorithms/kl_cov.md)."""
    import grpo_base

    adv, mask, old, _ = random_batch(3, G, C, seed=G + C)
    grads = []
    for policy_loss_of, args in ((policy_loss, Args()), (grpo_base.policy_loss, grpo_base.Args(loss_agg="token-mean"))):
        logp = old.clone().requires_grad_()
        loss, _ = policy_loss_of(logp, old, adv, mask, args, num_seqs=len(adv), num_tokens=mask.sum())
        loss.backward()
        grads.append((loss.detach(), logp.grad))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=0)
