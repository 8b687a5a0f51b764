"""Near-duplicate problems by MinHash-LSH (EGPO's App. A.2): `drop_near_duplicates` drops the rows close to a
test problem (decontamination), then those close to an earlier row of their subset."""

import functools
import re
import zlib

from data.row_filters import report

# EGPO's App. A.2: num_perm 128, threshold 0.8, on a problem's lower-cased words as the authors' script shingles
# them; each hash a universal (a * x + b) mod p of the words' CRC-32, minimised over the words.
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
    """(bands, rows), bands * rows <= num_perm, whose S-curve 1 - (1 - J^rows)^bands best splits Jaccard J at
    `threshold` (least false-positive + false-negative area)."""
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
    """Rows near a test problem dropped (decontamination), then those near an earlier row of their subset."""
    test = NearDuplicates(threshold)
    for problem in test_problems:
        test.add(problem)
    kept = [r for r in rows if not (test_problems and test.seen(r["problem"]))]
    if test_problems:
        report(
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
    report(f"near-duplicates within each subset removed (MinHash-LSH, {threshold})", len(kept), len(out))
    return out
