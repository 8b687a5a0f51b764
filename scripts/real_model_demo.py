"""The README's real-model demo: SmolLM2-135M-Instruct (`--model smollm2`) learns sums (a + b, each from 0 to
99) with GRPO on CPU. One fresh run, then the README table between the two marker lines below, from that run's
metrics; the metrics file and the run's wall time are kept in docs/ (tests/test_real_model.py holds the
table to them).

    python scripts/real_model_demo.py                  # data, a fresh run (minutes: the table says), the table
    python scripts/real_model_demo.py --table_only     # the table again from docs/real_demo_metrics.jsonl

The task: 400 training sums "What is a + b?" with a, b in 0..99, and 100 held-out sums for the
evaluation (none among the training ones), each prompt with two worked examples from the training
solutions (`--few_shot 2`).
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.stored_run import write_between  # noqa: E402
from common.run_dir import read_jsonl  # noqa: E402

BEGIN = "<!-- real-model table: written by scripts/real_model_demo.py from one fresh run -->"
END = "<!-- end of real-model table -->"
METRICS = ROOT / "docs" / "real_demo_metrics.jsonl"
RUN_INFO = ROOT / "docs" / "real_demo_run.json"
STEPS, EVAL_STEPS = 10, 5
PHASES = [("rollout", "rollout"), ("old_logp", "pi_old scoring"), ("update", "update"), ("sync", "weight sync")]
FLAGS = [
    "--model", "smollm2", "--few_shot", "2", "--steps", str(STEPS), "--prompts_per_step", "6", "--group_size", "8",
    "--max_completion_len", "32", "--lr", "1e-5", "--eval_steps", str(EVAL_STEPS), "--eval_n", "2",
    "--micro_batch_size", "8", "--save_minutes", "0",
]  # fmt: skip


def held_out_rows(n: int = 100) -> list[dict]:
    """The held-out evaluation sums: the first 100, then (n > 100) more drawn apart from them and the training sums,
    so that every grid trains on the same 400 sums."""
    from common.math_data import synthetic_arithmetic

    first = synthetic_arithmetic(100, seed=1, max_operand=99)
    if n <= 100:
        return first[:n]
    seen = [r["problem"] for r in first + training_rows(first)]
    return first + synthetic_arithmetic(n - 100, seed=3, max_operand=99, exclude=seen)


def training_rows(held_out: list[dict]) -> list[dict]:
    """The 400 training sums, drawn without the first 100 held-out ones."""
    from common.math_data import synthetic_arithmetic

    return synthetic_arithmetic(400, seed=2, max_operand=99, exclude=[r["problem"] for r in held_out[:100]])


def write_data(folder: Path, held_out_n: int = 100) -> tuple[Path, Path]:
    """The held-out evaluation sums first, then the training sums drawn without them."""
    folder.mkdir(parents=True, exist_ok=True)
    held_out = held_out_rows(held_out_n)
    train = training_rows(held_out)
    paths = folder / "sums_train.jsonl", folder / "sums_eval.jsonl"
    for path, rows in zip(paths, (train, held_out)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def table(rows: list[dict], wall_s: float) -> str:
    """Held-out pass@1 at each evaluation, and the training reward: step 1's (sampled before any update) under
    step 0, else the mean over the steps since the previous evaluation (one step's reward is noisy)."""
    by_step = {r["step"]: r for r in rows}
    marks = sorted(s for s, r in by_step.items() if "eval/sums/pass@1" in r)
    cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    reward = [by_step[1]["train/reward"]]  # step 1's rollout is sampled before any update
    reward += [sum(by_step[s]["train/reward"] for s in range(a + 1, b + 1)) / (b - a) for a, b in zip(marks, marks[1:])]
    return "\n".join(
        [
            "| step | " + " | ".join(str(s) for s in marks) + " |",
            "|---|" + "---|" * len(marks),
            "| training reward (T = 1, 48 samples a step; step 1 for 0, else the mean of the steps since the last column) | "
            + " | ".join(map(cell, reward))
            + " |",
            "| held-out pass@1 (100 unseen sums, T = 0.6, 2 samples each) | "
            + " | ".join(cell(by_step[s]["eval/sums/pass@1"]) for s in marks)
            + " |",
            "",
            f"Wall time of the run, model load and evaluations included: {wall_s / 60:.1f} min on 2 cores. "
            + step_line(rows),
        ]
    )


def step_line(rows: list[dict]) -> str:
    """The steps' time: its range, and the mean of each phase."""
    steps = [r for r in rows if r["step"] >= 1]
    total = [r["time/step_s"] for r in steps]
    mean = lambda k: sum(r[f"time/{k}_s"] for r in steps) / len(steps)  # noqa: E731
    phases = ", ".join(f"{name} {mean(k):.1f} s" for k, name in PHASES)
    reward = [r["train/reward"] for r in steps]
    return (
        f"A step took {min(total):.0f}-{max(total):.0f} s (means: {phases}); one step's training reward ranged "
        f"from {min(reward):.2f} to {max(reward):.2f}."
    )


def write_table(readme: Path) -> None:
    wall_s = json.loads(RUN_INFO.read_text())["wall_s"]
    write_between(readme, BEGIN, END, table(read_jsonl(METRICS), wall_s), "real-model table")
    print(f"wrote the real-model table of {readme} from {METRICS}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", default="runs/real_demo", help="the run (its data in <output_dir>-data/)")
    p.add_argument("--table_only", action="store_true", help="rewrite the table from docs/real_demo_metrics.jsonl")
    p.add_argument("--readme", default=str(ROOT / "README.md"))
    a = p.parse_args()
    if not a.table_only:
        train, held_out = write_data(Path(a.output_dir + "-data"))
        cmd = [sys.executable, "grpo_base.py", *FLAGS, "--dataset", str(train)]
        cmd += ["--eval_benchmarks", f"sums={held_out}", "--output_dir", a.output_dir, "--overwrite"]
        start = time.monotonic()
        subprocess.run(cmd, cwd=ROOT, check=True)
        wall_s = time.monotonic() - start
        shutil.copyfile(Path(a.output_dir) / "metrics.jsonl", METRICS)
        shown = ["python grpo_base.py", *FLAGS, "--dataset", "sums_train.jsonl"]
        shown += ["--eval_benchmarks", "sums=sums_eval.jsonl"]
        RUN_INFO.write_text(json.dumps({"command": " ".join(shown), "wall_s": round(wall_s, 1)}, indent=1) + "\n")
    write_table(Path(a.readme))


if __name__ == "__main__":
    main()
