"""Reward checking at the default setting: 2,000 mixed answers, 1% of them sympy-hard.

    python benchmarks/rewards.py [--n 2000] [--hard_frac 0.01] [--repeat 1]
                                 [--workers W] [--timeout_s T] [--budget_s B]

Scores one batch as a training step does by default (`default_workers()` children, MathVerifier's per-check
timeout, the scripts' --reward_time_budget_s): the wall time, the accuracy against the true one (the hard answers
are wrong by construction), the timeouts and the answers the budget left unchecked. Done right, the two accuracies
are equal. Run it on the machine you care about (the issue's: 2 cores).
"""

import argparse
import dataclasses
import inspect
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.rewards import accuracy_reward  # noqa: E402
from common.run_flags import RunFlags  # noqa: E402
from common.verifier import MathVerifier, default_workers  # noqa: E402

HARD = ["10^{10^{10^{10}}}", "2^{10^{10}}", "\\frac{10^{10^{9}}}{3^{10^{9}}}"]


def batch(n: int, hard_frac: float, seed: int = 0) -> tuple[list[str], list[str], list[bool]]:
    """(completions, gold answers, whether each is right): equal and unequal forms of numbers,
    fractions, roots, sets, intervals; a hard answer replaces the right one (so it is wrong)."""
    rng = random.Random(seed)
    texts, golds, right = [], [], []
    for i in range(n):
        a, b = rng.randint(1, 99), rng.randint(2, 99)
        kind = rng.choice(["int", "frac", "sqrt", "set", "interval", "wrong"])
        gold, pred = {
            "int": (str(a), f"{a}.0"),
            "frac": (f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}"),
            "sqrt": (f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}"),
            "set": (f"{a},{b}", f"{b},{a}"),
            "interval": (f"[{a},{a + b})", f"[{a}, {a + b})"),
            "wrong": (str(a), f"{a}+\\frac{{1}}{{{b}}}"),
        }[kind]
        ok = kind != "wrong"
        if rng.random() < hard_frac:
            pred, ok = HARD[i % len(HARD)], False
        texts.append(f"Some reasoning about step {i}. The answer is $\\boxed{{{pred}}}$.")
        golds.append(gold)
        right.append(ok)
    return texts, golds, right


def main() -> None:
    run_flags = {f.name: f.default for f in dataclasses.fields(RunFlags)}
    default_timeout = inspect.signature(MathVerifier).parameters["timeout_s"].default
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--hard_frac", type=float, default=0.01)
    p.add_argument("--workers", type=int, default=default_workers(), help="default: default_workers()")
    p.add_argument("--timeout_s", type=float, default=default_timeout, help="default: MathVerifier's")
    p.add_argument("--budget_s", type=float, default=run_flags["reward_time_budget_s"], help="default: the scripts'")
    p.add_argument("--repeat", type=int, default=1, help="score the batch this many times (a fresh verifier each)")
    a = p.parse_args()
    texts, golds, right = batch(a.n, a.hard_frac)
    true_acc = sum(right) / len(right)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n_hard = sum(h in t for t in texts for h in HARD)
    print(f"{a.n} answers, {n_hard} sympy-hard ({a.hard_frac:.0%}), {cores} cores")
    print(f"setting: {a.workers} children, {a.timeout_s:g} s per-check timeout, {a.budget_s:g} s budget\n")
    print("| run | wall s | accuracy | true | timeouts | unchecked | load avg before/after |")
    print("|---|---|---|---|---|---|---|")
    for r in range(a.repeat):
        with MathVerifier(timeout_s=a.timeout_s, workers=a.workers, budget_s=a.budget_s or None) as v:
            v._ensure_children()  # start-up (~1 s, once per run) is not what is measured
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            scores = accuracy_reward(texts, golds, v)
            wall = time.perf_counter() - t0
            timeouts = v.take_timeouts()
        unchecked = sum(s is None for s in scores)
        acc = sum(s or 0.0 for s in scores) / len(scores)
        print(
            f"| {r + 1} | {wall:.1f} | {acc:.3f} | {true_acc:.3f} | {timeouts} | {unchecked} "
            f"| {load:.1f} / {os.getloadavg()[0]:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
