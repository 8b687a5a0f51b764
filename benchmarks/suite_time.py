"""The whole test suite's count and wall time, stored in docs/bench/suite.json (no page prints it).

    python benchmarks/suite_time.py                  # `python -m pytest` as the README gives it
    python benchmarks/suite_time.py -- -m "not slow" # pytest's own arguments after `--` (stored elsewhere: --out)

A timing: run it alone. The record (benchmarks/stored_run.py) adds pytest's counts, the slowest tests and every
phase of a test that took MIN_SECONDS or more, where the next cut is looked for.
"""

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import stored_run  # noqa: E402

STORED = stored_run.BENCH / "suite.json"
SLOWEST = 5
MIN_SECONDS = 1.0  # the phases stored


def parse(output: str) -> dict:
    """pytest's counts (its last summary line), its slowest tests and every phase of MIN_SECONDS or more
    (`--durations`), from its output."""
    summary = [line for line in output.splitlines() if re.search(r"\b(passed|failed|error)", line)]
    counts = {}
    for number, outcome in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", summary[-1]):
        counts["errors" if outcome.startswith("error") else outcome] = int(number)
    phases = [
        {"seconds": float(s), "phase": phase, "test": test}
        for s, phase, test in re.findall(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)", output, re.M)
    ]
    slowest = [{"seconds": p["seconds"], "test": p["test"]} for p in phases if p["phase"] == "call"][:SLOWEST]
    return {"counts": counts, "slowest": slowest, "phases": phases}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(STORED), help="where the run is stored ('' for nowhere)")
    p.add_argument("pytest_args", nargs="*", help="pytest's own arguments, after --")
    a = p.parse_args()
    command = ["python", "-m", "pytest", *a.pytest_args]
    record = stored_run.start(" ".join(command), threads=0)  # pytest's workers set their own threads
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "--durations=0", f"--durations-min={MIN_SECONDS}", *a.pytest_args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    record |= {"wall_s": time.perf_counter() - t0, "exit_code": proc.returncode, **parse(proc.stdout)}
    print(proc.stdout)
    if a.out:
        stored_run.finish(record, Path(a.out))
        print(f"stored {a.out}")


if __name__ == "__main__":
    main()
