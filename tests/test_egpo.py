"""egpo.py: the entropy-calibrated advantage (eqs. 5, 7, 8, 13), every Table 2 ablation, and the CLI."""

import math

import pytest
import torch
from train_utils import as_completions, grpo_advantage, uneven_mask

import egpo
from common.batching import pack
from common.cli import parse_args
from common.run_flags import RunFlags
from egpo import Args, calibrated_advantages, span_after, validate, weight_stats

A0 = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # GRPO advantage magnitude in a 2-correct / 2-incorrect group of 4


def rollout(H_rows, pad=2):
    """Per-token old log-probs and mask whose per-completion mean NLL is H (padding holds junk that must be ignored)."""
    H = torch.tensor(H_rows, dtype=torch.float32).view(-1, 1)
    logp = torch.cat([-H.expand(-1, 3), torch.full((len(H), pad), -50.0)], 1)  # three valid tokens, then padding
    mask = torch.cat([torch.ones(len(H), 3), torch.zeros(len(H), pad)], 1)
    return logp, mask


def run(rewards, H, variant="egpo", **kw):
    logp, mask = rollout(H)
    return calibrated_advantages(
        torch.tensor(rewards, dtype=torch.float32), logp, mask, G=4, args=Args(variant=variant, **kw)
    )


# Mixed group: rewards [1, 1, 0, 0], H = [0.4, 1.25, 0.25, 2.1] (mean 1), so the raw weights of eq. 7 are
# [2.5, 0.8, 4.0, 1/2.1]: a correct answer above lambda_max and one below 1, an incorrect one above 1
# (and above lambda_max) and one below lambda_min. NSR group: rewards 0, H = [0.5, 1.5, 5, 1] (mean 2),
# raw weights [4, 4/3, 0.4, 2].
MIXED_R, MIXED_H = [1, 1, 0, 0], [0.4, 1.25, 0.25, 2.1]
NSR_R, NSR_H = [0, 0, 0, 0], [0.5, 1.5, 5.0, 1.0]
RAW_MIXED, RAW_NSR = [2.5, 0.8, 4.0, 1 / 2.1], [4.0, 4 / 3, 0.4, 2.0]
M6_MIXED, M6_NSR = sum(RAW_MIXED) / 4, sum(RAW_NSR) / 4  # group means of the raw weights (c6)
EXPECTED_W = {  # variant: (final w of the mixed group, final w of the NSR group)
    "egpo": ([2.0, 1.0, 1.0, 0.5], [1.0, 1.0, 0.5, 1.0]),
    "c1": ([2.0, 0.8, 2.0, 0.5], [2.0, 4 / 3, 0.5, 2.0]),  # everything in [0.5, 2]
    "c2": ([2.5, 0.8, 1.0, 0.5], [1.0, 1.0, 0.5, 1.0]),  # correct answers unconstrained
    "c3": ([2.0, 1.0, 4.0, 1 / 2.1], [4.0, 4 / 3, 0.4, 2.0]),  # incorrect answers unconstrained
    "c4": ([2.0, 1.0, 1.0, 0.5], [1.0, 1.0, 1.0, 1.0]),  # NSR undamped
    "c5": ([w / 1.125 for w in (2.0, 1.0, 1.0, 0.5)], [w / 0.875 for w in (1.0, 1.0, 0.5, 1.0)]),  # egpo's w / its mean
    "c6": ([2.5 / M6_MIXED, 1.0, 1.0, 0.5], [1.0, (4 / 3) / M6_NSR, 0.5, 1.0]),  # raw / mean, then the asymmetric clamp
}


@pytest.mark.parametrize("variant", list(EXPECTED_W))
def test_every_table2_variant_on_hand_computed_groups(variant):
    adv, info = run(MIXED_R + NSR_R, MIXED_H + NSR_H, variant)
    w_mixed, w_nsr = EXPECTED_W[variant]
    expected_w = torch.tensor(w_mixed + w_nsr)
    torch.testing.assert_close(info["w"], expected_w, rtol=1e-4, atol=0)
    base = torch.tensor([A0, A0, -A0, -A0, -1, -1, -1, -1])  # GRPO in the mixed group, -1 by NSR (eq. 13)
    torch.testing.assert_close(adv, expected_w * base, rtol=1e-4, atol=0)
    assert info["nsr"].tolist() == [False] * 4 + [True] * 4


