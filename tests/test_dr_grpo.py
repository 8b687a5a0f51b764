"""baselines/dr_grpo.py: the advantage without the std and the constant-length loss (Sec. 3.1), against oracles
written from the paper's objective in fp64 (loops, no vectorisation), and its CPU and real-model runs."""

import pytest
import torch
from train_utils import demo_learns

from baselines.dr_grpo import Args, dr_advantages, policy_loss
from common.cli import parse_args
from common.run_flags import RunFlags


def oracle_advantages(rewards: list[float], G: int) -> list[float]:
    """A_i = R_i - mean_j R_j over each group of G (Dr. GRPO: no division by the group's std)."""
    out = []
    for g in range(0, len(rewards), G):
        group = rewards[g : g + G]
        out += [r - sum(group) / G for r in group]
    return out


def oracle_loss(logp, old_logp, adv, lengths, eps_low, eps_high, max_len):
    """-1/(n L_max) sum_i sum_{t < |o_i|} min(rho A_i, clip(rho) A_i): every token weighs the same, whatever
    its response's length."""
    total = 0.0
    for i, n_i in enumerate(lengths):
        for t in range(n_i):
            rho = torch.exp(logp[i, t] - old_logp[i, t])
            total = total - torch.min(rho * adv[i], torch.clamp(rho, 1 - eps_low, 1 + eps_high) * adv[i])
    return total / (len(lengths) * max_len)


def random_batch(groups, G, C, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (groups * G,), generator=g).double() / 2  # 0, 0.5, 1: ties and equal groups
    rewards[:G] = 1.0  # one all-correct group: A = 0
    lengths = torch.randint(1, C + 1, (groups * G,), generator=g)
    mask = (torch.arange(C)[None] < lengths[:, None]).double()
    old = -torch.rand(groups * G, C, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(groups * G, C, generator=g, dtype=torch.float64) * 0.3  # some ratios clip
    return rewards, lengths, mask, old, logp


@pytest.mark.parametrize(("G", "C"), [(2, 1), (4, 7), (8, 16), (5, 33)])
def test_advantage_and_loss_match_the_papers_objective(G, C):
    rewards, lengths, mask, old, logp = random_batch(3, G, C, seed=G * 100 + C)
    adv, info = dr_advantages(rewards, {}, {"completion_mask": mask}, G, Args())
    torch.testing.assert_close(adv, torch.tensor(oracle_advantages(rewards.tolist(), G), dtype=torch.float64))
    assert (adv[:G] == 0).all()  # the all-equal group: no signal, no NaN (no std to divide by)

    args = Args(max_completion_len=C)
    assert args.loss_agg == "seq-mean-token-sum-norm"  # the paper's aggregation is the default here
    ours = logp.clone().requires_grad_()
    loss, _ = policy_loss(ours, old, adv, mask, args, num_seqs=len(adv), num_tokens=mask.sum())
    theirs = logp.clone().requires_grad_()
    expected = oracle_loss(theirs, old, adv, lengths.tolist(), args.eps_low, args.eps_high, C)
    torch.testing.assert_close(loss, expected)
    loss.backward(), expected.backward()
    torch.testing.assert_close(ours.grad, theirs.grad)


def test_a_tokens_gradient_does_not_depend_on_its_responses_length():
    """The length bias removed: where the clip is inactive, d loss / d logp_it = -rho_it A_i / (n L_max) for a
    token of a 2-token and of a 9-token response alike (GRPO divides by |o_i| too)."""
    C, n = 9, 2
    mask = torch.tensor([[1.0] * 2 + [0.0] * 7, [1.0] * 9], dtype=torch.float64)
    logp = torch.full((n, C), -1.0, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([-0.5, -0.5], dtype=torch.float64)
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, Args(max_completion_len=C), n, mask.sum())
    loss.backward()
    torch.testing.assert_close(logp.grad, mask * 0.5 / (n * C))


def test_length_metrics_split_responses_by_the_sign_of_their_advantage():
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])
    _, info = dr_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), {}, {"completion_mask": mask}, 2, Args())
    assert info["dr/response_len_above_mean"] == 4 and info["dr/response_len_below_mean"] == 2
    _, none = dr_advantages(torch.ones(4), {}, {"completion_mask": mask}, 2, Args())
    assert none["dr/response_len_above_mean"].isnan() and none["dr/response_len_below_mean"].isnan()


def test_grpo_aggregation_stays_available():
    args, _ = parse_args(Args, RunFlags, argv=["--loss_agg", "seq-mean-token-mean"])
    assert args.loss_agg == "seq-mean-token-mean"


@pytest.mark.slow
def test_demo_learns(tmp_path):
    """No real-model step: Dr. GRPO's change (the advantage and the loss's constant normaliser) meets nothing a
    real model shapes that GRPO's own real-model steps (tests/test_real_model.py) do not run."""
    demo_learns("baselines/dr_grpo.py", tmp_path)
