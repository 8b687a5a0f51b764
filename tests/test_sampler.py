"""common/sampler.py: the per-step prompt order, sharded by rank, resumable."""

import json

import pytest

from common.sampler import PromptSampler, count_steps

# ---------------------------------------------------------------------------
# Prompt sampler
# ---------------------------------------------------------------------------

ROWS = [{"problem": f"p{i}", "answer": str(i), "solution": None} for i in range(10)]


def ids(batch):
    return [r["problem"] for r in batch]


def test_sampler_epochs_cover_every_row_once():
    s = PromptSampler(ROWS, prompts_per_step=5, seed=1)
    e0 = ids(s.next_batch())
    assert s.step == 1 and s.epoch == 0
    e0 += ids(s.next_batch())
    assert s.step == 2 and s.epoch == 1  # the next prompt comes from epoch 1
    e1 = ids(s.next_batch()) + ids(s.next_batch())
    assert s.epoch == 2
    assert sorted(e0) == sorted(e1) == sorted(ids(ROWS)) and e0 != e1  # reshuffled
    # Batches straddle epoch boundaries without dropping rows.
    s = PromptSampler(ROWS, prompts_per_step=4, seed=1)
    drawn = sum((ids(s.next_batch()) for _ in range(5)), [])
    assert sorted(drawn[:10]) == sorted(drawn[10:20]) == sorted(ids(ROWS))
    # Deterministic.
    t = PromptSampler(ROWS, prompts_per_step=4, seed=1)
    assert sum((ids(t.next_batch()) for _ in range(5)), []) == drawn


def test_sampler_rank_shards():
    glob = PromptSampler(ROWS, prompts_per_step=6, seed=7)
    shards = [PromptSampler(ROWS, prompts_per_step=6, seed=7, rank=r, world_size=3) for r in range(3)]
    for _ in range(4):
        parts = [ids(s.next_batch()) for s in shards]
        assert all(len(p) == 2 for p in parts)
        assert sum(parts, []) == ids(glob.next_batch())  # contiguous shares, in rank order


def test_sampler_resume():
    s = PromptSampler(ROWS, prompts_per_step=4, seed=3)
    for _ in range(3):
        s.next_batch()
    state = json.loads(json.dumps(s.state_dict()))  # survives a checkpoint round trip
    expected = [ids(s.next_batch()) for _ in range(4)]
    r = PromptSampler(ROWS, prompts_per_step=4, seed=3)
    r.load_state_dict(state)
    assert r.step == 3 and [ids(r.next_batch()) for _ in range(4)] == expected
    with pytest.raises(ValueError, match="same dataset"):
        PromptSampler(ROWS[:5], prompts_per_step=4, seed=3).load_state_dict(state)


def test_sampler_errors():
    with pytest.raises(ValueError, match="divisible"):
        PromptSampler(ROWS, prompts_per_step=5, seed=0, world_size=2)
    with pytest.raises(ValueError, match="empty"):
        PromptSampler([], prompts_per_step=2, seed=0)


def test_count_steps_says_how_many_steps_and_why():
    assert count_steps(30, None, 100, 64) == (30, "30 steps (--steps)")
    total, why = count_steps(30, 5, 100, 64)  # 500 prompts at 64 a step: 7.8 steps, rounded up
    assert total == 8 and "--epochs 5 of 100 prompts at --prompts_per_step 64" in why and "5.12 epochs" in why
    assert count_steps(30, 1, 128, 64) == (2, "2 steps (--epochs 1 of 128 prompts at --prompts_per_step 64)")


def test_an_epoch_smaller_than_one_step_is_refused():
    """--epochs 1 with more prompts a step than the dataset holds would silently cover more than one epoch."""
    with pytest.raises(ValueError, match=r"--epochs 1 of 100 prompts is less than one step of --prompts_per_step 128"):
        count_steps(30, 1, 100, 128)
