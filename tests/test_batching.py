"""common/batching.py: packing, micro-batch plans (count or token budget), cutting, spans."""

import pytest
from train_utils import as_completions

from common.batching import micro_batches, pack, select

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
    batch = pack([[1] * p for p in PROMPTS], as_completions([[2] * c for c in COMPLETIONS]), pad_id=0)
    mb = select(batch, [1, 4])  # prompts 9 and 7, completions 2 and 1
    assert mb["input_ids"].shape == (2, 9 + 2) and mb["completion_mask"].tolist() == [[1, 1], [1, 0]]
    assert mb["attention_mask"].sum().item() == 9 + 2 + 7 + 1
    empty = select(batch, [])
    assert empty["rows"].tolist() == [0] and empty["completion_mask"].sum() == 0


def test_flash_varlen_kwargs_are_the_cumulative_lengths_in_int32_and_a_host_int():
    """What transformers' flash-attention integration needs to run its varlen kernel without inferring the
    boundaries in every layer: cu_seq_lens_q/k [n + 1] int32 (one tensor for both), max_length_q/k a Python
    int, so that nothing is read back from the device."""
    import torch

    from common.batching import flash_varlen_kwargs

    kw = flash_varlen_kwargs([3, 5, 2], "cpu")
    assert set(kw) == {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
    assert kw["cu_seq_lens_q"].tolist() == [0, 3, 8, 10] and kw["cu_seq_lens_q"].dtype == torch.int32
    assert kw["cu_seq_lens_k"] is kw["cu_seq_lens_q"]
    assert kw["max_length_q"] == kw["max_length_k"] == 5 and type(kw["max_length_q"]) is int


def test_select_packs_the_real_tokens_from_the_host_lengths():
    """layout="packed": the micro-batch's real tokens in one row, position ids restarting per sequence, and
    the boundaries for flash-attention, all from the batch's host lengths (no device read)."""
    from common.batching import Packed

    batch = pack([[1] * p for p in PROMPTS], as_completions([[2] * c for c in COMPLETIONS]), pad_id=0)
    for idx in ([1, 4, 2], []):  # prompts 9, 7, 5 and completions 2, 1, 30; an empty micro-batch runs row 0
        mb = select(batch, idx, "packed")
        layout, rows = mb["layout"], idx or [0]
        assert isinstance(layout, Packed)
        lengths = [PROMPTS[r] + COMPLETIONS[r] for r in rows]
        real = mb["input_ids"].flatten()[layout.take]
        assert real.tolist() == [t for r in rows for t in [1] * PROMPTS[r] + [2] * COMPLETIONS[r]]
        assert layout.position_ids.tolist() == [[i for n in lengths for i in range(n)]]
        assert layout.flash["cu_seq_lens_q"].tolist() == [sum(lengths[:i]) for i in range(len(rows) + 1)]
        assert layout.flash["max_length_q"] == max(lengths)


def test_rows_with_loss_reads_the_advantage_at_completion_tokens():
    import math

    import torch

    from common.batching import rows_with_loss

    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    assert rows_with_loss(torch.tensor([0.0, 0.5, 0.0, -0.0]), mask, every_row=False) == [False, True, False, False]
    assert rows_with_loss(torch.tensor([0.0, 0.5, 0.0, 0.0]), mask, every_row=True) == [True] * 4  # e.g. a KL term
    # Token advantages (CW-GRPO): only completion tokens count; a NaN is trained, so that it shows up.
    token_adv = torch.tensor([[0.0, 0, 3], [0, 2, 0], [0, 0, 1], [math.nan, 0, 0]])
    assert rows_with_loss(token_adv, mask, every_row=False) == [False, False, True, True]


def test_memory_budget_ends_a_run_of_rows_early_and_keeps_their_order():
    # Runs of up to 4 rows in batch order; rows x (longest prompt + longest completion) <= 40 tokens.
    plan = micro_batches(PROMPTS, COMPLETIONS, list(range(8)), 4, memory_tokens=40)
    assert plan == [[0, 1], [2], [3, 4], [5], [6, 7]] and all(size <= 40 for size in padded_size(plan))
    assert [i for mb in plan for i in mb] == list(range(8))  # in order
    # A budget that does not bind leaves the plan of --micro_batch_size rows as it was.
    assert micro_batches(PROMPTS, COMPLETIONS, list(range(8)), 3, memory_tokens=10**6) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_micro_batch_tokens_from_the_models_activation_memory():
    """SmolLM2-135M's shape (30 layers, hidden 576, MLP 1,536) in fp32: ~0.92 MiB of activations a token
    (the issue measured ~0.77 MB from the peaks at micro-batches of 8 and 32), so 3 GiB holds ~3,330
    tokens: 19 of its 173-token sequences, not 32; said in one line. The demo model's budget does not bind."""
    from types import SimpleNamespace

    from common.batching import activation_bytes_per_token, micro_batch_tokens

    smollm2 = SimpleNamespace(num_hidden_layers=30, hidden_size=576, intermediate_size=1536)
    assert activation_bytes_per_token(smollm2, 4, False) == 30 * (6 * 576 + 3 * 1536) * 4
    assert activation_bytes_per_token(smollm2, 4, True) < activation_bytes_per_token(smollm2, 4, False) / 9
    said = []
    run = dict(memory_gb=3.0, micro_batch_size=32, max_tokens_per_micro_batch=0, gradient_checkpointing=False)
    tokens = micro_batch_tokens(smollm2, 4, 125, 48, **run, say=said.append)
    assert tokens == int(3 * 2**30 // (30 * 8064 * 4)) and tokens // 173 == 19
    assert len(said) == 1 and "up to 32 sequences and 3,328 padded tokens each" in said[0]
    tiny = SimpleNamespace(num_hidden_layers=4, hidden_size=128, intermediate_size=512)
    assert micro_batch_tokens(tiny, 4, 512, 48, **run, say=said.append) > 32 * 560
    assert len(said) == 1  # silent: 32 sequences at the longest fit
    assert micro_batch_tokens(smollm2, 4, 125, 48, **run | {"max_tokens_per_micro_batch": 4096}, say=said.append) == 0


def test_an_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="a prompt has no tokens"):
        pack([[1, 2], []], as_completions([[3], [4]]), pad_id=0)
