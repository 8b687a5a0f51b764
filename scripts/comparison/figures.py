"""A stored run's figures: per-step curves, held-out pass@k (per problem, for the paired statistics, and their
mean), the confidence's AUROC, and what each method's mechanism did to the update."""

import json
from pathlib import Path

from common.evaluation import pass_at_k
from common.run_dir import read_jsonl
from scripts.comparison.grid import BASE, BENCH, ORDER
from scripts.comparison.runs import METRICS_FILE, RUN_FILE, SAMPLES_FILE


def mean(vs: list) -> float | None:
    vs = [v for v in vs if v is not None]
    return sum(vs) / len(vs) if vs else None


def auroc(scores: list, labels: list) -> float | None:
    """AUROC of `scores` for labels 1 vs 0, ties 1/2 (Mann-Whitney U over mid-ranks); None when every label is the
    same; None scores left out."""
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


def evaluation_figures(recs: list[dict], when: str) -> dict:
    """One evaluation's figures: pass@k per problem and their mean for k = 1, 2, 4, ..., AUROC, samples right/wrong."""
    recs = sorted(recs, key=lambda r: r["index"])
    n = min(len(s["correct"]) for s in recs)
    out = {f"problems_{when}": len(recs), f"ks_{when}": [k for k in (2**i for i in range(n.bit_length())) if k <= n]}
    for k in out[f"ks_{when}"]:
        per_problem = [pass_at_k(len(s["correct"]), sum(s["correct"]), k) for s in recs]
        out[f"pass{k}_{when}_problems"] = per_problem
        out[f"pass{k}_{when}"] = mean(per_problem)
    largest = out[f"ks_{when}"][-1]
    out[f"passmax_{when}"] = out[f"pass{largest}_{when}"]
    out[f"passmax_{when}_problems"] = out[f"pass{largest}_{when}_problems"]
    flat_conf = [c for s in recs for c in s["confidence"]]
    flat_correct = [y for s in recs for y in s["correct"]]
    out[f"auroc_{when}"] = auroc(flat_conf, flat_correct)
    scored = [y for c, y in zip(flat_conf, flat_correct) if c is not None]
    out[f"right_{when}"], out[f"wrong_{when}"] = sum(scored), len(scored) - sum(scored)
    return out


def run_figures(rows: list[dict], samples: list[dict], info: dict) -> dict:
    """One run's figures: per-step curves, the scalars of the page, and each evaluation's (evaluation_figures)."""
    steps = info["steps"]
    by_step = {r["step"]: r for r in rows}
    train = [by_step[s] for s in range(1, steps + 1)]
    # The policy's own accuracy over everything it sampled: EDGE-GRPO's train/accuracy counts the answers GEC put in,
    # DAPO's only the groups its dynamic sampling kept.
    own = ("gec/rollout_accuracy", "dapo/sampled_accuracy", "train/accuracy")
    acc = [next(r[k] for k in own if r.get(k) is not None) for r in train]
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
        "reward_curve": [r["train/reward"] for r in train],
        "grad_norm_curve": [r["train/grad_norm"] for r in train],
        "acc_mean": mean(acc),
        "entropy_late": late,
        "entropy_drift": abs(late - early) / early if early else None,
        "entropy_change": (late - early) / early if early else None,
        "zero_adv": mean(zero_adv),
        "adv_var": mean([r["train/adv_var_within_group"] for r in train]),
        "step_s": mean([r["time/step_s"] for r in train]),
        "wall_s": info["wall_s"],
    }
    for when in ["before", "after"] + sorted({s["eval"] for s in samples} - {"before", "after"}):
        out |= evaluation_figures([s for s in samples if s["eval"] == when], when)
    out |= mechanism_figures(train, info)
    # For the check that the stored samples are the logged evaluation's (only BASE's runs log step 0).
    out["logged_pass1"] = (by_step.get(0, {}).get(f"eval/{BENCH}/pass@1"), by_step[steps].get(f"eval/{BENCH}/pass@1"))
    return out


def logged(rows: list[dict], key: str) -> list[float]:
    """The steps' values of a metric, the steps that did not log it (or logged null) left out."""
    return [r[key] for r in rows if r.get(key) is not None]


def mechanism_figures(train: list[dict], info: dict) -> dict:
    """What each idea did to the update: the gradient norm (every script), GEC's edits and EDA's scaling
    (EDGE-GRPO), the kernel's weight on the top 1% of |covariance| (CW-GRPO); None where not logged."""
    flags = info["flags"]
    samples = int(flags[flags.index("--prompts_per_step") + 1]) * int(flags[flags.index("--group_size") + 1])
    gec_on = info.get("script_flags", {}).get("gec", "off") != "off"  # with GEC off its counts are 0, not measured
    edits = [sum(r[f"gec/{b}"] for b in ("reflection", "injection", "replacement")) for r in train if "gec/fixed" in r]
    edits = edits if gec_on else []
    largest = logged(train, "edge/adv_abs_max")
    return {
        "grad_norm": mean(logged(train, "train/grad_norm")),
        "grad_norm_max": max(logged(train, "train/grad_norm"), default=None),
        "gec_edited": sum(edits) / (samples * len(edits)) if edits else None,
        "reflections": sum(logged(train, "gec/reflection")) if edits else None,
        "reflections_fixed": sum(logged(train, "gec/reflection_fixed")) if edits else None,
        "adv_share_injected": mean(logged(train, "edge/adv_share_injected")) if edits else None,
        "P_injected": mean(logged(train, "edge/entropy_P_injected")),
        "P_all": mean(logged(train, "edge/entropy_P")),
        "adv_abs_max": max(largest, default=None),
        "cw_top_share": mean(logged(train, "cw/cov_top1pct_share")),
        "cw_top_weight": mean(logged(train, "cw/cov_top1pct_weight")),
    }


def load(store: Path) -> tuple[dict, dict]:
    """({run: {seed: figures}}, {run: {seed: run.json}}) of every stored run, in the grid's order."""
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
    return {m: dict(sorted(figures[m].items())) for m in order}, {m: dict(sorted(infos[m].items())) for m in order}
