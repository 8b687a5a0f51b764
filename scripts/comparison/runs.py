"""Running the grid: each (run, seed) trained by its own script, stored, then evaluated at the settings it is read
at. Resumable: a stored run is kept, a run cut short started over. A run's folder, <store>/<run>-seed<S>/, holds
metrics.jsonl, eval_samples.jsonl (each held-out sample's correctness and confidence) and run.json (its settings,
flags, machine and evaluations; written last, the mark of a finished run)."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common.evaluation import RECORDS_FILE
from common.run_dir import read_jsonl, write_jsonl
from scripts.comparison.grid import (
    ABLATIONS,
    BASE,
    BENCH,
    EVAL_TEMPERATURE,
    FLAGS,
    SCRIPT,
    Budget,
    eval_settings,
    label,
    samples_at,
    setting_text,
    settings,
)

ROOT = Path(__file__).resolve().parents[2]
RUN_FILE, METRICS_FILE, SAMPLES_FILE = "run.json", "metrics.jsonl", "eval_samples.jsonl"
# Flags that name this machine's paths or the run's bookkeeping, not what is trained: not stored.
LOCAL_FLAGS = {"dataset", "eval_benchmarks", "output_dir", "overwrite", "resume", "seed"}


def sample_lines(folder: Path, when: str) -> list[dict]:
    """An evaluation's records as the stored samples: whether each was right, and its confidence."""
    return [
        {
            "eval": when,
            "index": rec["index"],
            "correct": [int(c) for c in rec["correct"]],
            "confidence": [None if c is None else round(c, 6) for c in rec["mean_logprob"]],
        }
        for rec in read_jsonl(folder / RECORDS_FILE)
    ]


