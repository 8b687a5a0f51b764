"""The five methods side by side on a real model (issue 26): SmolLM2-135M-Instruct learns two-digit sums with
each of grpo_base, edge_grpo, egpo, cw_grpo and pro_grpo (and, named in --methods, the baselines: dapo,
dr_grpo, gspo, kl_cov from baselines/), the same seeds and budget, evaluated before the first
step and after the last on 100 held-out sums; and the ablations, each method's own script with its idea turned
off at the method's temperature (issue 34). After training, each method's runs and its ablations' are evaluated
again at the paper's own decoding (PAPER_EVAL), GRPO's at those of the methods compared. Then
docs/results_real.md and docs/compare_real.png, from the runs' stored metrics: each paper's claim beside plain
GRPO, with a verdict by the rule the page states, and each method read against its ablation and GRPO, at both.

    python scripts/compare_real.py                 # every (method, seed) run not stored yet, then the page
    python scripts/compare_real.py --render_only   # the page, the figure and the README block from the stored runs
    python scripts/compare_real.py --fresh         # forget the stored runs and run them all again
    python scripts/compare_real.py --methods grpo_base,dapo,egpo   # baselines/ too: DAPO beside EGPO (its Table 1)
    python scripts/compare_real.py --methods grpo_base,edge_grpo,edge_grpo-eda   # an ablation of ABLATIONS

Resumable: a run is done once its result is stored (docs/real_compare/<method>-seed<S>/run.json, written last);
a run cut short is started over (--overwrite), the stored ones are kept. A stored result made with other
settings (model, steps, flags) is refused: --fresh starts over, or --out keeps the new runs apart. A stored run
lacking an evaluation its method needs is evaluated from its model, kept in --runs_dir; a run whose model is gone
is trained again first (seeded, it gives the same answers; it says whether it did, and how far confidences moved).

The task is scripts/real_model_demo.py's (400 training sums, 100 held-out, two worked examples before each
question) with its flags; every method keeps its own defaults otherwise (the page lists where they differ from
grpo_base's). Each held-out sample's confidence is its mean token log-prob, `mean_logprob` of the evaluation
records (common/evaluation.py): minus EGPO's entropy proxy (eq. 5, docs/algorithms/egpo.md) over the whole
completion; at EVAL_TEMPERATURE = 1 it is that proxy under the policy itself, as EGPO trains at T = 1.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.evaluation import RECORDS_FILE, pass_at_k  # noqa: E402
from common.jsonl import read_jsonl, write_jsonl  # noqa: E402
from common.marked_text import write_between  # noqa: E402

METHODS = ("grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo")  # the default set
BASELINES = ("dapo", "dr_grpo", "gspo", "kl_cov", "clip_cov")  # baselines/<name>.py, or a variant of one
# A baseline run by another's script with its variant flag: name -> (script's method, flags).
VARIANTS = {"clip_cov": ("kl_cov", ["--variant", "clip_cov"])}
# Each method against itself with its idea turned off: the same script, temperature and other defaults, so that
# the difference is the idea alone (GRPO's runs differ from a method in its temperature and defaults as well).
# name: (method, the flags that turn the idea off, in words). EGPO has no flag that turns its weighting off.
ABLATIONS = {
    "edge_grpo-off": ("edge_grpo", ["--gec", "off", "--eda", "false"], "GEC and EDA off"),
    "edge_grpo-gec": ("edge_grpo", ["--eda", "false"], "GEC alone (EDA off)"),
    "edge_grpo-eda": ("edge_grpo", ["--gec", "off"], "EDA alone (GEC off)"),
    # Not an ablation: the opt-in stabiliser (a departure from the paper), read beside the method and its ablation.
    "edge_grpo-bound": ("edge_grpo", ["--eda_ratio_bound", "10"], "EDA's P_hat bounded to [0.1, 10]"),
    "cw_grpo-off": ("cw_grpo", ["--cw", "false"], "the kernel off"),
    "pro_grpo-off": ("pro_grpo", ["--alpha", "0"], "the re-weighting off (alpha 0)"),
    "egpo-off": ("egpo", ["--lambda_max", "1", "--lambda_min", "1", "--nsr", "false"], "the weighting and NSR off"),
}
# A partial ablation's part turned off, read as "that part, added to the rest" when the method differs from it.
PART_OFF = {"edge_grpo-gec": "EDA", "edge_grpo-eda": "GEC"}
DEFAULT_ABLATIONS = tuple(ABLATIONS)  # every one, by default
SCRIPT = {m: f"baselines/{VARIANTS.get(m, (m,))[0]}.py" if m in BASELINES else f"{m}.py" for m in METHODS + BASELINES}
SCRIPT |= {a: SCRIPT[m] for a, (m, _, _) in ABLATIONS.items()}
BASE = "grpo_base"
SEEDS = (0, 1, 2, 3, 4)
STEPS = 8
EVAL_N = 8  # samples per held-out sum: pass@1, 2, 4, 8
EVAL_TEMPERATURE = 1.0  # the methods' training T (CW-GRPO's own is 0.7): mean_logprob is then EGPO's proxy itself
# Each paper's own evaluation decoding (temperature, top-p), as each method's page states it under "Evaluation"
# (docs/algorithms/<method>.md): EDGE-GRPO's paper samples at T = 0.1; Pro-GRPO's at 0.6 / 0.95 (its Sec. 4.2);
# CW-GRPO's gives none and follows Open-RS, whose setup samples at 0.6 / 0.95; EGPO's values were lost from its text,
# 0.6 / 0.95 is the project's choice. A method's runs and its ablations' are evaluated there too after training,
# GRPO's at each of them, to be read against.
PAPER_EVAL = {"edge_grpo": (0.1, 1.0), "egpo": (0.6, 0.95), "cw_grpo": (0.6, 0.95), "pro_grpo": (0.6, 0.95)}
# The project's runs each paper compares its method with (its tables), read at that method's setting too: EGPO's
# Table 1 (GRPO, DAPO, EDGE-GRPO), CW-GRPO's Table 2 (GRPO, Clip-Cov), Pro-GRPO's Table 2 (GRPO, GRPO w/ KL-Cov).
COMPARED_WITH = {"egpo": ("dapo", "edge_grpo"), "cw_grpo": ("clip_cov",), "pro_grpo": ("kl_cov",)}
BENCH = "sums"
P1 = "pass1_after"  # the accuracy a method is read by (at EVAL_TEMPERATURE; at its paper's setting: evaluations())
# scripts/real_model_demo.py's flags, less its length and evaluation schedule.
FLAGS = [
    "--few_shot", "2", "--prompts_per_step", "6", "--group_size", "8", "--max_completion_len", "32",
    "--lr", "1e-5", "--micro_batch_size", "8", "--save_minutes", "0",
]  # fmt: skip
STORE, PAGE, FIGURE = "real_compare", "results_real.md", "compare_real.png"  # under --out
RUN_FILE, METRICS_FILE, SAMPLES_FILE = "run.json", "metrics.jsonl", "eval_samples.jsonl"
README_BEGIN = "<!-- real-model comparison: written by scripts/compare_real.py from docs/real_compare/ -->"
README_END = "<!-- end of real-model comparison -->"
# Each ablated method's page (docs/algorithms/<method>.md) carries the reading of its ablation, between these.
READING_BEGIN = "<!-- real-model reading: written by scripts/compare_real.py from docs/real_compare/ -->"
READING_END = "<!-- end of real-model reading -->"
# Flags that name this machine's paths or the run's bookkeeping, not what is trained: left out of the page.
LOCAL_FLAGS = {"dataset", "eval_benchmarks", "output_dir", "overwrite", "resume", "seed"}
BOOKKEEPING = {"eval_before"}  # the comparison's own, not a method's (Setup says who evaluates the policy before)
NAMES = {
    "grpo_base": "GRPO",
    "edge_grpo": "EDGE-GRPO",
    "egpo": "EGPO",
    "cw_grpo": "CW-GRPO",
    "pro_grpo": "Pro-GRPO",
    "dapo": "DAPO",
    "dr_grpo": "Dr. GRPO",
    "gspo": "GSPO",
    "kl_cov": "KL-Cov",
    "clip_cov": "Clip-Cov",
}
NAMES |= {a: f"{NAMES[m]}, {off}" for a, (m, _, off) in ABLATIONS.items()}
COLORS = {
    "grpo_base": "black",
    "edge_grpo": "tab:blue",
    "egpo": "tab:orange",
    "cw_grpo": "tab:green",
    "pro_grpo": "tab:red",
    "dapo": "tab:purple",
    "dr_grpo": "tab:brown",
    "gspo": "tab:pink",
    "kl_cov": "tab:olive",
    "clip_cov": "tab:cyan",
}
COLORS |= {a: COLORS[m] for a, (m, _, _) in ABLATIONS.items()}  # drawn dashed
ORDER = METHODS + BASELINES + tuple(ABLATIONS)
DASH = "–"
ARROW = "→"

# Each paper's claim: (method, what the paper says, the figure that measures it, the direction it claims).
CLAIMS = [
    ("edge_grpo", "GEC gives all-equal groups a signal: fewer groups with zero advantage", "zero_adv", "lower"),
    # GEC's edits enter this figure too (a replaced completion's reward, EDA's P on it): it reads GEC + EDA
    # together; the ablations (ABLATIONS) give each part's advantage variance.
    ("edge_grpo", "GEC + EDA spread the advantages: larger within-group advantage variance", "adv_var", "higher"),
    ("edge_grpo", "higher accuracy", "pass1_after", "higher"),
    ("egpo", "calibration: its confidence separates right from wrong answers better", "auroc_after", "higher"),
    ("egpo", "higher accuracy", "pass1_after", "higher"),
    ("cw_grpo", "stable entropy: a smaller entropy change over training", "entropy_drift", "lower"),
    ("cw_grpo", "higher accuracy", "pass1_after", "higher"),
    ("pro_grpo", "exploration: higher policy entropy", "entropy_late", "higher"),
    ("pro_grpo", "diversity: higher pass@k at the largest k", "passmax_after", "higher"),
    ("pro_grpo", "higher accuracy", "pass1_after", "higher"),
    ("dapo", "higher accuracy", "pass1_after", "higher"),
    ("dr_grpo", "higher accuracy", "pass1_after", "higher"),
    ("gspo", "higher accuracy", "pass1_after", "higher"),
    ("kl_cov", "exploration: higher policy entropy", "entropy_late", "higher"),
    ("kl_cov", "higher accuracy", "pass1_after", "higher"),
    ("clip_cov", "exploration: higher policy entropy", "entropy_late", "higher"),
    ("clip_cov", "higher accuracy", "pass1_after", "higher"),
]
SUPPORTED, CONTRADICTED, UNDECIDED = "supported", "contradicted", "cannot decide at this scale"


# -- the runs ------------------------------------------------------------------------------------------------------


def settings(method: str, seed: int, model: str, steps: int) -> dict:
    """What a stored run was made with; a stored run is reused only under the same."""
    evals = ["--eval_steps", str(steps), "--eval_n", str(EVAL_N), "--eval_temperature", str(EVAL_TEMPERATURE)]
    if method != BASE:  # the policy before training is every method's: evaluated once per seed, in BASE's run
        evals += ["--eval_before", "false"]
    off = ABLATIONS[method][1] if method in ABLATIONS else VARIANTS[method][1] if method in VARIANTS else []
    return {"method": method, "seed": seed, "model": model, "steps": steps, "flags": FLAGS + off + evals}


def own_setting(m: str) -> tuple | None:
    """The paper's evaluation setting of a method, or of the method an ablation turns off (None: it has none here)."""
    return PAPER_EVAL.get(ABLATIONS[m][0] if m in ABLATIONS else m)


