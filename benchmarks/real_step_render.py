"""benchmarks/real_step.py's stored runs as docs/SCALING.md's tables, and its memory breakdown (one process, a
step's parts added one at a time). Everything printed is read from the stored run: nothing is typed by hand."""

from pathlib import Path

from benchmarks import stored_run

PHASES = ["rollout_s", "scoring_s", "old_logp_s", "update_s", "sync_s", "step_s"]


def label(config: str) -> str:
    engine, _, precision = config.partition("@")
    return f"ours ({engine}, {precision})"


def phase_table(result: dict) -> list[str]:
    L = ["| run | rollout | scoring | old_logp | update | sync | step | peak RSS GB |", "|---" * 8 + "|"]
    for config, r in result["ours"].items():
        L.append(f"| {label(config)} | " + " | ".join(f"{r[k]:.1f}" for k in PHASES) + f" | {r['peak_mem_gb']:.1f} |")
    if "step_s" in (b := result["bare"]):
        L.append(f"| bare: HF generate + 1 fwd/bwd | {b['generate_s']:.1f} | - | - | {b['forward_backward_s']:.1f} | - "
                 f"| {b['step_s']:.1f} | - |")  # fmt: skip
    if "step_s" in (t := result["trl"]):
        L.append(f"| TRL {t['version']} GRPOTrainer (HF generation) | - | - | - | - | - | {t['step_s']:.1f} | - |")
    return L


def ratio_lines(result: dict) -> list[str]:
    b, t, args = result["bare"], result["trl"], result["args"]
    L = []
    for config, r in result["ours"].items():
        line = f"- {label(config)}: {args['prompts'] * args['group']} completions, {r['tokens']:.0f} completion tokens a step"
        if "step_s" in b:
            passes = (r["old_logp_s"] + r["update_s"]) / b["forward_backward_s"]
            line += f"; {r['step_s'] / b['step_s']:.2f}x bare (rollout {r['rollout_s'] / b['generate_s']:.2f}x"
            line += f" generate, old_logp + update {passes:.2f}x fwd/bwd)"
        if "step_s" in t:
            line += f"; {r['step_s'] / t['step_s']:.2f}x TRL"
        L.append(line)
    if "step_s" in t:
        steps = ", ".join(f"{s:.1f}" for s in t["steps"])
        L.append(f"- TRL: steps {steps} s" + (f"; {t['step_s'] / b['step_s']:.2f}x bare" if "step_s" in b else ""))
    for part in ("bare", "trl"):
        if "skipped" in result[part]:
            L.append(f"- {part}: skipped, {result[part]['skipped']}")
    return L


def precision_table(result: dict) -> list[str]:
    """Each precision of the vLLM engine with shared prompts: pi_old scoring + update, against fp32's, and the gap."""
    runs = {c.partition("@")[2]: r for c, r in result["ours"].items() if c.startswith("vllm@")}
    if "fp32" not in runs:
        return []
    base = runs["fp32"]["old_logp_s"] + runs["fp32"]["update_s"]
    steps = list(next(iter(runs.values()))["gap"])
    L = [
        "| --precision | pi_old scoring + update, s | x fp32's speed | step, s | "
        + " | ".join(f"gap at {s}: mean / p99" for s in steps)
        + " | peak RSS GB |",
        "|---" * (5 + len(steps)) + "|",
    ]
    for precision, r in runs.items():
        passes = r["old_logp_s"] + r["update_s"]
        gaps = " | ".join(f"{r['gap'][s]['mean']:.1e} / {r['gap'][s]['p99']:.1e}" for s in steps)
        L.append(
            f"| {precision} | {passes:.1f} | {base / passes:.2f} | {r['step_s']:.1f} | {gaps} | {r['peak_mem_gb']:.1f} |"
        )
    return L


