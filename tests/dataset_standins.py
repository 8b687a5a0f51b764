"""Local stand-ins of each paper's dataset in its real schema, for tests/test_math_data.py and
tests/test_data_prepare.py: rows, files in either format (`save`; the `fmt` fixture in conftest.py gives both),
and `python -m data.prepare` run in process."""

import random

import pyarrow as pa
import pyarrow.parquet as pq

from common.cli import parse_args
from common.math_data import DAPO_PREFIX, DAPO_SUFFIX
from common.run_dir import write_jsonl
from data import prepare


def run_prepare(argv):
    """`python -m data.prepare ARGV` in process."""
    prepare.main(parse_args(prepare.Args, argv=argv))


def write_parquet(rows, path):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_jsonl_file(rows, path):
    write_jsonl(rows, path)
    return str(path)


def deepscaler_rows():
    # DeepScaleR: problem / answer / solution; many solutions are empty or unboxed.
    return [
        {"problem": "Compute 1+1.", "answer": "2", "solution": "We add: $1+1=\\boxed{2}$."},
        {"problem": "Find x if 2x=6.", "answer": "3", "solution": ""},
        {"problem": "What is 2^3?", "answer": "8", "solution": "2^3 = 8, so the answer is 8."},
        {
            "problem": "Simplify \\frac{4}{6}.",
            "answer": "\\frac{2}{3}",
            "solution": "Divide by 2: \\boxed{\\frac{2}{3}}",
        },
    ] + [
        {"problem": f"Compute {i}+{i}.", "answer": str(2 * i), "solution": f"Twice {i} is \\boxed{{{2 * i}}}."}
        for i in range(2, 40)
    ]


def dapo_row(problem, answer, index):
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": f"{DAPO_PREFIX}\n\n{problem}\n\n{DAPO_SUFFIX}", "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": str(index)},
    }


def dapo_rows():
    # DAPO-Math-17k repeats every problem many times.
    rows = []
    for _ in range(3):
        rows.append(dapo_row("Let $x$ satisfy $x+1=3$. Find $x$.", "2", len(rows)))
        rows.append(dapo_row("How many primes are below 10?", "4", len(rows)))
    rows.append(dapo_row("Find the sum of {1, 2, 3}.", "6", len(rows)))
    return rows


def openr1_row(problem, answer, verdicts=(True, True), solution=None, llama=None):
    """A row of OpenR1-Math-220k in its own columns: R1 generations with math-verify's (and, for some
    rows, a Llama judge's) verdict on each, and their count; a generation judged right boxes the answer."""
    return {
        "problem": problem,
        "solution": f"Hence $\\boxed{{{answer}}}$." if solution is None else solution,
        "answer": answer,
        "problem_type": "Algebra",
        "question_type": "math-word-problem",
        "source": "olympiads",
        "uuid": "u",
        "is_reasoning_complete": [True] * len(verdicts),
        "generations": [f"<think>...</think> so \\boxed{{{answer if v else 'wrong'}}}" for v in verdicts],
        "correctness_math_verify": list(verdicts),
        "correctness_llama": llama,
        "finish_reasons": ["stop"] * len(verdicts),
        "correctness_count": sum(map(bool, verdicts)) if llama is None else sum(map(bool, llama)),
        "messages": [{"role": "user", "content": problem}, {"role": "assistant", "content": "y"}],
    }


def distinct_problem(i, words=8):
    """Problem i: a sentence that shares few words with any other (no near-duplicates)."""
    rng = random.Random(i)
    return f"Problem {i}: " + " ".join(f"w{rng.randrange(10_000)}" for _ in range(words)) + " solve it."


def openr1_rows():
    answers = [
        "5",
        "2, 3",
        "x=1 \\text{ or } x=2",
        "",
        "(1, 2)",
        "1,000",
        "\\boxed{1}\\boxed{2}",
        "proof",
        "[0, 1)",
        "a=1; b=2",
        "\\frac{1}{2}",
    ]
    rows = [openr1_row(distinct_problem(i), a) for i, a in enumerate(answers)]
    rows.append(openr1_row(rows[0]["problem"].replace(" ", "  "), "5", solution="dup"))  # duplicate
    rows.append(openr1_row("long " * 80 + "problem", "7"))
    return rows


def openrs_rows():
    return [
        {"problem": "What is 3*4?", "solution": "3*4=\\boxed{12}", "answer": "12", "level": "Level 1"},
        {"problem": "What is 5-2?", "solution": "\\boxed{3}", "answer": "3", "level": "Level 1"},
        {"problem": "Prove it.", "solution": "...", "answer": None, "level": "Level 5"},
        {"problem": "What is 9/3?", "solution": "\\boxed{3}", "answer": "  ", "level": "Level 2"},
    ]


def save(rows, tmp_path, fmt, name="data"):
    path = tmp_path / f"{name}.{fmt}"
    return write_parquet(rows, path) if fmt == "parquet" else write_jsonl_file(rows, path)
