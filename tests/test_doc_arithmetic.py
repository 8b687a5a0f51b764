"""The figures the README and docs/SCALING.md give outside their generated blocks (tests/test_generated_docs.py
holds those): arithmetic from the code's own functions and the models' published shapes, and prose read from
stored files. Each is computed here and looked for on its page as written, so a figure that no longer follows
from the code or the stored run fails."""

import json
import math
from types import SimpleNamespace

import pytest
from recipe_memory import MODELS
from test_logprobs import H100_RIDGE, gemm_flop_per_byte
from train_utils import ROOT

from common.batching import activation_bytes_per_token
from common.logprobs import head_chunk_rows
from common.preflight import GIB, bytes_per_parameter, kv_bytes_per_token, model_shape

KIB, MIB = 2**10, 2**20
B15, B7 = "Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-Math-7B"
V = 151_936
# SmolLM2-135M-Instruct's published config.json (common/smollm2.py converts it from the GGUF file)
SMOLLM2 = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)


def text(page: str) -> str:
    """The page with its line breaks and runs of spaces as single spaces (figures wrap across lines)."""
    return " ".join((ROOT / page).read_text().split())


def said(page: str, *phrases: str) -> None:
    missing = [p for p in phrases if " ".join(p.split()) not in text(page)]
    assert not missing, f"{page} no longer says {missing}"


def shape(model: str) -> tuple[SimpleNamespace, int]:
    config, parameters = MODELS[model]
    return SimpleNamespace(**config), parameters


def gib(parameters: int, bytes_each: float) -> float:
    return parameters * bytes_each / GIB


def test_training_state_per_gpu():
    """16 bytes a parameter under --precision auto; FSDP2 16 / N; DeepSpeed's bf16 mode 18 / N (ZeRO-3) and 2 + 16 / N
    (ZeRO-2): `common.preflight.bytes_per_parameter`, the preflight's own."""
    (_, p15), (_, p7) = shape(B15), shape(B7)
    single = [gib(p, bytes_per_parameter("single", 1, "auto")) for p in (p15, p7)]
    fsdp2, zero3, zero2 = (
        [gib(p, bytes_per_parameter(mode, 8, "auto")) for p in (p15, p7)] for mode in ("fsdp2", "zero3", "zero2")
    )
    said(
        "docs/SCALING.md",
        f"16 bytes per parameter: {single[0]:.1f} GiB at 1.5B, {single[1]:.1f} GiB at 7B",
        f"{fsdp2[0]:.1f} / {fsdp2[1]:.1f} GiB on 8",
        f"ZeRO-3 18 / N, {zero3[0]:.1f} / {zero3[1]:.1f} GiB on 8",
        f"ZeRO-2 2 + 16 / N, {zero2[0]:.1f} / {zero2[1]:.1f} GiB on 8",
        f"the training state alone is {single[1]:.1f} GiB",
        f"+2 bytes per parameter: {gib(p7, 2):.1f} GiB at 7B",  # FSDP2's unsharded gradients under no_sync
        f"bf16 weights ({gib(p15, 2):.1f} / {gib(p7, 2):.1f} GiB)",  # vLLM's copy
    )


