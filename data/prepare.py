"""Build each paper's training set as JSONL rows {"problem", "answer", "solution"}.

    python -m data.prepare edge      --output data/deepscaler_random_1k.jsonl
    python -m data.prepare egpo      --tokenizer Qwen/Qwen2.5-Math-1.5B --decontaminate math500,aime24,aime25,olympiadbench --output data/openr1_egpo.jsonl
    python -m data.prepare cw        --output data/open_rs.jsonl
    python -m data.prepare pro       --output data/dapo_math_17k.jsonl
    python -m data.prepare synthetic --output data/synthetic_arith_train.jsonl

`--source` defaults to the paper's hub dataset; without a network pass a local
copy (.jsonl / .json / .parquet, or a directory of them): the hub dataset's
field mapping is applied to it (override with --problem_field etc.).

- edge (EDGE-GRPO, arXiv 2507.21848): DeepScaleR rows whose reference solution puts
  its final answer in \\boxed{}, then a seeded random 1K = DeepScaleR-Random-1K.
  The paper's second set, DeepScaleR-Hard-1K (the 1K questions Qwen2.5-Math-7B
  answers least often in 8 samples), needs a model to build and is made by a
  separate command, not by this data-only script.
- egpo (EGPO, arXiv 2602.22751, App. A.2): OpenR1-Math-Stable-10K as far as the dataset's
  columns allow, with the values the paper lost taken from the authors' data script. From both
  subsets: single-value, non-empty answers (`is_single_value_answer`), at least two generations,
  the boxed-match filter (the solution's or a generation's last \\boxed{} is the answer) with
  that response at most 4096 tokens, exact and near duplicates removed, prompts of at most 1024 tokens
  once rendered with the training template; then a seeded 10,000-row pool, default 0.85 /
  extended 0.15 and within each mixed 0.60 / entirely-correct 0.40 (by the dataset's count of
  correct R1 generations), of which 128 rows are written apart for validation. Near-duplicates
  (MinHash-LSH) of each other and of `--decontaminate` benchmarks are dropped; the per-source caps
  are not reproduced (data/README.md).
- cw (CW-GRPO, arXiv 2605.11538): Open-RS as is (7,000 rows), minus rows without answer.
- pro (Pro-GRPO, arXiv 2602.05281): DAPO-Math-17k with the "Answer:"-format
  instruction wrapper stripped from the prompt and the ~100x repeated problems
  deduplicated (~17K left).
- synthetic: generated arithmetic problems (no download; operands up to 99 by
  default), none of them among the shipped evaluation set data/synthetic_arith_eval.jsonl.

Every step prints its row counts before and after (data/row_filters.py). EGPO's set is built in
data/openr1.py, its near-duplicates found in data/near_duplicates.py.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.cli import arg, clear_errors, parse_args
from common.math_data import iter_math_dataset, strip_dapo_instruction, synthetic_arithmetic, synthetic_eval_set
from common.prompts import TEMPLATE_CHOICES
from common.run_dir import write_jsonl
from data.openr1 import (
    EGPO_MAX_RESPONSE_TOKENS,
    EGPO_POOL,
    EGPO_SUBSET_RATIOS,
    EGPO_VAL,
    OPENR1_COLUMNS,
    load_tokenizer,
    openr1_source,
    openr1_summary,
    prepare_egpo,
)
from data.row_filters import complete, dedup, report, seeded_subset

DEFAULT_SOURCES = {
    "edge": "agentica-org/DeepScaleR-Preview-Dataset",
    "egpo": "open-r1/OpenR1-Math-220k",
    "cw": "knoveleng/open-rs",
    "pro": "BytedTsinghua-SIA/DAPO-Math-17k",
}


def prepare_edge(rows: list[dict], n: int | None = 1000, seed: int = 42) -> list[dict]:
    """Keep rows whose solution has a \\boxed{} final answer, then a seeded random `n`."""
    from common.answers import extract_boxed

    print(f"edge: {len(rows)} rows loaded")
    rows = complete(rows)
    kept = [r for r in rows if r["solution"] and (extract_boxed(r["solution"]) or "").strip()]
    report("solution with a \\boxed{} answer", len(rows), len(kept))
    return seeded_subset(kept, n, seed)


def prepare_cw(rows: list[dict]) -> list[dict]:
    """Open-RS unchanged except rows without an answer."""
    print(f"cw: {len(rows)} rows loaded")
    return complete(rows)


def prepare_pro(rows: Iterable[dict]) -> list[dict]:
    """DAPO's instruction wrapper stripped, one row per problem; streamed (the hub's ~1.8M rows)."""

    def unwrapped():
        for r in rows:
            yield {**r, "problem": strip_dapo_instruction(r["problem"])}

    print("pro: streaming rows")
    return complete(dedup(unwrapped(), "deduplicate repeated problems"))


def prepare_synthetic(n: int = 5000, seed: int = 42, max_operand: int = 99, ops: str = "+") -> list[dict]:
    """A synthetic arithmetic training set without the evaluation problems (data/synthetic_arith_eval.jsonl)."""
    held_out = [r["problem"] for r in synthetic_eval_set()]
    rows = synthetic_arithmetic(n, seed, max_operand, ops, exclude=held_out)
    print(
        f"synthetic: {len(rows)} problems (ops {ops!r}, operands 0..{max_operand}), none of the {len(held_out)} eval problems"
    )
    return rows


@dataclass
class Args:
    # What to build.
    dataset: str = arg(
        "synthetic", "the paper's training set", ["edge", "egpo", "cw", "pro", "synthetic"], positional=True
    )
    output: str = arg("", "JSONL file to write", required=True)
    source: str | None = arg(None, "local file/directory or hub name (default: the paper's)")
    split: str = arg("train", "split of the source")
    subsets: str | None = arg(
        None, "hub config(s), comma-separated (egpo: 'default,extended' by default, as in the paper)"
    )
    problem_field: str | None = arg(None, "column holding the problem (default: the paper's dataset mapping)")
    answer_field: str | None = arg(None, "column holding the gold answer")
    solution_field: str | None = arg(None, "column holding a reference solution")
    seed: int = arg(42, "seed of the sampling at the end")
    n: int | None = arg(
        None,
        "rows to sample at the end (edge: 1000, egpo: the 10000-row pool, validation included, synthetic: 5000, "
        "others: keep all)",
        at_least=1,
    )
    # EGPO's filters and validation set.
    tokenizer: str | None = arg(None, "egpo: tokenizer that counts prompt tokens")
    template: str = arg("qwen_math", "egpo: prompt template", TEMPLATE_CHOICES)
    max_prompt_tokens: int = arg(1024, "egpo: prompt length limit", at_least=1)
    max_response_tokens: int = arg(
        EGPO_MAX_RESPONSE_TOKENS, "egpo: length limit of the matching solution or generation", at_least=1
    )
    near_dup_threshold: float = arg(
        0.8,
        "egpo: MinHash-LSH Jaccard threshold of near-duplicate problems (1: exact duplicates only)",
        above=0,
        at_most=1,
    )
    decontaminate: str = arg(
        "",
        "egpo: benchmarks whose near-duplicates are dropped, comma-separated names (python -m tools.evaluate) or name=FILE",
    )
    data_dir: str | None = arg(None, "egpo: directory holding <benchmark>.jsonl copies for --decontaminate")
    val_size: int = arg(EGPO_VAL, "egpo: rows of the pool held out for validation", at_least=1)
    val_output: str | None = arg(None, "egpo: the validation JSONL (default: --output with _val before .jsonl)")
    # The synthetic task.
    max_operand: int = arg(99, "synthetic: operands in [0, max_operand]", at_least=1)
    ops: str = arg("+", "synthetic: operators among + - *, e.g. '+-'")


def main(args: Args) -> None:
    if args.dataset == "synthetic":
        rows = prepare_synthetic(args.n or 5000, args.seed, args.max_operand, args.ops)
    else:
        preset = DEFAULT_SOURCES[args.dataset]
        source = args.source or preset
        if not Path(source).exists():  # a hub name: without a network, the error now, not after retries
            from common.models import offline_unless_hub_reachable

            offline_unless_hub_reachable()
        configs = args.subsets.split(",") if args.subsets else [None]
        if args.dataset == "egpo":
            configs = args.subsets.split(",") if args.subsets else list(EGPO_SUBSET_RATIOS)
            if unknown := sorted(set(configs) - set(EGPO_SUBSET_RATIOS)):
                raise ValueError(
                    f"--subsets: unknown OpenR1-Math subset(s) {unknown}; choose from {list(EGPO_SUBSET_RATIOS)}"
                )

        columns = (args.split, args.problem_field, args.answer_field, args.solution_field)

        def stream():
            for config in configs:
                yield from iter_math_dataset(source, *columns, preset=preset, config=config)

        if args.dataset == "edge":
            rows = prepare_edge(list(stream()), n=args.n or 1000, seed=args.seed)
        elif args.dataset == "egpo":
            tokenizer = load_tokenizer(args.tokenizer)  # before loading 220K rows
            summaries = []
            for config in configs:
                source_rows = iter_math_dataset(
                    openr1_source(source, config, configs), *columns, preset=preset, config=config, keep=OPENR1_COLUMNS
                )
                summaries += [openr1_summary(r, config) for r in source_rows]
            test_problems = []
            if args.decontaminate:
                from common.evaluation import load_benchmarks

                with clear_errors("--decontaminate"):  # its errors name this command's flags
                    benchmarks = load_benchmarks(args.decontaminate, args.data_dir, data_dir_flag="--data_dir")
                test_problems = [r["problem"] for rows in benchmarks.values() for r in rows]
            rows, val = prepare_egpo(
                summaries, tokenizer, args.template, args.max_prompt_tokens, args.n or EGPO_POOL, args.seed,
                val_size=args.val_size, max_response_tokens=args.max_response_tokens,
                near_dup_threshold=args.near_dup_threshold, test_problems=test_problems,
            )  # fmt: skip
            val_output = args.val_output or str(Path(args.output).with_name(Path(args.output).stem + "_val.jsonl"))
            print(f"wrote {write_jsonl(val, val_output)} validation rows to {val_output}")
        elif args.dataset == "cw":
            rows = prepare_cw(list(stream()))
        else:
            rows = prepare_pro(stream())
    n = write_jsonl(rows, args.output)
    if n == 0:  # an empty or fully filtered source: say so rather than leave an empty training set
        Path(args.output).unlink(missing_ok=True)
        raise SystemExit(
            f"error: no rows left to write from {args.source or args.dataset}: check --source and the field flags"
        )
    print(f"wrote {n} rows to {args.output}")


if __name__ == "__main__":
    with clear_errors():  # user errors: one line, no traceback
        main(parse_args(Args, description=__doc__))
