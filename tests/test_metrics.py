"""What a run records besides metrics.jsonl: the samples."""

import json

import torch

from common.metrics import RunLogger


def logged_samples(tmp_path, groups, G, n):
    """samples.jsonl of one step of `groups` prompts x G completions, --log_samples n."""
    rows = [r for g in range(groups) for r in [{"problem": f"p{g}", "prompt_ids": [g]}] * G]  # a group shares its row
    texts = [f"completion {i}" for i in range(groups * G)]
    logger = RunLogger(tmp_path, total_steps=1, log_samples=n)
    logger.log_samples(
        1, (rows, texts, torch.arange(groups * G).float(), torch.zeros(groups * G)), lambda ids: f"prompt {ids[0]}"
    )
    logger.close()
    return [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]


def test_samples_carry_the_prompt_and_spread_over_the_groups(tmp_path):
    """Each row has the keys --log_samples' help names, the prompt as the policy saw it; --log_samples <= the
    number of groups takes one completion from each of that many groups, more takes the groups' next ones."""
    samples = logged_samples(tmp_path / "a", groups=4, G=3, n=4)
    assert set(samples[0]) == {"step", "prompt", "completion", "reward", "advantage"}
    assert [s["prompt"] for s in samples] == ["prompt 0", "prompt 1", "prompt 2", "prompt 3"]
    assert [s["completion"] for s in samples] == ["completion 0", "completion 3", "completion 6", "completion 9"]
    assert [s["reward"] for s in samples] == [0.0, 3.0, 6.0, 9.0]  # each sample's own reward
    samples = logged_samples(tmp_path / "b", groups=2, G=4, n=5)
    assert [s["completion"] for s in samples] == [f"completion {i}" for i in (0, 1, 2, 4, 5)]