def floor_flops(body: float, head: float, prompts: float, prompt_tokens: float, shared: float, samples: float,
                tokens: float, trained: float = 1.0) -> dict:  # fmt: skip
    """FLOPs each phase must compute (2 a weight a token forward, 6 forward and backward), attention left out (a few
    percent at these lengths). Sampling: each prompt's prefill once (the prefix all prompts share, once), a forward
    of the body a sampled token after each completion's first (which the prefill's last position gives), the head
    a sampled token. Scoring (pi_old) and the update: the prompt once per group (the shared-prompt layout) and each
    completion token, the head on completion tokens only. The update trains only the rows with a non-zero
    advantage (`train/skipped_rows` counts the rest): its floor is their share `trained` of the rows."""
    prefill = prompt_tokens - (prompts - 1) * shared
    sampling = 2 * body * (prefill + tokens - samples) + 2 * head * tokens
    forward = 2 * body * (prompt_tokens + tokens) + 2 * head * tokens
    return {"rollout_s": sampling, "old_logp_s": forward, "update_s": 3 * forward * trained}


def best_rate(result: dict, precision: str) -> float:
    """FLOP/s of the matmul in `precision`, the faster of the run's start and end."""
    return max(result[k][f"{precision}_gflops"] for k in ("matmul", "matmul_end") if k in result) * 1e9


def run_floors(result: dict, config: str) -> dict:
    """A run's floor, seconds a phase (and the step: rollout, pi_old and update), at its precision's matmul rate."""
    r, args, m, p = result["ours"][config], result["args"], result["model"], result["prompt_len"]
    prompts = args["prompts"]
    flops = floor_flops(m["body"], m["head"], prompts, prompts * p["mean"], p["shared"], prompts * args["group"],
                        r["tokens"], r.get("trained", 1.0))  # fmt: skip
    rate = best_rate(result, "bf16" if config.endswith("bf16-mixed") else "fp32")
    floors = {k: f / rate for k, f in flops.items()}
    return floors | {"step_s": sum(floors.values())}


def floor_table(result: dict) -> list[str]:
    """Each run's phases as measured / floor."""
    keys = ["rollout_s", "old_logp_s", "update_s", "step_s"]
    L = ["| run | rollout | old_logp | update | step (floor s) |", "|---" * 5 + "|"]
    for config, r in result["ours"].items():
        floors = run_floors(result, config)
        cells = [f"{r[k] / floors[k]:.2f}x" for k in keys]
        L.append(f"| {label(config)} | " + " | ".join(cells[:-1]) + f" | {cells[-1]} ({floors['step_s']:.1f}) |")
    return L


def eval_lines(result: dict) -> list[str]:
    """The evaluation here and at earlier commits: seconds, the floor, and this tree's share of each commit's time."""
    if "evaluation" not in result:
        return []
    m, rate = result["model"], best_rate(result, "fp32")
    L = ["| evaluation at | eval s | sampled tokens | floor s | / floor | pass@1 |", "|---" * 6 + "|"]
    for name, e in result["evaluation"].items():
        flops = floor_flops(m["body"], m["head"], e["prompts"], e["prompt_tokens"], e["shared_prefix"],
                            e["completions"], e["tokens"])["rollout_s"]  # fmt: skip
        L.append(f"| {name} | {e['eval_s']:.1f} | {e['tokens']:,} | {flops / rate:.1f} | "
                 f"{e['eval_s'] * rate / flops:.2f}x | {e['pass@1']:.3f} |")  # fmt: skip
    here = result["evaluation"]["this tree"]["eval_s"]
    for name, e in result["evaluation"].items():
        if name != "this tree":
            L += ["", f"This tree's evaluation takes {100 * here / e['eval_s']:.0f}% of {name}'s time."]
    return L


