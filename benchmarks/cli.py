"""How long each command line takes to answer --help and a mistyped flag (the target: under a second).

    python benchmarks/cli.py [--repeats 3]

Every script and tool parses its flags before importing torch, transformers or vLLM; this prints
the median wall time of each, run as a user runs it (a fresh interpreter each time).
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIS = {
    "grpo_base.py": [sys.executable, "grpo_base.py"],
    "edge_grpo.py": [sys.executable, "edge_grpo.py"],
    "egpo.py": [sys.executable, "egpo.py"],
    "cw_grpo.py": [sys.executable, "cw_grpo.py"],
    "pro_grpo.py": [sys.executable, "pro_grpo.py"],
    "tools.evaluate": [sys.executable, "-m", "tools.evaluate"],
    "tools.plot": [sys.executable, "-m", "tools.plot"],
    "data.prepare": [sys.executable, "-m", "data.prepare"],
}


def seconds(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print("| command | --help (s) | a mistyped flag (s) |\n|---|---|---|")
    for name, cmd in CLIS.items():
        print(
            f"| {name} | {seconds([*cmd, '--help'], a.repeats):.2f} | {seconds([*cmd, '--grup_size', '8'], a.repeats):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
