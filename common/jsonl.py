"""JSON Lines files: the one reader and writer every module uses (datasets, metrics, evaluation records)."""

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path


def iter_jsonl(path: str | os.PathLike, skip_torn_last_line: bool = False) -> Iterator[dict]:
    """The rows of a .jsonl file; blank lines are skipped. A line that is not JSON raises
    ValueError naming the file and line, except a last line cut short by a killed writer when
    `skip_torn_last_line` (a run's own logs, appended to while the run was killed)."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                if skip_torn_last_line and not line.endswith("\n"):  # only the last line can lack one
                    return
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from None


def read_jsonl(path: str | os.PathLike, skip_torn_last_line: bool = False) -> list[dict]:
    return list(iter_jsonl(path, skip_torn_last_line))


def write_jsonl(rows: Iterable[dict], path: str | os.PathLike) -> int:
    """Write rows as JSON lines (parent directories created, replaced whole); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
