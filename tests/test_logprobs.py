"""Chunked log-probs / entropy / NLL against the plain full-tensor computation."""

import pytest
import torch
from train_utils import as_completions

from common.logprobs import (
    CHUNK_BYTES,
    GPU_CHUNK_BYTES,
    _chunked,
    _device_memory,
    _logp_and_entropy,
    head_chunk_rows,
    masked_mean,
    sequence_logprobs,
)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """The chunked head's kernel (`_chunked` over `_logp_and_entropy`) on logits that already exist: fp32
    log pi(token_t | <t) and, optionally, H(pi(. | <t)) shaped like `tokens`."""
    V = logits.shape[-1]
    out = _chunked(
        lambda x, t: _logp_and_entropy(x, t, temperature, with_entropy),
        logits.reshape(-1, V),
        tokens.reshape(-1),
        chunk_rows or head_chunk_rows(V, logits.device.type, _device_memory(logits.device)),
    )
    out = out.view(*tokens.shape, 2)
    return out[..., 0], out[..., 1] if with_entropy else None


def reference(logits, tokens, T):
    logp_all = torch.log_softmax(logits.double() / T, -1)
    return logp_all.gather(-1, tokens[..., None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def test_chunked_equals_unchunked():
    torch.manual_seed(0)
    logits = torch.randn(3, 17, 1000) * 4
    tokens = torch.randint(0, 1000, (3, 17))
    for chunk in (1, 7, 51, 10_000):
        logp, ent = token_logprobs(logits, tokens, temperature=0.7, with_entropy=True, chunk_rows=chunk)
        ref_logp, ref_ent = reference(logits, tokens, 0.7)
        torch.testing.assert_close(logp.double(), ref_logp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent.double(), ref_ent, atol=1e-4, rtol=1e-5)


def test_bf16_logits_are_upcast_per_chunk():
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 300) * 3).bfloat16()
    tokens = torch.randint(0, 300, (2, 5))
    logp, ent = token_logprobs(logits, tokens, 1.0, with_entropy=True, chunk_rows=3)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    ref_logp, ref_ent = reference(logits.float(), tokens, 1.0)
    torch.testing.assert_close(logp.double(), ref_logp, atol=1e-5, rtol=1e-5)


def test_entropy_bounds_and_gradient():
    logits = torch.zeros(1, 2, 64, requires_grad=True)
    tokens = torch.zeros(1, 2, dtype=torch.long)
    logp, ent = token_logprobs(logits, tokens, 1.0, with_entropy=True, chunk_rows=1)
    torch.testing.assert_close(ent, torch.full((1, 2), torch.log(torch.tensor(64.0)).item()))  # uniform: log V
    (logp.sum() + ent.sum()).backward()  # differentiable through both
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    peaked = torch.full((1, 1, 64), -1e4)
    peaked[..., 3] = 0
    _, ent = token_logprobs(peaked, torch.tensor([[3]]), 1.0, with_entropy=True)
    assert ent.item() == 0.0  # p log p with p = 0 contributes 0, not NaN


def test_sequence_logprobs_matches_model_forward(tiny_random_model):
    model, _ = tiny_random_model
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (2, 12))
    attn = torch.ones_like(ids)
    full, _ = sequence_logprobs(model, ids, attn, temperature=0.6)
    kept, ent = sequence_logprobs(model, ids, attn, temperature=0.6, logits_to_keep=5, with_entropy=True)
    logits = model(input_ids=ids).logits[:, :-1].double() / 0.6
    ref = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(full.double(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kept, full[:, -5:], atol=1e-5, rtol=1e-5)
    assert ent.shape == (2, 5)


def test_left_padding_does_not_change_logprobs(tiny_random_model):
    model, _ = tiny_random_model
    torch.manual_seed(1)
    seq = torch.randint(3, model.config.vocab_size, (1, 10))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), seq], 1)
    attn = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)], 1)
    a, _ = sequence_logprobs(model, seq, torch.ones_like(seq), 1.0, logits_to_keep=6)
    b, _ = sequence_logprobs(model, padded, attn, 1.0, logits_to_keep=6)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_masked_mean_of_empty_rows_is_zero():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_mean(x, m).item() == 1.5
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.5, 0.0]))  # empty row: 0, not NaN


