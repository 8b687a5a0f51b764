"""Memory of the log-prob path and padding of micro-batches, measured on CPU at real vocabulary size.

    python benchmarks/memory.py [--lengths 512,2048,8192] [--batch 1]

1. `common.logprobs.sequence_logprobs` on a one-layer model at Qwen2.5's 151,936 vocabulary: the peak bytes it
   allocates (tracked op by op, not the RSS) training and scoring, and the bytes saved for backward, as multiples
   of one fp32 [B, C, V] logits tensor; beside the textbook path where it fits. Target: <= 0.1x at 8,192 tokens.
2. A long-tailed batch's padding share, fixed micro-batches of 4 vs a token budget. Target: <= 10%.

Stored in docs/bench/memory.json; docs/SCALING.md's block is written from it. Also the update's memory estimated
phase by phase from the model's shapes (`update_phases`), which gpu_check/step.py measures on a GPU.
"""

import argparse
import math
import os
import random
import sys
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import stored_run  # noqa: E402
from common.batching import activation_bytes_per_token, micro_batches  # noqa: E402
from common.logprobs import sequence_logprobs  # noqa: E402
from common.models import GIB, bytes_per_parameter  # noqa: E402

VOCAB = 151_936
STORED = stored_run.BENCH / "memory.json"
DOC = ROOT / "docs" / "SCALING.md"
BEGIN, END, FIND = stored_run.markers("memory", "benchmarks/memory.py", "docs/bench/memory.json")