def paper_settings(method: str, methods: list) -> list[tuple]:
    """The papers' settings a run is evaluated at after training, besides T = EVAL_TEMPERATURE: its method's own;
    GRPO's at those of every method compared, for each to be read against."""
    if method == BASE:
        return sorted({st for m in methods if (st := own_setting(m))})
    readers = [m for m, others in COMPARED_WITH.items() if method in others and m in methods]
    return sorted({st for m in [method, *readers] if (st := own_setting(m))})


def label(setting: tuple) -> str:
    """The stored samples' name of an evaluation at a paper's setting, and its figures' suffix."""
    return "after-T{}-p{}".format(*setting)


def pass_key(k: int, setting: tuple) -> str:
    """The figure of held-out pass@k after training at a paper's setting."""
    return f"pass{k}_{label(setting)}"


def setting_text(setting: tuple) -> str:
    t, top_p = setting
    return f"T = {t}" + (f", top-p {top_p}" if top_p != 1.0 else "")


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


def run_one(method: str, seed: int, model: str, steps: int, data: tuple[Path, Path], runs: Path, store: Path) -> None:
    """Train one (method, seed) from scratch and store what the page needs; run.json last, as the mark of a
    finished run."""
    train, held_out = data
    want = settings(method, seed, model, steps)
    run_dir = runs / f"{method}-seed{seed}"
    cmd = [sys.executable, SCRIPT[method], "--model", model, "--steps", str(steps), "--seed", str(seed)]
    cmd += [*want["flags"], "--dataset", str(train), "--eval_benchmarks", f"{BENCH}={held_out}"]
    cmd += ["--output_dir", str(run_dir), "--overwrite"]
    print(f"== {method}, seed {seed}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    if (code := subprocess.run(cmd, cwd=ROOT).returncode) != 0:
        raise SystemExit(
            f"error: {SCRIPT[method]}, seed {seed}, failed (exit {code}; its output is above): run the command again to "
            "start that run over; the stored runs are kept"
        )
    wall_s = time.monotonic() - start
    out = store / run_dir.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copyfile(run_dir / METRICS_FILE, out / METRICS_FILE)
    lines = []
    if method != BASE:  # the same seed's BASE run (run first) evaluated the policy before training
        lines = [r for r in read_jsonl(store / f"{BASE}-seed{seed}" / SAMPLES_FILE) if r["eval"] == "before"]
    if method == BASE:
        lines += sample_lines(run_dir / "eval-step-0", "before")
    lines += sample_lines(run_dir, "after")
    write_jsonl(lines, out / SAMPLES_FILE)
    config = json.loads((run_dir / "run_config.json").read_text())
    flags = {k: v for k, v in config["flags"].items() if k not in LOCAL_FLAGS}
    sizes = {"train": len(read_jsonl(train)), "held_out": len(read_jsonl(held_out))}
    info = want | {"data": sizes, "script_flags": flags, "wall_s": round(wall_s, 1)}
    info["machine"] = config["history"][0].get("machine")  # CPU, bf16 units, threads, load at start, precision
    (out / RUN_FILE).write_text(json.dumps(info, indent=1) + "\n")
    for checkpoint in run_dir.glob("checkpoint-*"):  # the exported model/ stays, for evaluations at other settings
        shutil.rmtree(checkpoint)


def evaluate_at(method: str, seed: int, setting: tuple, held_out: Path, runs: Path, store: Path) -> None:
    """Evaluate a stored run's trained model (kept in its run directory) at a paper's setting, as the run evaluated
    it at T = EVAL_TEMPERATURE (the same prompts, samples, length and seed); the samples join the stored ones under
    their label, and run.json records the setting. An evaluation already in the run directory (a call cut short
    before storing it) is taken: the directory is deleted whenever its run is trained again."""
    run_dir, out = runs / f"{method}-seed{seed}", store / f"{method}-seed{seed}"
    folder = run_dir / "eval-T{}-p{}".format(*setting)
    cmd = [sys.executable, "-m", "tools.evaluate", "--model", str(run_dir), "--benchmarks", f"{BENCH}={held_out}"]
    cmd += ["--n", str(EVAL_N), "--temperature", str(setting[0]), "--top_p", str(setting[1]), "--seed", str(seed)]
    cmd += ["--max_tokens", FLAGS[FLAGS.index("--max_completion_len") + 1], "--output_dir", str(folder)]
    if (folder / RECORDS_FILE).is_file():
        print(f"== {method}, seed {seed}: evaluated at {setting_text(setting)} in {folder}, taken", flush=True)
    else:
        print(f"== {method}, seed {seed}: evaluated at {setting_text(setting)}: {' '.join(cmd[1:])}", flush=True)
        if (code := subprocess.run(cmd, cwd=ROOT).returncode) != 0:
            raise SystemExit(
                f"error: evaluating {run_dir} failed (exit {code}; its output is above): run the command again"
            )
    lines = [r for r in read_jsonl(out / SAMPLES_FILE) if r["eval"] != label(setting)]
    lines += sample_lines(folder, label(setting))
    write_jsonl(lines, out / SAMPLES_FILE)
    info = json.loads((out / RUN_FILE).read_text())
    evals = info.setdefault("evals", {})
    evals[label(setting)] = {"temperature": setting[0], "top_p": setting[1], "n": EVAL_N}
    (out / RUN_FILE).write_text(json.dumps(info, indent=1) + "\n")


def rerun(before: list[dict], after: list[dict]) -> str:
    """A rerun's held-out samples against the stored run's, in words: whether each sample is right or wrong as
    before, and how far its confidence moved (the CPU's float reductions need not repeat to the last bit)."""
    if [r["correct"] for r in after] != [r["correct"] for r in before]:
        differ = sum(a != b for x, y in zip(after, before) for a, b in zip(x["correct"], y["correct"]))
        return f"OTHER answers than the stored run in {differ} of {EVAL_N * len(before)} samples (now replaced)"
    moved = [
        abs(a - b)
        for x, y in zip(after, before)
        for a, b in zip(x["confidence"], y["confidence"])
        if None not in (a, b)
    ]
    within = f"confidence within {max(moved, default=0):.1e}"
    return f"the same answers, right and wrong, in all {EVAL_N * len(before)} samples; {within}"


def evaluate_missing(
    method: str, seed: int, methods: list, model: str, steps: int, data: tuple, runs: Path, store: Path
):
    """The paper's settings a stored run lacks, evaluated on its kept model; a run whose model is gone (made before
    these evaluations, or on another machine) is trained again first: seeded, it is the same run up to the CPU's
    float rounding, which the check of its samples at T = EVAL_TEMPERATURE against the stored ones shows (rerun)."""
    name = f"{method}-seed{seed}"
    done = json.loads((store / name / RUN_FILE).read_text()).get("evals", {})
    missing = [s for s in paper_settings(method, methods) if label(s) not in done]
    if missing and not (runs / name / "model").is_dir():
        print(f"== {method}, seed {seed}: its model is not in {runs / name}: trained again to evaluate it", flush=True)
        before = [r for r in read_jsonl(store / name / SAMPLES_FILE) if r["eval"] == "after"]
        run_one(method, seed, model, steps, data, runs, store)
        after = [r for r in read_jsonl(store / name / SAMPLES_FILE) if r["eval"] == "after"]
        print(
            f"== {method}, seed {seed}: trained again; its evaluation at T = {EVAL_TEMPERATURE}: {rerun(before, after)}"
        )
    for setting in missing:
        evaluate_at(method, seed, setting, data[1], runs, store)


def run_all(methods, seeds, model: str, steps: int, runs: Path, store: Path) -> None:
    """Every (method, seed) whose result is not stored yet, seed by seed (a cut-short comparison has every method),
    then each run's evaluations at the papers' settings."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from real_model_demo import write_data

    data = write_data(runs / "data")
    for seed in seeds:
        for method in methods:
            done = store / f"{method}-seed{seed}" / RUN_FILE
            if done.is_file():
                stored = {
                    k: v for k, v in json.loads(done.read_text()).items() if k in settings(method, seed, model, steps)
                }
                if stored != settings(method, seed, model, steps):
                    raise SystemExit(
                        f"error: {done.parent} was run with other settings ({stored} here, "
                        f"{settings(method, seed, model, steps)} now): pass --fresh to run every method again, "
                        "or --out another folder"
                    )
                print(f"== {method}, seed {seed}: stored in {done.parent}, skipped")
            else:
                run_one(method, seed, model, steps, data, runs, store)
            evaluate_missing(method, seed, methods, model, steps, data, runs, store)


# -- the figures of a run ------------------------------------------------------------------------------------------


def auroc(scores: list, labels: list) -> float | None:
    """Area under the ROC curve of `scores` for telling labels 1 from 0: the chance that a random positive scores
    above a random negative, a tie counting 1/2 (Mann-Whitney U over mid-ranks). None (undefined) when every label
    is the same; a None score is left out."""
    pairs = [(s, y) for s, y in zip(scores, labels) if s is not None]
    pos = sum(1 for _, y in pairs if y)
    neg = len(pairs) - pos
    if pos == 0 or neg == 0:
        return None
    pairs.sort(key=lambda p: p[0])
    rank_sum, i = 0.0, 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        mid = (i + 1 + j) / 2  # the mean of ranks i+1 .. j
        rank_sum += mid * sum(1 for _, y in pairs[i:j] if y)
        i = j
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def verdict(method: list, base: list, direction: str) -> str:
    """The page's rule: supported when every seed of the method lies beyond every seed of GRPO on the claimed
    side, contradicted when every seed lies beyond on the other side, else it cannot be decided at this scale
    (also when a figure is undefined)."""
    if not method or not base or any(v is None for v in method + base):
        return UNDECIDED
    sign = 1 if direction == "higher" else -1
    if min(sign * v for v in method) > max(sign * v for v in base):
        return SUPPORTED
    if max(sign * v for v in method) < min(sign * v for v in base):
        return CONTRADICTED
    return UNDECIDED


def mean(vs: list) -> float | None:
    vs = [v for v in vs if v is not None]
    return sum(vs) / len(vs) if vs else None


def run_figures(rows: list[dict], samples: list[dict], info: dict) -> dict:
    """One run's figures: per-step curves and the scalars of the page."""
    steps = info["steps"]
    by_step = {r["step"]: r for r in rows}
    train = [by_step[s] for s in range(1, steps + 1)]
    # The policy's own accuracy: EDGE-GRPO's train/accuracy counts the answers GEC put in.
    acc = [r["train/accuracy"] if r.get("gec/rollout_accuracy") is None else r["gec/rollout_accuracy"] for r in train]
    entropy = [r["train/entropy"] for r in train]
    # Zero advantage: a group whose rewards are all equal, but for EGPO's all-wrong groups (NSR trains them).
    zero_adv = [r["train/zero_adv_group_frac"] - (r.get("egpo/nsr_group_frac") or 0.0) for r in train]
    half = steps // 2
    early, late = mean(entropy[:half] or entropy[:1]), mean(entropy[steps - half :] or entropy[-1:])
    out = {
        "acc": acc,
        "entropy": entropy,
        "zero_adv_curve": zero_adv,
        "adv_var_curve": [r["train/adv_var_within_group"] for r in train],
        "step_s_curve": [r["time/step_s"] for r in train],
        "acc_mean": mean(acc),
        "entropy_late": late,
        "entropy_drift": abs(late - early) / early if early else None,
        "entropy_change": (late - early) / early if early else None,
        "zero_adv": mean(zero_adv),
        "adv_var": mean([r["train/adv_var_within_group"] for r in train]),
        "step_s": mean([r["time/step_s"] for r in train]),
        "wall_s": info["wall_s"],
    }
    # then each evaluation at a paper's setting, under its label()
    for when in ["before", "after"] + sorted({s["eval"] for s in samples} - {"before", "after"}):
        recs = [s for s in samples if s["eval"] == when]
        out[f"problems_{when}"] = len(recs)
        n = min(len(s["correct"]) for s in recs)
        out[f"ks_{when}"] = [k for k in (2**i for i in range(n.bit_length())) if k <= n]
        for k in out[f"ks_{when}"]:
            out[f"pass{k}_{when}"] = mean([pass_at_k(len(s["correct"]), sum(s["correct"]), k) for s in recs])
        out[f"passmax_{when}"] = out[f"pass{out[f'ks_{when}'][-1]}_{when}"]
        flat_conf = [c for s in recs for c in s["confidence"]]
        flat_correct = [y for s in recs for y in s["correct"]]
        out[f"auroc_{when}"] = auroc(flat_conf, flat_correct)
        scored = [y for c, y in zip(flat_conf, flat_correct) if c is not None]
        out[f"right_{when}"], out[f"wrong_{when}"] = sum(scored), len(scored) - sum(scored)
    out |= mechanism_figures(train, info)
    # The eval logged in metrics.jsonl, for the check that the stored samples are that evaluation's.
    # (Only BASE's runs log the evaluation before training: None in the others.)
    out["logged_pass1"] = (by_step.get(0, {}).get(f"eval/{BENCH}/pass@1"), by_step[steps].get(f"eval/{BENCH}/pass@1"))
    return out


def logged(rows: list[dict], key: str) -> list[float]:
    """The steps' values of a metric, the steps that did not log it (or logged null) left out."""
    return [r[key] for r in rows if r.get(key) is not None]


def mechanism_figures(train: list[dict], info: dict) -> dict:
    """What each idea did to the update, over the steps: the gradient norm before clipping (every script); for
    EDGE-GRPO what GEC edited and fixed, what share of sum |A| its insertions carried, their entropy P against
    every completion's, the largest |A_hat|; for CW-GRPO the kernel's weight on the top 1% of |covariance|.
    None where the run did not log it."""
    flags = info["flags"]
    samples = int(flags[flags.index("--prompts_per_step") + 1]) * int(flags[flags.index("--group_size") + 1])
    gec_on = info.get("script_flags", {}).get("gec", "off") != "off"  # with GEC off its counts are 0, not measured
    edits = [sum(r[f"gec/{b}"] for b in ("reflection", "injection", "replacement")) for r in train if "gec/fixed" in r]
    edits = edits if gec_on else []
    reflections = sum(logged(train, "gec/reflection"))
    largest = logged(train, "edge/adv_abs_max")
    return {
        "grad_norm": mean(logged(train, "train/grad_norm")),
        "grad_norm_max": max(logged(train, "train/grad_norm"), default=None),
        "gec_edited": sum(edits) / (samples * len(edits)) if edits else None,
        "reflections": reflections if edits else None,
        "reflections_fixed": sum(logged(train, "gec/reflection_fixed")) if edits else None,
        "adv_share_injected": mean(logged(train, "edge/adv_share_injected")) if edits else None,
        "P_injected": mean(logged(train, "edge/entropy_P_injected")),
        "P_all": mean(logged(train, "edge/entropy_P")),
        "adv_abs_max": max(largest, default=None),
        "cw_top_share": mean(logged(train, "cw/cov_top1pct_share")),
        "cw_top_weight": mean(logged(train, "cw/cov_top1pct_weight")),
    }


def load(store: Path) -> tuple[dict, dict]:
    """({method: {seed: figures}}, {method: {seed: run.json}}) of every stored run, methods in METHODS' order."""
    figures, infos = {}, {}
    for path in sorted(store.glob(f"*/{RUN_FILE}")):
        info = json.loads(path.read_text())
        rows = read_jsonl(path.parent / METRICS_FILE)
        samples = read_jsonl(path.parent / SAMPLES_FILE)
        figures.setdefault(info["method"], {})[info["seed"]] = run_figures(rows, samples, info)
        infos.setdefault(info["method"], {})[info["seed"]] = info
    if BASE not in figures:
        raise SystemExit(f"error: {store} holds no {BASE} run: run `python scripts/compare_real.py` first")
    order = [m for m in ORDER if m in figures]
    return {m: figures[m] for m in order}, {m: infos[m] for m in order}


# -- the page ------------------------------------------------------------------------------------------------------


def seeds_of(runs: dict, key: str) -> list:
    """A figure over the seeds, None where a run lacks it (not evaluated there)."""
    return [runs[s].get(key) for s in sorted(runs)]


def fmt(v, digits: int = 3) -> str:
    return "undefined" if v is None else f"{v:.{digits}f}"


def cell(vs: list, digits: int = 3) -> str:
    """mean (min–max over seeds); one seed: its value."""
    if any(v is None for v in vs):
        return " / ".join(fmt(v, digits) for v in vs) + " (per seed)"
    if len(vs) == 1:
        return fmt(vs[0], digits)
    return f"{fmt(mean(vs), digits)} ({fmt(min(vs), digits)}{DASH}{fmt(max(vs), digits)})"


def method_defaults(infos: dict) -> list[str]:
    """The flags in which a method's runs differ from grpo_base's (its own defaults)."""
    base = infos[BASE][min(infos[BASE])]["script_flags"]
    lines = []
    for m, runs in infos.items():
        if m == BASE:
            continue
        flags = {k: v for k, v in runs[min(runs)]["script_flags"].items() if k not in BOOKKEEPING}
        diff = [f"`--{k} {flags[k]}` ({base[k]})" for k in flags if k in base and flags[k] != base[k]]
        own = [f"`--{k} {flags[k]}`" for k in flags if k not in base]
        lines.append(f"- {NAMES[m]} (`{SCRIPT[m]}`): " + "; ".join(diff + own))
    return lines


def evaluations(m: str, figures: dict) -> list[tuple[str, str]]:
    """(figure, in words) of each held-out pass@1 a run is read by: at T = EVAL_TEMPERATURE, and at its paper's
    setting once every seed of its runs, and GRPO's of the same seeds, were evaluated there."""
    out = [(P1, f"T = {EVAL_TEMPERATURE}")]
    key = pass_key(1, own) if (own := own_setting(m)) else None
    if key and all(key in f and key in figures[BASE].get(s, {}) for s, f in figures[m].items()):
        out.append((key, f"the paper's setting, {setting_text(own)}"))
    return out


def claims(figures: dict) -> list[tuple]:
    """(method, claim, figure key, direction, the method's seeds, GRPO's seeds, verdict) of the stored methods; an
    accuracy claim is read at T = EVAL_TEMPERATURE and again at the paper's own evaluation setting."""
    out = []
    for m, text, key, direction in CLAIMS:
        if m not in figures:
            continue
        for k, where in evaluations(m, figures) if key == P1 else [(key, "")]:
            mine, base = seeds_of(figures[m], k), seeds_of(figures[BASE], k)
            if k != key:  # at the paper's setting: GRPO's seeds evaluated there (every seed of the method's was)
                base = logged_seeds(figures[BASE], k)[1]
            said = f"{text}, at {where}" if k != key else text
            out.append((m, said, k, direction, mine, base, verdict(mine, base, direction)))
    return out


KEY_NAMES = {
    "zero_adv": "groups with zero advantage, mean over steps",
    "adv_var": "within-group advantage variance, mean over steps",
    "pass1_after": "held-out pass@1 after training",
    "auroc_after": "AUROC of the confidence for right vs wrong, held-out, after training",
    "entropy_drift": "|relative entropy change|, first half of the steps to the second",
    "entropy_late": "policy entropy, mean over the second half of the steps",
}


def fell_line(figures: dict) -> str:
    """Which runs end below the policy they started from (held-out pass@1, the same seed's evaluation before)."""
    fell = [
        f"{NAMES[m]} seed {seed} ({fmt(figures[BASE][seed]['pass1_before'])} {ARROW} {fmt(f['pass1_after'])})"
        for m, runs in figures.items()
        for seed, f in runs.items()
        if seed in figures[BASE] and f["pass1_after"] < figures[BASE][seed]["pass1_before"]
    ]
    if not fell:
        return "that every run ends above its start in held-out pass@1"
    return "where training lost ground: held-out pass@1 ended below its start in " + ", ".join(fell)


def key_name(key: str, figures: dict) -> str:
    if at := [s for s in PAPER_EVAL.values() if key == pass_key(1, s)]:
        return f"held-out pass@1 after training, at {setting_text(at[0])}"
    if key == "passmax_after":
        k = next(iter(next(iter(figures.values())).values()))["ks_after"][-1]
        return f"held-out pass@{k} after training"
    return KEY_NAMES[key]


def readme_block(figures: dict, infos: dict, docs: str = "docs") -> str:
    """The README's lines: the links, and each claim's verdict. docs: the page's folder, from the README's."""
    rows = [
        f"[{docs}/{PAGE}]({docs}/{PAGE}), figure [{docs}/{FIGURE}]({docs}/{FIGURE}). The claims' verdicts:",
        "",
        "| method | claim | verdict |",
        "|---|---|---|",
    ]
    rows += [f"| {NAMES[m]} | {text} | {v} |" for m, text, _, _, _, _, v in claims(figures)]
    if groups := ablation_groups(figures):
        rows += [
            "",
            "Each method against its own script with the idea turned off (the page's section on ablations):",
            "",
        ]
        rows += [f"- **{NAMES[m]}** {reading(m, group, figures, infos)}" for m, group in groups.items()]
    return "\n".join(rows)


def shared(figures: dict, a: str, b: str, key: str) -> tuple[list, list]:
    """Two runs' figure over the seeds both have it, seed by seed."""
    seeds = [
        s
        for s in sorted(set(figures[a]) & set(figures[b]))
        if None not in (figures[a][s].get(key), figures[b][s].get(key))
    ]
    return [figures[a][s][key] for s in seeds], [figures[b][s][key] for s in seeds]


def compared(figures: dict, a: str, b: str, key: str = P1) -> str:
    """The page's rule on the seeds both runs have ('higher': every seed of a above every seed of b); two seeds
    at least, else it cannot decide."""
    x, y = shared(figures, a, b, key)
    return verdict(x, y, "higher") if len(x) >= 2 else UNDECIDED


def relation(v: str, whose: str, pairs: tuple[list, list] | None = None) -> str:
    """A verdict in words. pairs: the two runs' figure over the seeds evaluated in both; fewer than 2 are not
    compared. One within the seeds' spread says whether each seed still lies on one side of the same seed's (the
    same prompts in the same order: a direction, not a difference the rule can tell)."""
    if v in (SUPPORTED, CONTRADICTED):
        return f"{'higher' if v == SUPPORTED else 'lower'} than {whose}"
    x, y = pairs or ([], [])
    if pairs is not None and len(x) < 2:
        return (
            f"not compared with {whose} ({len(x)} seed{'' if len(x) == 1 else 's'} evaluated in both; the rule needs 2)"
        )
    side = {"lower": all(a < b for a, b in zip(x, y)), "higher": all(a > b for a, b in zip(x, y))}
    seed_by_seed = [f" ({word} in each of the {len(x)} seeds, seed by seed)" for word, yes in side.items() if yes]
    return f"within the seeds' spread of {whose}" + (seed_by_seed[0] if seed_by_seed and len(x) >= 2 else "")


def per_seed(vs: list, digits: int = 3) -> str:
    return ", ".join(fmt(v, digits) for v in vs)


def other_settings(m: str, infos: dict) -> str:
    """The flags in which a method's own defaults differ from GRPO's (its idea's flags and the comparison's
    bookkeeping left out): what an ablation keeps and GRPO does not."""
    base, flags = (infos[r][min(infos[r])]["script_flags"] for r in (BASE, m))
    diff = [f"--{k} {flags[k]}" for k in flags if k in base and flags[k] != base[k] and k not in BOOKKEEPING]
    return ", ".join(diff) or "none"


def cause_of(whole: str, idea: str, rest: str, settings: str) -> str:
    """What a method's held-out pass@1 against GRPO comes with. whole: the method against GRPO, idea: against its
    ablation, rest: the ablation against GRPO (each a verdict of 'higher'); settings: the other flags, in words."""
    part = {SUPPORTED: "gains", CONTRADICTED: "costs"}
    said = [f"the idea {part[idea]} accuracy" if idea in part else "the idea's effect is within the seeds' spread"]
    plural = {SUPPORTED: "gain", CONTRADICTED: "cost"}
    said.append(
        f"its other settings ({settings}) {plural[rest]} accuracy"
        if rest in part
        else f"its other settings' ({settings}) effect is within the seeds' spread"
    )
    line = "; ".join(said) + " at this scale"
    if whole in part:
        word = "gain" if whole == SUPPORTED else "loss"
        with_it = [name for name, v in (("the idea", idea), ("its other settings", rest)) if v == whole]
        line += f". Its {word} against GRPO comes with " + (" and ".join(with_it) if with_it else "neither alone")
    return line


def ablation_groups(figures: dict) -> dict:
    """{method: [its ablation with the whole idea off, its other stored ablations]} for the methods with the first."""
    return {
        m: [f"{m}-off"] + [a for a, (of, _, _) in ABLATIONS.items() if of == m and a in figures and a != f"{m}-off"]
        for m in METHODS
        if m in figures and f"{m}-off" in figures
    }


def reading(m: str, group: list, figures: dict, infos: dict) -> str:
    """One sentence on a method's held-out pass@1 against GRPO, its own ablation, and that ablation against GRPO,
    and what it comes with (cause_of); then each partial ablation against the whole one."""
    full, *parts = group
    off, t, base = ABLATIONS[full][2], infos[m][min(infos[m])]["script_flags"]["temperature"], f"{NAMES[BASE]}'s"
    line = f"(trained at T = {t})."
    for key, where in evaluations(m, figures):
        pairs = [shared(figures, *pair, key) for pair in ((m, BASE), (m, full), (full, BASE))]
        whole, idea, rest = (compared(figures, *pair, key) for pair in ((m, BASE), (m, full), (full, BASE)))
        line += (
            f" Evaluated at {where}: held-out pass@1 {relation(whole, base, pairs[0])}, and "
            f"{relation(idea, 'its own with ' + off, pairs[1])}; that ablation's is {relation(rest, base, pairs[2])}."
        )
        if all(len(x) >= 2 for x, _ in pairs):  # else a part is not compared: no cause to read
            line += f" So {cause_of(whole, idea, rest, other_settings(m, infos))}."
    for a in parts:
        at = [(key, where) for key, where in evaluations(m, figures) if shared(figures, a, full, key)[0]]
        for i, (key, where) in enumerate(at):  # the evaluations the part has (its seeds evaluated there)
            rel = relation(compared(figures, a, full, key), "that with " + off, shared(figures, a, full, key))
            told = compared(figures, m, a, key)
            mine = relation(told, "it", shared(figures, m, a, key))
            line += f" With {ABLATIONS[a][2]}, at {where}, pass@1 is " if i == 0 else f"; at {where}, it is "
            line += f"{rel}, and {NAMES[m]}'s is {mine}"
            part = {SUPPORTED: "gains", CONTRADICTED: "costs"}.get(told)
            line += f" ({PART_OFF[a]}, added to the rest, {part} accuracy)" if part and a in PART_OFF else ""
        line += "."
    return line


def ablation_section(figures: dict, infos: dict) -> list[str]:
    """Each method beside its ablations and GRPO: accuracy, what reads the idea apart from the method's other
    settings, and the mechanism's own figures (EDGE-GRPO's GEC and EDA, CW-GRPO's kernel)."""
    groups = ablation_groups(figures)
    temp = {m: infos[m][min(infos[m])]["script_flags"]["temperature"] for m in figures}
    L = []
    add = L.append
    add("## Each method against its own ablation")
    add("")
    add(
        "A method's runs above differ from GRPO's in its idea and also in its other defaults (Setup). Each "
        "ablation runs the method's own script with the idea turned off and every other flag kept: the method "
        "against its ablation reads the idea alone, the ablation against GRPO the rest. The same evaluations as "
        f"above (held-out pass@1 after the last step, at T = {EVAL_TEMPERATURE} for all, and at the paper's own "
        "setting for the method, its ablations and GRPO); a comparison uses the seeds both runs have and reads "
        "'higher' or 'lower' only when every seed of one lies beyond every seed of the other (two seeds at least). "
        "The ablations:"
    )
    add("")
    for abl in groups.values():
        for a in abl:
            add(f"- {NAMES[a]}: `{SCRIPT[a]} {' '.join(ABLATIONS[a][1])}`, {seeds_text({a: infos[a]})}")
    add("")
    at = sorted({e for m in groups for e in evaluations(m, figures)[1:]})  # the papers' settings evaluated
    add(
        f"| run | training T | held-out pass@1 after, T = {EVAL_TEMPERATURE} | "
        + "".join(f"at {where} | " for _, where in at)
        + "training accuracy | advantage variance | gradient norm before clipping: mean | largest, per seed |"
    )
    add("|---|---|---|" + "---|" * len(at) + "---|---|---|---|")
    for m in [BASE] + [r for of, abl in groups.items() for r in (of, *abl)]:
        runs = figures[m]
        paper = [seeds_cell(runs, key) for key, _ in at]
        add(
            f"| {NAMES[m]} | {temp[m]} | {cell(seeds_of(runs, P1))} | {''.join(c + ' | ' for c in paper)}"
            f"{cell(seeds_of(runs, 'acc_mean'))} | {cell(seeds_of(runs, 'adv_var'))} "
            f"| {cell(seeds_of(runs, 'grad_norm'), 2)} | {per_seed(seeds_of(runs, 'grad_norm_max'), 1)} |"
        )
    add("")
    add("| comparison | evaluated at | first, per seed | second, per seed | the first's held-out pass@1 is |")
    add("|---|---|---|---|---|")
    for m, abl in groups.items():
        for first, second in [(m, BASE)] + [(m, a) for a in abl] + [(a, BASE) for a in abl]:
            for key, where in evaluations(m, figures):
                x, y = shared(figures, first, second, key)
                rel = relation(compared(figures, first, second, key), f"{NAMES[second]}'s", (x, y))
                if x:  # a pair with no seed evaluated in both is left out
                    add(f"| {NAMES[first]} against {NAMES[second]} | {where} | {per_seed(x)} | {per_seed(y)} | {rel} |")
    add("")
    add("What the ablations say, read off the table above:")
    add("")
    for m in groups:
        add(f"- **{NAMES[m]}** {reading(m, groups[m], figures, infos)}")
    add("")
    if "edge_grpo" in groups:
        L.extend(edge_mechanism(figures, infos, groups["edge_grpo"]))
    if "cw_grpo" in groups:
        L.extend(cw_mechanism(figures, groups["cw_grpo"]))
    return L


def total(vs: list) -> str:
    """A count summed over seeds; 'not logged' when a seed lacks it."""
    return "not logged" if any(v is None for v in vs) else f"{sum(vs):.0f}"


def edge_mechanism(figures: dict, infos: dict, ablations: list) -> list[str]:
    """GEC's edits and EDA's scaling, in EDGE-GRPO's runs and its ablations."""
    flags = infos["edge_grpo"][min(infos["edge_grpo"])]["flags"]
    group = int(flags[flags.index("--group_size") + 1])
    L = ["### EDGE-GRPO: what GEC and EDA did", ""]
    add = L.append
    add(
        "Per run, over its steps: the share of completions GEC edited (every wrong answer: continued after a "
        "reflection with p = 0.5, given the right answer with p = 0.25, swapped for the reference solution with "
        "p = 0.25); the reflections that ended in a right answer, summed over seeds; the share of the step's sum "
        "|A| that the completions ending in inserted text (answer or solution) carried; the entropy P (eq. 3) of "
        "those completions and of all; the largest |A| of any step, per seed. '-': GEC off."
    )
    add("")
    add(
        "| run | completions edited | reflections that fixed the answer | insertions' share of sum \\|A\\| "
        "| P, insertions / all | largest \\|A\\|, per seed |"
    )
    add("|---|---|---|---|---|---|")
    for m in ("edge_grpo", *ablations):
        runs = figures[m]
        gec_on = all(f["gec_edited"] is not None for f in runs.values())
        shares = seeds_cell(runs, "adv_share_injected")
        shares = "not logged" if shares == "-" else shares  # runs made before edge/adv_share_injected existed
        fixed = f"{total(seeds_of(runs, 'reflections_fixed'))} of {total(seeds_of(runs, 'reflections'))}"
        P = cell(seeds_of(runs, "P_injected")) if gec_on else "-"
        P += f" / {cell(seeds_of(runs, 'P_all'))}"
        row = [cell(seeds_of(runs, "gec_edited")), fixed, shares] if gec_on else ["-", "-", "-"]
        add(f"| {NAMES[m]} | {' | '.join(row)} | {P} | {per_seed(seeds_of(runs, 'adv_abs_max'), 2)} |")
    add("")
    add(
        f"GRPO's |A| is at most (G - 1) / sqrt(G) = {(group - 1) / group**0.5:.2f} at G = {group}; EDA divides it "
        "by P_i / mean_group(P) (eq. 7), without a bound."
    )
    add("")
    return L


def logged_seeds(runs: dict, key: str) -> tuple[list, list]:
    """(the seeds whose run logged `key`, their values)."""
    seeds = [s for s in sorted(runs) if runs[s].get(key) is not None]
    return seeds, [runs[s][key] for s in seeds]


def seeds_cell(runs: dict, key: str) -> str:
    """cell() over the seeds that have the figure, those named when not all; '-' when none has it."""
    seeds, vs = logged_seeds(runs, key)
    if not seeds:
        return "-"
    return cell(vs) + (f" ({seed_list(seeds)})" if len(seeds) < len(runs) else "")


def cw_mechanism(figures: dict, ablations: list) -> list[str]:
    """The kernel's weight on the tokens of extreme covariance, with it on and (computed, not applied) off."""
    L = ["### CW-GRPO: what the kernel did", ""]
    add = L.append
    add(
        "Per step, over the groups with a signal: the 1% of tokens with the largest |covariance| between "
        "log-prob and advantage (Sec. 2.3), their share of the sum of |covariance|, and the mean kernel weight "
        "on them (1: kept as GRPO keeps them; with the kernel off the weight is computed, not applied); the mean "
        "over the steps:"
    )
    add("")
    add("| run | top 1%'s share of sum \\|covariance\\| | their mean weight | gradient norm before clipping, mean |")
    add("|---|---|---|---|")
    for m in ("cw_grpo", *ablations):
        runs = figures[m]
        add(
            f"| {NAMES[m]} | {cell(seeds_of(runs, 'cw_top_share'))} | {cell(seeds_of(runs, 'cw_top_weight'))} "
            f"| {cell(seeds_of(runs, 'grad_norm'), 2)} |"
        )
    add("")
    on, off = (mean(shared(figures, "cw_grpo", "cw_grpo-off", "grad_norm")[i]) for i in (0, 1))
    if on is not None and off:
        add(
            f"Over the seeds both have, the gradient norm before clipping averaged {on:.2f} with the kernel and "
            f"{off:.2f} without it ({on / off:.0%}): although its weights average 1 over a group's tokens, the "
            "gradients with them were that fraction of the gradients without."
        )
        add("")
    return L


def seed_list(seeds: list) -> str:
    """'seed 2', 'seeds 0, 1'."""
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def seeds_text(infos: dict) -> str:
    """'seeds 0, 1, 2', and the runs with fewer named."""
    every = sorted({s for runs in infos.values() for s in runs})
    fewer = {m: sorted(runs) for m, runs in infos.items() if sorted(runs) != every}
    line = seed_list(every)
    if fewer:
        line += " (" + "; ".join(f"{NAMES[m]}: {', '.join(map(str, ss))}" for m, ss in fewer.items()) + ")"
    return line


def setup_section(figures: dict, infos: dict, all_infos: dict) -> list[str]:
    """What was run, on what, and how it was evaluated."""
    base_info = infos[BASE][min(infos[BASE])]
    steps, model, flags = base_info["steps"], base_info["model"], base_info["flags"]
    first = figures[BASE][min(figures[BASE])]
    n_methods = len(figures)
    L = []
    add = L.append
    add("## Setup")
    add("")
    add(
        f"- Model `--model {model}`; {n_methods} methods, {seeds_text(infos)}, {steps} steps each; "
        f"the task of `scripts/real_model_demo.py`: {base_info['data']['train']} training sums "
        f'"What is a + b?" (a, b in 0..99), {base_info["data"]["held_out"]} held-out sums never trained on.'
    )
    add(f"- Every run: `{' '.join(flags)}` (the same data, seeds and budget for all).")
    add(
        "- Every method keeps its own defaults otherwise. Where they differ from GRPO's "
        "(grpo_base's value in brackets):"
    )
    L.extend("  " + line for line in method_defaults(infos))
    n, temp = flags[flags.index("--eval_n") + 1], flags[flags.index("--eval_temperature") + 1]
    add(
        f"- Evaluation before the first step and after the last on the {first['problems_after']} held-out sums, "
        f"{n} samples each at T = {temp} for every method; pass@k unbiased (Chen et al. 2021). The policy before "
        "training is the same for every method: it is evaluated once per seed, in GRPO's run, and its samples "
        'serve every method\'s "before".'
    )
    if own := {m: st for m in all_infos if (st := own_setting(m))}:
        done = {m: [s for s, i in all_infos[m].items() if label(own[m]) in i.get("evals", {})] for m in own}
        evaluated = [
            f"{NAMES[m]} at {setting_text(own[m])} ({seed_list(done[m])})"
            for m in own
            if m not in ABLATIONS and done[m]
        ]
        not_yet = [f"{NAMES[m]} ({setting_text(own[m])})" for m in own if not done[m]]
        add(
            "- After training, a method's runs (and its ablations') are evaluated again at its paper's own decoding, "
            "and GRPO's at each of these, with the same prompts, samples, length and seed (each method's page, "
            "Evaluation, says where its setting comes from): "
            + ("; ".join(evaluated) or "none yet")
            + (f". Not evaluated there yet: {', '.join(not_yet)}" if not_yet else "")
            + f". These evaluations load the run's saved model; at T = {EVAL_TEMPERATURE} that path gives the run's "
            "own evaluation's samples to the bit."
        )
    add(
        "- Each held-out sample's confidence is its mean token log-prob under logits / T over the whole completion, "
        "the stop token included: minus EGPO's entropy proxy H_i (eq. 5, [algorithms/egpo.md](algorithms/egpo.md), "
        "`--entropy_span response`, its default). AUROC: the chance that a right sample is more confident than a "
        "wrong one, ties 1/2, over all held-out samples of a run; undefined when all are right or all wrong."
    )
    add(
        "- Each cell: the mean over seeds and, in brackets, the smallest and largest seed; a figure undefined "
        "in some seed is given per seed."
    )
    add("")
    return L


def held_out_section(figures: dict, infos: dict) -> list[str]:
    """Held-out pass@k before and after training, and at each paper's own evaluation setting."""
    steps = infos[BASE][min(infos[BASE])]["steps"]
    ks = figures[BASE][min(figures[BASE])]["ks_after"]
    L = []
    add = L.append
    add("## Held-out pass@k")
    add("")
    for when, title in (("before", "before the first step"), ("after", f"after step {steps}")):
        add(f"{title.capitalize()}:")
        add("")
        add("| method | " + " | ".join(f"pass@{k}" for k in ks) + " |")
        add("|---|" + "---|" * len(ks))
        for m, runs in figures.items():
            add(f"| {NAMES[m]} | " + " | ".join(cell(seeds_of(runs, f"pass{k}_{when}")) for k in ks) + " |")
        add("")
    if own := [
        (m, st)
        for m in figures
        if (st := own_setting(m)) and any(label(st) in i.get("evals", {}) for i in infos[m].values())
    ]:
        add(f"After step {steps}, at each paper's own evaluation setting, beside GRPO's at the same:")
        add("")
        add(f"| method | setting | pass@1 | GRPO's pass@1 | pass@{ks[-1]} | GRPO's pass@{ks[-1]} |")
        add("|---|---|---|---|---|---|")
        for m, st in own:
            one, most = pass_key(1, st), pass_key(ks[-1], st)
            add(
                f"| {NAMES[m]} | {setting_text(st)} | {seeds_cell(figures[m], one)} | {seeds_cell(figures[BASE], one)} "
                f"| {seeds_cell(figures[m], most)} | {seeds_cell(figures[BASE], most)} |"
            )
        add("")
    return L


def training_section(figures: dict, infos: dict) -> list[str]:
    """Training accuracy by step, entropy and the advantage signal."""
    steps, flags = (infos[BASE][min(infos[BASE])][k] for k in ("steps", "flags"))
    L = []
    add = L.append
    add("## Training")
    add("")
    add(
        "Training accuracy is the policy's own (for EDGE-GRPO before GEC's edits, `gec/rollout_accuracy`), "
        f"on its {flags[flags.index('--prompts_per_step') + 1]} x {flags[flags.index('--group_size') + 1]} "
        "samples a step at its own temperature. By step (mean over seeds):"
    )
    add("")
    add("| method | " + " | ".join(str(s) for s in range(1, steps + 1)) + " |")
    add("|---|" + "---|" * steps)
    for m, runs in figures.items():
        curves = [runs[s]["acc"] for s in sorted(runs)]
        add(f"| {NAMES[m]} | " + " | ".join(fmt(mean(list(col)), 2) for col in zip(*curves)) + " |")
    add("")
    add(
        "Policy entropy (`train/entropy`, nats per token under logits / T: at the method's own temperature) and "
        "the advantage signal, each the mean over the steps unless named otherwise. Groups with zero advantage: "
        "`train/zero_adv_group_frac` (all rewards equal; for EDGE-GRPO after GEC) less EGPO's all-wrong groups, "
        "which NSR trains (`egpo/nsr_group_frac`). The entropy change compares the mean of the first half of the "
        "steps with the second's."
    )
    add("")
    cols = [
        ("training accuracy", "acc_mean"),
        ("entropy, second half", "entropy_late"),
        ("entropy change", "entropy_change"),
        ("zero-advantage groups", "zero_adv"),
        ("advantage variance", "adv_var"),
    ]
    add("| method | " + " | ".join(c for c, _ in cols) + " |")
    add("|---|" + "---|" * len(cols))
    for m, runs in figures.items():
        add(f"| {NAMES[m]} | " + " | ".join(cell(seeds_of(runs, k)) for _, k in cols) + " |")
    add("")
    return L


def calibration_section(figures: dict) -> list[str]:
    """AUROC of the confidence, and the samples right / wrong."""
    L = []
    add = L.append
    add("## Calibration")
    add("")
    add("AUROC of the sequence confidence for right vs wrong held-out samples, and the samples right / wrong:")
    add("")
    add("| method | AUROC before | AUROC after | right / wrong before | right / wrong after |")
    add("|---|---|---|---|---|")
    for m, runs in figures.items():
        counts = [
            ", ".join(f"{runs[s][f'right_{w}']} / {runs[s][f'wrong_{w}']}" for s in sorted(runs))
            for w in ("before", "after")
        ]
        add(
            f"| {NAMES[m]} | {cell(seeds_of(runs, 'auroc_before'))} | {cell(seeds_of(runs, 'auroc_after'))} | "
            f"{counts[0]} | {counts[1]} |"
        )
    add("")
    return L


def cost_section(figures: dict) -> list[str]:
    """Wall time per step and per run, and the ratio to GRPO."""
    L = []
    add = L.append
    add("## Cost")
    add("")
    lo, hi = min(seeds_of(figures[BASE], "step_s")), max(seeds_of(figures[BASE], "step_s"))
    add(
        "Wall time per step (`time/step_s`: rollout, GEC, scoring, update and sync; the evaluations not counted), "
        "the mean over the steps, and its ratio to GRPO's mean over the seeds both have; the run's whole wall time, the model's loading "
        "and its evaluations included (GRPO's run has one more: the policy before training). The runs ran one "
        f"after another on 2 CPU cores whose speed and load vary between runs: GRPO's own seeds took {lo:.1f} to "
        f"{hi:.1f} s / step for work of one size. Read the ratio, not the seconds."
    )
    add("")
    add("| method | s / step | x GRPO | run wall time (min) |")
    add("|---|---|---|---|")
    for m, runs in figures.items():
        mine, base = shared(figures, m, BASE, "step_s")
        ratio = mean(mine) / mean(base)
        add(
            f"| {NAMES[m]} | {cell(seeds_of(runs, 'step_s'), 1)} | {ratio:.2f} | "
            f"{cell([w / 60 for w in seeds_of(runs, 'wall_s')], 1)} |"
        )
    add("")
    return L


def claims_section(figures: dict, everything: dict, all_infos: dict) -> list[str]:
    """Each claim's verdict by the page's rule, and the cause of a contradicted accuracy claim."""
    L = []
    add = L.append
    add("## The papers' claims")
    add("")
    add(
        "Each claim is read off one figure in the direction the paper claims, and judged by a fixed rule: "
        f"**{SUPPORTED}** when every seed of the method lies beyond every seed of GRPO on the claimed side, "
        f"**{CONTRADICTED}** when every seed lies beyond GRPO's on the other side, otherwise (the ranges overlap, "
        f"or a figure is undefined) **{UNDECIDED}**. The comparison uses the unrounded figures."
    )
    add("")
    add("| method | claim | figure | claimed | method, per seed | GRPO, per seed | verdict |")
    add("|---|---|---|---|---|---|---|")
    for m, text, key, direction, mine, base, v in claims(figures):
        per = lambda vs: ", ".join(fmt(x) for x in vs)  # noqa: E731
        add(f"| {NAMES[m]} | {text} | {key_name(key, figures)} | {direction} | {per(mine)} | {per(base)} | {v} |")
    add("")
    counts = {v: sum(c[-1] == v for c in claims(figures)) for v in (SUPPORTED, CONTRADICTED, UNDECIDED)}
    add(
        f"Of {len(claims(figures))} claims: {counts[SUPPORTED]} supported, {counts[CONTRADICTED]} contradicted, "
        f"{counts[UNDECIDED]} undecided."
    )
    add("")
    groups = ablation_groups(everything)
    accuracy = {k: where for m in groups for k, where in evaluations(m, everything)}
    why = [(m, k) for m, _, k, _, _, _, v in claims(figures) if v == CONTRADICTED and k in accuracy and m in groups]
    if why:
        add(
            "Where accuracy is contradicted, the method against its own ablation "
            "([next section](#each-method-against-its-own-ablation)):"
        )
        add("")
        for m, k in why:
            full = groups[m][0]
            whole, idea, rest = (compared(everything, *pair, k) for pair in ((m, BASE), (m, full), (full, BASE)))
            add(f"- **{NAMES[m]}**, at {accuracy[k]}: {cause_of(whole, idea, rest, other_settings(m, all_infos))}.")
        add("")
    return L


def scale_section(figures: dict, infos: dict, everything: dict) -> list[str]:
    """What this scale can and cannot show."""
    base_info = infos[BASE][min(infos[BASE])]
    steps, model, flags = base_info["steps"], base_info["model"], base_info["flags"]
    first = figures[BASE][min(figures[BASE])]
    L = []
    add = L.append
    add("## What this scale can and cannot show")
    add("")
    base_p1 = seeds_of(figures[BASE], "pass1_after")
    n_samples = first["right_after"] + first["wrong_after"]
    temps = {m: runs[min(runs)]["script_flags"]["temperature"] for m, runs in infos.items()}
    other_t = [f"{NAMES[m]} (T = {temp})" for m, temp in temps.items() if temp != temps[BASE]]
    if len(base_p1) > 1:
        at = [
            f"{max(vs) - min(vs):.3f} at {setting_text(st)} ({len(vs)} seeds)"
            for st in sorted(set(PAPER_EVAL.values()))
            if len(vs := logged_seeds(figures[BASE], pass_key(1, st))[1]) > 1
        ]
        seeds_line = (
            f"GRPO's own {len(base_p1)} seeds end {max(base_p1) - min(base_p1):.3f} apart in held-out pass@1 "
            + (f"at T = {EVAL_TEMPERATURE} ({', '.join(at)}) " if at else "")
            + f"({n_samples} samples each): a method's difference from GRPO smaller than the seeds' spread cannot be "
            f"told from chance here. With {len(base_p1)} seeds a range is those seeds themselves: 'supported' means "
            "every seed of the method beat every seed of GRPO, not a significant effect."
        )
    else:
        seeds_line = "One seed: no spread to judge a difference by; every verdict is one run against one run."
    add(
        f"`--model {model}`, {steps} steps of {flags[flags.index('--prompts_per_step') + 1]} prompts. {seeds_line} "
        "What it can show: whether each mechanism moves its own figure (zero-advantage groups, advantage "
        f"variance, entropy, the confidence's ranking) on this model, at what cost per step, and {fell_line(everything)}. "
        "What it cannot: the papers' gains on their benchmarks, which come from hundreds of "
        "steps on larger models with long reasoning; sums answered in one line leave little room for the entropy "
        "and confidence signals these methods act on."
        + (
            f" {', '.join(other_t)} sample{'s' if len(other_t) == 1 else ''} at another temperature than GRPO's "
            f"(T = {temps[BASE]}) in training, so their training accuracy and entropy are not measured at the same "
            f"T; the held-out evaluation at T = {EVAL_TEMPERATURE} is the same for all."
            if other_t
            else ""
        )
    )
    add("")
    return L


def page(everything: dict, all_infos: dict) -> str:
    """The page: the methods beside GRPO, then each method beside its own ablations."""
    figures = {m: f for m, f in everything.items() if m not in ABLATIONS}
    infos = {m: i for m, i in all_infos.items() if m not in ABLATIONS}
    L = []
    add = L.append
    add("# The five methods side by side on a real model")
    add("")
    add(
        "Written by `python scripts/compare_real.py` from the runs stored in [real_compare/](real_compare/) "
        "(`--render_only` writes it again from them); nothing here is typed by hand. Figure: "
        "[compare_real.png](compare_real.png)."
    )
    add("")
    L.extend(setup_section(figures, infos, all_infos))
    L.extend(held_out_section(figures, infos))
    L.extend(training_section(figures, infos))
    L.extend(calibration_section(figures))
    L.extend(cost_section(figures))
    L.extend(claims_section(figures, everything, all_infos))
    if ablation_groups(everything):
        L.extend(ablation_section(everything, all_infos))
    L.extend(scale_section(figures, infos, everything))
    return "\n".join(L)


# -- the figure ----------------------------------------------------------------------------------------------------


def draw(figures: dict, model: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    curves = [
        ("acc", "Training accuracy (policy's own)", "fraction correct"),
        ("entropy", "Policy entropy", "nats per token"),
        ("zero_adv_curve", "Groups with zero advantage", "fraction of groups"),
        ("adv_var_curve", "Within-group advantage variance", "variance"),
    ]
    for ax, (key, title, ylabel) in zip(axes[0], curves):
        for m, runs in figures.items():
            cols = list(zip(*[runs[s][key] for s in sorted(runs)]))
            x = list(range(1, len(cols) + 1))
            ax.plot(x, [mean(list(c)) for c in cols], color=COLORS[m], label=NAMES[m])
            ax.fill_between(x, [min(c) for c in cols], [max(c) for c in cols], color=COLORS[m], alpha=0.15)
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax = axes[1][0]
    for m, runs in figures.items():
        ks = runs[min(runs)]["ks_after"]
        for when, style in (("before", ":"), ("after", "-")):
            vals = [seeds_of(runs, f"pass{k}_{when}") for k in ks]
            ax.errorbar(
                ks, [mean(v) for v in vals], yerr=[[mean(v) - min(v) for v in vals], [max(v) - mean(v) for v in vals]],
                color=COLORS[m], linestyle=style, marker="o", ms=3, capsize=2, alpha=1 if when == "after" else 0.5,
            )  # fmt: skip
    ax.set_xscale("log", base=2)
    ks = figures[BASE][min(figures[BASE])]["ks_after"]
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set(title="Held-out pass@k (dotted: before, solid: after)", xlabel="k", ylabel="pass@k")
    bars = [
        (axes[1][1], ("auroc_before", "auroc_after"), "AUROC of confidence, right vs wrong", "AUROC (before | after)"),
        (axes[1][2], ("step_s",), "Wall time per step", "seconds"),
        (axes[1][3], ("pass1_before", "pass1_after"), "Held-out pass@1", "pass@1 (before | after)"),
    ]
    for ax, keys, title, ylabel in bars:
        width = 0.8 / len(keys)
        for i, m in enumerate(figures):
            for j, key in enumerate(keys):
                every = seeds_of(figures[m], key)
                vs = [v for v in every if v is not None]  # an AUROC is undefined where all were right or all wrong
                x = i + (j - (len(keys) - 1) / 2) * width
                if len(vs) < len(every):
                    note = f"undefined in {len(every) - len(vs)} of {len(every)} seeds"
                    ax.text(
                        x,
                        0.02,
                        note,
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        transform=ax.get_xaxis_transform(),
                    )
                if not vs:
                    continue
                ax.bar(
                    x, mean(vs), width, yerr=[[mean(vs) - min(vs)], [max(vs) - mean(vs)]], capsize=2,
                    color=COLORS[m], alpha=0.45 if j < len(keys) - 1 else 0.9,
                )  # fmt: skip
        ax.set_xticks(range(len(figures)), [NAMES[m] for m in figures], rotation=20)
        ax.set(title=title, ylabel=ylabel)
    axes[1][1].axhline(0.5, color="grey", lw=0.8, ls="--")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"Five methods on --model {model}: mean over seeds, band / bars: min-max (AUROC: the seeds where it is defined)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


# -- writing -------------------------------------------------------------------------------------------------------


def reading_block(m: str, figures: dict, infos: dict) -> str:
    """A method page's lines: the reading of its ablation, and where the tables are."""
    steps = infos[BASE][min(infos[BASE])]["steps"]
    return (
        f"On `--model {infos[BASE][min(infos[BASE])]['model']}`, two-digit sums, {steps} steps "
        f"([results_real.md](../{PAGE}#each-method-against-its-own-ablation), the runs in "
        f"[real_compare/](../{STORE}/)): **{NAMES[m]}** {reading(m, ablation_groups(figures)[m], figures, infos)}"
    )


def write_readings(out: Path, figures: dict, infos: dict) -> None:
    """Each ablated method's reading into its page under out/algorithms/ (when that folder is there)."""
    for m in ablation_groups(figures):
        path = out / "algorithms" / f"{m}.md"
        if not path.parent.is_dir():
            continue
        write_between(path, READING_BEGIN, READING_END, reading_block(m, figures, infos), "real-model reading")


def write_readme(readme: Path, figures: dict, infos: dict, out: Path) -> None:
    docs = Path(os.path.relpath(out.resolve(), readme.resolve().parent)).as_posix()
    write_between(readme, README_BEGIN, README_END, readme_block(figures, infos, docs), "real-model comparison")


def render(out: Path, readme: Path | None) -> None:
    figures, infos = load(out / STORE)
    (out / PAGE).write_text(page(figures, infos))
    main = {m: f for m, f in figures.items() if m not in ABLATIONS}
    draw(main, infos[BASE][min(infos[BASE])]["model"], out / FIGURE)
    write_readings(out, figures, infos)
    if readme is not None:
        write_readme(readme, figures, infos, out)
    print(f"wrote {out / PAGE} and {out / FIGURE}" + (f", and the comparison block of {readme}" if readme else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="the model every run trains (tiny: the CPU demo's, for a check)")
    p.add_argument("--steps", type=int, default=STEPS, help="steps of every run")
    p.add_argument(
        "--methods",
        default=",".join(METHODS + BASELINES + DEFAULT_ABLATIONS),
        help=f"comma-separated scripts (grpo_base among them; or {', '.join(BASELINES)}), or ablations: "
        + ", ".join(f"{a} ({NAMES[a]})" for a in ABLATIONS),
    )
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds")
    p.add_argument("--runs_dir", default="runs/compare_real", help="the run directories and the data")
    p.add_argument("--out", default=str(ROOT / "docs"), help=f"where {STORE}/, {PAGE} and {FIGURE} go")
    p.add_argument(
        "--readme", default=str(ROOT / "README.md"), help="README whose comparison block is written ('' for none)"
    )
    p.add_argument("--render_only", action="store_true", help="only write the page, the figure and the README block")
    p.add_argument("--fresh", action="store_true", help="delete the stored runs first and run them all again")
    a = p.parse_args()
    methods = [m for m in a.methods.split(",") if m]
    unknown = [m for m in methods if m not in SCRIPT]
    if unknown or BASE not in methods:
        raise SystemExit(f"error: --methods takes {', '.join(SCRIPT)}, {BASE} among them (got {a.methods!r})")
    methods = [m for m in ORDER if m in methods]  # BASE first: its run evaluates the policy first
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"error: --seeds takes comma-separated whole numbers such as 0,1 (got {a.seeds!r})") from None
    if a.steps < 1:
        raise SystemExit(f"error: --steps must be at least 1 (got {a.steps})")
    out, readme = Path(a.out), Path(a.readme) if a.readme else None
    if not a.render_only:
        if a.fresh and (out / STORE).exists():
            shutil.rmtree(out / STORE)
        run_all(methods, seeds, a.model, a.steps, Path(a.runs_dir), out / STORE)
    render(out, readme)


if __name__ == "__main__":
    main()