def test_random_uneven_batches_match_eqs_5_7_8_13_completion_by_completion():
    """The EGPO row in plain Python: H_i the mean NLL over o_i's valid tokens (eq. 5), w_i = mean_group(H) / (H_i +
    1e-6) (eq. 7), clamped to [1, 2] if r_i > 0 else [0.5, 1] (eq. 8; lambda_max 2, lambda_min 0.5: the authors'
    defaults, docs/algorithms/egpo.md), times GRPO's A_i, or -1 in an entirely-incorrect group (eq. 13)."""
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        G, n, C = 6, 36, 12
        rewards = (torch.rand(n, generator=g) > 0.5).double()
        rewards[::G], rewards[:G], rewards[G : 2 * G] = 1 - rewards[1::G], 1.0, 0.0  # mixed, all right, all wrong
        logp = -((torch.rand(n, C, generator=g, dtype=torch.float64) * 3) ** 2)  # raw w far outside the bounds too
        lengths = torch.randint(1, C + 1, (n,), generator=g).tolist()
        mask = uneven_mask(lengths, C)
        adv, _ = calibrated_advantages(rewards, logp, mask, G, Args())
        r, want = rewards.tolist(), []
        for grp in range(0, n, G):
            rg = r[grp : grp + G]
            H = [-sum(logp[i, t].item() for t in range(lengths[i])) / lengths[i] for i in range(grp, grp + G)]
            for x, h, a in zip(rg, H, grpo_advantage(rg)):
                w = sum(H) / G / (h + 1e-6)
                w = min(max(w, 1.0), 2.0) if x > 0 else min(max(w, 0.5), 1.0)
                want.append(w * (-1.0 if max(rg) == 0 else a))
        torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)


def test_entropy_proxy_is_the_mean_nll_of_valid_tokens_only():
    _, info = run(MIXED_R, MIXED_H)
    torch.testing.assert_close(info["H"], torch.tensor(MIXED_H))  # the -50 padding is ignored


def test_eps_enters_eq7():
    _, info = run([1, 1, 1, 1], [1.0, 1.0, 1.0, 1.0], "c3")  # incorrect side unconstrained, correct clamped up to 1
    assert (info["w"] == 1.0).all()
    _, info = run([0, 0, 0, 0], [1.0, 1.0, 1.0, 1.0], "c3")  # raw w = 1 / (1 + 1e-6)
    torch.testing.assert_close(info["w"], torch.full((4,), 1 / (1 + 1e-6)), rtol=1e-7, atol=0)


def test_entirely_correct_group_keeps_zero_advantage():
    for variant in EXPECTED_W:
        adv, _ = run([1, 1, 1, 1], [0.1, 1.0, 3.0, 0.0], variant)
        assert (adv == 0).all(), variant


def test_ties_give_grpo_advantages():
    # Equal proxies: w = 1 up to eps; the clamp lifts correct ones to exactly 1.
    adv, info = run([1, 0, 0, 1], [0.7, 0.7, 0.7, 0.7])
    torch.testing.assert_close(adv, torch.tensor([A0, -A0, -A0, A0]), rtol=1e-5, atol=0)
    assert info["w"][0] == info["w"][3] == 1.0


@pytest.mark.parametrize("variant", list(EXPECTED_W))
def test_zero_entropy_is_finite(variant):
    # A deterministic policy: H = 0 for a whole group (w = 0 before the clamp) or for one completion
    # in a mixed group (w = mean / 1e-6 before the clamp). Never NaN or inf.
    adv, info = run([0, 0, 0, 0, 1, 0, 1, 0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 1.0], variant)
    assert torch.isfinite(adv).all() and torch.isfinite(info["w"]).all()
    if variant == "egpo":
        torch.testing.assert_close(info["w"], torch.tensor([0.5, 0.5, 0.5, 0.5, 2.0, 1.0, 1.0, 1.0]))
    if variant == "c6":  # renorm of an all-zero group: a tie, all 1
        assert (info["w"][:4] == 1).all()