def update_phases(
    parameters: int, config, tokens: int, *, mode: str, world: int, precision: str, chunk_rows: int,
    scored: int | None = None, checkpointing: bool = True, autocast_cache: bool = False, fused_adamw: bool = True,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """GiB per term of each phase of one micro-batch's update on one GPU, at the phase's peak. `tokens`: its padded
    tokens, `scored` of them through the output layer (None: all), `chunk_rows` at a time; `autocast_cache`,
    `fused_adamw`: what the trainer does (`common.models.autocast_options`, `optimizer_options`). An estimate from
    the shapes: gpu_check/step.py measures each phase."""
    V, D, L = config.vocab_size, config.hidden_size, config.num_hidden_layers
    scored = tokens if scored is None else scored
    autocast = mode in ("single", "ddp") and precision in ("auto", "bf16-mixed")
    value = 4 if precision == "fp32" else 2  # inside a layer: the compute dtype
    residual = 4 if autocast or precision == "fp32" else 2
    head = V * D * (value if mode in ("fsdp2", "zero3") else 2 if autocast else 0)  # gathered, or cast once
    embeddings = V * D * (1 if getattr(config, "tie_word_embeddings", False) else 2)  # not cast by autocast
    shard = 1 if mode in ("single", "ddp") else world
    moment = parameters * (4 if mode.startswith("zero") or precision != "bf16" else 2) / shard  # AdamW's v
    state = parameters * bytes_per_parameter(mode, world, precision)
    per_token = activation_bytes_per_token(config, value, checkpointing, residual)
    inputs = tokens * (L * residual * D if checkpointing else per_token)
    layer = tokens * per_token - inputs  # with checkpointing, the layer recomputed at a time
    if autocast and checkpointing:
        layer = layer_backward_bytes(config, tokens, (parameters - embeddings) // L)
    rows, chunks = scored * D * residual, 4 * min(chunk_rows, scored) * V * 4  # ~4 fp32 [rows, V] tensors at once
    cache = 2 * (parameters - embeddings) if autocast and autocast_cache else 0
    grad = V * D * (4 if autocast or precision == "fp32" else 2)  # a [V, D] gradient
    # A tied output layer's gradient waits in autograd's buffer for the embedding's, to the end of the backward.
    waiting = grad if getattr(config, "tie_word_embeddings", False) else 0
    phases = {
        "forward": {"training state": state, "autocast's weight cache": cache, "layer inputs": inputs,
                    "output layer's input rows": rows, "output layer's compute copy": head, "output layer's chunks": chunks},
        "output layer's backward": {"training state": state, "layer inputs": inputs,
                                    "output layer's input rows and their gradient": 2 * rows,
                                    "output layer's compute copy": head, "output layer's chunks": chunks,
                                    "output layer's fp32 gradient sum": 4 * V * D},
        "layers' backward": {"training state": state, "layer inputs": inputs, "one layer's backward": layer,
                             "the hidden states' gradient": tokens * D * residual,
                             "the tied output layer's gradient, waiting": waiting},
        "embedding's backward": {"training state": state, "the hidden states' gradient": tokens * D * residual,
                                 "the tied output layer's gradient, waiting": waiting, "its dense gradient": grad},
        "optimiser step": {"training state": state, "AdamW's sqrt(v) (foreach)": 0 if fused_adamw else moment},
    }  # fmt: skip
    return {phase: {k: v / GIB for k, v in terms.items()} for phase, terms in phases.items()}


def layer_backward_bytes(config, tokens: int, layer_parameters: int) -> int:
    """What one decoder layer holds in its backward under gradient checkpointing and bf16 autocast over fp32
    weights, counted on Qwen2's layer (tests/test_update_memory.py measures it): per token the norms' fp32 outputs
    and residual (3 D x 4), their bf16 casts for q, k, v, gate, up (5 D x 2), q, attention's output, o_proj's input
    (3 A x 2), k, v (2 K x 2), the MLP's four (4 I x 2) and two gradients (2 I x 2); the weights in bf16."""
    D, mlp = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or D // config.num_attention_heads
    A = config.num_attention_heads * head_dim
    K = (getattr(config, "num_key_value_heads", None) or config.num_attention_heads) * head_dim
    return tokens * (22 * D + 6 * A + 4 * K + 12 * mlp) + 2 * layer_parameters


class AllocationTracker(TorchDispatchMode):
    """Live and peak bytes of every storage created inside the block (freed ones subtracted)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def _free(self, nbytes):
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not hasattr(t.untyped_storage(), "_tracked"):
                storage = t.untyped_storage()
                storage._tracked = True
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._free, storage.nbytes())
        return out


def saved_bytes(fn) -> tuple[object, int]:
    """fn()'s result and the bytes of the distinct storages autograd saves for backward."""
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        return fn(), total


def one_layer_lm():
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=16_384, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def textbook_logprobs(model, ids, attn, K, with_entropy=True):
    """What the scripts did before: the model's full logits, then an fp32 log-softmax in row chunks."""
    logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=K + 1).logits[:, :-1]
    rows, targets = logits.reshape(-1, VOCAB), ids[:, -K:].reshape(-1)
    logps, ents = [], []
    for s in range(0, rows.shape[0], 1024):
        lp = F.log_softmax(rows[s : s + 1024].float(), -1)
        logps.append(lp.gather(-1, targets[s : s + 1024, None]).squeeze(-1))
        ents.append(-(lp.exp() * lp).sum(-1))
    return torch.cat(logps), torch.cat(ents) if with_entropy else None


def measure(path, model, B, C, prompt=16) -> dict:
    ids = torch.randint(0, VOCAB, (B, prompt + C))
    attn = torch.ones_like(ids)
    out = {}
    with torch.no_grad(), AllocationTracker() as t:
        path(model, ids, attn, C)
    out["score"] = t.peak
    model.zero_grad(set_to_none=True)
    with AllocationTracker() as t:
        (logp, ent), saved = saved_bytes(lambda: path(model, ids, attn, C))
        (logp.sum() + ent.sum()).backward()
        del logp, ent
    out["train"], out["saved"] = t.peak, saved
    model.zero_grad(set_to_none=True)
    return out


def new_path(model, ids, attn, K):
    return sequence_logprobs(model, ids, attn, 1.0, logits_to_keep=K, with_entropy=True)


def padding_table(n=256, max_len=8192, seed=0) -> tuple[list[tuple[str, float, int]], float]:
    rng = random.Random(seed)
    mean = max_len / 4
    sigma = 0.9
    mu = math.log(mean) - sigma**2 / 2  # lognormal with this mean, cut at max_len
    completions = [max(1, min(max_len, int(rng.lognormvariate(mu, sigma)))) for _ in range(n)]
    prompts = [rng.randint(64, 512) for _ in range(n)]
    real = sum(prompts) + sum(completions)
    rows = []
    for name, kw in [
        ("fixed, 4 sequences", dict(micro_batch_size=4)),
        ("token budget 16,384", dict(micro_batch_size=4, max_tokens=16_384)),
        ("token budget 32,768", dict(micro_batch_size=4, max_tokens=32_768)),
    ]:
        plan = micro_batches(prompts, completions, list(range(n)), **kw)
        processed = sum(len(mb) * (max(prompts[i] for i in mb) + max(completions[i] for i in mb)) for mb in plan)
        rows.append((name, 1 - real / processed, len(plan)))
    return rows, sum(completions) / n


def logprob_table(record: dict) -> list[str]:
    L = [
        "| completion tokens | one fp32 logits tensor | path | training pass peak | saved for backward | scoring pass peak |",
        "|---|---|---|---|---|---|",
    ]
    for r in record["logprob_path"]:
        unit = r["unit_bytes"]
        L.append(
            f"| {r['tokens']:,} | {unit / 2**30:.2f} GiB | {r['path']} | {r['train'] / unit:.3f}x | "
            f"{r['saved'] / unit:.3f}x | {r['score'] / unit:.3f}x |"
        )
    return L


def render(record: dict) -> str:
    """docs/SCALING.md's block: the log-prob path's bytes and the padding of micro-batches, from the stored run."""
    longest = max(record["logprob_path"], key=lambda r: (r["path"].startswith("chunked"), r["tokens"]))
    pad = record["padding"]
    return "\n".join(
        [
            f"Stored in `docs/bench/memory.json`: {stored_run.conditions(record)}. The log-prob + entropy path on a "
            f"one-layer model at Qwen2.5's vocabulary ({VOCAB:,}), batch {record['batch']}: the bytes it allocates "
            "(tracked op by op: not the process's RSS) as a multiple of one fp32 [B, C, V] logits tensor, the "
            f"textbook path (the model's full logits, an fp32 log-softmax) up to {record['textbook_max']:,} tokens:",
            "",
            *logprob_table(record),
            "",
            f"The chunked path's training peak at {longest['tokens']:,} tokens: {longest['train'] / 2**30:.2f} GiB. "
            f"Micro-batches of {pad['sequences']} sequences, completions lognormal (mean {pad['mean_completion']:,.0f}, "
            f"max {pad['max_len']:,}), prompts {pad['prompts'][0]}-{pad['prompts'][1]} tokens:",
            "",
            "| micro-batching | padded share of processed tokens | micro-batches |",
            "|---|---|---|",
            *[f"| {r['plan']} | {r['padded_share']:.1%} | {r['micro_batches']} |" for r in pad["rows"]],
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="512,2048,8192")
    p.add_argument("--batch", type=int, default=1)
    textbook = "longest C the textbook path is run at (it needs ~4 GB per 1k tokens)"
    p.add_argument("--textbook_max", type=int, default=2048, help=textbook)
    p.add_argument("--out", default=str(STORED), help="where the run is stored ('' for nowhere)")
    p.add_argument("--doc", default=str(DOC), help="the page whose block is written ('' for none)")
    p.add_argument("--render_only", action="store_true", help="write the page's block from the stored run")
    a = p.parse_args()
    if a.render_only:
        return write_doc(stored_run.load(Path(a.out)), a.doc)
    record = stored_run.start(" ".join(["python benchmarks/memory.py", *sys.argv[1:]]))
    record |= {"batch": a.batch, "textbook_max": a.textbook_max, "logprob_path": []}
    torch.manual_seed(0)
    model = one_layer_lm()
    for C in map(int, a.lengths.split(",")):
        paths = [("chunked head (now)", new_path)] + (
            [("textbook (before)", textbook_logprobs)] if C <= a.textbook_max else []
        )
        for name, path in paths:
            m = measure(path, model, a.batch, C)
            record["logprob_path"].append({"tokens": C, "path": name, "unit_bytes": a.batch * C * VOCAB * 4, **m})
            print(f"{C} tokens, {name}: {m}", flush=True)
    rows, mean = padding_table()
    record["padding"] = {
        "sequences": 256, "max_len": 8192, "prompts": [64, 512], "mean_completion": mean,
        "rows": [{"plan": name, "padded_share": share, "micro_batches": count} for name, share, count in rows],
    }  # fmt: skip
    if a.out:
        stored_run.finish(record, Path(a.out))
    else:
        record["load_1min_after"] = os.getloadavg()[0]
    print(render(record))
    write_doc(record, a.doc)


def write_doc(record: dict, doc: str) -> None:
    if doc:
        stored_run.write_between(Path(doc), BEGIN, END, render(record), "memory", FIND)
        print(f"wrote {doc}'s memory block")


if __name__ == "__main__":
    main()