def test_activations_and_kv_per_token():
    """`common.batching.activation_bytes_per_token` (bf16 autocast) and `kv_bytes_per_token`, per token."""
    (c15, _), (c7, _) = shape(B15), shape(B7)
    kept = [c.num_hidden_layers * 2 * c.hidden_size / KIB for c in (c15, c7)]
    layer = [2 * (6 * c.hidden_size + 3 * c.intermediate_size) / KIB for c in (c15, c7)]
    checkpointed = [activation_bytes_per_token(c, 2, True) for c in (c15, c7)]
    assert [k + lay for k, lay in zip(kept, layer)] == [b / KIB for b in checkpointed]
    budget = [16_384 * b / GIB + 2.0 for b in checkpointed]  # + the log-prob path's four 512 MiB chunks
    whole = activation_bytes_per_token(c15, 2, False)
    kv = [kv_bytes_per_token(model_shape(c), 2) / KIB for c in (c15, c7)]
    said(
        "docs/SCALING.md",
        f"28 x 2 x D bytes: {kept[0]:.0f} KiB at 1.5B, {kept[1]:.0f} KiB at 7B",
        f"2 x (6 D + 3 MLP) bytes: {layer[0]:.1f} KiB / {layer[1]:.0f} KiB",
        f"At a 16,384-token budget: {budget[0]:.1f} GiB at 1.5B, {budget[1]:.1f} GiB at 7B",
        f"{whole / MIB:.1f} MiB per token at 1.5B ({16_384 * whole / GIB:.1f} GiB at 16k tokens)",
        f"128 x 2 bytes per token: {kv[0]:.0f} KiB at 1.5B, {kv[1]:.0f} KiB at 7B",
    )


def test_bf16_and_checkpoint_figures():
    """The fp32 output-weight buffer (V x D x 4 bytes), DeepSpeed's fp32 gradient partitions (+2 bytes / N), and a
    7B ZeRO-3 checkpoint (12 bytes of fp32 state a parameter + the bf16 HF weights), in GB as the page gives them."""
    (c15, _), (c7, p7) = shape(B15), shape(B7)
    buffer = [c.vocab_size * c.hidden_size * 4 / 1e9 for c in (c15, c7)]
    state, weights = 12 * p7 / 1e9, 2 * p7 / 1e9
    said(
        "docs/SCALING.md",
        f"({buffer[0]:.1f} GB at 1.5B, {buffer[1]:.1f} GB at 7B)",
        f"+{2 * p7 / 8 / 1e9:.1f} GB per GPU at 7B on 8 GPUs",
        f"~{state + weights:.0f} GB (arithmetic: 12 bytes of fp32 state per parameter, {state:.0f} GB, and the "
        f"{weights:.0f} GB of bf16 weights)",
        f"its ~{state / 8:.0f} GB optimiser shard, or the ~{weights:.0f} GB weights",
    )


def test_the_output_layers_chunk():
    """`head_chunk_rows` and the GEMMs' FLOPs per byte (tests/test_logprobs.py's `gemm_flop_per_byte`)."""
    cpu, gpu = head_chunk_rows(V, "cpu"), head_chunk_rows(V, "cuda", device_memory=80 * 10**9)
    ai = lambda rows, acc=False: " / ".join(f"{gemm_flop_per_byte(rows, D, V, acc):.0f}" for D in (1536, 3584))  # noqa: E731
    past = 2 * gpu
    assert all(gemm_flop_per_byte(past, D, V, True) > H100_RIDGE for D in (1536, 3584))
    said(
        "docs/SCALING.md",
        f"{cpu} and {gpu} rows at V = 151,936",
        f"= {H100_RIDGE:.0f} FLOP/byte",
        f"At {cpu} rows the chunk's GEMMs (forward, recompute, dZ @ W) ran at {ai(cpu)} FLOP/byte",
        f"at {gpu}, {ai(gpu)}",
        f"{gemm_flop_per_byte(cpu, 1536, V, True):.0f} FLOP/byte at {cpu} rows, {ai(gpu, True)} at {gpu}",
        f"({past:,} rows would pass the ridge",
    )