def run_one(run: str, seed: int, budget: Budget, data: tuple[Path, Path], runs: Path, store: Path) -> None:
    """Train one (run, seed) from scratch and store what the page needs, run.json last; its model stays in `runs`."""
    train, held_out = data
    want = settings(run, seed, budget)
    run_dir = runs / f"{run}-seed{seed}"
    cmd = [sys.executable, SCRIPT[run], "--model", budget.model, "--steps", str(budget.steps), "--seed", str(seed)]
    cmd += [*want["flags"], "--dataset", str(train), "--eval_benchmarks", f"{BENCH}={held_out}"]
    cmd += ["--output_dir", str(run_dir), "--overwrite"]
    print(f"== {run}, seed {seed}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    if (code := subprocess.run(cmd, cwd=ROOT).returncode) != 0:
        raise SystemExit(
            f"error: {SCRIPT[run]}, seed {seed}, failed (exit {code}; its output is above): run the command again to "
            "start that run over; the stored runs are kept"
        )
    wall_s = time.monotonic() - start
    out = store / run_dir.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copyfile(run_dir / METRICS_FILE, out / METRICS_FILE)
    lines = []
    if run != BASE:  # the same seed's BASE run (run first) evaluated the policy before training
        lines = [r for r in read_jsonl(store / f"{BASE}-seed{seed}" / SAMPLES_FILE) if r["eval"] == "before"]
    else:
        lines += sample_lines(run_dir / "eval-step-0", "before")
    lines += sample_lines(run_dir, "after")
    write_jsonl(lines, out / SAMPLES_FILE)
    config = json.loads((run_dir / "run_config.json").read_text())
    flags = {k: v for k, v in config["flags"].items() if k not in LOCAL_FLAGS}
    sizes = {"train": len(read_jsonl(train)), "held_out": len(read_jsonl(held_out))}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    info = want | {"data": sizes, "script_flags": flags, "wall_s": round(wall_s, 1), "commit": commit.strip()}
    info["machine"] = config["history"][0].get("machine")  # CPU, bf16 units, threads, load at start, precision
    (out / RUN_FILE).write_text(json.dumps(info, indent=1) + "\n")
    for checkpoint in run_dir.glob("checkpoint-*"):  # the exported model/ stays, for the other evaluations
        shutil.rmtree(checkpoint)


def evaluate_at(seed: int, pending: list[tuple[str, list]], eval_n: int, held_out: Path, runs: Path, store: Path):
    """Evaluate a seed's kept models at the settings each lacks (`pending`: [(run, settings)]) as the runs evaluated
    themselves, in one process (evaluate_settings.py); store the samples under their label, the setting in run.json.
    An evaluation already in a run directory (a call cut short) is taken."""
    folders = {(r, st): runs / f"{r}-seed{seed}" / "eval-T{}-p{}".format(*st) for r, sts in pending for st in sts}
    lines = []
    for (run, setting), folder in folders.items():
        flags = ["--model", str(folder.parent), "--benchmarks", f"{BENCH}={held_out}", "--seed", str(seed)]
        flags += ["--n", str(samples_at(setting, eval_n)), "--temperature", str(setting[0]), "--top_p", str(setting[1])]
        flags += ["--max_tokens", FLAGS[FLAGS.index("--max_completion_len") + 1], "--output_dir", str(folder)]
        if (folder / RECORDS_FILE).is_file():
            print(f"== {run}, seed {seed}: evaluated at {setting_text(setting)} in {folder}, taken", flush=True)
        else:
            print(f"== {run}, seed {seed}: evaluated at {setting_text(setting)}: {' '.join(flags)}", flush=True)
            lines += ["--", *flags]
    cmd = [sys.executable, "-m", "scripts.comparison.evaluate_settings", *lines]
    if lines and (code := subprocess.run(cmd, cwd=ROOT).returncode) != 0:
        raise SystemExit(f"error: evaluating seed {seed}'s runs failed (exit {code}; its output is above): run again")
    for (run, setting), folder in folders.items():
        out = store / f"{run}-seed{seed}"
        stored = [r for r in read_jsonl(out / SAMPLES_FILE) if r["eval"] != label(setting)]
        write_jsonl(stored + sample_lines(folder, label(setting)), out / SAMPLES_FILE)
        info = json.loads((out / RUN_FILE).read_text())
        evals = info.setdefault("evals", {})
        evals[label(setting)] = {"temperature": setting[0], "top_p": setting[1], "n": samples_at(setting, eval_n)}
        (out / RUN_FILE).write_text(json.dumps(info, indent=1) + "\n")


def rerun(before: list[dict], after: list[dict]) -> str:
    """A rerun's held-out samples against the stored run's, in words: the same answers? how far the confidence moved?"""
    total = sum(len(r["correct"]) for r in before)
    if [r["correct"] for r in after] != [r["correct"] for r in before]:
        differ = sum(a != b for x, y in zip(after, before) for a, b in zip(x["correct"], y["correct"]))
        return f"OTHER answers than the stored run in {differ} of {total} samples (now replaced)"
    moved = [
        abs(a - b)
        for x, y in zip(after, before)
        for a, b in zip(x["confidence"], y["confidence"])
        if None not in (a, b)
    ]
    return f"the same answers, right and wrong, in all {total} samples; confidence within {max(moved, default=0):.1e}"


def missing_evaluations(run: str, seed: int, grid: list, budget: Budget, data: tuple, runs: Path, store: Path) -> list:
    """The settings a stored run lacks. A run whose model is gone is trained again first (seeded: the same run up to
    float rounding, `rerun` says), and then lacks every setting, so that all its samples come from one model."""
    name = f"{run}-seed{seed}"
    done = json.loads((store / name / RUN_FILE).read_text()).get("evals", {})
    missing = [s for s in eval_settings(run, grid, budget) if label(s) not in done]
    if missing and not (runs / name / "model").is_dir():
        print(f"== {run}, seed {seed}: its model is not in {runs / name}: trained again to evaluate it", flush=True)
        before = [r for r in read_jsonl(store / name / SAMPLES_FILE) if r["eval"] == "after"]
        run_one(run, seed, budget, data, runs, store)
        after = [r for r in read_jsonl(store / name / SAMPLES_FILE) if r["eval"] == "after"]
        print(f"== {run}, seed {seed}: trained again; its evaluation at T = {EVAL_TEMPERATURE}: {rerun(before, after)}")
        missing = eval_settings(run, grid, budget)
    return missing


def check_stored(path: Path, run: str, seed: int, budget: Budget) -> None:
    """A stored run made with other settings than asked is refused, naming the fix."""
    want = settings(run, seed, budget)
    stored = {k: v for k, v in json.loads(path.read_text()).items() if k in want}
    if stored != want:
        raise SystemExit(
            f"error: {path.parent} was run with other settings ({stored} here, {want} now): pass --fresh to run "
            "every method again, or --out another folder"
        )


def run_all(grid: list, seeds: list, budget: Budget, runs: Path, store: Path, ablation_seeds: int | None = None):
    """Every (run, seed) not stored yet, seed by seed, then the seed's runs evaluated at the settings they lack; the
    ablations on the first `ablation_seeds` seeds only (None: all)."""
    from scripts.real_model_demo import write_data

    data = write_data(runs / "data", budget.held_out)
    for i, seed in enumerate(seeds):
        pending = []  # evaluated together once the seed's runs are trained: vLLM starts once
        for run in grid:
            if run in ABLATIONS and ablation_seeds is not None and i >= ablation_seeds:
                continue
            done = store / f"{run}-seed{seed}" / RUN_FILE
            if done.is_file():
                check_stored(done, run, seed, budget)
                print(f"== {run}, seed {seed}: stored in {done.parent}, skipped")
            else:
                run_one(run, seed, budget, data, runs, store)
            if missing := missing_evaluations(run, seed, grid, budget, data, runs, store):
                pending.append((run, missing))
        if pending:
            evaluate_at(seed, pending, budget.eval_n, data[1], runs, store)
