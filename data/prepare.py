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

Every step prints its row counts before and after.
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.cli import arg, clear_errors, parse_args
from common.jsonl import write_jsonl
from common.math_data import iter_math_dataset, strip_dapo_instruction
from common.prompts import TEMPLATE_CHOICES, format_prompt
from common.synthetic import synthetic_arithmetic, synthetic_eval_set

DEFAULT_SOURCES = {
    "edge": "agentica-org/DeepScaleR-Preview-Dataset",
    "egpo": "open-r1/OpenR1-Math-220k",
    "cw": "knoveleng/open-rs",
    "pro": "BytedTsinghua-SIA/DAPO-Math-17k",
}


def _report(name: str, before: int, after: int) -> None:
    print(f"  {name}: {before} -> {after} rows")


def _complete(rows: list[dict]) -> list[dict]:
    """Drop rows with an empty problem or answer: they cannot be rewarded."""
    kept = [r for r in rows if r["problem"].strip() and r["answer"].strip()]
    _report("non-empty problem and answer", len(rows), len(kept))
    return kept


def _seeded_subset(rows: list[dict], n: int | None, seed: int) -> list[dict]:
    if n is None:
        return rows
    if len(rows) < n:
        print(f"  warning: only {len(rows)} rows left, fewer than --n {n}; keeping them all")
        return rows
    kept = random.Random(seed).sample(rows, n)
    _report(f"seeded random {n} (seed {seed})", len(rows), len(kept))
    return kept


def _dedup(rows: Iterable[dict], name: str = "deduplicate problems") -> list[dict]:
    """Keep the first row of each problem (compared with whitespace collapsed)."""
    seen: dict[str, str] = {}
    kept, total, conflicts = [], 0, 0
    for r in rows:
        total += 1
        key = " ".join(r["problem"].split())
        if key in seen:
            conflicts += seen[key] != r["answer"]
            continue
        seen[key] = r["answer"]
        kept.append(r)
    _report(name, total, len(kept))
    if conflicts:
        print(f"  warning: {conflicts} duplicates disagreed with the first copy's answer; kept the first")
    return kept


# ---------------------------------------------------------------------------
# EDGE-GRPO: DeepScaleR-Random-1K
# ---------------------------------------------------------------------------


def prepare_edge(rows: list[dict], n: int | None = 1000, seed: int = 42) -> list[dict]:
    """Keep rows whose solution has a \\boxed{} final answer, then a seeded random `n`."""
    from common.answers import extract_boxed

    print(f"edge: {len(rows)} rows loaded")
    rows = _complete(rows)
    kept = [r for r in rows if r["solution"] and (extract_boxed(r["solution"]) or "").strip()]
    _report("solution with a \\boxed{} answer", len(rows), len(kept))
    return _seeded_subset(kept, n, seed)


# ---------------------------------------------------------------------------
# EGPO: OpenR1-Math, single-value answers, prompts <= 1024 tokens
# ---------------------------------------------------------------------------

# OpenR1-Math marks problems without a checkable answer with these.
_PLACEHOLDER_ANSWERS = {"proof", "notfound", "none", "null", "n/a", "-"}
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")
_CONJUNCTION = re.compile(r"\b(or|and)\b|以及", re.IGNORECASE)


def is_single_value_answer(answer: str) -> bool:
    """Whether a gold answer is one value (EGPO's "single-value GT enforced"), by the rule of the
    authors' data script: no separator ("," "，" ";" "；" outside thousands separators such as
    1,000), no "and" / "or", at most one "=". So tuples, intervals and sets ("(1, 2)", "[0, 1)")
    are rejected too: the binary reward checks one value. Also rejected: empty or placeholder
    answers ("proof", "notfound", ...) and more than one \\boxed.
    """
    a = _THOUSANDS_COMMA.sub("", answer.strip())
    if not a or a.lower() in _PLACEHOLDER_ANSWERS or a.count("\\boxed") > 1:
        return False
    return not (any(sep in a for sep in ",，;；") or _CONJUNCTION.search(a) or a.count("=") >= 2)


