"""common/batching.py: packing, micro-batch plans (count or token budget), cutting, spans."""

import pytest
import torch

from common.batching import micro_batches, pack, select, span_after
from common.logprobs import sequence_logprobs
from grpo_base import Args, policy_loss

PROMPTS = [3, 9, 5, 4, 7, 2, 8, 6]
COMPLETIONS = [10, 2, 30, 7, 1, 25, 12, 4]


def padded_size(plan, prompts=PROMPTS, completions=COMPLETIONS):
    return [len(mb) * (max(prompts[i] for i in mb) + max(completions[i] for i in mb)) for mb in plan]


def test_fixed_micro_batches_keep_batch_order():
    assert micro_batches(PROMPTS, COMPLETIONS, list(range(8)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert micro_batches(PROMPTS, COMPLETIONS, [5, 1, 7], 2) == [[5, 1], [7]]


def test_token_budget_sorts_by_length_and_stays_within_budget():
    plan = micro_batches(PROMPTS, COMPLETIONS, list(range(8)), 99, max_tokens=60)
    assert sorted(i for mb in plan for i in mb) == list(range(8))  # every row exactly once
    assert all(size <= 60 for size in padded_size(plan))
    assert plan[0] == [2]  # 5 + 30 tokens: a second row would pass the budget
    assert micro_batches(PROMPTS, COMPLETIONS, list(range(8)), 99, max_tokens=20)[0] == [2]  # too long: alone
    # Neighbours in length share a micro-batch, so little is padding.
    fixed = micro_batches(PROMPTS, COMPLETIONS, list(range(8)), 2)
    assert sum(padded_size(plan)) < sum(padded_size(fixed))


def test_count_splits_until_every_rank_runs_as_many_micro_batches():
    plan = micro_batches(PROMPTS, COMPLETIONS, list(range(8)), 4, count=5)
    assert len(plan) == 5 and sorted(i for mb in plan for i in mb) == list(range(8))
    assert micro_batches(PROMPTS, COMPLETIONS, [0], 4, count=3) == [[0], [], []]  # nothing left to split


def test_select_cuts_to_the_micro_batch_lengths_and_empty_trains_nothing():
    batch = pack([[1] * p for p in PROMPTS], [[2] * c for c in COMPLETIONS], pad_id=0)
    mb = select(batch, [1, 4])  # prompts 9 and 7, completions 2 and 1
    assert mb["input_ids"].shape == (2, 9 + 2) and mb["completion_mask"].tolist() == [[1, 1], [1, 0]]
    assert mb["attention_mask"].sum().item() == 9 + 2 + 7 + 1
    empty = select(batch, [])
    assert empty["rows"].tolist() == [0] and empty["completion_mask"].sum() == 0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_loss_and_gradients_equal_one_unbucketed_pass(tiny_random_model, agg):
    """Token-budget micro-batches, each cut to its own lengths, give the loss and gradients of the
    whole batch in one padded pass (global denominators)."""
    model, _ = tiny_random_model
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    batch = pack(
        [torch.randint(3, V, (p,), generator=g).tolist() for p in PROMPTS],
        [torch.randint(3, V, (c,), generator=g).tolist() for c in COMPLETIONS],
        pad_id=0,
    )
    mask, n = batch["completion_mask"], len(PROMPTS)
    old = -torch.rand(mask.shape, generator=g)
    adv = torch.randn(n, generator=g)
    args = Args(loss_agg=agg, max_completion_len=mask.shape[1])

    def run(plan):
        model.zero_grad()
        total = 0.0
        for idx in plan:
            mb = select(batch, idx)
            C = mb["completion_mask"].shape[1]
            logp, _ = sequence_logprobs(model, mb["input_ids"], mb["attention_mask"], 1.0, logits_to_keep=C)
            loss, _ = policy_loss(logp, old[mb["rows"]], adv[mb["rows"]], mb["completion_mask"], args, n, mask.sum())
            loss.backward()
            total += loss.item()
        return total, {k: p.grad.clone() for k, p in model.named_parameters()}

    whole = run([list(range(n))])
    bucketed = run(micro_batches(PROMPTS, COMPLETIONS, list(range(n)), 99, max_tokens=60))
    assert bucketed[0] == pytest.approx(whole[0], rel=1e-5, abs=1e-7)
    for k in whole[1]:
        torch.testing.assert_close(bucketed[1][k], whole[1][k], rtol=1e-4, atol=1e-6, msg=k)
    model.zero_grad(set_to_none=True)


def test_span_after_marker():
    think_end = [7, 8]
    completions = [[1, 7, 8, 4, 5], [1, 2, 3], [7, 8, 7, 8, 9]]
    batch = pack([[5], [5], [5]], completions, pad_id=0)
    span = span_after(batch["input_ids"], batch["completion_mask"], think_end)
    assert span.tolist() == [[0, 0, 0, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 1]]  # after the LAST marker; none: all
