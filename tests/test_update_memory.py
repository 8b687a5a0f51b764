"""The update's memory under bf16 autocast over fp32 weights (issue 51, item 3): the three terms the plan left out,
each measured on CPU (autocast's weight cache, foreach AdamW's sqrt(v), the fp32 residual stream) with the removal
of the first two (`common.models.autocast_options`, `optimizer_options`), one layer's backward as counted, and
DAPO's recipe on one 80 GB GPU by hand (`benchmarks/memory.py` `update_phases`, tests/recipe_memory.py)."""

import sys
from types import SimpleNamespace

import pytest
import torch
from recipe_memory import H100_GIB, MODELS, update_activations_gib, update_phases_gib
from train_utils import ROOT

from benchmarks.memory import layer_backward_bytes, update_phases
from common.batching import activation_bytes_per_token
from common.models import GIB, autocast_options, optimizer_options, precision_for

sys.path.insert(0, str(ROOT / "benchmarks"))

from kv_room import budget  # noqa: E402
from memory import AllocationTracker  # noqa: E402

DAPO = "dapo_qwen2.5-math-1.5b.yaml"
SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip


def said(page: str, *phrases: str) -> None:
    """The page says each phrase (line breaks and runs of spaces read as one space: figures wrap across lines)."""
    text = " ".join((ROOT / page).read_text().split())
    missing = [p for p in phrases if " ".join(p.split()) not in text]
    assert not missing, f"{page} no longer says {missing}"


def small_model(checkpointing: bool = True, **sizes):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**(SMALL | sizes))).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def cast_bytes(model) -> int:
    """2 bytes per value of the tensors autocast casts to bf16: the layers' linear weights and biases."""
    linears = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    return 2 * sum(p.numel() for m in linears for p in m.parameters())


@pytest.mark.parametrize("options, held", [({}, "every weight"), (autocast_options(), "none")])
def test_autocast_keeps_a_bf16_copy_of_every_weight_to_the_forwards_end(options, held):
    """torch's default: each fp32 weight's bf16 cast stays in autocast's cache until the outermost autocast exits
    (the end of the forward accelerate wraps), 2 bytes a parameter beside what checkpointing keeps; the project's
    options keep none. The plan's term (`update_phases`, autocast_cache=True) is that cache, to the norms' weights."""
    model, ids = small_model(), torch.randint(0, 256, (2, 32))
    with AllocationTracker() as t:
        with torch.autocast("cpu", dtype=torch.bfloat16, **options):
            logits = model(input_ids=ids).logits  # kept: its graph holds the output layer's cast, not the cache
            at_the_end = t.live
        after = t.live
        del logits
    expected = cast_bytes(model) if held == "every weight" else 0
    assert at_the_end - after == expected
    parameters = sum(p.numel() for p in model.parameters())
    phases = update_phases(parameters, model.config, 64, mode="single", world=1, precision="bf16-mixed",
                           chunk_rows=64, autocast_cache=True)  # fmt: skip
    assert phases["forward"]["autocast's weight cache"] * GIB == pytest.approx(cast_bytes(model), rel=0.01)


def test_foreach_adamw_takes_sqrt_v_of_the_whole_model_and_the_trainers_none():
    """foreach AdamW (torch's default on CUDA) allocates sqrt(v) of every parameter at once at each step, 4 bytes an
    fp32 parameter above the state; the trainer's AdamW is fused, which allocates none."""
    assert optimizer_options("cuda") == optimizer_options("cpu") == {"fused": True}
    params = [torch.nn.Parameter(torch.randn(256, 256)) for _ in range(4)] + [torch.nn.Parameter(torch.randn(256))]
    count = sum(p.numel() for p in params)
    above = {}
    for name, options in [("foreach", {"foreach": True}), ("trainer's on CUDA", optimizer_options("cuda"))]:
        opt = torch.optim.AdamW(params, lr=1e-3, **options)
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()  # the state is made at the first step
        with AllocationTracker() as t:
            opt.step()
        above[name] = t.peak
    assert above == {"foreach": 4 * count, "trainer's on CUDA": 0}
    plan = update_phases(count, SimpleNamespace(**SMALL), 64, mode="single", world=1, precision="auto", chunk_rows=64,
                         fused_adamw=False)["optimiser step"]  # fmt: skip
    assert plan["AdamW's sqrt(v) (foreach)"] * GIB == 4 * count