def load_tokenizer(tokenizer: Any):
    """A tokenizer object, or load one from a path / hub name."""
    if tokenizer is None:
        raise ValueError(
            "the EGPO prompt-length filter counts tokens: pass --tokenizer "
            "(a Hugging Face tokenizer path, e.g. the model you will train)"
        )
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer)
    return tokenizer


def token_lengths(texts: list[str], tokenizer, batch_size: int = 1000) -> list[int]:
    """Token count of each text (no extra BOS/EOS)."""
    lengths = []
    for i in range(0, len(texts), batch_size):
        lengths += [len(ids) for ids in tokenizer(texts[i : i + batch_size], add_special_tokens=False)["input_ids"]]
    return lengths


def prompt_token_lengths(problems: list[str], tokenizer, template: str) -> list[int]:
    """Token count of each problem's rendered prompt (chat markup included, no extra BOS/EOS)."""
    return token_lengths([format_prompt(p, template, tokenizer) for p in problems], tokenizer)


# OpenR1-Math-Stable-10K (EGPO's App. A.2; the values the paper lost from the authors' data script):
# the pool's mix of subsets and of buckets, 128 rows of it held out for validation.
EGPO_SUBSET_RATIOS = {"default": 0.85, "extended": 0.15}
EGPO_BUCKET_RATIOS = {"mixed": 0.60, "entirely_correct": 0.40}
EGPO_POOL, EGPO_VAL = 10_000, 128
EGPO_MIN_GENERATIONS, EGPO_MAX_RESPONSE_TOKENS = 2, 4096
OPENR1_SUBSET_DIRS = {"default": "data", "extended": "extended"}  # each config's folder in the hub repository
OPENR1_COLUMNS = ("generations", "correctness_count")


def _light_norm(s: str) -> str:
    """The boxed-match comparison's normalisation: outer $...$, thousands commas, whitespace, the
    spacing macros \\, \\! \\; and outer braces removed."""
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] == "$":
        s = s[1:-1]
    s = "".join(_THOUSANDS_COMMA.sub("", s).split())
    for macro in ("\\,", "\\!", "\\;"):
        s = s.replace(macro, "")
    return s.strip("{}")


def openr1_summary(row: dict, subset: str) -> dict:
    """An OpenR1-Math row reduced to what EGPO's filters and mix need (the long generations dropped).

    `bucket`: from `correctness_count` (the dataset's count of its R1 generations judged correct)
    against their number N: "entirely_correct" (N of N), "entirely_incorrect" (0), else "mixed";
    None when fewer than EGPO_MIN_GENERATIONS generations or an inconsistent count. `response`: the
    solution if its last \\boxed{} matches the answer (`_light_norm`), else the first generation
    whose last box does; None when none does (the boxed-match filter)."""
    from common.answers import extract_boxed

    generations = [g for g in row.get("generations") or [] if isinstance(g, str)]
    count, n = row.get("correctness_count"), len(generations)
    bucket = None
    if n >= EGPO_MIN_GENERATIONS and isinstance(count, int) and 0 <= count <= n:
        bucket = "entirely_correct" if count == n else "entirely_incorrect" if count == 0 else "mixed"

    def matches(text: str) -> bool:
        box = extract_boxed(text)
        return box is not None and _light_norm(box) == _light_norm(row["answer"])

    response = next((t for t in [row["solution"] or "", *generations] if t and matches(t)), None)
    return {"problem": row["problem"], "answer": row["answer"], "solution": row["solution"],
            "subset": subset, "bucket": bucket, "response": response}  # fmt: skip


