"""Reward-checking throughput: 2,000 mixed answers, 1% of them sympy-hard.

    python benchmarks/rewards.py [--n 2000] [--hard_frac 0.01] [--timeout_s 5]

A step of a real run scores hundreds to thousands of completions. Most answers are
settled by the exact-match fast path or a quick math-verify call; a few (a tower
of powers, a huge expression) would make sympy grind until the per-check timeout.
This prints the wall time of scoring the same batch with one verifier child and
no step budget (how every step was scored before the pool), with a pool of
children, and with a pool plus the per-step budget the training scripts use.
"""

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.rewards import MathVerifier, accuracy_reward  # noqa: E402

HARD = ["10^{10^{10^{10}}}", "2^{10^{10}}", "\\frac{10^{10^{9}}}{3^{10^{9}}}"]


def batch(n: int, hard_frac: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """(completions, gold answers): equal and unequal forms of numbers, fractions, roots, sets, intervals."""
    rng = random.Random(seed)
    texts, golds = [], []
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
        if rng.random() < hard_frac:
            pred = HARD[i % len(HARD)]
        texts.append(f"Some reasoning about step {i}. The answer is $\\boxed{{{pred}}}$.")
        golds.append(gold)
    return texts, golds


def timed(verifier: MathVerifier, texts: list[str], golds: list[str]) -> tuple[float, float, int]:
    verifier.verify("1/2", "0.5")  # children up: start-up is not what is measured
    t0 = time.perf_counter()
    scores = accuracy_reward(texts, golds, verifier)
    return time.perf_counter() - t0, sum(scores) / len(scores), verifier.take_timeouts()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--hard_frac", type=float, default=0.01)
    p.add_argument("--timeout_s", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--budget_s", type=float, default=60.0, help="the scripts' default --reward_time_budget_s")
    a = p.parse_args()
    texts, golds = batch(a.n, a.hard_frac)
    configs = [
        ("1 child, no budget (before)", dict(workers=1)),
        (f"{a.workers} children, no budget", dict(workers=a.workers)),
        (f"{a.workers} children, {a.budget_s:g} s budget", dict(workers=a.workers, budget_s=a.budget_s)),
    ]
    print(f"{a.n} answers, {a.hard_frac:.0%} sympy-hard, {a.timeout_s:g} s per-check timeout\n")
    print("| verifier | wall s | accuracy | timeouts |\n|---|---|---|---|")
    for name, kw in configs:
        with MathVerifier(timeout_s=a.timeout_s, **kw) as v:
            wall, acc, timeouts = timed(v, texts, golds)
        print(f"| {name} | {wall:.1f} | {acc:.3f} | {timeouts} |", flush=True)


if __name__ == "__main__":
    main()
