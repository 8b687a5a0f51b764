"""EGPO's training set, OpenR1-Math-Stable-10K (App. A.2), from OpenR1-Math (data/prepare.py egpo): single-value
answers, the boxed-match and length filters, near-duplicates and test problems dropped, and the paper's mix of
subsets and buckets, a validation set held out (`prepare_egpo`; `openr1_summary` reduces a dataset row first)."""

import random
import re
from pathlib import Path
from typing import Any

from common.prompts import format_prompt
from data.near_duplicates import drop_near_duplicates
from data.row_filters import complete, dedup, report

# OpenR1-Math marks problems without a checkable answer with these.
_PLACEHOLDER_ANSWERS = {"proof", "notfound", "none", "null", "n/a", "-"}
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")
_CONJUNCTION = re.compile(r"\b(or|and)\b|以及", re.IGNORECASE)


def is_single_value_answer(answer: str) -> bool:
    """Whether a gold answer is one value (EGPO's "single-value GT enforced", by the authors' data script): no
    separator outside thousands commas, no "and" / "or", at most one "=", not empty or a placeholder, at most one
    \\boxed. Tuples, intervals and sets are rejected too: the binary reward checks one value."""
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


# OpenR1-Math-Stable-10K (EGPO's App. A.2; the values the paper lost from the authors' data script):
# the pool's mix of subsets and of buckets, 128 rows of it held out for validation.
EGPO_SUBSET_RATIOS = {"default": 0.85, "extended": 0.15}
EGPO_BUCKET_RATIOS = {"mixed": 0.60, "entirely_correct": 0.40}
EGPO_POOL, EGPO_VAL = 10_000, 128
EGPO_MIN_GENERATIONS, EGPO_MAX_RESPONSE_TOKENS = 2, 4096
OPENR1_SUBSET_DIRS = {"default": "data", "extended": "extended"}  # each config's folder in the hub repository
OPENR1_COLUMNS = ("generations", "correctness_count")


def _light_norm(s: str) -> str:
    """The boxed match's normalisation: outer $...$, thousands commas, whitespace, \\, \\! \\; and outer braces off."""
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] == "$":
        s = s[1:-1]
    s = "".join(_THOUSANDS_COMMA.sub("", s).split())
    for macro in ("\\,", "\\!", "\\;"):
        s = s.replace(macro, "")
    return s.strip("{}")


def openr1_summary(row: dict, subset: str) -> dict:
    """An OpenR1-Math row reduced to what EGPO's filters need. `bucket`: from `correctness_count` of N generations,
    "entirely_correct" (N), "entirely_incorrect" (0), else "mixed"; None under EGPO_MIN_GENERATIONS or inconsistent.
    `response`: the solution, else the first generation, whose last \\boxed{} matches the answer (or None)."""
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


def egpo_mix(rows: list[dict], n: int, seed: int, subsets: list[str]) -> list[dict]:
    """A shuffled, seeded pool of `n` rows: subsets by EGPO_SUBSET_RATIOS (over `subsets`), buckets within each by
    EGPO_BUCKET_RATIOS; a short cell is filled from the rest of its subset (entirely-incorrect rows, "retained")."""
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
    """OpenR1-Math-Stable-10K (EGPO App. A.2) from `openr1_summary` rows: the filters in order, then the `egpo_mix`
    pool of `n`, its first `val_size` rows the validation set. Returns (train, validation)."""
    tokenizer = load_tokenizer(tokenizer)  # fail before the slow steps
    print(f"egpo: {len(rows)} rows loaded")
    rows = complete(rows)
    kept = [r for r in rows if is_single_value_answer(r["answer"])]
    report("single-value answer", len(rows), len(kept))
    rows = [r for r in kept if r["bucket"] is not None]
    report(f"at least {EGPO_MIN_GENERATIONS} judged generations", len(kept), len(rows))
    kept = [r for r in rows if r["response"] is not None]
    report("boxed match (solution or a generation)", len(rows), len(kept))
    lengths = token_lengths([r["response"] for r in kept], tokenizer)
    rows = [r for r, length in zip(kept, lengths) if length <= max_response_tokens]
    report(f"response (that solution or generation) <= {max_response_tokens} tokens", len(kept), len(rows))
    rows = dedup(rows)
    if near_dup_threshold < 1:
        rows = drop_near_duplicates(rows, near_dup_threshold, test_problems)
    lengths = token_lengths([format_prompt(r["problem"], template, tokenizer) for r in rows], tokenizer)
    kept = [r for r, length in zip(rows, lengths) if length <= max_prompt_tokens]
    report(f"prompt <= {max_prompt_tokens} tokens ({template} template)", len(rows), len(kept))
    pool = egpo_mix(kept, n, seed, sorted({r["subset"] for r in kept}, key=list(EGPO_SUBSET_RATIOS).index))
    pool = [{k: r[k] for k in ("problem", "answer", "solution", "subset", "bucket")} for r in pool]
    if len(pool) <= val_size:
        raise ValueError(f"only {len(pool)} rows left: not enough for a {val_size}-row validation set and training")
    print(f"  pool {len(pool)} -> {len(pool) - val_size} training + {val_size} validation rows")
    return pool[val_size:], pool[:val_size]


def openr1_source(source: str, subset: str, subsets: list[str]) -> str:
    """Where a subset's rows are: a hub name as is, a local copy's OPENR1_SUBSET_DIRS folder, else the path."""
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