def render(result: dict) -> str:
    mm, args, end = result["matmul"], result["args"], result.get("matmul_end")
    at_end = f", {end['fp32_gflops']:.0f} and {end['bf16_gflops']:.0f} at the end" if end else ""
    L = [
        f"Stored in `docs/bench/real_step.json`: {stored_run.conditions(result, units=True)}. "
        f"{args['prompts']} prompts x {args['group']} "
        f"completions of <= {args['max_completion_len']} tokens, micro-batch {args['micro_batch_size']}, the mean of "
        f"steps 2-{args['steps']} (the first warms up), seconds:",
        "",
        *phase_table(result),
        "",
        *ratio_lines(result),
        "",
        f"The GPU's mode against fp32 on this CPU (`--rollout vllm`, shared prompts; the gap is |log p_trainer - "
        f"log p_vLLM| per sampled token, nats, after step 1's first sync of weights and at the last step). A "
        f"{mm['n']:,}² matmul alone ran at {mm['fp32_gflops']:.0f} GFLOP/s in fp32 and {mm['bf16_gflops']:.0f} in bf16 "
        f"({mm['bf16_gflops'] / mm['fp32_gflops']:.2f}x) at the start{at_end}:",
        "",
        *precision_table(result),
        "",
        f"Each phase against its floor, the FLOPs it must compute over that matmul rate (the precision's, the faster; "
        f"`floor_flops` in benchmarks/real_step_render.py says what is counted; SmolLM2: "
        f"{result['model']['body'] / 1e6:.0f}M weights in the body, {result['model']['head'] / 1e6:.0f}M in the head; "
        f"the training prompts {result['prompt_len']['mean']:.0f} tokens, {result['prompt_len']['shared']} shared by all):",
        "",
        *floor_table(result),
        "",
        *eval_lines(result),
    ]
    return "\n".join(L)


def step_memory(a, data: Path, prompts_and_model) -> dict:
    """Resident memory of one process as a step's parts arrive, in the order they grow: the policy, its gradients
    and AdamW state, vLLM's engine (its own weights and KV cache), the rollout, pi_old scoring, the update."""
    import resource

    import psutil
    import torch

    from common.batching import micro_batches, pack, select
    from common.logprobs import sequence_logprobs
    from common.rollout import make_engine

    rss = lambda: psutil.Process().memory_info().rss / 2**30  # noqa: E731
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # noqa: E731
    parts, last = [], [rss()]

    def mark(what):
        now = rss()
        parts.append({"part": what, "added": now - last[0], "rss": now, "peak": peak()})
        last[0] = now

    head = stored_run.start("python benchmarks/real_step.py --memory")
    mark("python, torch, transformers imported")
    path, tok, rows, model = prompts_and_model(a, data)
    mark("policy weights (fp32)")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    mark("gradients + AdamW moments")
    max_len = max(len(r["prompt_ids"]) for r in rows) + a.max_completion_len
    engine = make_engine("vllm", path, tok, max_model_len=max_len, max_num_seqs=a.prompts * a.group)
    kv_gib = engine.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes / 2**30
    mark(f"vLLM engine: its weights + KV cache ({kv_gib:.2f} GiB)")
    groups = engine.generate([r["prompt_ids"] for r in rows], a.group, a.max_completion_len, 1.0, seed=0)
    mark("rollout")
    prompts = [r["prompt_ids"] for r in rows for _ in range(a.group)]
    batch = pack(prompts, [c for g in groups for c in g], tok.pad_token_id)
    lens = batch["prompt_mask"].sum(1).long().tolist(), batch["completion_mask"].sum(1).long().tolist()
    plan = micro_batches(*lens, list(range(len(prompts))), a.micro_batch_size)
    with torch.no_grad():
        for idx in plan:
            mb = select(batch, idx)
            sequence_logprobs(model, mb["input_ids"], mb["attention_mask"], 1.0, mb["completion_mask"].shape[1], True)
    mark(f"pi_old scoring (micro-batch {a.micro_batch_size})")
    model.train()
    for idx in plan:
        mb = select(batch, idx)
        logp, _ = sequence_logprobs(model, mb["input_ids"], mb["attention_mask"], 1.0, mb["completion_mask"].shape[1])
        (logp * mb["completion_mask"]).sum().backward()
    mark(f"update forward/backward (micro-batch {a.micro_batch_size})")
    engine.close()
    shape = f"{len(prompts)} sequences x {batch['input_ids'].shape[1]} padded tokens, {int(batch['completion_mask'].sum())} completion tokens"
    return {**head, "shape": shape, "parts": parts}


def memory_block(result: dict) -> str:
    L = [
        f"Stored in `docs/bench/real_step_memory.json`: {stored_run.conditions(result, units=True)}; the padded layout, {result['shape']}; "
        "GiB:",
        "",
        "| part | RSS added | RSS after | peak RSS so far |",
        "|---|---|---|---|",
    ]
    L += [f"| {p['part']} | {p['added']:+.2f} | {p['rss']:.2f} | {p['peak']:.2f} |" for p in result["parts"]]
    return "\n".join(L)
