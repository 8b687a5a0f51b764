"""Synthetic arithmetic, a task that needs no download (the CPU demo, the learning tests): the 100 single-digit sums.

The demo trains and evaluates on the same 100 problems: it shows RL raising a policy's accuracy, not generalisation
(`data.prepare synthetic` draws larger sets with them held out)."""

import operator
import random
from collections.abc import Callable, Iterable
from pathlib import Path

SYNTHETIC_NAME = "synthetic-arith"
# Single-digit sums: 100 problems, few enough that a ~1M-parameter model learns them in a minute of SFT.
SYNTHETIC_MAX_OPERAND = 9
SYNTHETIC_EVAL_SEED = 20250
SYNTHETIC_EVAL_SIZE = (SYNTHETIC_MAX_OPERAND + 1) ** 2
SYNTHETIC_TRAIN_SEED = 0
SYNTHETIC_TRAIN_SIZE = (SYNTHETIC_MAX_OPERAND + 1) ** 2
SYNTHETIC_EVAL_PATH = Path(__file__).resolve().parent.parent / "data" / "synthetic_arith_eval.jsonl"

_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def synthetic_arithmetic(
    n: int, seed: int, max_operand: int = 99, ops: str = "+", exclude: Iterable[str] = ()
) -> list[dict]:
    """`n` distinct problems "What is a <op> b?", a and b in [0, max_operand], each op of `ops` ("+-*") equally
    likely, deterministic given the arguments. "-" never goes negative (one less thing for a tiny model to learn);
    texts in `exclude` are never drawn (training sets exclude the evaluation set)."""
    if not ops or any(op not in _OPS for op in ops):
        raise ValueError(f"ops must be a non-empty string of {sorted(_OPS)}, got {ops!r}")
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    ops = "".join(dict.fromkeys(ops))  # "++-" -> "+-": duplicates would skew the op mix
    m = max_operand + 1
    space = sum(m * (m + 1) // 2 if op == "-" else m * m for op in ops)
    excluded = set(exclude)
    if n > space - len(excluded):  # conservative: some excluded texts may lie outside the space
        raise ValueError(
            f"asked for {n} distinct problems but only {space} exist "
            f"(ops={ops!r}, max_operand={max_operand}, {len(excluded)} excluded)"
        )
    rng = random.Random(seed)
    rows, seen = [], set(excluded)
    while len(rows) < n:
        op = rng.choice(ops)
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if op == "-" and a < b:
            a, b = b, a
        problem = f"What is {a} {op} {b}?"
        if problem in seen:
            continue
        seen.add(problem)
        c = _OPS[op](a, b)
        # The solution is short on purpose: a tiny model is SFT'd on it before RL.
        rows.append(
            {"problem": problem, "answer": str(c), "solution": f"{a} {op} {b} = {c}. The answer is \\boxed{{{c}}}."}
        )
    return rows


def synthetic_eval_set() -> list[dict]:
    """The fixed evaluation set shipped as data/synthetic_arith_eval.jsonl."""
    return synthetic_arithmetic(SYNTHETIC_EVAL_SIZE, seed=SYNTHETIC_EVAL_SEED, max_operand=SYNTHETIC_MAX_OPERAND)
