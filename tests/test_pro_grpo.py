"""pro_grpo.py: the re-weighted advantage (eq. 4, Table 7), the confidences (eqs. 5-6) and the CLI."""

import math
import re

import pytest
import torch
from train_utils import as_completions, grpo_advantage, scoring_session, uneven_mask

import grpo_base
import pro_grpo
from common.batching import pack
from common.cli import parse_args
from common.logprobs import low_prob_mask
from common.run_flags import RunFlags
from pro_grpo import Args, group_advantages, prompt_confidence, reweighted_advantages, validate

ALPHA = 0.3
A_STD = 1 / (math.sqrt(1 / 3) + 1e-6)  # 1 / (unbiased std of [1, 0, 0, 1] + eps)


def test_mixed_group_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    c_o = torch.tensor([0.9, 0.2, 0.4, 0.6])
    adv, mixed = pro_advantages_of(r, torch.tensor([0.5]), c_o, G=4, alpha=ALPHA)
    base = torch.tensor([0.5, -0.5, -0.5, 0.5]) * A_STD
    # c(q) - c(o) = [-0.4, 0.3, 0.1, -0.1]: the confident correct answer gets less credit than
    # the unsure one, the confident wrong answer more blame than the unsure one.
    torch.testing.assert_close(adv, base + ALPHA * torch.tensor([-0.4, 0.3, 0.1, -0.1]))
    assert adv[0] < adv[3] and adv[2] < adv[1] and mixed.tolist() == [True]


@pytest.mark.parametrize(
    "rule, bonus",
    [
        ("cq-co", [0.5 - 0.9, 0.5 - 0.2, 0.5 - 0.4, 0.5 - 0.6]),
        ("1-co", [0.1, 0.8, 0.6, 0.4]),
        ("1-cq-co", [1 - 0.5 - 0.9, 1 - 0.5 - 0.2, 1 - 0.5 - 0.4, 1 - 0.5 - 0.6]),
    ],
)
def test_each_confidence_rule(rule, bonus):
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv, _ = pro_advantages_of(r, torch.tensor([0.5]), torch.tensor([0.9, 0.2, 0.4, 0.6]), G=4, alpha=ALPHA, rule=rule)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5]) * A_STD + ALPHA * torch.tensor(bonus))


def test_rules_are_table_7s_rows():
    assert next(f for f in Args.__dataclass_fields__.values() if f.name == "confidence_rule").metadata["choices"] == [
        "cq-co",
        "1-co",
        "1-cq-co",
    ]
    assert Args().confidence_rule == "cq-co" and Args().alpha == 0.3


@pytest.mark.parametrize("rule", ["cq-co", "1-co", "1-cq-co"])
def test_uniform_groups_keep_grpo_advantage(rule):
    # Groups of 3: all correct, all incorrect, all equal non-binary, mixed with a tie, a 0/1 extreme.
    r = torch.tensor([1.0, 1, 1, 0, 0, 0, 0.5, 0.5, 0.5, 1, 1, 0, 0, 0, 1])
    c_o = torch.tensor([0.9, 0.1, 1.0, 0.0, 0.3, 1.0, 0.5, 0.2, 0.7, 0.8, 0.8, 1.0, 0.0, 1.0, 1e-30])
    c_q = torch.tensor([0.7, 0.2, 0.4, 0.6, 1.0])
    adv, mixed = pro_advantages_of(r, c_q, c_o, G=3, alpha=ALPHA, rule=rule)
    assert torch.isfinite(adv).all()
    assert mixed.tolist() == [False, False, False, True, True]
    assert (adv[:9] == 0).all()  # A = 0 stays 0: no signal made up in an uniform group
    base = group_advantages(r, 3)
    assert adv[9] == adv[10]  # equal reward and equal confidence: still tied
    assert not torch.equal(adv[9:], base[9:])