def test_micro_batches_sized_for_the_model():
    """SmolLM2-135M in fp32 and the shipped demo model: activation bytes a token, and the tokens 1/8 of a 24 GiB
    machine's memory holds (`common.batching.micro_batch_tokens`' budget)."""
    per_token = activation_bytes_per_token(SMOLLM2, 4, False)
    tokens = int(24 * GIB / 8 // per_token)
    demo = SimpleNamespace(**json.loads((ROOT / "models" / "tiny-arith" / "config.json").read_text()))
    said(
        "docs/SCALING.md",
        f"SmolLM2-135M in fp32, {per_token / MIB:.2f} MiB a token, so on a 24 GiB machine ~{round(tokens, -2):,} "
        f"tokens, {tokens // 173} sequences of 173 tokens; the demo model ({activation_bytes_per_token(demo, 4, False) / KIB:.0f} "
        "KiB a token)",
    )


def test_the_real_models_step_arithmetic():
    """A forward and a backward are 6 FLOPs a parameter and token; the shared layout's row against the padded
    rows, from the demo's shapes (~125 prompt and ~24 completion tokens, G = 8)."""
    prompt, completion, G, rows, parameters = 125, 24, 8, 48, 135e6
    sequence = round(prompt + completion, -1)  # ~150
    padded, shared = G * sequence, prompt + G * completion
    said(
        "docs/SCALING.md",
        f"{rows} x ~{sequence} tokens, are about 6 x 135M x {rows * sequence:,} = "
        f"{6 * parameters * rows * sequence / 1e12:.1f} TFLOP",
        f"~125 + 8 x 24 = ~{round(shared, -1)} tokens instead of 8 x ~{sequence} = ~{padded:,}, about "
        f"{padded / shared:.1f} times fewer",
    )


def test_prose_read_from_stored_runs():
    """Figures the prose takes from stored files: the demo's seed-0 pass@1 at step 0 (docs/demo_runs.json), the
    real-model demo's held-out pass@1 before training, its peak RSS and trainer-vs-engine gap over its steps
    (docs/real_demo_metrics.jsonl)."""
    runs = json.loads((ROOT / "docs" / "demo_runs.json").read_text())
    seed0 = next(r for r in runs if r["seed"] == 0)["eval"][0]
    said("README.md", f"gave step 0's pass@1 of seed 0 here, {seed0:g}")
    rows = [json.loads(line) for line in (ROOT / "docs" / "real_demo_metrics.jsonl").read_text().splitlines()]
    before = rows[0]["eval/sums/pass@1"]
    assert abs(before - 0.25) <= 0.03, before
    said("README.md", "gets about a quarter of unseen sums right")
    peak = [r["time/peak_mem_gb"] for r in rows if "time/peak_mem_gb" in r]
    said("docs/SCALING.md", f"is {min(peak):.1f}-{max(peak):.1f} GB over its steps")
    gap = [r["train/rollout_logp_gap"] for r in rows if "train/rollout_logp_gap" in r]
    assert 1e-7 <= min(gap) and max(gap) <= 2e-6, (min(gap), max(gap))
    said("docs/SCALING.md", "stays between 1e-7 and 2e-6 over the demo's steps")


def test_the_demo_model_and_the_readmes_standard_error():
    """The shipped model's size and build (models/tiny-arith/), and pass@1's standard error over 100 sums x 2
    samples: between 200 independent samples and 100 (a problem's two samples agreeing), at p = 0.5."""
    size = sum(p.stat().st_size for p in (ROOT / "models" / "tiny-arith").iterdir())
    build = json.loads((ROOT / "models" / "tiny-arith" / "tiny_model.json").read_text())
    assert build["sft_noise"] == 0.5  # "half state the right sum without \boxed{}"
    said("README.md", f"its own tokenizer, {size / 1e6:.0f} MB", f"({build['sft_steps']} SFT steps)")
    low, high = math.sqrt(0.25 / 200), math.sqrt(0.25 / 100)
    assert low < 0.04 < high
    said("README.md", "a standard error of about 0.04, arithmetic: sqrt(0.5 x 0.5 / 200) to sqrt(0.5 x 0.5 / 100)")


@pytest.mark.parametrize("page", ["README.md", "docs/SCALING.md", "docs/EVALUATION.md"])
def test_no_page_says_trl_has_a_stop_option(page):
    """TRL 1.16's GRPOConfig has no `stop` (its generation_kwargs pass vLLM's): `--stop` is vLLM's."""
    assert "TRL's `stop`" not in text(page) and "TRL's stop" not in text(page)
