"""Where a step's time goes on CPU: `grpo_base.py --model smollm2` on real_step.py's step (4 prompts x 8 completions
of <= 32 tokens, fp32, shared prompts, vLLM in this process) under torch.profiler. Each phase's self time by op over
steps 2.. (the first warms up), and the rate its matmuls ran at beside a 2,048-square matmul's. Run it alone.

    python benchmarks/profile_step.py                # profile (~3 min alone), store, write docs/SCALING.md's block
    python benchmarks/profile_step.py --render_only  # the block again from docs/bench/profile_step.json
"""

import argparse
import os
import runpy
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import stored_run  # noqa: E402

STORED = stored_run.BENCH / "profile_step.json"
BEGIN, END, FIND = stored_run.markers("profile_step", "benchmarks/profile_step.py", "docs/bench/profile_step.json")
PHASES = ("rollout", "old_logp", "update")
STEPS = 3  # the first warms up
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "_C::onednn_mm")  # with_flops counts the aten ones


def context(event) -> str:
    """Where an op ran, from its enclosing ranges: " (backward of X)", " (optimiser)", or "" (forward)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("autograd::engine::evaluate_function: "):
            return f" (backward of {parent.name.split(': ', 1)[1]})"
        if parent.name.startswith("Optimizer.step"):
            return " (optimiser)"
        parent = parent.cpu_parent
    return ""


def is_matmul(op: str) -> bool:
    """Is `op` (a name `phase_ops` keeps, its context after " (") a matmul?"""
    return op.split(" (")[0] in MATMULS


def phase_ops(events) -> dict:
    """{phase: {"s": seconds, "ops": {op: self seconds}, "matmul_gflop": ...}} over every range of a phase but its
    first. An op belongs to the range it runs inside (same thread); the range's own self time is Python between ops."""
    ranges = defaultdict(list)
    for e in events:
        if e.name in PHASES:
            ranges[e.name].append(e)
    out = {}
    for phase, found in ranges.items():
        spans = [
            (r.thread, r.time_range.start, r.time_range.end)
            for r in sorted(found, key=lambda r: r.time_range.start)[1:]
        ]
        ops, flops = defaultdict(float), 0.0
        for e in events:
            if any(t == e.thread and a <= e.time_range.start and e.time_range.end <= b for t, a, b in spans):
                name = "python between ops" if e.name == phase else f"{e.name}{context(e)}"
                ops[name] += e.self_cpu_time_total / 1e6
                flops += e.flops if e.name in MATMULS else 0
        out[phase] = {"s": sum(b - a for _, a, b in spans) / 1e6, "ops": dict(ops), "matmul_gflop": flops / 1e9}
    return out


def profile(steps: int) -> dict:
    """grpo_base.py in this process under the profiler; `phase_ops` of its events, per step."""
    import torch
    from torch.profiler import ProfilerActivity

    from benchmarks.real_step import matmul, parser, step_flags, write_data

    with tempfile.TemporaryDirectory() as tmp:
        write_data(Path(tmp) / "sums.jsonl")
        a = parser().parse_args(["--steps", str(steps)])
        sys.argv = ["grpo_base.py", *step_flags(a, Path(tmp) / "sums.jsonl", "vllm@fp32", Path(tmp) / "run")]
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        with torch.profiler.profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
            runpy.run_path(str(ROOT / "grpo_base.py"), run_name="__main__")
    phases = phase_ops(prof.events())
    for p in phases.values():
        p["s"] /= steps - 1
        p["ops"] = {k: v / (steps - 1) for k, v in p["ops"].items()}
        p["matmul_gflop"] /= steps - 1
    return {"steps": steps, "phases": phases, "matmul": matmul()}


def render(result: dict, top: int = 5) -> str:
    """docs/SCALING.md's block: each phase's top ops by self time, and its matmuls' rate against the 2,048-square one."""
    rate = result["matmul"]["fp32_gflops"]
    L = [
        f"Stored in `docs/bench/profile_step.json`: {stored_run.conditions(result)}. Seconds a step, the mean of steps "
        f"2-{result['steps']}, under the profiler (which slows small ops); a 2,048-square fp32 matmul ran at "
        f"{rate:.0f} GFLOP/s:",
        "",
        "| phase | s | matmuls: s (share), GFLOP/s (of the 2,048² rate) | the rest, largest first: op s |",
        "|---|---|---|---|",
    ]
    for phase in PHASES:
        p = result["phases"][phase]
        mm = sum(v for k, v in p["ops"].items() if is_matmul(k))
        rest = sorted(((v, k) for k, v in p["ops"].items() if not is_matmul(k)), reverse=True)[:top]
        rest_text = ", ".join(f"{k.removeprefix('aten::')} {v:.2f}" for v, k in rest)
        achieved = p["matmul_gflop"] / mm if p["matmul_gflop"] else 0.0  # vLLM's onednn_mm counts no FLOPs
        speed = f"{achieved:.0f} ({achieved / rate:.0%})" if achieved else "not counted"
        L.append(f"| {phase} | {p['s']:.2f} | {mm:.2f} ({mm / p['s']:.0%}), {speed} | {rest_text} |")
    return "\n".join(L)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render_only", action="store_true")
    a = parser.parse_args()
    if a.render_only:
        result = stored_run.load(STORED)
    else:
        result = stored_run.start("python benchmarks/profile_step.py " + " ".join(sys.argv[1:]))
        result = stored_run.finish(result | profile(STEPS), STORED)
    block = render(result)
    print(block)
    stored_run.write_between(ROOT / "docs" / "SCALING.md", BEGIN, END, block, "profile_step", FIND)


if __name__ == "__main__":
    main()
