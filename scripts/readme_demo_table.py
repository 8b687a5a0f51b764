"""Write the README's CPU-demo table from runs of `python grpo_base.py --eval_steps 10 --seed S` over several seeds
and thread counts (scripts/compare_demo.sh runs them): each cell is the range over the runs, `lo–hi`, since another
CPU or thread count rounds a kernel differently and the run diverges as under another seed. The runs' figures are
kept in docs/demo_runs.json (tests/test_learning.py holds the table to them).

    python scripts/readme_demo_table.py runs/compare_demo/grpo_base_seed0_t1 ... [--readme README.md]
    python scripts/readme_demo_table.py --results_demo   # docs/results_demo.md from docs/demo_compare/
"""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.stored_run import write_between  # noqa: E402
from common.run_dir import read_jsonl  # noqa: E402

BEGIN = "<!-- demo table: written by scripts/readme_demo_table.py from docs/demo_runs.json -->"
RUNS = Path(__file__).resolve().parent.parent / "docs" / "demo_runs.json"
DOCS = Path(__file__).resolve().parent.parent / "docs"
COMPARED = DOCS / "demo_compare"  # one folder per script: its run's metrics.jsonl, eval_results.json, run_config.json
RESULTS_PAGE = DOCS / "results_demo.md"
SCRIPTS = ("grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo")
MARK = "<!-- demo table:"  # BEGIN's start: the marker line is rewritten whole
END = "<!-- end of demo table -->"
STEPS = (0, 10, 20, 30)
DASH = "–"  # lo–hi


def values(rows: list[dict]) -> tuple[list, list]:
    """(training accuracy, eval pass@1) of one run at STEPS; step 0 has no training yet: step 1's accuracy."""
    by_step = {r["step"]: r for r in rows}
    train = [by_step.get(max(s, 1), {}).get("train/accuracy") for s in STEPS]
    evals = [by_step.get(s, {}).get("eval/synthetic/pass@1") for s in STEPS]
    return train, evals


def cell(vs: list) -> str:
    vs = [v for v in vs if v is not None]
    if not vs:
        return "-"
    # rounded outward: the printed range holds every kept run (tests/test_learning.py's check)
    lo, hi = f"{math.floor(min(vs) * 100 + 1e-9) / 100:.2f}", f"{math.ceil(max(vs) * 100 - 1e-9) / 100:.2f}"
    return lo if lo == hi else f"{lo}{DASH}{hi}"


def listed(values: list) -> str:
    """[2, 0, 1, 0] -> '0, 1, 2'."""
    return ", ".join(str(v) for v in sorted(set(values)))


def table(runs: list[dict]) -> str:
    """The markdown table of kept runs ({"seed", "threads", "train", "eval"} each)."""
    train = [cell([r["train"][i] for r in runs]) for i in range(len(STEPS))]
    evals = [cell([r["eval"][i] for r in runs]) for i in range(len(STEPS))]
    over = f"seeds {listed([r['seed'] for r in runs])} × {listed([r['threads'] for r in runs])} threads"
    return "\n".join(
        [
            f"| step (range over {over}) | " + " | ".join(str(s) for s in STEPS) + " |",
            "|---|" + "---|" * len(STEPS),
            "| training accuracy (T = 1, 128 samples; step 1 for 0) | " + " | ".join(train) + " |",
            "| eval pass@1 on the 100 sums (T = 0.6, 4 samples each) | " + " | ".join(evals) + " |",
        ]
    )


def parse_cell(text: str) -> tuple[float, float] | None:
    """'0.48–0.55' -> (0.48, 0.55); '0.99' -> (0.99, 0.99); '-' -> None."""
    if text == "-":
        return None
    lo, _, hi = text.partition(DASH)
    return float(lo), float(hi or lo)


def results_page(stored: Path = COMPARED) -> str:
    """docs/results_demo.md: where and how the five runs were made (their run_config.json), then their final
    evaluations (`tools.plot`'s table)."""
    from tools.plot import results_table
    from tools.run_logs import read_eval

    runs = [stored / s for s in SCRIPTS]
    launches = [json.loads((run / "run_config.json").read_text())["history"][0] for run in runs]
    machines = {(m["cpu"], m["cores"], m["threads"]) for m in (launch["machine"] for launch in launches)}
    loads = [launch["machine"]["load_1min"] for launch in launches]
    where = "; ".join(f"{cpu}, {cores} cores, {threads} torch threads" for cpu, cores, threads in sorted(machines))
    head = [
        "# The five scripts on the CPU demo",
        "",
        f"Written by `python scripts/readme_demo_table.py --results_demo` from the runs stored in "
        f"`docs/demo_compare/` (`bash scripts/compare_demo.sh` makes them): each script's `--seed 0 --steps 30 "
        f"--eval_steps 10` (`python grpo_base.py --seed 0 --steps 30 --eval_steps 10` and the four others alike), "
        f"each on {where}, at 1-minute load averages {min(loads):.1f}-{max(loads):.1f} "
        "(not timings: a run's figures do not depend on the load; [what moves them](GUIDE.md#the-cpu-demo)). "
        "Each run's final evaluation on the 100 sums; its curves: [compare_demo.png](compare_demo.png).",
        "",
    ]
    return "\n".join(head) + "\n" + results_table({run.name: read_eval(run) for run in runs})


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", help="the seed runs' directories (RUN_DIR ...): the README's demo table")
    p.add_argument("--readme", default=str(Path(__file__).resolve().parent.parent / "README.md"), help="its page")
    p.add_argument("--results_demo", action="store_true", help=f"write {RESULTS_PAGE.name} from {COMPARED} instead")
    a = p.parse_args()
    if a.results_demo:
        RESULTS_PAGE.write_text(results_page())
        return print(f"wrote {RESULTS_PAGE} from {COMPARED}")
    if not a.runs:
        p.error("give the runs' directories, or --results_demo")
    runs = [kept(Path(run)) for run in a.runs]
    RUNS.write_text("[\n" + ",\n".join(json.dumps(r) for r in runs) + "\n]\n")  # a run a line
    write_between(Path(a.readme), BEGIN, END, table(runs), "demo-table", find=MARK)
    print(f"wrote {RUNS} and the demo table of {a.readme} from {len(runs)} runs")


def kept(run: Path) -> dict:
    """What the table keeps of a run: its seed and torch threads (run_config.json) and its figures at STEPS."""
    config = json.loads((run / "run_config.json").read_text())
    train, evals = values(read_jsonl(run / "metrics.jsonl", skip_torn_last_line=True))
    return {"seed": config["flags"]["seed"], "threads": config["history"][0]["threads"], "train": train, "eval": evals}


if __name__ == "__main__":
    main()
