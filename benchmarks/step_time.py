"""Step time by phase for the five scripts on the same CPU demo run.

    python benchmarks/step_time.py [--steps 10] [--rollout vllm] [--scripts grpo_base.py,egpo.py]

Runs each script on the demo model and task (same seed, same data), skips the
first step (warm-up), and prints the mean seconds per phase, the overhead over
grpo_base.py, peak memory, and the evaluated accuracy before and after.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["grpo_base.py", "edge_grpo.py", "egpo.py", "cw_grpo.py", "pro_grpo.py"]
PHASES = [f"time/{k}" for k in ("rollout_s", "gec_s", "scoring_s", "old_logp_s", "update_s", "sync_s", "step_s")]


def run(script: str, steps: int, rollout: str, out: Path) -> list[dict]:
    cmd = [
        sys.executable,
        str(ROOT / script),
        "--steps",
        str(steps),
        "--rollout",
        rollout,
        "--eval_steps",
        str(steps),
        "--output_dir",
        str(out),
    ]
    subprocess.run(
        cmd,
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
    )
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rollout", default="vllm", choices=["vllm", "hf"])
    p.add_argument("--scripts", default=",".join(SCRIPTS))
    a = p.parse_args()
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for script in a.scripts.split(","):
            rows = run(script, a.steps, a.rollout, Path(tmp) / script)
            train = [r for r in rows if r["step"] >= 2 and "time/step_s" in r]  # step 1 warms up
            table[script] = {k: sum(r.get(k) or 0.0 for r in train) / len(train) for k in PHASES}
            table[script]["peak_mem_gb"] = max(r.get("time/peak_mem_gb") or 0.0 for r in train)
            table[script]["before"] = rows[0].get("eval/synthetic/pass@1")
            table[script]["after"] = rows[-1].get("eval/synthetic/pass@1")
            print(f"ran {script}", file=sys.stderr)
    base = table.get("grpo_base.py", {}).get("time/step_s")
    print(f"mean seconds per step over steps 2..{a.steps} ({a.rollout} rollout, CPU demo)\n")
    print(f"| script | {' | '.join(k[5:] for k in PHASES)} | vs grpo_base | peak GiB | eval pass@1 before -> after |")
    print("|---" * (len(PHASES) + 4) + "|")
    for script, t in table.items():
        overhead = f"{100 * (t['time/step_s'] / base - 1):+.0f}%" if base else "-"
        phases = " | ".join(f"{t[k]:.2f}" for k in PHASES)
        print(f"| {script} | {phases} | {overhead} | {t['peak_mem_gb']:.1f} | {t['before']:.2f} -> {t['after']:.2f} |")


if __name__ == "__main__":
    main()
