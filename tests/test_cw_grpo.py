"""cw_grpo.py: the covariance-weighted token advantage (Sec. 2.3), its statistics (Table 1), and the CLI."""

import math

import pytest
import torch
from train_utils import grpo_advantage

from common.run_flags import RunFlags
from cw_grpo import Args, covariance_stats, kernel_weighted_advantages, policy_loss, validate

# Hand-computed batch, G = 2. Group 1: rewards [1, 0], completion 1 has log-probs [-1, -3], completion 2
# has [-2] (then padding). A = +-a with a = 0.5 / (std([1, 0]) + 1e-6). Token-weighted means over the
# group's N = 3 tokens: mean logp = -2, mean A = (a + a - a) / 3 = a / 3, so
#   c = [(1)(2a/3), (-1)(2a/3)] and [(0)(-4a/3)] = [2a/3, -2a/3, 0];
# mean c = 0, unbiased sigma^2 = 2 (2a/3)^2 / 2 = (2a/3)^2, so w = [e^-1/2, e^-1/2, 1]
# and w~ = w * 3 / (2 e^-1/2 + 1). Group 2: rewards [1, 1] -> A = 0, c = 0, sigma = 0 -> w = 1.
a = 0.5 / (math.sqrt(0.5) + 1e-6)
E = math.exp(-0.5)
W = [3 * E / (2 * E + 1), 3 * E / (2 * E + 1), 3 / (2 * E + 1)]
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])
LOGP = torch.tensor([[-1.0, -3.0], [-2.0, -40.0], [-0.5, -0.1], [-7.0, -40.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])


def test_hand_computed_group():
    adv, info = kernel_weighted_advantages(REWARDS, LOGP, MASK, 2, Args())
    torch.testing.assert_close(info["c"][:2], torch.tensor([[2 * a / 3, -2 * a / 3], [0.0, 0.0]]))
    torch.testing.assert_close(info["w"][:2], torch.tensor([[W[0], W[1]], [W[2], 0.0]]))
    torch.testing.assert_close(adv[:2], torch.tensor([[W[0] * a, W[1] * a], [-W[2] * a, 0.0]]))
    # The all-correct group: sigma = 0 -> weights 1 on its valid tokens, advantage 0, no NaN.
    assert info["w"][2:].tolist() == MASK[2:].tolist() and (adv[2:] == 0).all()


def test_vanilla_switch_keeps_grpo_advantages_and_still_measures():
    adv, info = kernel_weighted_advantages(REWARDS, LOGP, MASK, 2, Args(cw=False))
    torch.testing.assert_close(adv[:2], torch.tensor([[a, a], [-a, 0.0]]))
    torch.testing.assert_close(info["w"][0], torch.tensor([W[0], W[1]]))  # what CW-GRPO would have used


def random_batch(groups=5, G=6, C=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(groups * G, generator=g) > 0.5).float()
    rewards[::G] = 1 - rewards[1::G]  # every group mixed
    logp = -torch.rand(groups * G, C, generator=g) * 5
    lengths = torch.randint(1, C + 1, (groups * G,), generator=g)
    mask = (torch.arange(C)[None] < lengths[:, None]).float()
    return rewards, logp, mask, G


def test_random_uneven_batches_match_the_papers_equations_token_by_token():
    """Sec. 2.3 in plain Python, one group at a time over its valid tokens: c = (logp - mean logp)(A - mean A),
    sigma^2 their unbiased variance, w = exp(-c^2 / 2 sigma^2), w~ = w N / sum w, token advantage w~ A_i."""
    for seed in range(3):
        rewards, logp, mask, G = random_batch(seed=seed)
        rewards, logp = rewards.double(), logp.double()
        adv, _ = kernel_weighted_advantages(rewards, logp, mask.double(), G, Args())
        want = torch.zeros_like(adv)
        for grp in range(len(rewards) // G):
            tokens = [(i, t) for i in range(grp * G, (grp + 1) * G) for t in range(int(mask[i].sum()))]
            a = dict(zip(range(grp * G, (grp + 1) * G), grpo_advantage(rewards[grp * G : (grp + 1) * G].tolist())))
            n = len(tokens)
            mean_logp, mean_a = sum(float(logp[i, t]) for i, t in tokens) / n, sum(a[i] for i, _ in tokens) / n
            c = [(float(logp[i, t]) - mean_logp) * (a[i] - mean_a) for i, t in tokens]
            var = sum((x - sum(c) / n) ** 2 for x in c) / (n - 1)
            w = [math.exp(-(x**2) / (2 * var)) for x in c]
            for (i, t), wi in zip(tokens, w):
                want[i, t] = wi * n / sum(w) * a[i]
        torch.testing.assert_close(adv, want, rtol=1e-9, atol=1e-12)


def test_weights_have_mean_one_over_each_groups_tokens():
    rewards, logp, mask, G = random_batch()
    _, info = kernel_weighted_advantages(rewards, logp, mask, G, Args())
    per_group = (info["w"] * mask).view(-1, G * mask.shape[1]).sum(1) / mask.view(-1, G * mask.shape[1]).sum(1)
    torch.testing.assert_close(per_group, torch.ones(len(per_group)))
    assert (info["w"][mask == 0] == 0).all()


def test_most_extreme_covariance_tokens_get_the_smallest_weights():
    rewards, logp, mask, G = random_batch(seed=1)
    _, info = kernel_weighted_advantages(rewards, logp, mask, G, Args())
    for grp in range(len(rewards) // G):
        rows = slice(grp * G, (grp + 1) * G)
        valid = mask[rows].bool()
        c, w = info["c"][rows][valid].abs(), info["w"][rows][valid]
        assert w[c.argmax()] == w.min() and w[c.argmin()] == w.max()
        order = c.argsort()
        assert (w[order].diff() <= 1e-6).all()  # w~ decreases as |c| grows
        assert w.min() < 1 < w.max()


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.5]])
def test_all_equal_rewards_give_unit_weights_and_zero_advantage(rewards):
    _, logp, _, _ = random_batch(groups=1, G=3, C=4)
    mask = torch.ones(3, 4)
    adv, info = kernel_weighted_advantages(torch.tensor(rewards), logp, mask, 3, Args())
    assert (info["w"] == 1).all() and (adv == 0).all()