def test_the_residual_stream_stays_fp32_under_autocast_over_fp32_weights():
    """Each layer's input, what gradient checkpointing keeps, is fp32 under bf16 autocast over fp32 weights (the
    embedding and the residual adds are not autocast ops): L x D x 4 bytes a token, not 2."""
    model, ids = small_model(), torch.randint(0, 256, (2, 32))
    inputs = []
    for layer in model.model.layers:
        layer.register_forward_pre_hook(
            lambda m, a, kw: inputs.append((a or [kw["hidden_states"]])[0]), with_kwargs=True
        )
    with torch.autocast("cpu", dtype=torch.bfloat16, **autocast_options()):
        model(input_ids=ids)
    tokens, (L, D, inner) = ids.numel(), (SMALL["num_hidden_layers"], SMALL["hidden_size"], SMALL["intermediate_size"])
    assert {x.dtype for x in inputs} == {torch.float32}
    assert sum(x.numel() * x.element_size() for x in inputs) == tokens * L * D * 4
    assert precision_for("bf16-mixed", gpu=True).residual_bytes == 4
    assert activation_bytes_per_token(model.config, 2, True, residual_bytes=4) == L * D * 4 + 4 * D + 2 * (
        5 * D + 3 * inner
    )
    assert activation_bytes_per_token(model.config, 2, True) == 2 * (L * D + 6 * D + 3 * inner)  # all-bf16, as before
    phases = update_phases(1, model.config, tokens, mode="single", world=1, precision="bf16-mixed", chunk_rows=64)
    assert phases["forward"]["layer inputs"] * GIB == tokens * L * D * 4


@pytest.mark.parametrize("sizes", [{}, {"hidden_size": 128, "intermediate_size": 512, "num_key_value_heads": 2}])
def test_one_layers_backward_is_what_its_recompute_saves(sizes):
    """What one Qwen2 layer's recompute saves for backward under bf16 autocast over fp32 weights (every tensor
    autograd saves, parameters and the layer's input aside) against `layer_backward_bytes` less the two MLP-sized
    gradients of its backward: per token 22 D + 6 A + 4 K + 8 I bytes, and the layer's weights in bf16."""
    model = small_model(checkpointing=False, num_hidden_layers=1, **sizes)
    layer, (B, S) = model.model.layers[0], (4, 96)
    x = torch.randn(B, S, model.config.hidden_size, requires_grad=True)
    position = model.model.rotary_emb(x, torch.arange(S)[None].expand(B, S))
    own = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    saved = {}

    def pack(t):
        if (ptr := t.untyped_storage().data_ptr()) not in own:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16, **autocast_options()):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x, position_embeddings=position, attention_mask=None)
    tokens, weights = B * S, sum(p.numel() for p in layer.parameters())
    counted = layer_backward_bytes(model.config, tokens, weights) - tokens * 4 * model.config.intermediate_size
    assert sum(saved.values()) == pytest.approx(counted, rel=0.05)