# MinHash-LSH near-duplicates (EGPO's App. A.2: num_perm 128, threshold 0.8), on a problem's set of
# lower-cased words, as the authors' script shingles it. Each of the num_perm hashes is a random
# universal hash (a * x + b) mod p of the words' CRC-32, minimised over the words; LSH then calls two
# texts duplicates when all `rows` values of any one of `bands` bands agree.
_WORDS = re.compile(r"\w+")
_P = (1 << 31) - 1  # a Mersenne prime; a * x + b stays below 2^63


def minhash(text: str, num_perm: int = 128, seed: int = 1):
    """The MinHash signature (num_perm int64) of the text's set of lower-cased words."""
    import numpy as np

    a, b = np.random.default_rng(seed).integers(1, _P, size=(2, num_perm), dtype=np.int64)
    words = {zlib.crc32(w.encode()) % _P for w in _WORDS.findall(text.lower())} or {0}
    x = np.fromiter(words, dtype=np.int64)[:, None]
    return ((x * a + b) % _P).min(axis=0)


@functools.cache
def lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) with bands * rows <= num_perm whose S-curve 1 - (1 - J^rows)^bands best separates
    Jaccard similarities J below and above `threshold` (least false-positive + false-negative area)."""
    import numpy as np

    j = np.linspace(0.0, 1.0, 1001)
    below, above = j <= threshold, j >= threshold
    best = None
    for rows in range(1, num_perm + 1):
        for bands in range(1, num_perm // rows + 1):
            hit = 1 - (1 - j**rows) ** bands
            error = np.trapezoid(hit[below], j[below]) + np.trapezoid(1 - hit[above], j[above])
            if best is None or error < best[0]:
                best = (error, bands, rows)
    return best[1], best[2]


class NearDuplicates:
    """An LSH index of MinHash signatures: `seen(text)` after `add(text)` of a near-duplicate is True."""

    def __init__(self, threshold: float = 0.8, num_perm: int = 128):
        self.num_perm = num_perm
        self.bands, self.rows = lsh_bands(threshold, num_perm)
        self.buckets: set[tuple[int, bytes]] = set()

    def _keys(self, text: str) -> list[tuple[int, bytes]]:
        sig = minhash(text, self.num_perm)
        return [(i, sig[i * self.rows : (i + 1) * self.rows].tobytes()) for i in range(self.bands)]

    def add(self, text: str) -> None:
        self.buckets.update(self._keys(text))

    def seen(self, text: str) -> bool:
        return any(key in self.buckets for key in self._keys(text))


def drop_near_duplicates(rows: list[dict], threshold: float, test_problems: list[str] = ()) -> list[dict]:
    """Rows whose problem is a near-duplicate of a test problem dropped (decontamination), then of an
    earlier row of the same subset (the authors' script deduplicates within each subset)."""
    test = NearDuplicates(threshold)
    for problem in test_problems:
        test.add(problem)
    kept = [r for r in rows if not (test_problems and test.seen(r["problem"]))]
    if test_problems:
        _report(
            f"decontaminated against {len(test_problems)} test problems (MinHash-LSH, {threshold})",
            len(rows),
            len(kept),
        )
    seen: dict[str, NearDuplicates] = {}
    out = []
    for r in kept:
        index = seen.setdefault(r["subset"], NearDuplicates(threshold))
        if not index.seen(r["problem"]):
            index.add(r["problem"])
            out.append(r)
    _report(f"near-duplicates within each subset removed (MinHash-LSH, {threshold})", len(kept), len(out))
    return out


def egpo_mix(rows: list[dict], n: int, seed: int, subsets: list[str]) -> list[dict]:
    """A seeded pool of `n` rows in the paper's proportions: subsets by EGPO_SUBSET_RATIOS
    (renormalised over `subsets`), and within each subset buckets by EGPO_BUCKET_RATIOS. A cell
    short of rows gives all it has and the rest of its subset (entirely-incorrect rows included,
    which the paper "retains") fills it; the pool comes back shuffled."""
    rng = random.Random(seed)
    total = sum(EGPO_SUBSET_RATIOS[s] for s in subsets)
    pool = []
    for subset in subsets:
        want = round(n * EGPO_SUBSET_RATIOS[subset] / total)
        rest = [r for r in rows if r["subset"] == subset]
        rng.shuffle(rest)
        taken = []
        for bucket, ratio in EGPO_BUCKET_RATIOS.items():
            cell = [r for r in rest if r["bucket"] == bucket]
            quota = round(want * ratio)
            if len(cell) < quota:
                print(
                    f"  warning: {subset}/{bucket} has {len(cell)} rows, fewer than its {quota}; filling from the rest"
                )
            taken += cell[:quota]
        chosen = {id(r) for r in taken}
        fill = [r for r in rest if id(r) not in chosen][: want - len(taken)]
        if len(taken) + len(fill) < want:
            print(f"  warning: subset {subset} has {len(rest)} rows, fewer than its {want}; keeping them all")
        pool += taken + fill
        counts = {b: sum(r["bucket"] == b for r in taken + fill) for b in (*EGPO_BUCKET_RATIOS, "entirely_incorrect")}
        print(f"  {subset}: {len(taken) + len(fill)} rows ({', '.join(f'{b} {c}' for b, c in counts.items())})")
    rng.shuffle(pool)
    return pool


def prepare_egpo(
    rows: list[dict],
    tokenizer: Any,
    template: str = "qwen_math",
    max_prompt_tokens: int = 1024,
    n: int = EGPO_POOL,
    seed: int = 42,
    val_size: int = EGPO_VAL,
    max_response_tokens: int = EGPO_MAX_RESPONSE_TOKENS,
    near_dup_threshold: float = 0.8,
    test_problems: list[str] = (),
) -> tuple[list[dict], list[dict]]:
    """OpenR1-Math-Stable-10K: single-value non-empty answers, at least two judged generations, the
    boxed-match filter, its response at most `max_response_tokens`, exact dedup, decontamination
    against `test_problems` and near-duplicate removal (`drop_near_duplicates`; threshold 1: off),
    rendered prompt <= `max_prompt_tokens`, then the `egpo_mix` pool of `n`, of which the first
    `val_size` rows are the validation set.

    rows: `openr1_summary` rows (subset, bucket, response). Returns (train, validation)."""
    tokenizer = load_tokenizer(tokenizer)  # fail before the slow steps
    print(f"egpo: {len(rows)} rows loaded")
    rows = _complete(rows)
    kept = [r for r in rows if is_single_value_answer(r["answer"])]
    _report("single-value answer", len(rows), len(kept))
    rows = [r for r in kept if r["bucket"] is not None]
    _report(f"at least {EGPO_MIN_GENERATIONS} judged generations", len(kept), len(rows))
    kept = [r for r in rows if r["response"] is not None]
    _report("boxed match (solution or a generation)", len(rows), len(kept))
    lengths = token_lengths([r["response"] for r in kept], tokenizer)
    rows = [r for r, length in zip(kept, lengths) if length <= max_response_tokens]
    _report(f"response (that solution or generation) <= {max_response_tokens} tokens", len(kept), len(rows))
    rows = _dedup(rows)
    if near_dup_threshold < 1:
        rows = drop_near_duplicates(rows, near_dup_threshold, test_problems)
    lengths = prompt_token_lengths([r["problem"] for r in rows], tokenizer, template)
    kept = [r for r, length in zip(rows, lengths) if length <= max_prompt_tokens]
    _report(f"prompt <= {max_prompt_tokens} tokens ({template} template)", len(rows), len(kept))
    pool = egpo_mix(kept, n, seed, sorted({r["subset"] for r in kept}, key=list(EGPO_SUBSET_RATIOS).index))
    pool = [{k: r[k] for k in ("problem", "answer", "solution", "subset", "bucket")} for r in pool]
    if len(pool) <= val_size:
        raise ValueError(f"only {len(pool)} rows left: not enough for a {val_size}-row validation set and training")
    print(f"  pool {len(pool)} -> {len(pool) - val_size} training + {val_size} validation rows")
    return pool[val_size:], pool[:val_size]


def openr1_source(source: str, subset: str, subsets: list[str]) -> str:
    """Where a subset's rows are: a hub name as it is; a local copy of the hub repository holds
    each subset in its folder (OPENR1_SUBSET_DIRS); any other local file or folder is one subset."""
    path = Path(source).expanduser()
    if not path.exists():
        return source
    folder = path / OPENR1_SUBSET_DIRS[subset]
    if path.is_dir() and folder.is_dir():
        return str(folder)
    if len(subsets) > 1:
        raise ValueError(
            f"--source {source} is not a copy of the hub dataset with the folders "
            f"{', '.join(f'{d}/ ({s})' for s, d in OPENR1_SUBSET_DIRS.items())}: the paper's subset mix needs to "
            "know each row's subset; pass such a copy, or one subset: --subsets default"
        )
    return source


# ---------------------------------------------------------------------------
# CW-GRPO: Open-RS as is
# ---------------------------------------------------------------------------


def prepare_cw(rows: list[dict]) -> list[dict]:
    """Open-RS unchanged except rows without an answer."""
    print(f"cw: {len(rows)} rows loaded")
    return _complete(rows)


# ---------------------------------------------------------------------------
# Pro-GRPO: DAPO-Math-17k, unwrapped and deduplicated
# ---------------------------------------------------------------------------


def prepare_pro(rows: Iterable[dict]) -> list[dict]:
    """Strip DAPO's instruction wrapper and keep one row per distinct problem.

    Streams: the hub copy has ~1.8M rows (each problem ~100 times).
    """

    def unwrapped():
        for r in rows:
            yield {**r, "problem": strip_dapo_instruction(r["problem"])}

    print("pro: streaming rows")
    return _complete(_dedup(unwrapped(), "deduplicate repeated problems"))


def prepare_synthetic(n: int = 5000, seed: int = 42, max_operand: int = 99, ops: str = "+") -> list[dict]:
    """A synthetic arithmetic training set that holds none of the evaluation problems
    (data/synthetic_arith_eval.jsonl), e.g. a harder one: `--max_operand 99 --ops +-`."""
    held_out = [r["problem"] for r in synthetic_eval_set()]
    rows = synthetic_arithmetic(n, seed, max_operand, ops, exclude=held_out)
    print(
        f"synthetic: {len(rows)} problems (ops {ops!r}, operands 0..{max_operand}), none of the {len(held_out)} eval problems"
    )
    return rows


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


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
            unknown = sorted(set(configs) - set(EGPO_SUBSET_RATIOS))
            if unknown:
                raise ValueError(
                    f"--subsets: unknown OpenR1-Math subset(s) {unknown}; choose from {list(EGPO_SUBSET_RATIOS)}"
                )

        def stream():
            for config in configs:
                yield from iter_math_dataset(
                    source,
                    args.split,
                    args.problem_field,
                    args.answer_field,
                    args.solution_field,
                    preset=preset,
                    config=config,
                )

        if args.dataset == "edge":
            rows = prepare_edge(list(stream()), n=args.n or 1000, seed=args.seed)
        elif args.dataset == "egpo":
            tokenizer = load_tokenizer(args.tokenizer)  # before loading 220K rows
            summaries = []
            for config in configs:
                source_rows = iter_math_dataset(
                    openr1_source(source, config, configs), args.split, args.problem_field, args.answer_field,
                    args.solution_field, preset=preset, config=config, keep=OPENR1_COLUMNS,
                )  # fmt: skip
                summaries += [openr1_summary(r, config) for r in source_rows]
            test_problems = []
            if args.decontaminate:
                from common.benchmarks import load_benchmarks

                benchmarks = load_benchmarks(args.decontaminate, args.data_dir)
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
