"""The row filters every training set of data/prepare.py goes through, each saying its row counts before and
after: empty problems or answers dropped (`complete`), exact duplicates (`dedup`), a seeded subset."""

import random
from collections.abc import Iterable


def report(name: str, before: int, after: int) -> None:
    print(f"  {name}: {before} -> {after} rows")


def complete(rows: list[dict]) -> list[dict]:
    """Drop rows with an empty problem or answer: they cannot be rewarded."""
    kept = [r for r in rows if r["problem"].strip() and r["answer"].strip()]
    report("non-empty problem and answer", len(rows), len(kept))
    return kept


def seeded_subset(rows: list[dict], n: int | None, seed: int) -> list[dict]:
    if n is None:
        return rows
    if len(rows) < n:
        print(f"  warning: only {len(rows)} rows left, fewer than --n {n}; keeping them all")
        return rows
    kept = random.Random(seed).sample(rows, n)
    report(f"seeded random {n} (seed {seed})", len(rows), len(kept))
    return kept


def dedup(rows: Iterable[dict], name: str = "deduplicate problems") -> list[dict]:
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
    report(name, total, len(kept))
    if conflicts:
        print(f"  warning: {conflicts} duplicates disagreed with the first copy's answer; kept the first")
    return kept