def test_dapos_update_on_an_80gb_gpu_by_hand():
    """DAPO's recipe (DDP, Qwen2.5-Math-1.5B: P = 1,543,714,304, D = 1,536, V = 151,936, 28 layers; 16,384 tokens a
    micro-batch, gradient checkpointing; 883-row chunks): its peak is the output layer's backward, 16 P (23.00 GiB)
    + 16,384 x 28 x 1,536 x 4 (2.625, the layers' fp32 inputs) + 2 x 16,384 x 1,536 x 4 (0.188, the head's input
    rows and their gradient) + V D x 2 (0.435, its bf16 copy) + 4 x 883 x V x 4 (1.999, its chunks) + V D x 4
    (0.869, its fp32 gradient sum) = 29.12 GiB; with vLLM's 0.6 x 79.2 = 47.52 and the 2 GiB margin, 78.64 of
    79.2. The terms removed would not have fitted: autocast's cache, 2 (P - V D) = 2.44 GiB at the forward's end,
    and foreach's sqrt(v), 4 P = 5.75 GiB at the step, beside the same share."""
    P, (V, D) = MODELS["Qwen/Qwen2.5-Math-1.5B"][1], (151_936, 1536)
    head = update_phases_gib(DAPO)["output layer's backward"]
    hand = {"training state": 16 * P, "layer inputs": 16_384 * 28 * D * 4,
            "output layer's input rows and their gradient": 2 * 16_384 * D * 4, "output layer's compute copy": 2 * V * D,
            "output layer's chunks": 4 * 883 * V * 4, "output layer's fp32 gradient sum": 4 * V * D}  # fmt: skip
    assert head == pytest.approx({k: v / GIB for k, v in hand.items()})
    assert update_activations_gib(DAPO) == pytest.approx(sum(head.values()) - head["training state"])
    assert budget(DAPO)["update"] == pytest.approx(sum(head.values()) + 0.6 * H100_GIB + 2.0) == pytest.approx(78.64, abs=0.005)  # fmt: skip
    config = SimpleNamespace(**MODELS["Qwen/Qwen2.5-Math-1.5B"][0])
    kept = update_phases(P, config, 16_384, mode="ddp", world=8, precision="auto", chunk_rows=883,
                         autocast_cache=True, fused_adamw=False)  # fmt: skip
    assert kept["forward"]["autocast's weight cache"] == pytest.approx(2 * (P - V * D) / GIB)  # 2.44
    assert kept["optimiser step"]["AdamW's sqrt(v) (foreach)"] == pytest.approx(4 * P / GIB)  # 5.75
    assert max(sum(t.values()) for t in kept.values()) + 0.6 * H100_GIB + 2.0 > H100_GIB


def test_scaling_md_gives_the_phases_and_the_removed_terms():
    """docs/SCALING.md's "Per-GPU budget": the fp32 inputs per token, DAPO's phases, the two removed terms and what
    DAPO's update would need with them, each computed here."""
    P, (V, D) = MODELS["Qwen/Qwen2.5-Math-1.5B"][1], (151_936, 1536)
    kib = [28 * 4 * MODELS[m][0]["hidden_size"] / 2**10 for m in ("Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-Math-7B")]
    forward, head, layers, embedding, _ = (sum(v.values()) for v in update_phases_gib(DAPO).values())
    config = SimpleNamespace(**MODELS["Qwen/Qwen2.5-Math-1.5B"][0])
    kept = update_phases(P, config, 16_384, mode="ddp", world=8, precision="auto", chunk_rows=883,
                         autocast_cache=True, fused_adamw=False)  # fmt: skip
    with_them = max(sum(t.values()) for t in kept.values()) + 0.6 * H100_GIB + 2.0
    said(
        "docs/SCALING.md",
        f"28 x 4 x D bytes: {kib[0]:.0f} KiB at 1.5B, {kib[1]:.0f} KiB at 7B",
        f"its chunks (2.0): {forward:.1f} GiB",
        f"(V x D x 4, {4 * V * D / GIB:.2f}): {head:.1f} GiB, the update's peak",
        f"embedding's (0.87): {layers:.1f} GiB",
        f"the embedding's backward ({embedding:.1f} GiB)",
        f"2 bytes a parameter, {2 * (P - V * D) / GIB:.1f} GiB at 1.5B",
        f"4 bytes a parameter, {4 * P / GIB:.1f} GiB at 1.5B",
        f"DAPO's update would need {with_them:.1f} GiB of {H100_GIB}",
    )
