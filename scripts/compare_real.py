"""The methods and the baselines side by side on a real model: SmolLM2-135M-Instruct learns sums with each of
grpo_base, edge_grpo, egpo, cw_grpo and pro_grpo, the baselines dapo, dr_grpo, gspo, kl_cov and clip_cov, and each
method's ablations (its own script with its idea turned off), on the same data, seeds and budget; each run is
evaluated before its first step and after its last on 100 held-out sums, then again at its own evaluation setting
(and at those of the methods that read it). Then docs/results_real.md, docs/compare_real.png, the README's
verdict table and each method page's comparisons, from the stored runs, read by Student's t over the seeds' paired
differences, the primary family (each run against GRPO at T = 1) Holm-adjusted (scripts/comparison/stats.py).

    python scripts/compare_real.py                 # every run not stored yet (hours on CPU), then the page
    python scripts/compare_real.py --render_only   # the page, the figure and the README block from the stored runs
    python scripts/compare_real.py --methods grpo_base,dapo,egpo --seeds 0,1   # a part of the grid
    python scripts/compare_real.py --fresh         # forget the stored runs and run them all again

Resumable: a run is done once its result is stored (docs/real_compare/<run>-seed<S>/run.json, written last); a run
cut short is started over, the stored ones are kept. A stored result made with other settings (model, steps, flags)
is refused: --fresh starts over, or --out keeps the new runs apart. A stored run lacking an evaluation is evaluated
from its model, kept in --runs_dir; a run whose model is gone is trained again first (seeded, it gives the same
answers; it says whether it did). The parts: scripts/comparison/ (grid: what runs; runs: running and storing;
figures: a run's figures; stats and verdicts: the paired estimates; design: the coverage and the detectable
difference; page, details, plot: the writing).
"""

import argparse
import os
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.stored_run import write_between  # noqa: E402
from scripts.comparison.figures import load  # noqa: E402
from scripts.comparison.grid import (  # noqa: E402
    ABLATIONS,
    BASE,
    BASELINES,
    METHODS,
    NAMES,
    ORDER,
    REFERENCE,
    REGIMES,
    ROWS,
    SCRIPT,
    STEPS,
)
from scripts.comparison.page import (  # noqa: E402
    FIGURE,
    PAGE,
    PRIMARY,
    STORE,
    method_block,
    page,
    readme_block,
    runs_of,
)
from scripts.comparison.plot import draw  # noqa: E402
from scripts.comparison.runs import run_all  # noqa: E402
from scripts.comparison.verdicts import Reader, comparisons  # noqa: E402

README_BEGIN = "<!-- real-model comparison: written by scripts/compare_real.py from docs/real_compare/ -->"
README_END = "<!-- end of real-model comparison -->"
# Each compared method's page (docs/algorithms/<method>.md) carries its comparisons, between these.
READING_BEGIN = "<!-- real-model reading: written by scripts/compare_real.py from docs/real_compare/ -->"
READING_END = "<!-- end of real-model reading -->"


def task_text() -> str:
    """The task in words, from the held-out sums themselves (scripts/real_model_demo.py's data)."""
    from scripts.real_model_demo import held_out_rows

    operands = [tuple(map(int, re.findall(r"\d+", r["problem"]))) for r in held_out_rows()]
    small = sum(min(pair) < 10 for pair in operands)
    return (
        f'sums "What is a + b?" with a and b whole numbers from 0 to 99 ({small} of the {len(operands)} held-out '
        "sums have a one-digit operand), each prompt with two worked examples"
    )


def compared_methods(figures: dict) -> list[str]:
    """The methods whose page carries a comparison block: those with an ablation or a paper's baseline stored."""
    firsts = {a for a, _ in comparisons(figures)}
    return [m for m in METHODS if m in firsts and m != BASE]


def stored(out: Path) -> tuple[dict, dict, tuple | None]:
    """The on-policy grid's (figures, infos), and the primary regime's once its GRPO has a run (else None)."""
    figures, infos = load(out / STORE)
    return figures, infos, load(out / PRIMARY.store) if any((out / PRIMARY.store).glob(f"{BASE}-seed*")) else None


