"""common/rollout.py: the per-step prompt order, sharded by rank, resumable; baselines/dapo.py fill_groups: more prompts within a step."""

import json

import pytest

from common.rollout import PromptSampler, count_steps

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


def test_count_steps_says_how_many_steps_and_why():
    assert count_steps(30, None, 100, 64) == (30, "30 steps (--steps)")
    total, why = count_steps(30, 5, 100, 64)  # 500 prompts at 64 a step: 7.8 steps, rounded up
    assert total == 8 and "--epochs 5 of 100 prompts at --prompts_per_step 64" in why and "5.12 epochs" in why
    assert count_steps(30, 1, 128, 64) == (2, "2 steps (--epochs 1 of 128 prompts at --prompts_per_step 64)")


def test_an_epoch_smaller_than_one_step_is_refused():
    """--epochs 1 with more prompts a step than the dataset holds would silently cover more than one epoch."""
    with pytest.raises(ValueError, match=r"--epochs 1 of 100 prompts is less than one step of --prompts_per_step 128"):
        count_steps(30, 1, 100, 128)


# ---------------------------------------------------------------------------
# Dynamic sampling (baselines/dapo.py fill_groups): drawing more prompts within a step
# ---------------------------------------------------------------------------

# Prompts whose answers are always right, always wrong, or mixed: the kind stands for what the verifier would say.
KINDS = ["right", "wrong", "right", "mixed", "wrong", "wrong", "right", "mixed", "wrong", "right"]
KIND_ROWS = [{"problem": f"p{i}", "kind": k} for i, k in enumerate(KINDS)]


def kind_rollout(calls):
    """A generation batch: one group per prompt, recording each call's prompts (an empty call counts too)."""

    def rollout(rows):
        calls.append([r["problem"] for r in rows])
        return [dict(r) for r in rows]

    return rollout


def keep_mixed(groups):
    return [g["kind"] == "mixed" for g in groups]


def test_fill_groups_keeps_drawing_until_it_holds_enough_kept_groups():
    from baselines.dapo import fill_groups

    sampler, calls = PromptSampler(KIND_ROWS, prompts_per_step=4, seed=0), []
    got = fill_groups(sampler.next_batch, kind_rollout(calls), keep_mixed, need=4, max_batches=0)
    assert [g["kind"] for g in got.groups] == ["mixed"] * 4 and got.kept == 4 and not got.gave_up
    assert got.batches == len(calls) == sampler.step  # one draw and one engine call per generation batch
    assert got.generated == 4 * got.batches and got.kept_seen >= 4
    # It stops with the batch that holds the 4th mixed prompt of the sampler's order (2 an epoch of 10).
    fresh = PromptSampler(KIND_ROWS, prompts_per_step=4, seed=0)
    order = [r["kind"] for _ in range(10) for r in fresh.next_batch()]
    fourth = [i for i, k in enumerate(order) if k == "mixed"][3]
    assert got.batches == fourth // 4 + 1 and got.kept_seen == order[: 4 * got.batches].count("mixed")


def test_fill_groups_honours_the_cap_and_fills_with_dropped_groups():
    from baselines.dapo import fill_groups

    sampler, calls = PromptSampler(KIND_ROWS, prompts_per_step=4, seed=0), []
    got = fill_groups(sampler.next_batch, kind_rollout(calls), keep_mixed, need=4, max_batches=2)
    assert got.gave_up and got.batches == len(calls) == 2 and sampler.step == 2
    assert len(got.groups) == 4 and got.kept == sum(g["kind"] == "mixed" for g in got.groups) < 4
    assert [g["kind"] for g in got.groups[: got.kept]] == ["mixed"] * got.kept  # the kept ones first
    # Nothing to keep at all: it still returns `need` groups (all dropped ones), after exactly the cap.
    sampler = PromptSampler([r for r in KIND_ROWS if r["kind"] != "mixed"], prompts_per_step=4, seed=1)
    got = fill_groups(sampler.next_batch, kind_rollout([]), keep_mixed, need=4, max_batches=3)
    assert got.gave_up and got.batches == 3 and got.kept == 0 and len(got.groups) == 4


def test_a_full_rank_still_makes_the_engine_call_with_no_prompts():
    """`fewest` stands for the all-reduce over ranks: another rank that is still short keeps this one drawing."""
    from baselines.dapo import fill_groups

    short_elsewhere = iter([0, 0, 4])  # the other rank's kept count after each round
    sampler, calls = PromptSampler(KIND_ROWS, prompts_per_step=2, seed=0), []
    got = fill_groups(
        sampler.next_batch,
        kind_rollout(calls),
        lambda gs: [True] * len(gs),
        2,
        0,
        lambda n: min(n, next(short_elsewhere)),
    )
    assert got.batches == 3 and [len(c) for c in calls] == [2, 0, 0]  # full after the first call, then empty calls
    assert got.kept == 2 and got.generated == 2 and sampler.step == 3  # the sampler advances with the other ranks


def test_fill_groups_refuses_a_draw_smaller_than_a_rank_s_share():
    from baselines.dapo import fill_groups

    with pytest.raises(ValueError, match="fewer than the 4 groups"):
        fill_groups(lambda: [{}] * 2, lambda rows: rows, lambda gs: [True] * len(gs), need=4, max_batches=1)