def test_ties_in_logp_give_grpo_advantages():
    # Mixed rewards but every token equally likely: c = 0, sigma = 0, w = 1.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    adv, info = kernel_weighted_advantages(rewards, torch.full((4, 3), -0.7), torch.ones(4, 3), 4, Args())
    A = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert (info["w"] == 1).all()
    torch.testing.assert_close(adv, torch.tensor([A, A, -A, -A])[:, None].expand(4, 3))


def test_degenerate_groups_never_nan():
    # One token per completion in a group of 2: the two c are equal up to rounding, so sigma is 0 or
    # ~1e-8 and every kernel weight underflows; either way the weights fall back to 1.
    for logp in ([-0.3, -1.7], [-1e-8, -80.0], [-1e4, -3.0], [-1.0, -1.0]):
        adv, info = kernel_weighted_advantages(
            torch.tensor([1.0, 0.0]), torch.tensor(logp)[:, None], torch.ones(2, 1), 2, Args()
        )
        assert torch.isfinite(adv).all() and (info["w"] == 1).all(), logp
    # Extreme and mixed scales in bigger groups stay finite with mean 1.
    rewards, logp, mask, G = random_batch(seed=2)
    logp = logp * torch.logspace(-8, 4, logp.shape[1])[None]
    adv, info = kernel_weighted_advantages(rewards, logp, mask, G, Args())
    assert torch.isfinite(adv).all() and torch.isfinite(info["w"]).all()


def test_token_advantages_enter_the_clipped_surrogate():
    adv, info = kernel_weighted_advantages(REWARDS, LOGP, MASK, 2, Args())
    args = Args(loss_agg="seq-mean-token-mean")
    loss, _ = policy_loss(LOGP, LOGP, adv, MASK, args, num_seqs=4, num_tokens=MASK.sum().item())
    expected = -((W[0] * a + W[1] * a) / 2 + (-W[2] * a)) / 4  # ratio 1: minus the mean of per-sequence means
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_covariance_stats_hand_computed():
    _, info = kernel_weighted_advantages(REWARDS, LOGP, MASK, 2, Args())
    stats = {k: float(v) for k, v in covariance_stats(info, REWARDS, MASK, 2).items()}
    # Only group 1 has a signal: |c| = [0, 2a/3, 2a/3]; the top 1% is one token, half of sum |c|.
    top = 2 * a / 3
    assert stats == pytest.approx(
        {
            "cov_mean": 0.0,
            "cov_abs_p60": top,
            "cov_abs_p80": top,
            "cov_abs_p99": top,
            "cov_abs_p99.99": top,
            "cov_abs_max": top,
            "cov_top1pct_share": 0.5,
            "cov_top1pct_weight": W[0],
        },
        abs=1e-6,
    )
    empty = covariance_stats(info, torch.ones(4), MASK, 2)
    assert all(math.isnan(v) for v in empty.values())  # no group with a signal: null in the log


def test_validate_uses_the_group_size():
    validate(Args(num_minibatches=3), RunFlags())  # 16 prompts x G = 12 = 192 completions: 3 mini-batches of 64
    with pytest.raises(SystemExit, match="--num_minibatches=5 must divide"):
        validate(Args(num_minibatches=5), RunFlags())
    with pytest.raises(SystemExit, match="--num_minibatches"):
        validate(Args(num_minibatches=3, group_size=8), RunFlags())  # 128 does not split in 3


def test_cw_false_is_the_vanilla_baseline_flag():
    from common.cli import parse_args

    assert parse_args(Args, RunFlags, argv=["--cw", "false"])[0].cw is False
    assert parse_args(Args, RunFlags, argv=["--cw"])[0].cw is True