def test_clamp_bounds_follow_the_flags():
    torch.manual_seed(0)
    r = (torch.rand(64) > 0.5).float()
    H = (10 ** (4 * torch.rand(64) - 2)).tolist()  # log-uniform in [0.01, 100]: raw weights far outside the bounds
    logp, mask = rollout(H)
    args = Args(lambda_max=3.0, lambda_min=0.25)
    _, info = calibrated_advantages(r, logp, mask, 8, args)
    w, correct = info["w"], r > 0
    assert (
        (w[correct] >= 1).all()
        and (w[correct] <= 3.0).all()
        and (w[~correct] >= 0.25).all()
        and (w[~correct] <= 1).all()
    )
    assert (w[correct] == 3.0).any() and (w[~correct] == 0.25).any()  # the bounds are reached, not only respected


def test_weight_stats_count_the_clamps_of_trained_groups():
    _, info = run(MIXED_R + [1, 1, 1, 1], MIXED_H + [0.1, 0.2, 5.0, 9.0])  # the all-correct group is left out
    rewards = torch.tensor(MIXED_R + [1, 1, 1, 1], dtype=torch.float32)
    stats = {k: float(v) for k, v in weight_stats(info, rewards, 4, Args()).items()}
    # raw [2.5, 0.8, 4.0, 0.476] -> lambda_max, 1, 1, lambda_min
    assert stats == pytest.approx(
        {
            "w_min": 0.5,
            "w_mean": 1.125,
            "w_max": 2.0,
            "w_at_lambda_max_frac": 0.25,
            "w_at_one_frac": 0.5,
            "w_at_lambda_min_frac": 0.25,
        }
    )
    only_correct = weight_stats(info, torch.ones(8), 4, Args())
    assert all(math.isnan(v) for v in only_correct.values())  # nothing trained: null in the log, no crash


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--rewards", "accuracy,boxed_format"], "--rewards must be 'accuracy'"),
        (["--reward_fn", "my:fn"], "--rewards must be 'accuracy'"),
        (["--lambda_min", "1.5"], "--lambda_min must be > 0, <= 1"),
        (["--lambda_max", "0.9"], "--lambda_max must be >= 1"),
    ],
)
def test_flag_checks_name_the_flag(argv, flag):
    with pytest.raises(SystemExit, match=flag):
        validate(*parse_args(Args, RunFlags, argv=argv))
    args, run = parse_args(Args, RunFlags, argv=["--variant", "c4"])
    validate(args, run)
    assert args.variant == "c4"


def test_answer_span_proxy_of_the_authors_code():
    """--entropy_span answer: H over the completion tokens after </think> (the entropy mask main() passes)."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    logp = torch.tensor([[-3.0, -1.0, -0.5]] * 4)  # think tokens are unsure, the answer token sure
    mask = torch.ones(4, 3)
    span = torch.tensor([[0.0, 0.0, 1.0]] * 4)  # only the token after </think>
    whole = egpo.egpo_advantages(rewards, {"logp": logp}, {"completion_mask": mask}, 4, Args(), mask)[1]
    answer = egpo.egpo_advantages(rewards, {"logp": logp}, {"completion_mask": mask}, 4, Args(), span)[1]
    assert whole["egpo/entropy_proxy_correct"].item() == pytest.approx(1.5)  # mean NLL of 3, 1, 0.5
    assert answer["egpo/entropy_proxy_correct"].item() == pytest.approx(0.5)


def test_span_after_marker():
    think_end = [7, 8]
    completions = [[1, 7, 8, 4, 5], [1, 2, 3], [7, 8, 7, 8, 9]]
    batch = pack([[5], [5], [5]], as_completions(completions), pad_id=0)
    span = span_after(batch["input_ids"], batch["completion_mask"], think_end)
    # After the FIRST marker (the authors' EntropyMaskGenerator), so the third row keeps its second
    # "</think>"; no marker: the whole completion.
    assert span.tolist() == [[0, 0, 0, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]]


def test_update_trains_the_all_wrong_groups_and_skips_only_all_right_ones():
    """NSR gives an entirely-incorrect group A = -w != 0: the update keeps its rows; an entirely-correct
    group (A = 0) is the only one whose rows are left out of the micro-batches."""
    from common.batching import rows_with_loss

    adv, _ = run(NSR_R + [1, 1, 1, 1] + MIXED_R, NSR_H + [1.0] * 4 + MIXED_H)
    _, mask = rollout(NSR_H + [1.0] * 4 + MIXED_H)
    assert rows_with_loss(adv, mask, every_row=False) == [True] * 4 + [False] * 4 + [True] * 4
