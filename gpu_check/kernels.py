"""The part "kernels" of gpu_check/first_run.py, on the device there is: the chunked head's fp32 accumulation and
gradient, the SDPA kernel each layout's mask gets, the layouts against the padded one, and the chunk rows' speed
(one function each, below). `dry`: toy sizes, for the CPU dry run.
"""

import copy
import time
import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from common.batching import SharedPrefix, pack, select
from common.logprobs import _add_product, _device_memory, _fp32_out_addmm, head_chunk_rows, sequence_logprobs
from common.prompts import Completion
from gpu_check.report import Findings

# Groups of rows sharing a prompt: (prompt length, completion lengths), as tests/test_logprobs.py's SHARED_GROUPS.
GROUPS = [(6, [4, 1, 0, 3]), (2, [5, 5]), (1, [2]), (9, [1, 3, 2])]


def small_qwen(device, vocab: int = 1024, hidden: int = 256, heads: int = 4, layers: int = 2, **extra):
    """A random small Qwen2 with a tied embedding, on `device`, SDPA attention."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), tie_word_embeddings=True,
        max_position_embeddings=1024, attn_implementation="sdpa", **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device)


def grouped_batch(vocab: int, device) -> tuple[dict, list[int]]:
    """A packed batch of GROUPS (left-padded prompts, empty completions, a one-token prompt) on `device`."""
    g = torch.Generator().manual_seed(0)
    prompts, completions = [], []
    for p, cs in GROUPS:
        prompt = torch.randint(3, vocab, (p,), generator=g).tolist()
        for c in cs:
            prompts.append(prompt)
            tokens = torch.randint(3, vocab, (c,), generator=g).tolist()
            completions.append(Completion(tokens, [0.0] * c, True))
    batch = pack(prompts, completions, 0, device)
    return batch, list(range(len(prompts)))


def fp32_accumulation(f: Findings, device, dry: bool) -> None:
    """The weight gradient's sum over chunks, sum_c dZ_c^T H_c, of bf16 factors: in one fp32 buffer (the scripts'),
    in bf16 (autograd's sum before), and in fp64 (exact)."""
    V, D, rows, chunks = 4096, 256, 32, 166
    g = torch.Generator().manual_seed(0)
    dz = [torch.randn(rows, V, generator=g).to(device, torch.bfloat16) for _ in range(chunks)]
    h = [torch.randn(rows, D, generator=g).to(device, torch.bfloat16) for _ in range(chunks)]
    exact = sum(a.double().T @ b.double() for a, b in zip(dz, h))
    acc = torch.zeros(V, D, device=device)
    bf16 = torch.zeros(V, D, device=device, dtype=torch.bfloat16)
    for a, b in zip(dz, h):
        _add_product(acc, a.T, b)
        bf16 += a.T @ b
    rel = lambda x: ((x.double() - exact).norm() / exact.norm()).item()
    native = _fp32_out_addmm(device.type)
    f.figure("addmm with out_dtype=float32 taken here (`_fp32_out_addmm`, decided from the build)", native)
    f.figure(f"sum of {chunks} chunks' V x D products, relative error: fp32 buffer", rel(acc))
    f.figure(f"sum of {chunks} chunks' V x D products, relative error: bf16 running sum", rel(bf16))
    f.check("the fp32 buffer's sum is at least 4x closer to fp64 than the bf16 sum", rel(acc) * 4 < rel(bf16))
    if device.type == "cuda":
        f.check("CUDA's addmm sums bf16 factors into an fp32 tensor (torch >= 2.8)", native)


def _tied_grad(model, ids, K: int, adv, dtype, autocast: bool, chunk_rows: int | None) -> torch.Tensor:
    """The tied embedding / output weight's gradient of -sum A logp / tokens, chunked (`chunk_rows`) or not."""
    m = copy.deepcopy(model).to(dtype)
    attn = torch.ones_like(ids)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        if chunk_rows:
            logp = sequence_logprobs(m, ids, attn, 1.0, logits_to_keep=K, chunk_rows=chunk_rows)[0]
        else:
            logits = m(input_ids=ids, attention_mask=attn, logits_to_keep=K + 1).logits[:, :-1]
            logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
            logp = logp.gather(-1, ids[:, -K:, None])[..., 0]
    (-(adv[:, None] * logp).sum() / logp.numel()).backward()
    return m.get_input_embeddings().weight.grad.double()


def chunked_head_gradient(f: Findings, device, dry: bool) -> None:
    """The tied weight's gradient of one micro-batch (2 x 248 completion tokens, 166 chunks of 3 rows) under bf16
    autocast, against fp64: the chunked head (fp32 sum) and the unchunked pass (the yardstick)."""
    model = small_qwen(device, vocab=4096, hidden=64, heads=4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())  # bf16-representable: every dtype starts from the same weights
    g = torch.Generator().manual_seed(1)
    K = 248
    ids = torch.randint(3, 4096, (2, 8 + K), generator=g).to(device)
    adv = torch.randn(2, generator=g).to(device)
    exact = _tied_grad(model, ids, K, adv.double(), torch.float64, False, None)
    rel = lambda x: ((x - exact).norm() / exact.norm()).item()
    unchunked = rel(_tied_grad(model, ids, K, adv, torch.float32, True, None))
    chunked = rel(_tied_grad(model, ids, K, adv, torch.float32, True, 3))
    f.figure("tied weight's gradient under bf16 autocast, relative error: unchunked (yardstick)", unchunked)
    f.figure("tied weight's gradient under bf16 autocast, relative error: chunked head, 166 chunks", chunked)
    ok = chunked <= 1.15 * unchunked
    f.check("the chunked head's gradient is no worse than the unchunked bf16 pass's (x 1.15)", ok)


def sdpa_ops(step) -> list[str]:
    """The SDPA aten ops `step()` ran (the kernel torch picked), from the profiler's op names."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    names = {e.name.removeprefix("aten::") for e in prof.events() if "scaled_dot_product" in e.name}
    return sorted(n for n in names if n.startswith("_"))  # the kernels, not the dispatching op


def _runs_under(backends: list, model, mb: dict, cuda: bool) -> tuple[bool, str, str]:
    """Whether a forward + backward of `mb` runs with only `backends` allowed; if not, its error and torch's reason."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backends):
                _layout_pass(model, mb, cuda)
            return True, "ran", ""
        except RuntimeError as e:
            why = next((str(w.message) for w in seen if "attention" in str(w.message).lower()), "")
            return False, str(e).splitlines()[0][:120], why[:160]


def sdpa_kernels(f: Findings, device, dry: bool) -> None:
    """Which SDPA kernel runs each layout's mask, the shared-prompt layout under each backend alone, and with the
    math kernel excluded."""
    cuda = device.type == "cuda"
    model = small_qwen(device, hidden=256, heads=4)  # head_dim 64: within every fused kernel's limits
    batch, rows = grouped_batch(1024, device)
    layouts = {name: select(batch, rows, name) for name in ("shared", "padded", "packed")}
    shared = layouts["shared"]
    if not isinstance(shared["layout"], SharedPrefix):
        raise AssertionError("select() kept the padded layout for the shared-prompt groups")
    for name, mb in layouts.items():
        picked = sdpa_ops(lambda mb=mb: _layout_pass(model, mb, cuda))
        f.figure(f"SDPA kernel torch picks, {name} layout", ", ".join(picked))
    B = SDPBackend
    backends = [B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.CUDNN_ATTENTION, B.MATH]
    results = [[b.name, *_runs_under([b], model, shared, cuda)[1:]] for b in backends]
    title = "The shared-prompt layout (forward + backward) under one SDPA backend at a time"
    f.table(title, ["backend", "result", "torch's reason"], results)
    ok, detail, _ = _runs_under([B.EFFICIENT_ATTENTION, B.CUDNN_ATTENTION], model, shared, cuda)
    if cuda:
        f.check("the shared-prompt layout runs with the math kernel excluded (efficient or cuDNN)", ok, detail)
        picked = f.figures["SDPA kernel torch picks, shared layout"]
        f.check("torch's own pick for the shared-prompt mask is not the math kernel", "math" not in picked, picked)
    else:
        f.note(f"CPU: efficient and cuDNN attention are CUDA kernels; with math excluded the shared layout: {detail}")


def _layout_pass(model, mb: dict, autocast: bool) -> tuple:
    """logp and entropy at real positions and every parameter's gradient of their sum (tests/test_logprobs.py)."""
    attn, C = mb["attention_mask"], mb["completion_mask"].shape[1]
    valid = (attn[:, 1:] * attn[:, :-1])[:, -C:].float()
    model.zero_grad(set_to_none=True)
    with torch.autocast(attn.device.type, dtype=torch.bfloat16, enabled=autocast):
        logp, ent = sequence_logprobs(model, mb["input_ids"], attn, 0.7, C, with_entropy=True, layout=mb["layout"])
    ((logp * valid).sum() + (ent * valid).sum()).backward()
    return logp * valid, ent * valid, {k: p.grad.clone() for k, p in model.named_parameters()}


def layouts_equal(f: Findings, device, dry: bool) -> None:
    """The shared-prompt and padding-free layouts against the padded one on this device: fp32 (checked to 1e-4) and
    under bf16 autocast (reported)."""
    model = small_qwen(device, hidden=256, heads=4)
    batch, rows = grouped_batch(1024, device)
    for autocast in (False, True) if device.type == "cuda" else (False,):
        precision = "bf16 autocast" if autocast else "fp32"
        want = _layout_pass(model, select(batch, rows), autocast)
        for name in ("shared", "packed"):
            got = _layout_pass(model, select(batch, rows, name), autocast)
            values = max((got[i] - want[i]).abs().max().item() for i in (0, 1))
            grads = max(((got[2][k] - g).norm() / g.norm().clamp(min=1e-30)).item() for k, g in want[2].items())
            f.figure(f"{name} vs padded, {precision}: max |difference| of log-probs and entropies", values)
            f.figure(f"{name} vs padded, {precision}: largest relative gradient difference (a parameter's)", grads)
            if not autocast:
                f.check(f"{name} layout equals the padded one in fp32 (values, gradients to 1e-4)",
                        values <= 1e-4 and grads <= 1e-4, f"{values:.2e}, {grads:.2e}")  # fmt: skip


def chunk_speed(f: Findings, device, dry: bool) -> None:
    """A scoring pass's forward + backward time at Qwen2.5's vocabulary (one decoder layer of Qwen2.5-1.5B's width:
    the output layer dominates) for the rows `head_chunk_rows` picks here, CPU's 110 and twice the picked."""
    cuda = device.type == "cuda"
    V, D, heads, N = (4096, 64, 4, 256) if dry else (151_936, 1536, 12, 8192)
    picked = head_chunk_rows(V, device.type, _device_memory(device))  # the figures are cuda_lines' (parts.py)
    model = small_qwen(device, vocab=V, hidden=D, heads=heads, layers=1)
    ids = torch.randint(3, V, (2, N // 2 + 1), device=device)
    attn = torch.ones_like(ids)
    rows_out, sync = [], torch.cuda.synchronize if cuda else lambda: None
    for rows in sorted({110 if not dry else 32, picked, 2 * picked}):
        times = []
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for _ in range(4):  # the first is a warm-up
            sync()
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logp = sequence_logprobs(model, ids, attn, 1.0, logits_to_keep=N // 2, chunk_rows=rows)[0]
            logp.sum().backward()
            sync()
            times.append(time.perf_counter() - t0)
        t = sum(times[1:]) / 3
        flops = 8 * N * D * V  # forward, recompute, and the two backward products, 2 N D V each
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        rows_out.append([rows, f"{1e3 * t:.3g}", f"{flops / t / 1e12:.3g}", "-" if peak is None else f"{peak:.2f}"])
    f.table(
        f"Scoring pass, forward + backward, {N:,} scored rows, V = {V:,}, D = {D:,} (output layer's FLOP/s: 8 N D V over the whole pass's time)",
        ["chunk rows", "ms", "output layer TFLOP/s", "peak GiB"], rows_out,
    )  # fmt: skip


def run(dry: bool) -> Findings:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    f = Findings()
    for name, step in [
        ("fp32 accumulation", fp32_accumulation),
        ("chunked head's gradient", chunked_head_gradient),
        ("SDPA kernels", sdpa_kernels),
        ("layouts equal", layouts_equal),
        ("chunk speed", chunk_speed),
    ]:
        f.attempt(name, step, device, dry)
    return f