def direct(model, ids, attn, T, K):
    """The textbook computation: full logits, fp32 log-softmax over the whole tensor."""
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -K - 1 : -1].float() / T
    logp_all = torch.log_softmax(logits, -1)
    return logp_all.gather(-1, ids[:, -K:, None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def test_values_and_gradients_equal_the_direct_computation(tiny_random_model):
    model, _ = tiny_random_model
    torch.manual_seed(2)
    ids = torch.randint(3, model.config.vocab_size, (3, 14))
    attn = torch.ones_like(ids)
    attn[0, :3] = 0  # a left-padded row
    weights = torch.randn(3, 6, dtype=torch.float64)

    def grads(fn):
        model.zero_grad()
        logp, ent = fn()
        ((logp.double() * weights).sum() + (ent.double() * weights.flip(0)).sum()).backward()
        return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    for chunk in (1, 5, None):  # chunks smaller than, not dividing, and larger than the 18 rows
        a = grads(
            lambda c=chunk: sequence_logprobs(model, ids, attn, 0.7, logits_to_keep=6, with_entropy=True, chunk_rows=c)
        )
        b = grads(lambda: direct(model, ids, attn, 0.7, 6))
        torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=1e-5)
        for name in b[2]:
            torch.testing.assert_close(a[2][name], b[2][name], atol=1e-5, rtol=1e-4, msg=name)
    model.zero_grad(set_to_none=True)
    assert "forward" not in vars(model.get_output_embeddings()), "the output layer's forward must be restored"


def gemm_flop_per_byte(rows: int, D: int, V: int, fp32_accumulator: bool = False) -> float:
    """A [rows, D] x [D, V] bf16 product: its FLOPs per byte moved. With an fp32 [V, D] accumulator
    (the output weight's gradient, `_add_product`) the accumulator is read and written instead of W."""
    flops = 2 * rows * D * V
    weight = 8 * V * D if fp32_accumulator else 2 * V * D
    return flops / (weight + 2 * rows * V + 2 * rows * D)


H100_RIDGE = 989e12 / 3.35e12  # bf16 dense FLOP/s over HBM3 bytes/s: ~295 FLOP/byte


def test_head_chunk_on_a_gpu_is_compute_bound_and_bounded_in_memory():
    """At Qwen2.5's vocabulary, a chunk is 64 MiB of fp32 logits on CPU (110 rows, as before) and 512 MiB
    on a GPU (883 rows): its logits GEMMs (forward, recompute, dZ @ W) run above an H100's ridge at both
    Qwen2.5 hidden sizes, where 110 rows ran at about a third of it; the weight gradient's fp32 sum
    reaches ~2/3 of it (was 1/11). Memory: a chunk's ~4 fp32 tensors, at most 1/32 of the device's."""
    V = 151_936
    assert (CHUNK_BYTES, GPU_CHUNK_BYTES) == (64 * 2**20, 512 * 2**20)
    assert head_chunk_rows(V, "cpu") == 110
    gpu = head_chunk_rows(V, "cuda", device_memory=80 * 10**9)
    assert gpu == head_chunk_rows(V, "cuda") == 883 >= 512
    for D in (1536, 3584):  # Qwen2.5 1.5B, 7B
        assert gemm_flop_per_byte(110, D, V) < H100_RIDGE / 2.5 < H100_RIDGE < gemm_flop_per_byte(gpu, D, V)
        assert gemm_flop_per_byte(110, D, V, True) < 30 < 190 < gemm_flop_per_byte(gpu, D, V, True)
    assert 4 * gpu * V * 4 <= 80 * 10**9 / 32
    small = head_chunk_rows(V, "cuda", device_memory=24 * 10**9)  # a 24 GB card: bounded by its memory
    assert small == 308 and 4 * small * V * 4 <= 24 * 10**9 / 32
    assert head_chunk_rows(10**9, "cuda") == 1  # a vocabulary wider than the budget: one row at a time


def test_nothing_vocabulary_sized_is_kept_for_backward(tiny_random_model):
    """Autograd keeps no [rows, V] tensor: the logits are recomputed chunk by chunk in backward."""
    model, _ = tiny_random_model
    V = model.config.vocab_size
    ids = torch.randint(3, V, (2, 40))
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, ent = sequence_logprobs(
            model, ids, torch.ones_like(ids), 1.0, logits_to_keep=30, with_entropy=True, chunk_rows=8
        )
    assert saved, "the hook must see the model's saved activations"
    assert not [s for s in saved if s and s[-1] == V and len(s) > 1 and s[0] > 1], [s for s in saved if s[-1] == V]
    (logp.sum() + ent.sum()).backward()
    model.zero_grad(set_to_none=True)


def test_autocast_casts_the_output_layer_once_not_once_per_chunk(tiny_random_model):
    """fp32 master weights under bf16 autocast: each chunk's backward recompute used to cast the whole
    V x D output weight again (autocast's cast cache is gone by then). Counted at the dispatcher."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model, _ = tiny_random_model
    shape = tuple(model.get_output_embeddings().weight.shape)

    class CountWeightCasts(TorchDispatchMode):
        casts = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and tuple(out.shape) == shape and out.dtype == torch.bfloat16:
                CountWeightCasts.casts += 1
            return out

    ids = torch.randint(3, model.config.vocab_size, (2, 40))
    with CountWeightCasts():
        with torch.autocast("cpu", dtype=torch.bfloat16):  # as accelerate wraps the forward; backward runs outside
            logp, _ = sequence_logprobs(model, ids, torch.ones_like(ids), 1.0, logits_to_keep=32, chunk_rows=4)
        logp.sum().backward()  # 16 chunks recomputed
    model.zero_grad(set_to_none=True)
    assert CountWeightCasts.casts == 1, f"the output weight was cast to bf16 {CountWeightCasts.casts} times"


def test_bf16_output_layer_gradient_is_as_exact_as_the_unchunked_pass():
    """Under bf16 autocast, 299 chunks' gradients of the output weight used to be summed by autograd in bf16:
    twice the relative error (vs fp64) of the unchunked bf16 pass. Now they are summed in fp32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())  # the same weights in bf16 and fp64
    ids = torch.randint(3, 4096, (2, 300))
    adv = torch.randn(2, 1, dtype=torch.float64)

    def head_grad(dtype, autocast, chunk_rows):
        m = Qwen2ForCausalLM(config).to(dtype)
        m.load_state_dict(model.state_dict())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if chunk_rows:
                logp, _ = sequence_logprobs(m, ids, torch.ones_like(ids), chunk_rows=chunk_rows)
            else:  # the textbook pass: full logits
                logits = m(input_ids=ids).logits[:, :-1]
                logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
                logp = logp.gather(-1, ids[:, 1:, None])[..., 0]
        (logp.double() * adv).sum().backward()
        return m.lm_head.weight.grad.double()

    exact = head_grad(torch.float64, False, None)
    error = lambda g: ((g - exact).norm() / exact.norm()).item()  # noqa: E731
    unchunked = error(head_grad(torch.float32, True, None))
    chunked = error(head_grad(torch.float32, True, 2))
    assert 1e-4 < unchunked and chunked <= 1.1 * unchunked, (chunked, unchunked)


