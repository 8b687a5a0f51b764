"""Every recipe's vLLM KV cache against what a step asks of it per rank (issue 40, item 3), on an 80 GB GPU:
arithmetic from the recipes and their models' config.json (tests/recipe_memory.py). docs/SCALING.md's table,
which benchmarks/kv_room.py writes from the same functions, is rendered again by tests/test_docs.py."""

import re

import pytest
from recipe_memory import KV_TABLE_END, RECIPES, kv_room, launch_plan
from train_utils import ROOT

# The recipes whose step no share of an 80 GB GPU holds at once; docs/SCALING.md says why, recipe by recipe.
MANY_WAVES = {"dapo_qwen2.5-math-1.5b.yaml", "gspo_qwen3-30b-a3b-base.yaml", "pro_grpo_qwen2.5-7b.yaml"}
SCALING = ROOT / "docs" / "SCALING.md"


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_holds_a_wave_or_the_fewest_its_gpu_allows(recipe):
    """A recipe holds a wave when vLLM's KV cache, at its share, holds every sequence of a rank's step at once at
    its longest (prompts_per_step / ranks x G sequences of prompt + completion tokens, each with its own prompt):
    then none waits for another to finish or is preempted, whatever the completions' lengths, and the rollout
    lasts as long as its longest completion. It is the bound a step can reach, not its typical need; vLLM's
    max_num_seqs is the same count (the session's default: the rank's whole rollout, at most 1,024).
    Every share fits its plan (`largest_share`: beside the training state, the margin and, unless vLLM sleeps,
    the update's activations). Where even the largest share holds no wave (MANY_WAVES), the recipe's share gives
    the fewest waves any share would: raising it further buys no wave."""
    room = kv_room(recipe)
    assert room["share"] <= room["largest share"], f"{recipe}: share {room['share']} past the plan's room"
    best = kv_room(recipe, share=room["largest share"])
    if recipe in MANY_WAVES:
        assert best["held"] < best["asked"], f"{recipe} holds a wave at {room['largest share']}: not MANY_WAVES"
        assert room["waves"] == best["waves"], f"{recipe}: {room['waves']} waves, {best['waves']} at the largest share"
    else:
        assert room["held"] >= room["asked"], f"{recipe}: {room['held']:,} KV tokens of {room['asked']:,} asked"
        assert room["waves"] == 1 and room["at once"] == room["sequences"]


def test_dr_grpos_room_by_hand():
    """0.6 x 79.2 = 47.52 GiB; before the KV cache 7,615,616,512 x 2 bytes (14.185 GiB) + the forward of 16,384
    tokens, 16,384 x (3 x 3,584 + 3 x 18,944) x 2 bytes (2.063) + 1.0 of CUDA graphs = 17.248; the rest, 30.27
    GiB, in 16-token blocks of 57,344 bytes a token: 35,427 blocks, 566,832 tokens, against 128 sequences (128
    prompts x G = 8 over 8 GPUs) of 1,024 + 3,000 tokens = 515,072."""
    room = kv_room("dr_grpo_qwen2.5-math-7b.yaml")
    assert (room["share"], room["held"], room["asked"], room["sequences"]) == (0.6, 566_832, 515_072, 128)
    assert room["before KV"] == pytest.approx(17.248, abs=0.001)
    assert launch_plan("dr_grpo_qwen2.5-math-7b.yaml")["world"] == 8
    # At vLLM's default 0.3, before: 23.76 - 17.25 GiB held 121,936 tokens, 5 waves (KL-Cov's 655,360: 6)
    assert kv_room("dr_grpo_qwen2.5-math-7b.yaml", share=0.3)["waves"] == 5
    assert kv_room("kl_cov_qwen2.5-7b.yaml", share=0.3)["waves"] == 6


def test_scaling_md_says_why_each_many_wave_recipe_holds_no_wave():
    """Each recipe in MANY_WAVES has its own line after the table, with its waves and what would hold one."""
    text = SCALING.read_text().split(KV_TABLE_END, 1)[1].split("\n## ", 1)[0]
    for recipe in MANY_WAVES:
        line = re.search(rf"^- `{re.escape(recipe.removesuffix('.yaml'))}`: (.*?)(?=^- |\Z)", text, re.M | re.S)
        assert line, f"docs/SCALING.md does not say why {recipe} holds no wave"
        said, waves = " ".join(line.group(1).split()), kv_room(recipe)["waves"]
        assert f"{waves} waves" in said and "would hold one" in said, said