def test_alpha_zero_is_grpo():
    torch.manual_seed(0)
    r = (torch.rand(32) > 0.5).float()
    adv, _ = pro_advantages_of(r, torch.rand(4), torch.rand(32), G=8, alpha=0.0)
    torch.testing.assert_close(adv, group_advantages(r, 8))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--alpha", "-0.1"], "--alpha must be >= 0"),
        (["--alpha", "nan"], "--alpha must be >= 0 (got nan)"),
        (["--low_prob_frac", "0"], "--low_prob_frac must be > 0, <= 1"),
        (["--low_prob_frac", "1.5"], "--low_prob_frac must be > 0, <= 1"),
    ],
)
def test_bad_hyperparameters_are_refused(argv, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        validate(*parse_args(Args, RunFlags, argv=argv))


# --- confidences from the no-grad scoring pass ---------------------------------------------------

PROMPTS = ["What is 12 + 34? Think it through.", "Compute 7 + 8, then 3 + 4, and add them up."]
COMPLETIONS = ["46", "The sum is 22"]


def pro_advantages_of(r, b, c_o, G, alpha, rule="cq-co"):
    return reweighted_advantages(group_advantages(r, G), r, b, c_o, G, alpha, rule)


def scored(model, tok, prompts=PROMPTS, completions=COMPLETIONS, micro_batch_size=8):
    p = [tok(t, add_special_tokens=False).input_ids for t in prompts]
    c = [tok(t, add_special_tokens=False).input_ids for t in completions]
    batch = pack(p, as_completions(c), tok.pad_token_id)
    return batch, pro_grpo.old_logprobs(scoring_session(model, micro_batch_size), batch, Args())


def test_prompt_confidence_hand_computed_with_left_padding():
    # Columns of prompt_logp predict prompt columns 1..7. Row 0: 2 pads, 6 real tokens, of which the
    # first is "predicted" from a pad (-100, must be ignored): 5 predicted, ceil(0.2 * 5) = 1 -> 0.3.
    # Row 1: 8 real tokens, 7 predicted, ceil(1.4) = 2 -> sqrt(0.1 * 0.2). Row 2: one token, nothing
    # predicted -> 1.0.
    pm = torch.tensor([[0.0, 0, 1, 1, 1, 1, 1, 1], [1] * 8, [0] * 7 + [1]])
    logp = torch.log(
        torch.tensor(
            [
                [1e-9, 1e-40, 0.9, 0.5, 0.8, 0.3, 0.95],
                [0.9, 0.1, 0.8, 0.7, 0.6, 0.2, 0.95],
                [1e-9] * 7,
            ]
        )
    )
    c_q = prompt_confidence(logp, pm, 0.2)
    torch.testing.assert_close(c_q, torch.tensor([0.3, math.sqrt(0.1 * 0.2), 1.0]))


def test_completion_part_matches_grpo_base(tiny_random_model):
    model, tok = tiny_random_model
    batch, old = scored(model, tok)
    base = grpo_base.old_logprobs(scoring_session(model, 8), batch, grpo_base.Args())
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(old["logp"][mask], base["logp"][mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(old["entropy"][mask], base["entropy"][mask], atol=1e-5, rtol=1e-5)
    assert old["prompt_logp"].shape == (2, batch["prompt_mask"].shape[1] - 1)


def test_prompt_confidence_uses_prompt_positions_only(tiny_random_model):
    model, tok = tiny_random_model
    batch, old = scored(model, tok)
    c_q = prompt_confidence(old["prompt_logp"], batch["prompt_mask"])
    assert ((c_q > 0) & (c_q <= 1)).all()
    batch1, other_completions = scored(model, tok, completions=["13 and 99 and 5", "x"])
    torch.testing.assert_close(prompt_confidence(other_completions["prompt_logp"], batch1["prompt_mask"]), c_q)
    batch2, other_prompt = scored(model, tok, prompts=[PROMPTS[0].replace("12", "19"), PROMPTS[1]])
    c_q2 = prompt_confidence(other_prompt["prompt_logp"], batch2["prompt_mask"])
    assert not torch.allclose(c_q2[0], c_q[0], rtol=1e-3, atol=0)  # a few per cent for the random model
    torch.testing.assert_close(c_q2[1], c_q[1])


def test_left_padding_does_not_change_prompt_confidence(tiny_random_model):
    model, tok = tiny_random_model
    alone_batch, alone = scored(model, tok, prompts=PROMPTS[:1], completions=COMPLETIONS[:1])
    padded_batch, padded = scored(model, tok, prompts=[PROMPTS[1] * 2, PROMPTS[0]], completions=COMPLETIONS)
    assert padded_batch["prompt_mask"][1, 0] == 0  # the short prompt really is left-padded
    c_alone = prompt_confidence(alone["prompt_logp"], alone_batch["prompt_mask"])[0]
    c_padded = prompt_confidence(padded["prompt_logp"], padded_batch["prompt_mask"])[1]
    torch.testing.assert_close(c_padded, c_alone, atol=1e-5, rtol=1e-5)


def test_low_probability_set_is_ceil_20_percent_of_predicted_prompt_tokens(tiny_random_model):
    model, tok = tiny_random_model
    batch, old = scored(model, tok)
    pm = batch["prompt_mask"]
    predicted = pm[:, 1:] * pm[:, :-1]
    n_prompt = pm.sum(-1)
    assert predicted.sum(-1).tolist() == (n_prompt - 1).tolist()  # every prompt token but the first
    sel = low_prob_mask(old["prompt_logp"], predicted, 0.2)
    assert sel.sum(-1).tolist() == [max(1, math.ceil(0.2 * (n - 1))) for n in n_prompt.tolist()]
    # c(q) is exp(mean log p) over exactly that set
    expected = torch.stack([old["prompt_logp"][i][sel[i]].mean().exp() for i in range(2)])
    torch.testing.assert_close(prompt_confidence(old["prompt_logp"], pm), expected)


def test_prompt_confidence_is_equal_across_the_group(tiny_random_model):
    model, tok = tiny_random_model
    G = 4
    batch, old = scored(
        model,
        tok,
        prompts=[p for p in PROMPTS for _ in range(G)],
        completions=["1", "22 22", "The sum is 46", "", "x", "9 + 9", "15", "7"],
        micro_batch_size=3,
    )
    c_q = prompt_confidence(old["prompt_logp"], batch["prompt_mask"]).view(-1, G)
    torch.testing.assert_close(c_q, c_q[:, :1].expand_as(c_q), atol=1e-6, rtol=1e-6)


def test_group_mean_baseline_of_the_appendix_hand_computed():
    """--confidence_baseline group_mean (appendix eqs. 10, 18): b = the group's mean c(o) instead of c(q)."""
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    c_o = torch.tensor([0.9, 0.2, 0.4, 0.5])  # mean 0.5
    P, C = 3, 2
    old = {"logp": c_o.log()[:, None].expand(4, C).clone(), "prompt_logp": torch.full((4, P - 1), math.log(0.8))}
    batch = {"completion_mask": torch.ones(4, C), "prompt_mask": torch.ones(4, P)}
    base = group_advantages(r, 4)
    for baseline, b in (("prompt", 0.8), ("group_mean", 0.5)):
        args = Args(confidence_baseline=baseline, alpha=ALPHA, low_prob_frac=1.0)
        adv, metrics = pro_grpo.pro_advantages(r, old, batch, 4, args)
        torch.testing.assert_close(adv, base + ALPHA * (b - c_o))
        assert metrics["pro/conf_prompt"].item() == pytest.approx(0.8)
    assert Args().confidence_baseline == "prompt"  # eq. 4 is the default


def low_set_confidence(values):
    """exp of the mean of the ceil(20%) (at least one) lowest log-probs among `values` (eqs. 5, 6, 12)."""
    low = sorted(values)[: max(1, math.ceil(len(values) / 5))]
    return math.exp(sum(low) / len(low))


def test_random_uneven_batches_match_eqs_4_5_6_completion_by_completion():
    """Eqs. 4-6 in plain Python, one group at a time: c(q) over the prompt's real tokens but the first (left padding,
    prompt_logp column j predicts token j + 1), c(o_i) over o_i's valid tokens, alpha 0.3, the bonus only in mixed
    groups (Algorithm 1: all-right and all-wrong groups keep A_i, docs/algorithms/pro_grpo.md)."""
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        G, n, C, P = 6, 36, 14, 16
        rewards = (torch.rand(n, generator=g) > 0.5).double()
        rewards[::G], rewards[:G], rewards[G : 2 * G] = 1 - rewards[1::G], 1.0, 0.0  # mixed, all right, all wrong
        logp = -torch.rand(n, C, generator=g, dtype=torch.float64) * 4
        lengths = torch.randint(1, C + 1, (n,), generator=g).tolist()
        mask = uneven_mask(lengths, C)
        q_len = torch.randint(2, P + 1, (n // G,), generator=g).repeat_interleave(G).tolist()
        prompt_mask = torch.tensor([[0.0] * (P - k) + [1.0] * k for k in q_len], dtype=torch.float64)
        prompt_logp = (-torch.rand(n // G, P - 1, generator=g, dtype=torch.float64) * 4).repeat_interleave(G, 0)
        old, batch = {"logp": logp, "prompt_logp": prompt_logp}, {"completion_mask": mask, "prompt_mask": prompt_mask}
        adv, _ = pro_grpo.pro_advantages(rewards, old, batch, G, Args())
        r, want = rewards.tolist(), []
        for grp in range(0, n, G):
            rg = r[grp : grp + G]
            c_q = low_set_confidence([prompt_logp[grp, j].item() for j in range(P - q_len[grp], P - 1)])
            for i, a in zip(range(grp, grp + G), grpo_advantage(rg)):
                c_o = low_set_confidence([logp[i, t].item() for t in range(lengths[i])])
                want.append(a + (ALPHA * (c_q - c_o) if 0 < sum(rg) < G else 0.0))
        torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)


def test_confidence_is_the_geometric_mean_probability_of_the_low_set():
    logp = torch.log(torch.tensor([[0.9, 0.1, 0.5, 0.8, 0.2, 0.7, 0.6, 0.95, 0.3, 0.4], [0.5] + [1.0] * 9]))
    mask = torch.ones_like(logp)
    mask[1, 1:] = 0  # one valid token: the set is that token
    torch.testing.assert_close(pro_grpo.low_prob_confidence(logp, mask, 0.2), torch.tensor([math.sqrt(0.1 * 0.2), 0.5]))
    assert pro_grpo.low_prob_confidence(logp, torch.zeros_like(logp), 0.2).tolist() == [
        1.0,
        1.0,
    ]  # nothing to be unsure about