def layout_pass(model, ids, attn_mask, K, layout):
    """logp and entropy at the positions whose values mean something (a real token predicted from a real
    one), and every parameter's gradient of their sum, scoring `ids` in `layout` at T = 0.7."""
    real = attn_mask.to(next(model.parameters()).dtype)
    valid = real[:, 1:] * real[:, :-1]
    valid = valid[:, -K:] if K else valid
    model.zero_grad(set_to_none=True)
    logp, ent = sequence_logprobs(model, ids, attn_mask, 0.7, K, with_entropy=True, layout=layout)
    assert logp.dtype == torch.float32
    ((logp * valid).sum() + (ent * valid).sum()).backward()
    return logp * valid, ent * valid, {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("keep", ["completion", "all"])
def test_padding_free_equals_the_padded_pass(tiny_random_dir, attn, keep):
    """--padding_free: the real tokens of every row packed into one row, position ids restarting per
    sequence, give the padded pass's log-probs, entropies and gradients (transformers builds the
    block-diagonal causal mask from the position ids: per attention implementation)."""
    from transformers import AutoModelForCausalLM

    from common.batching import pack

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir, attn_implementation=attn)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    prompts = [torch.randint(3, V, (p,), generator=g).tolist() for p in (3, 9, 5, 1, 7)]
    batch = pack(prompts, as_completions([torch.randint(3, V, (c,), generator=g).tolist() for c in (4, 1, 9, 6, 2)]), 0)
    ids, attn_mask, C = batch["input_ids"], batch["attention_mask"], batch["completion_mask"].shape[1]
    K = C if keep == "completion" else None
    padded, packed = (layout_pass(model, ids, attn_mask, K, layout) for layout in ("padded", "packed"))
    torch.testing.assert_close(packed[0], padded[0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(packed[1], padded[1], rtol=1e-5, atol=2e-5)
    for k in padded[2]:
        torch.testing.assert_close(packed[2][k], padded[2][k], rtol=1e-4, atol=1e-4, msg=lambda m, k=k: f"{k}: {m}")


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """flash-attention's varlen kernel, on CPU: causal attention within each sequence of a packed row, whose
    boundaries it takes from `cu_seq_lens_q/k` and `max_length_q/k` alone (the kwargs transformers hands
    `_flash_attention_forward`), never from the position ids. Records each call's kwargs."""
    import torch.nn.functional as F

    VARLEN_CALLS.append({k: kwargs.get(k) for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")})
    cu, longest = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
    assert query.shape[0] == 1 and attention_mask is None and cu.dtype == torch.int32 and type(longest) is int
    bounds = cu.tolist()
    assert kwargs["cu_seq_lens_k"].tolist() == bounds and bounds[-1] == query.shape[2]
    out = torch.empty_like(query)
    for a, b in zip(bounds, bounds[1:]):
        assert b - a <= longest
        q, k, v = (x[:, :, a:b] for x in (query, key, value))
        out[:, :, a:b] = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


VARLEN_CALLS: list[dict] = []


def test_padding_free_hands_flash_attention_the_boundaries_from_the_host(tiny_random_dir):
    """Under flash-attention, transformers takes a packed row's boundaries from the forward's kwargs
    (`cu_seq_lens_q/k`, `max_length_q/k`) when all four are given, else infers them from the position ids in
    every layer (device syncs). An attention that uses those kwargs alone (`varlen_attention`, registered as
    transformers' flash-attention is: its own attention function, flash's mask function) gets them in every
    layer, made by `select` from the host lengths, and gives the padded pass's log-probs and entropies."""
    from transformers import AttentionInterface, AttentionMaskInterface, AutoModelForCausalLM
    from transformers.masking_utils import flash_attention_mask

    from common.batching import pack, select

    AttentionInterface.register("varlen_test", varlen_attention)
    AttentionMaskInterface.register("varlen_test", flash_attention_mask)
    padded_model = AutoModelForCausalLM.from_pretrained(tiny_random_dir, attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir, attn_implementation="varlen_test")
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    prompts = [torch.randint(3, V, (p,), generator=g).tolist() for p in (3, 9, 5, 1, 7)]
    batch = pack(prompts, as_completions([torch.randint(3, V, (c,), generator=g).tolist() for c in (4, 1, 9, 6, 2)]), 0)
    mb = select(batch, [0, 1, 2, 3, 4], "packed")
    ids, attn_mask, C = mb["input_ids"], mb["attention_mask"], mb["completion_mask"].shape[1]
    VARLEN_CALLS.clear()
    with torch.no_grad():
        logp, ent = sequence_logprobs(model, ids, attn_mask, 0.7, C, with_entropy=True, layout=mb["layout"])
        want = sequence_logprobs(padded_model, ids, attn_mask, 0.7, C, with_entropy=True)
    assert len(VARLEN_CALLS) == model.config.num_hidden_layers
    assert all(call["cu_seq_lens_q"] is mb["layout"].flash["cu_seq_lens_q"] for call in VARLEN_CALLS)
    assert VARLEN_CALLS[0]["max_length_q"] == 5 + 9  # the longest sequence
    mask = mb["completion_mask"]
    torch.testing.assert_close(logp * mask, want[0] * mask, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(ent * mask, want[1] * mask, rtol=1e-5, atol=2e-5)


# Groups of rows sharing a prompt: (prompt length, completion lengths), varied so that the padded layout
# left-pads prompts, right-pads completions, and holds empty completions and a one-token prompt.
SHARED_GROUPS = [(6, [4, 1, 0, 3]), (2, [5, 5]), (1, [2]), (9, [1, 3, 2])]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("keep", ["completion", "all"])
@pytest.mark.parametrize("order", ["grouped", "shuffled"])  # shuffled: the token-budget planner sorts rows by length
def test_shared_prefix_equals_the_padded_pass(tiny_random_dir, attn, keep, order):
    """Each prompt computed once for all its completions (one row, a 4D mask) gives the padded pass's
    log-probs, entropies and parameter gradients, for the completion columns and for the whole
    sequence (Pro-GRPO scores the prompt too). SDPA runs an fp64 model, so that only the output layer's
    fp32 log-softmax (summed in another order) separates the two; eager runs fp32 (transformers' fp64
    eager attention turns the padded rows' fully masked pad queries into NaN)."""
    from transformers import AutoModelForCausalLM

    from common.batching import pack, select

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir, attn_implementation=attn)
    model, tol = (model.double(), 1e-6) if attn == "sdpa" else (model, 2e-5)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    prompts, completions = [], []
    for p, cs in SHARED_GROUPS:
        prompt = torch.randint(3, V, (p,), generator=g).tolist()
        for c in cs:
            prompts.append(prompt)
            completions.append(torch.randint(3, V, (c,), generator=g).tolist())
    batch = pack(prompts, as_completions(completions), 0)
    rows = list(range(len(prompts)))
    if order == "shuffled":
        rows = torch.randperm(len(rows), generator=g).tolist()
    padded, shared = select(batch, rows), select(batch, rows, "shared")
    assert padded["layout"] == "padded" and shared["layout"].input_ids.shape[0] == len(SHARED_GROUPS)
    ids, attn_mask, C = padded["input_ids"], padded["attention_mask"], padded["completion_mask"].shape[1]
    K = C if keep == "completion" else None
    want, got = (layout_pass(model, ids, attn_mask, K, layout) for layout in ("padded", shared["layout"]))
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1], want[1], rtol=tol, atol=tol)
    valid = (attn_mask[:, 1:] * attn_mask[:, :-1])[:, -K:] if K else attn_mask[:, 1:] * attn_mask[:, :-1]
    assert (got[0] == 0).sum() == (valid == 0).sum()  # nothing scored outside the real tokens
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], rtol=10 * tol, atol=2 * tol, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize(
    "prompt, completions, shared",
    [
        (100, [10] * 8, True),  # a long prompt, short completions: computed once instead of 8 times
        (10, [100] * 8, False),  # long completions: one row of 810 tokens would attend over 810^2 pairs
        (20, [20], False),  # a group of one: nothing to share
        (50, [0, 0], True),  # empty completions: the prompt once
    ],
)
def test_shared_prefix_only_where_it_computes_less(prompt, completions, shared):
    from common.batching import pack, select

    batch = pack([[1] * prompt] * len(completions), as_completions([[2] * c for c in completions]), 0)
    layout = select(batch, list(range(len(completions))), "shared")["layout"]
    assert layout != "padded" if shared else layout == "padded"


def test_padding_free_by_default_only_where_attention_skips_other_sequences():
    from common.batching import pass_layout

    # SDPA and eager would attend over a dense T x T mask: they share prompts instead (a 4D mask they take)
    assert pass_layout("auto", True, "sdpa", False) == pass_layout("auto", True, "eager", False) == "shared"
    assert pass_layout("auto", True, "flash_attention_2", False) == "packed"
    assert pass_layout("auto", True, "flex_attention", False) == "packed"
    assert pass_layout("on", True, "sdpa", False) == "packed"
    assert pass_layout("off", True, "flash_attention_2", False) == "padded"
    assert pass_layout("off", False, "sdpa", False) == "padded"
    assert pass_layout("auto", True, "sdpa", True) == "padded"  # a given 4D mask would drop the window


def test_sliding_window_is_read_from_the_config():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    from common.batching import sliding

    assert not sliding(LlamaConfig()) and not sliding(Qwen2Config())  # Qwen2: sliding_window set, not used
    assert sliding(Qwen2Config(use_sliding_window=True, max_window_layers=1, num_hidden_layers=2))
    assert sliding(MistralConfig()) and not sliding(MistralConfig(sliding_window=None))


def test_entropy_is_fp32_under_autocast():
    """autocast runs bmm (the entropy's row-wise product) in bf16: ~3 significant digits of H."""
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 2000) * 3
    tokens = torch.randint(0, 2000, (4, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, ent = token_logprobs(logits, tokens, 1.0, with_entropy=True)
    torch.testing.assert_close(ent.double(), reference(logits, tokens, 1.0)[1], atol=1e-5, rtol=1e-5)
