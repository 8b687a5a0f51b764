"""A benchmark's run kept in docs/bench/ (what it measured, the machine, its load, the commit), and a docs page's
block written from it between `<!-- NAME: written by SCRIPT from STORED -->` and `<!-- end of NAME -->`.
tests/test_docs.py renders every block again and fails on a difference.
"""

import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench"


def markers(name: str, script: str, stored: str) -> tuple[str, str, str]:
    """(begin, end, find) of a block: `find` locates the begin line whatever it says (awaiting, or an older one)."""
    return f"<!-- {name}: written by {script} from {stored} -->", f"<!-- end of {name} -->", f"<!-- {name}:"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def start(command: str, threads: int | None = None) -> dict:
    """The record's head as the run starts: command, date, commit, modified files, the machine
    (`common.metrics.describe_machine`)."""
    from common.metrics import describe_machine

    if threads is None:
        import torch

        threads = torch.get_num_threads()
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _git("rev-parse", "--short", "HEAD").strip(),
        "modified": modified_files(),
        "machine": describe_machine(threads),
    }


def modified_files() -> list[str]:
    """The tracked files that differ from the commit (`git status --porcelain -z`; a rename's old name skipped)."""
    entries, out = iter(_git("status", "--porcelain", "-z", "--untracked-files=no").split("\0")), []
    for entry in entries:
        if len(entry) > 3:
            out.append(entry[3:])
            if entry[0] in "RC":
                next(entries, None)
    return out


def finish(record: dict, path: Path) -> dict:
    """The load average as the run ends, and the record written to `path` (docs/bench/...)."""
    record["load_1min_after"] = os.getloadavg()[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def conditions(record: dict, units: bool = False) -> str:
    """Where, when and beside what the run was made, read from its record; `units`: the CPU's bf16 units too (a
    figure that compares precisions). Busy: a load average above the cores + 1 (more than the run's own work)."""
    m = record["machine"]
    n = len(record["modified"])
    commit = record["commit"] + (f" with {n} file{'s' * (n != 1)} modified" if n else "")
    cpu = m["cpu"] + (f" (bf16 units: {', '.join(m['bf16_units']) or 'none'})" if units else "")
    threads = f", {m['threads']} compute threads" if m.get("threads") else ""
    busy = max(m["load_1min"], record["load_1min_after"]) > m["cores"] + 1
    return (
        f"`{record['command'].strip()}`, {record['date']}, commit {commit}, on {cpu}, {m['cores']} cores{threads}; "
        f"1-minute load average {m['load_1min']:.1f} at the start and {record['load_1min_after']:.1f} at the end "
        f"({'beside other work' if busy else 'about the run alone'})"
    )


def write_between(path: Path, begin: str, end: str, body: str, what: str, find: str | None = None) -> None:
    """Rewrite `path`'s text between the markers `begin` and `end` with `body`. `find`: a prefix of `begin` that
    locates an older marker line (rewritten whole); `what`: the block's name in the error when the markers lack."""
    text = path.read_text()
    if (find or begin) not in text or end not in text:
        raise SystemExit(f"error: {path} has no {what} markers ({begin} ... {end})")
    head, rest = text.split(find or begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}")
