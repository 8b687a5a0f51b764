"""What a run says at start about flags that do nothing here (issue 40, item 8: --vllm_sleep was silently ignored on
CPU, a GPU recipe on CPU never said it needs GPUs): every row of common/run_flags.py's NO_EFFECT, set under its
condition, is named in its condition's line; each recipe launched on CPU says how many GPUs it is sized for."""

import dataclasses
import re

import pytest
from recipe_memory import RECIPES, launch_command
from test_resume_flags import other_value
from train_utils import ROOT, run_cli, user_env

from common.run_flags import CONDITIONS, NO_EFFECT, RECIPE_GPU_GB, RunFlags, no_effect_notes, recipe_launch, recipe_note

FIELDS = {f.name: f for f in dataclasses.fields(RunFlags)}
# Each condition made to hold, with a GPU or not: (flags, gpu). Every other condition is then false.
HOLDING = {
    "cpu": ({"rollout": "vllm", "eval_steps": 5}, False),
    "hf": ({"rollout": "hf", "eval_steps": 5}, True),
    "token_budget": ({"rollout": "vllm", "eval_steps": 5, "max_tokens_per_micro_batch": 4096}, True),
    "packed": ({"rollout": "vllm", "eval_steps": 5, "padding_free": "on"}, True),
    "no_eval": ({"rollout": "vllm", "eval_steps": 0}, True),
}
# Flags whose help speaks of the GPU or vLLM but need no row: why.
NO_ROW = {
    "precision": "its own line at start on CPU (common.models.precision_note)",
    "micro_batch_memory_gb": "on CPU its budget is the machine's memory: it acts (its row: under a token budget)",
    "stop": "both engines stop at the strings",
}


@pytest.mark.parametrize("flag, condition, why", NO_EFFECT, ids=[f"{f}-{c}" for f, c, _ in NO_EFFECT])
def test_a_flag_set_where_it_does_nothing_is_named_at_start(flag, condition, why):
    flags, gpu = HOLDING[condition]
    value = other_value(RunFlags, FIELDS[flag], FIELDS[flag].default)
    run = RunFlags(**flags | {flag: value})
    lines = [line for line in no_effect_notes(run, gpu) if f"--{flag} " in line]
    opening = CONDITIONS[condition][1]
    assert len(lines) == 1 and lines[0].startswith(f"note: {opening}, these flags do nothing: "), lines
    shown = {True: "true", False: "false"}.get(value, str(value)) if isinstance(value, bool) else str(value)
    assert f"--{flag} {shown} ({why})" in lines[0]
    assert not [line for line in no_effect_notes(RunFlags(**flags), gpu) if f"--{flag} " in line]  # left at default
    everywhere_else = RunFlags(**{"rollout": "vllm", "eval_steps": 5} | {flag: value})
    assert not any(f"--{flag} " in line for line in no_effect_notes(everywhere_else, gpu=True)), "said where it acts"


def test_the_table_names_real_flags_and_holds_every_gpu_or_vllm_flag():
    """A row names a flag of RunFlags and a known condition; a flag whose help speaks of the GPU or vLLM has a row
    (or a reason in NO_ROW): a new one cannot do nothing silently."""
    assert {flag for flag, _, _ in NO_EFFECT} <= set(FIELDS)
    assert {condition for _, condition, _ in NO_EFFECT} <= set(CONDITIONS) == set(HOLDING)
    rows = {flag for flag, _, _ in NO_EFFECT}
    speaks = {n for n, f in FIELDS.items() if n.startswith("vllm_") or re.search(r"GPU|vLLM", f.metadata["help"])}
    assert speaks - rows - set(NO_ROW) == set(), "give these a NO_EFFECT row (or a reason in NO_ROW)"


def test_one_line_per_condition_each_flag_once():
    run = RunFlags(rollout="hf", vllm_sleep=True, vllm_max_num_seqs=8, per_prompt_seeds=False, eval_steps=5)
    lines = no_effect_notes(run, gpu=False)
    assert lines == [
        "note: on CPU (no GPU here), these flags do nothing: --vllm_sleep true (vLLM's sleep mode frees GPU memory)",
        "note: with --rollout hf, these flags do nothing: --vllm_max_num_seqs 8 (no vLLM engine; the hf engine samples "
        "a step in batches of 256 rows); --per_prompt_seeds false (the hf engine seeds every prompt from its place in "
        "the batch, always)",
    ]


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_on_cpu_says_the_gpus_it_is_sized_for(recipe):
    """The GPU count is the launch line's --num_processes, else its accelerate config's (tests/recipe_memory.py
    reads the same line its own way)."""
    import yaml

    config, world, _ = launch_command(recipe)
    gpus = world or yaml.safe_load((ROOT / config).read_text())["num_processes"]
    path = ROOT / "recipes" / recipe
    assert recipe_launch(path)[0] == gpus
    line = recipe_note(str(path), False, "M", 32, 8, 3000)
    assert line.startswith(f"note: {path} is sized for {gpus} GPU{'s' * (gpus > 1)} of {RECIPE_GPU_GB} GB (")
    assert f"--config_file {config}" in line and "32 x 8 completions of up to 3,000 tokens" in line
    assert recipe_note(str(path), True, "M", 32, 8, 3000) is None and recipe_note(None, False, "M", 1, 1, 1) is None


def test_a_real_start_says_it_before_anything_loads(tmp_path):
    """The user's runs: a GPU recipe and --vllm_sleep on this CPU. The lines come before the model is looked for
    (here the hub cannot be reached: the run stops there, after saying them)."""
    recipe = "recipes/grpo_base_qwen2.5-math-1.5b.yaml"
    env = user_env(HF_ENDPOINT="http://127.0.0.1:9")
    proc = run_cli("grpo_base.py", "--config", recipe, "--output_dir", str(tmp_path / "run"), "--vllm_sleep",
                   "--rollout", "hf", env=env, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and "cannot be reached" in proc.stderr, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert (  # named under the first reason that holds (any machine with vLLM or not: --rollout hf)
        "note: on CPU (no GPU here), these flags do nothing: --vllm_sleep true (vLLM's sleep mode frees GPU memory); "
        "--vllm_gpu_memory_utilization 0.45 (vLLM on CPU sizes its KV cache to the run, or to VLLM_CPU_KVCACHE_SPACE)"
    ) in lines, lines
    assert not [x for x in lines if x.startswith("note: with --rollout hf")], lines  # each flag once
    [line] = [x for x in lines if x.startswith(f"note: {recipe} is sized for")]
    assert "sized for 1 GPU of 80 GB (accelerate launch --config_file configs/accelerate/single_gpu.yaml" in line
    assert "Qwen/Qwen2.5-Math-1.5B in this machine's memory" in line
