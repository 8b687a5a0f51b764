"""Write the README's CPU-demo table from a run of `python grpo_base.py --eval_steps 10` (scripts/compare_demo.sh
runs it). The table sits between the two marker lines below; tests/test_learning.py holds it to a fresh run.

    python scripts/readme_demo_table.py runs/compare_demo/grpo_base [README.md]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.jsonl import read_jsonl  # noqa: E402

BEGIN = (
    "<!-- demo table: written by scripts/readme_demo_table.py from a run of `python grpo_base.py --eval_steps 10` -->"
)
END = "<!-- end of demo table -->"
STEPS = (0, 10, 20, 30)


def table(rows: list[dict]) -> str:
    by_step = {r["step"]: r for r in rows}
    train = [by_step.get(max(s, 1), {}).get("train/accuracy") for s in STEPS]  # step 0 has no training yet: step 1
    evals = [by_step.get(s, {}).get("eval/synthetic/pass@1") for s in STEPS]
    cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    return "\n".join(
        [
            "| step | " + " | ".join(str(s) for s in STEPS) + " |",
            "|---|" + "---|" * len(STEPS),
            "| training accuracy (T = 1, 128 samples; step 1 for 0) | " + " | ".join(map(cell, train)) + " |",
            "| eval pass@1 on the 100 sums (T = 0.6, 4 samples each) | " + " | ".join(map(cell, evals)) + " |",
        ]
    )


def main() -> None:
    run = Path(sys.argv[1])
    readme = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parent.parent / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"error: {readme} has no demo-table markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(
        f"{head}{BEGIN}\n{table(read_jsonl(run / 'metrics.jsonl', skip_torn_last_line=True))}\n{END}{tail}"
    )
    print(f"wrote the demo table of {readme} from {run}")


if __name__ == "__main__":
    main()