def render(out: Path, readme: Path | None) -> None:
    figures, infos, primary = stored(out)
    (out / PAGE).write_text(page(figures, infos, task_text(), primary))
    draw(Reader(figures), runs_of(figures), infos[BASE][min(infos[BASE])]["model"], out / FIGURE)
    if (out / "algorithms").is_dir():
        for m in compared_methods(figures):
            path = out / "algorithms" / f"{m}.md"
            write_between(path, READING_BEGIN, READING_END, method_block(m, figures, infos), "real-model reading")
    if readme is not None:
        docs = Path(os.path.relpath(out.resolve(), readme.resolve().parent)).as_posix()
        write_between(
            readme, README_BEGIN, README_END, readme_block(figures, infos, docs, primary), "real-model comparison"
        )
    print(f"wrote {out / PAGE} and {out / FIGURE}" + (f", and the comparison block of {readme}" if readme else ""))


def parse_grid(methods: str, seeds: str) -> tuple[list[str], list[int]]:
    runs = [m for m in methods.split(",") if m]
    unknown = [m for m in runs if m not in SCRIPT]
    if unknown or BASE not in runs:
        raise SystemExit(f"error: --methods takes {', '.join(SCRIPT)}, {BASE} among them (got {methods!r})")
    try:
        seed_list = [int(s) for s in seeds.split(",")]
    except ValueError:
        raise SystemExit(f"error: --seeds takes comma-separated whole numbers such as 0,1 (got {seeds!r})") from None
    return [m for m in ORDER if m in runs], seed_list  # BASE first: its run evaluates the policy first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="the model every run trains (tiny: the CPU demo's, for a check)")
    p.add_argument(
        "--regime",
        choices=REGIMES,
        default="primary",
        help="primary: 4 optimiser steps per rollout, 10 seeds, 300 held-out sums x 4 samples (the page's first "
        "table); on_policy: one step per rollout, 5 seeds, 100 sums x 8 (the stored first grid)",
    )
    p.add_argument("--steps", type=int, default=STEPS, help="steps of every run")
    p.add_argument(
        "--eval_n", type=int, help="samples per held-out sum (default: the regime's; fewer: a quick check of the grid)"
    )
    p.add_argument(
        "--methods",
        help=f"comma-separated runs (default: the regime's), {BASE} among them: methods ({', '.join(METHODS)}), baselines "
        f"({', '.join(BASELINES)}), {REFERENCE} (TRL's GRPOTrainer as {BASE}) or ablations: "
        + ", ".join(f"{a} ({NAMES[a]})" for a in ABLATIONS),
    )
    p.add_argument("--seeds", help="comma-separated seeds (default: the regime's; its ablations on the first 5)")
    p.add_argument("--runs_dir", help="the run directories (with their models), the data (default: runs/<store>)")
    p.add_argument("--out", default=str(ROOT / "docs"), help=f"where {STORE}/, {PAGE} and {FIGURE} go")
    p.add_argument(
        "--readme", default=str(ROOT / "README.md"), help="README whose comparison block is written ('' for none)"
    )
    p.add_argument("--render_only", action="store_true", help="only write the page, the figure and the README block")
    p.add_argument("--fresh", action="store_true", help="delete the stored runs first and run them all again")
    a = p.parse_args()
    regime = REGIMES[a.regime]
    methods = a.methods or ",".join((*ROWS, *regime.ablations))
    grid, seeds = parse_grid(methods, a.seeds or ",".join(map(str, regime.seeds)))
    budget = replace(regime.budget, model=a.model, steps=a.steps, eval_n=a.eval_n or regime.budget.eval_n)
    for flag, value in (("--steps", budget.steps), ("--eval_n", budget.eval_n)):
        if value < 1:
            raise SystemExit(f"error: {flag} must be at least 1 (got {value})")
    out, readme = Path(a.out), Path(a.readme) if a.readme else None
    if not a.render_only:
        store = out / regime.store
        if a.fresh and store.exists():
            shutil.rmtree(store)
        runs = Path(a.runs_dir or f"runs/{regime.store}")
        run_all(grid, seeds, budget, runs, store, regime.ablation_seeds if a.seeds is None else None)
    render(out, readme)


if __name__ == "__main__":
    main()
