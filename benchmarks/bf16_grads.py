"""How exact is a bf16 GRPO step's gradient, engine by engine? Measured against fp64, on CPU.

    python benchmarks/bf16_grads.py [--engines ddp,fsdp2,zero2,zero3] [--seeds 0,1,2]   # stored, SCALING.md written
    python benchmarks/bf16_grads.py --render_only     # docs/SCALING.md's block again from the stored run

One update step (the clipped surrogate at ratio 1, token-mean) on a small tied-embedding Qwen2, its gradient's
relative error |g - g64| / |g64| for the output layer / embedding and for the body: one process (unchunked, the
chunked head before and now) and DDP, FSDP2, ZeRO-2/3 on 2 gloo processes under the shipped accelerate configs.
The setup and its reading: docs/SCALING.md, above the block written from docs/bench/bf16_grads.json.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import common.trainer as trainer_utils  # noqa: E402
from benchmarks import stored_run  # noqa: E402
from common.logprobs import _chunked, _logp_and_entropy, sequence_logprobs  # noqa: E402
from common.trainer import end_run, make_accelerator, micro_batch, parallel_mode  # noqa: E402

VOCAB, CHUNK, PROMPT, COMPLETION, ROWS, MICRO, WORLD = 4096, 3, 8, 248, 2, 8, 2
TIED = "model.embed_tokens.weight"
ENGINES = {"ddp": "ddp_8gpu.yaml", "fsdp2": "fsdp2.yaml", "zero2": "zero2.yaml", "zero3": "zero3.yaml"}
RESULT = "BF16_GRADS "
STORED = stored_run.BENCH / "bf16_grads.json"
DOC = ROOT / "docs" / "SCALING.md"
BEGIN, END, FIND = stored_run.markers("bf16 grads", "benchmarks/bf16_grads.py", "docs/bench/bf16_grads.json")
hf_logging.disable_progress_bar()


def build_model(path: Path) -> None:
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())  # representable in bf16: bf16 engines start from these very weights
    model.save_pretrained(path)


def micro_batches(seed: int) -> list[dict]:
    """MICRO micro-batches of ROWS sequences: ids, attention mask, completion mask, advantages."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(MICRO):
        ids = torch.randint(3, VOCAB, (ROWS, PROMPT + COMPLETION), generator=g)
        lengths = torch.randint(COMPLETION // 2, COMPLETION + 1, (ROWS,), generator=g)
        mask = (torch.arange(COMPLETION)[None] < lengths[:, None]).float()
        out.append({"ids": ids, "attn": torch.ones_like(ids), "mask": mask, "adv": torch.randn(ROWS, generator=g)})
    return out


def surrogate(logp: torch.Tensor, mb: dict, denominator: float) -> torch.Tensor:
    """GRPO's clipped surrogate at ratio 1 (old = current log-probs), token-mean: its gradient is -A dlogp."""
    ratio = torch.exp(logp - logp.detach())
    return -(mb["adv"][:, None] * ratio * mb["mask"]).sum() / denominator


def unchunked_logp(model, mb) -> torch.Tensor:
    """The textbook pass: the model's full [B, L, V] logits, an fp32 log-softmax."""
    logits = model(input_ids=mb["ids"], attention_mask=mb["attn"]).logits[:, -COMPLETION - 1 : -1]
    return torch.log_softmax(logits.double() if logits.dtype == torch.float64 else logits.float(), -1).gather(
        -1, mb["ids"][:, -COMPLETION:, None]
    )[..., 0]


def chunked_before_logp(model, mb) -> torch.Tensor:
    """The chunked head as it was: each checkpointed chunk's F.linear with the bf16 weight copy, whose
    gradients autograd summed in bf16."""
    hidden = model.model(input_ids=mb["ids"], attention_mask=mb["attn"]).last_hidden_state[:, -COMPLETION - 1 : -1]
    weight = model.lm_head.weight.to(torch.get_autocast_dtype("cpu"))
    rows = hidden.reshape(-1, hidden.shape[-1])
    out = _chunked(lambda h, t: _logp_and_entropy(F.linear(h, weight), t, 1.0, False), rows,
                   mb["ids"][:, -COMPLETION:].reshape(-1), CHUNK)  # fmt: skip
    return out[:, 0].view(ROWS, COMPLETION)


def chunked_logp(model, mb) -> torch.Tensor:
    return sequence_logprobs(model, mb["ids"], mb["attn"], 1.0, logits_to_keep=COMPLETION, chunk_rows=CHUNK)[0]


def one_process_grads(model_dir: Path, seed: int, dtype, autocast: bool, logp_fn) -> dict:
    """The step's gradient in one process: each micro-batch's gradient summed in fp32 (fp64 for fp64)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    batches = micro_batches(seed)
    tokens = sum(mb["mask"].sum().item() for mb in batches)
    total = {
        n: torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32)) for n, p in model.named_parameters()
    }
    for mb in batches:
        mb = {k: v.to(dtype) if v.is_floating_point() else v for k, v in mb.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = surrogate(logp_fn(model, mb), mb, tokens)
        loss.backward()
        for n, p in model.named_parameters():
            total[n] += p.grad
            p.grad = None
    return {n: g.double() for n, g in total.items()}


def errors(grads: dict, reference: dict) -> dict:
    def rel(names):
        num = sum((grads[n].double() - reference[n]).square().sum() for n in names)
        return (num / sum(reference[n].square().sum() for n in names)).sqrt().item()

    body = [n for n in reference if n != TIED]
    return {"head": rel([TIED]), "body": rel(body)}


def worker(out: Path, seed: int, zero_defaults: bool) -> None:
    """One rank's part of the step under the engine accelerate was launched with; rank 0 writes the gradient."""
    if zero_defaults:  # DeepSpeed's own bf16 dtypes, as before
        trainer_utils.ZERO_BF16_GRADIENTS = {}
    accelerator = make_accelerator("bf16", None, ROWS)
    mode = parallel_mode(accelerator)
    facts = {"mode": mode.kind, "world": accelerator.num_processes, "mixed_precision": accelerator.mixed_precision}
    if mode.kind.startswith("zero"):  # the settings handed to DeepSpeed
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        facts["settings"] = {k: ds_config.get(k) for k in ("data_types", "communication_data_type")}
    elif mode.kind == "fsdp2":  # ... and to FSDP2
        policy = accelerator.state.fsdp_plugin.mixed_precision_policy
        facts["settings"] = {"param_dtype": str(policy.param_dtype), "reduce_dtype": str(policy.reduce_dtype)}
    try:
        model = AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
        model, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    except Exception as e:  # noqa: BLE001 - reported, beside the settings the engine was handed
        facts["error"] = f"{type(e).__name__}: {e}"[:300]
        print(RESULT + json.dumps(facts), flush=True)
        return
    rank, world = accelerator.process_index, accelerator.num_processes
    if mode.kind.startswith("zero"):  # what the engine made of them
        facts |= {
            "grad_accum_dtype": str(model.get_data_types()[1]),
            "communication_data_type": str(model.communication_data_type),
        }
    batches = micro_batches(seed)
    tokens = sum(mb["mask"].sum().item() for mb in batches)
    mine = batches[rank * MICRO // world : (rank + 1) * MICRO // world]
    for i, mb in enumerate(mine):
        last = i == len(mine) - 1
        with micro_batch(accelerator, model, mode, last):
            loss = surrogate(chunked_logp(model, mb), mb, tokens / world)  # global denominator, as the scripts
            if mode.kind.startswith("zero"):  # accelerate's DeepSpeed backward, without the step it then takes
                model.set_gradient_accumulation_boundary(is_boundary=last)
                model.backward(loss)
            else:
                accelerator.backward(loss)
    if mode.kind == "fsdp2":
        policy = accelerator.state.fsdp_plugin.mixed_precision_policy
        facts |= {"param_dtype": str(policy.param_dtype), "grad_accum_dtype": "float32",
                  "communication_data_type": str(policy.reduce_dtype)}  # fmt: skip
    elif mode.kind == "ddp":  # autocast over the parameters; DDP reduces the gradient buckets as they are
        p = next(accelerator.unwrap_model(model).parameters())
        facts |= {"param_dtype": f"{p.dtype} + autocast", "grad_accum_dtype": str(p.grad.dtype),
                  "communication_data_type": str(p.grad.dtype)}  # fmt: skip
    else:
        facts["param_dtype"] = str(next(accelerator.unwrap_model(model).parameters()).dtype)
    grads = {}
    for name, p in accelerator.unwrap_model(model).named_parameters():
        if mode.kind.startswith("zero"):
            from deepspeed.utils import safe_get_full_grad

            g = safe_get_full_grad(p)  # a collective under ZeRO-3: every rank, every parameter
        else:
            g = p.grad.full_tensor() if type(p.grad).__name__ == "DTensor" else p.grad
        grads[name] = g.detach().double().clone()
    if rank == 0:
        torch.save(grads, out / "grads.pt")
        print(RESULT + json.dumps(facts), flush=True)
    end_run(accelerator)


def run_engine(engine: str, model_dir: Path, seed: int, zero_defaults: bool = False, timeout: float = 300) -> dict:
    """Launch the worker on WORLD gloo processes under `engine`'s shipped config: facts + gradient (or error)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from engines.launch import CONFIGS, launch

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "model").symlink_to(model_dir.resolve())
        args = ["--worker", str(out), "--seeds", str(seed)] + (["--zero_defaults"] if zero_defaults else [])
        rc, log = launch(CONFIGS / ENGINES[engine], Path(__file__), *args, num_processes=WORLD, timeout=timeout)
        lines = [json.loads(line[len(RESULT) :]) for line in log.splitlines() if line.startswith(RESULT)]
        facts = lines[0] if lines else {"error": f"exit code {rc}: " + log[-1500:]}
        if rc == 0 and (out / "grads.pt").exists():
            facts["grads"] = torch.load(out / "grads.pt")
        elif "error" not in facts:
            facts["error"] = f"exit code {rc}: " + log[-1500:]
    return facts


def measure(engines: list[str], seeds: list[int], model_dir: Path, before: bool = True) -> list[dict]:
    """The table's rows; `before`: also the old chunked head and DeepSpeed's own bf16 dtypes."""
    rows = []
    refs = {s: one_process_grads(model_dir, s, torch.float64, False, unchunked_logp) for s in seeds}

    def add(name, processes, per_seed, facts=None):
        errs = [errors(g, refs[s]) for s, g in per_seed.items()]
        row = {"config": name, "processes": processes, "seeds": len(errs), **(facts or {})}
        for part in ("head", "body"):
            values = [e[part] for e in errs]
            row[part] = statistics.mean(values)
            row[part + "_range"] = [min(values), max(values)]
            row[part + "_seeds"] = values  # in the order of `seeds`
        rows.append(row)
        print(f"  {name}: head {row['head']:.3%}  body {row['body']:.3%}", file=sys.stderr, flush=True)

    one = [
        ("fp32, chunked head", torch.float32, False, chunked_logp),
        ("bf16 autocast, unchunked (yardstick)", torch.float32, True, unchunked_logp),
        ("bf16 weights, unchunked (yardstick)", torch.bfloat16, False, unchunked_logp),
        ("bf16 autocast, chunked, bf16 sum (before)", torch.float32, True, chunked_before_logp),
        ("bf16 autocast, chunked, fp32 sum (now)", torch.float32, True, chunked_logp),
    ]
    for name, dtype, autocast, fn in one:
        if "(before)" in name and not before:
            continue
        add(name, 1, {s: one_process_grads(model_dir, s, dtype, autocast, fn) for s in seeds})
    for engine in engines:
        variants = [(False, "")] + (
            [(True, ", DeepSpeed's bf16 dtypes (before)")] if engine[:4] == "zero" and before else []
        )
        for zero_defaults, suffix in variants:
            facts = run_engine(engine, model_dir, seeds[0], zero_defaults)
            grads = facts.pop("grads", None)
            name = f"{engine}{suffix}"
            if grads is None:
                rows.append({"config": name, "processes": WORLD, "error": facts.get("error", "no gradient"), **facts})
                print(f"  {name}: cannot run bf16 here: {rows[-1]['error'][:200]}", file=sys.stderr, flush=True)
                continue
            add(name, WORLD, {seeds[0]: grads}, facts)
    return rows


def dtypes(row: dict) -> str:
    """What the engine computed and summed in (its own report), blank for the one-process rows."""
    short = lambda t: (t or "").replace("torch.", "").replace("float32", "fp32").replace("bfloat16", "bf16")  # noqa: E731
    parts = [short(row.get(k)) for k in ("param_dtype", "grad_accum_dtype", "communication_data_type")]
    return ", ".join(p for p in parts if p)


def table(rows: list[dict]) -> str:
    lines = [
        "| configuration | processes | output layer / embedding | body | weights, gradient sum, reduction |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['config']} | {r['processes']} | cannot run bf16 here: {r['error'][:80]} | | {dtypes(r)} |"
            )
            continue
        cells = []
        for part in ("head", "body"):
            lo, hi = r[part + "_range"]
            cells.append(f"{r[part]:.3%}" + (f" [{lo:.3%}, {hi:.3%}]" if r["seeds"] > 1 else ""))
        lines.append(f"| {r['config']} | {r['processes']} | {cells[0]} | {cells[1]} | {dtypes(r)} |")
    return "\n".join(lines)


def render(record: dict) -> str:
    """docs/SCALING.md's block: where the run was made, the yardsticks at the engines' seed, and the table."""
    rows = {r["config"]: r for r in record["rows"]}
    seeds = record["seeds"]

    def at_first_seed(config: str) -> str:
        r = rows[config]
        return f"{r['head_seeds'][0]:.3%} / {r['body_seeds'][0]:.3%}"

    return "\n".join(
        [
            f"Stored in `docs/bench/bf16_grads.json`: {stored_run.conditions(record)}. One process: mean [min, max] "
            f"over data seeds {', '.join(map(str, seeds))}; engines: seed {seeds[0]} (the yardsticks at seed "
            f"{seeds[0]}: {at_first_seed('bf16 autocast, unchunked (yardstick)')} with autocast, "
            f"{at_first_seed('bf16 weights, unchunked (yardstick)')} with bf16 weights):",
            "",
            table(record["rows"]),
        ]
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of " + ", ".join(ENGINES))
    ap.add_argument("--seeds", default="0,1,2", help="data seeds (engines run the first)")
    ap.add_argument("--json", default="", help="also write the rows here")
    ap.add_argument("--out", default=str(STORED), help="where the run is stored ('' for nowhere)")
    ap.add_argument("--doc", default=str(DOC), help="the page whose block is written ('' for none)")
    ap.add_argument("--render_only", action="store_true", help="write the page's block from the stored run")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)  # a rank under accelerate launch
    ap.add_argument("--zero_defaults", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.worker:
        return worker(Path(a.worker), seeds[0], a.zero_defaults)
    if a.render_only:
        return write_doc(stored_run.load(Path(a.out)), a.doc)
    engines = [e for e in a.engines.split(",") if e]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        raise SystemExit(f"error: --engines: unknown {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    record = stored_run.start(" ".join(["python benchmarks/bf16_grads.py", *sys.argv[1:]]), torch.get_num_threads())
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir)
        rows = measure(engines, seeds, model_dir)
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if a.out:
        record |= {"seeds": seeds, "engines": engines, "rows": rows}
        write_doc(stored_run.finish(record, Path(a.out)), a.doc)


def write_doc(record: dict, doc: str) -> None:
    if doc:
        stored_run.write_between(Path(doc), BEGIN, END, render(record), "bf16-gradient", FIND)
        print(f"wrote {doc}'s bf16 gradient table")


if __name__ == "__main__":
    main()
