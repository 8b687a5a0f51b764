"""The first GPU run: every line docs/SCALING.md lists as needing CUDA, executed in one call, one report.

    python gpu_check/first_run.py --out docs/gpu_first_run.md     # on a GPU: ~3 min expected, 6.5 at most
    python gpu_check/first_run.py --dry_run --out /tmp/dry.md     # anywhere: every part at toy sizes
    python gpu_check/first_run.py --parts kernels,gpu_step ...    # some parts only

Parts, each in its own process with its own time budget (a part that fails, crashes or runs out of time is
recorded with the last lines of its output, and the others go on; a CUDA error cannot poison the next part):

- grpo_base, edge_grpo, egpo, cw_grpo, pro_grpo: 2 GRPO steps of the script on the shipped demo model, as a
  user runs it (`--rollout hf --precision auto`: bf16 autocast over fp32 weights on a GPU; `--group_size 2`, so
  that the default shared-prompt layout computes less and runs), through gpu_check/sync_guard.py, which runs
  its scoring pass and update under `torch.cuda.set_sync_debug_mode`, attributes every host sync (none may be
  ours) and counts the layout each micro-batch ran in; each step's gap and rollout-correction figures are
  reported. The five run at once on a GPU (one process each).
- cuda_lines: `device_memory_bytes`, `peak_memory_gb`, `_device_memory` and the chunk rows, `to_device`'s
  pinned copy and `select`'s layouts without a host sync, the run's dtypes, what is not installed
  (gpu_check/parts.py).
- kernels: `addmm(..., out_dtype=float32)` in the chunked head, its gradient against the unchunked bf16 pass,
  the SDPA kernel for the shared-prompt mask (never math), shared and packed layouts equal to the padded one,
  the chunk's speed (gpu_check/kernels.py).
- logp_gap: the trainer-vs-engine log-prob gap in bf16, mean and p99 per token, padded and shared-prompt
  (gpu_check/parts.py).
- gpu_step: gpu_check/step.py at Qwen2.5-Math-1.5B's shape (random weights): step time, tokens/s, MFU,
  peak memory against the memory preflight's prediction.

The report (`--out`, markdown, and the same as JSON beside it) names each part's result, figures and checks,
and what stays unexecuted; the exit status is 0 only if every part ran and passed its checks.

On this project's lent GPU machine (Python 3.12, torch 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0; no
vLLM, no network), math-verify and its two dependencies travel as wheels (~380 KB). Here, in the repository's
root (`/.whl/` is in .gitignore):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 -d .whl math-verify==0.9.0 latex2sympy2_extended==1.11.0 \\
        antlr4-python3-runtime==4.13.2

then one call of the device tool with carry [".whl"] and timeout_s 540, this command (one line there):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site
    .whl/*.whl && export PYTHONPATH=/tmp/site || exit; PYTHONUNBUFFERED=1 python3 gpu_check/first_run.py
    --out $OUT/gpu_first_run.md --work_dir /tmp/gfr; s=$?; cd /tmp/gfr && tar czf $OUT/gpu_first_run_logs.tgz
    *.log *.json */metrics.jsonl; exit $s

The report comes back as gpu_first_run.md and .json (commit them under docs/), the parts' logs in the archive.
"""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

SCRIPTS = ["grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo"]
DEADLINE_S = 420  # on a GPU: no part starts once it could end past 7 minutes


@dataclass
class Part:
    name: str
    gpu_s: int  # time budget on a GPU
    cpu_s: int  # in the dry run on CPU (2 slow cores)
    what: str


SCRIPT_PART = (
    "`{}.py --rollout hf --precision auto --group_size 2`, 2 steps on the demo model, scoring and update under the "
    "sync detector"
)
PARTS = [Part(s, 120, 900, SCRIPT_PART.format(s)) for s in SCRIPTS] + [
    Part("cuda_lines", 30, 300, "the memory reads, the chunk rows, `to_device` and `select` without a host sync"),
    Part("kernels", 60, 600, "fp32-out `addmm`, the shared-prompt mask's SDPA kernel, the layouts, the chunk's speed"),
    Part("logp_gap", 45, 300, "trainer-vs-engine log-prob gap per sampled token, demo model, bf16"),
    Part("gpu_step", 120, 300, "gpu_check/step.py at Qwen2.5-Math-1.5B's shape: time, MFU, peak memory"),
]
# What a script's figures show of each logged step: the rollout correction's (common/rollout_correction.py
# `figures`) say whether it acts (on a GPU --rollout_correction auto truncates: the trainer scores in bf16).
CORRECTION_KEYS = ["train/rollout_logp_gap", "train/rollout_logp_gap_p99", "train/rollout_is_ratio_max",
                   "train/rollout_is_weight_mean", "train/rollout_is_corrected_frac"]  # fmt: skip
STEP_KEYS = ["train/reward", "train/accuracy", *CORRECTION_KEYS, "train/grad_norm", "time/step_s", "time/peak_mem_gb"]


def child_env(threads: int) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def launch(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    """A part's process, in its own session (so that a timeout ends its children too), output to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def finish(proc: subprocess.Popen, until: float) -> int | None:
    """The process's exit status, or None after killing it (and its children) at `until` (time.monotonic)."""
    try:
        return proc.wait(timeout=max(0.0, until - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def tail(log: Path, lines: int = 25) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    text = text.replace("\r", "\n")  # progress bars
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def script_command(name: str, work: Path, dry: bool) -> list[str]:
    run = work / name
    flags = ["--rollout", "hf", "--precision", "auto", "--steps", "2", "--save_minutes", "0", "--log_samples", "0"]
    flags += ["--output_dir", str(run), "--overwrite"]
    # G = 2: the demo's 36-token prompt is then longer than its completions' share of a shared row (~15-20 tokens
    # each), so the default shared-prompt layout computes less and runs; at G = 8 `select` falls back to padded.
    # (Longer prompts, few-shot or a longer system turn, take the demo model off what it learnt: next to no sum right.)
    flags += ["--group_size", "2", "--prompts_per_step", "8" if dry else "64"]  # 16 rows; 128, as the default 16 x 8
    guard = [sys.executable, str(HERE / "sync_guard.py"), "--report", str(work / f"{name}.syncs.json")]
    return guard + [str(ROOT / f"{name}.py"), *flags]


def script_findings(name: str, work: Path, status: int | None, cuda: bool) -> dict:
    """A script run's figures and checks from its run directory and its sync report."""
    from findings import Findings

    f = Findings()
    f.check("the script exited 0", status == 0, "timed out" if status is None else status)
    run_figures(f, work / name, cuda)
    syncs = work / f"{name}.syncs.json"
    if syncs.exists():
        sync_figures(f, json.loads(syncs.read_text()))
    else:
        f.check("the sync report was written", False)
    return f.record()


def run_figures(f, run: Path, cuda: bool) -> None:
    """Each step's figures from metrics.jsonl; the precision the run took from run_config.json."""
    metrics = run / "metrics.jsonl"
    metrics = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    f.check("2 steps logged", len(metrics) == 2, len(metrics))
    for i, m in enumerate(metrics, 1):
        f.figure(f"step {i}", {k.split("/")[1]: round(m[k], 8) for k in STEP_KEYS if isinstance(m.get(k), int | float)})
    if metrics:
        bad = sorted({k for m in metrics for k in CORRECTION_KEYS if not finite(m.get(k))})
        f.check("each step logged the gap and the rollout correction's figures, finite", not bad, bad or "")
        # The demo model boxes about half its sums right: none in two steps means it samples noise.
        f.check("the demo model answers some sums right", max(m.get("train/accuracy") or 0 for m in metrics) > 0)
    config = run / "run_config.json"
    history = json.loads(config.read_text())["history"] if config.exists() else []
    precision = next((h["machine"].get("precision") for h in reversed(history) if "machine" in h), None)
    f.figure("precision the run took", precision)
    if cuda:
        f.check("--precision auto took bf16 autocast", (precision or {}).get("autocast") == "bf16", precision)


def finite(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def sync_figures(f, syncs: dict) -> None:
    """The host syncs gpu_check/sync_guard.py saw in old_logprobs and update: none may be ours."""
    f.figure("sync detector", syncs["detector"])
    f.figure("host syncs by kind (old_logprobs + update, 2 steps)", syncs["by_kind"] or "none")
    f.check("old_logprobs and update were wrapped", syncs["wrapped"] == ["old_logprobs", "update"], syncs["wrapped"])
    ours = [s for s in syncs["syncs"] if s["kind"] in ("ours", "backward")]
    where = "; ".join(f"{s['where']} x {s['count']}" for s in ours)
    f.check("no host sync of ours in scoring or update", not ours, where)
    f.figure("micro-batches by layout", syncs["layouts"])
    shared = {phase: syncs["layouts"].get(phase, {}).get("shared", 0) for phase in ("old_logprobs", "update")}
    f.check("old_logprobs and update ran the shared-prompt layout", all(shared.values()), shared)
    rows = [[s["phase"], s["kind"], s["where"], s["count"]] for s in syncs["syncs"]]
    f.table("Host syncs seen", ["phase", "kind", "where", "count"], rows)


def run_scripts(parts: list[Part], work: Path, dry: bool, cuda: bool, jobs: int) -> list[dict]:
    """The scripts' parts, `jobs` at a time, each within its budget from its own start."""
    env = child_env(max(1, len(os.sched_getaffinity(0)) // jobs))
    waiting, running, done = list(parts), [], {}
    while waiting or running:
        while waiting and len(running) < jobs:
            p = waiting.pop(0)
            budget = p.gpu_s if cuda else p.cpu_s
            proc = launch(script_command(p.name, work, dry), work / f"{p.name}.log", env)
            running.append((p, proc, time.monotonic(), budget))
            print(f"{p.name}: started (budget {budget} s)", flush=True)
        time.sleep(0.5)
        for item in [r for r in running if r[1].poll() is not None or time.monotonic() > r[2] + r[3]]:
            p, proc, start, budget = item
            running.remove(item)
            findings = script_findings(p.name, work, finish(proc, start + budget), cuda)
            done[p.name] = result(p, budget, time.monotonic() - start, findings, work / f"{p.name}.log")
    return [done[p.name] for p in parts]


def result(p: Part, budget: int, took: float | None, findings: dict | None, log: Path | None, skip: str = "") -> dict:
    """A part's entry in the report: "ran" when every check passed, else "failed" (or "skipped")."""
    findings = findings or nothing_found()
    ok = findings["checks"] and all(c["ok"] for c in findings["checks"].values())
    status = "skipped" if skip else "ran" if ok else "failed"
    error = skip or (tail(log) if status == "failed" and log else None)
    print(f"{p.name}: {status}" + (f" in {took:.0f} s" if took is not None else ""), flush=True)
    entry = {"name": p.name, "what": p.what, "budget_s": budget, "took_s": took, "status": status, "error": error}
    return entry | findings


def run_other(p: Part, work: Path, dry: bool, cuda: bool) -> dict:
    """A part other than the scripts' in its own process: `--part` of this file, or gpu_step.py."""
    budget, out, log = p.gpu_s if cuda else p.cpu_s, work / f"{p.name}.json", work / f"{p.name}.log"
    if p.name == "gpu_step":
        cmd = [sys.executable, str(HERE / "step.py"), "--json", str(out)] + (["--size", "tiny"] if dry else [])
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--part", p.name, "--part_out", str(out)]
        cmd += ["--dry_run"] if dry else []
    print(f"{p.name}: started (budget {budget} s)", flush=True)
    start = time.monotonic()
    status = finish(launch(cmd, log, child_env(len(os.sched_getaffinity(0)))), start + budget)
    findings = json.loads(out.read_text()) if out.exists() else nothing_found()
    if p.name == "gpu_step" and out.exists():
        from step import findings as step_findings

        findings = step_findings(findings)
    exited = {"ok": status == 0, "detail": "timed out" if status is None else str(status)}
    findings["checks"] = {"the part's process exited 0": exited} | findings["checks"]
    return result(p, budget, time.monotonic() - start, findings, log)


def nothing_found() -> dict:
    """The findings of a part that wrote none (it crashed or ran out of time)."""
    return {"figures": {}, "checks": {}, "notes": [], "tables": []}


def run_part(name: str, out: Path, dry: bool) -> None:
    """`--part NAME`: one in-process part, its findings written to `out`."""
    import kernels
    import parts

    fn = {"cuda_lines": parts.cuda_lines, "kernels": kernels.run, "logp_gap": parts.logp_gap}[name]
    out.write_text(json.dumps(fn(dry).record(), indent=1, default=str))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "gpu_first_run.md", help="the report (and .json beside)")
    p.add_argument("--dry_run", action="store_true", help="toy sizes (also without CUDA): the suite's check")
    p.add_argument("--parts", default=",".join(x.name for x in PARTS), help="comma-separated parts to run")
    p.add_argument("--jobs", type=int, default=0, help="scripts run at once (0: all five on a GPU, 2 on CPU)")
    p.add_argument("--work_dir", type=Path, default=None, help="runs and logs (default: a temporary directory)")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)  # a part's own process
    p.add_argument("--part_out", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    dry = a.dry_run or not cuda
    if a.part:
        run_part(a.part, a.part_out, dry)
        return 0
    from report import NOT_EXECUTED, command_line, environment, write

    wanted = a.parts.split(",")
    unknown = set(wanted) - {x.name for x in PARTS}
    if unknown:
        p.error(f"--parts: unknown {sorted(unknown)}; parts: {', '.join(x.name for x in PARTS)}")
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="gpu_first_run."))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"gpu_first_run: {'dry run' if dry else 'full size'} on {'CUDA' if cuda else 'CPU'}; logs in {work}", flush=True
    )
    started, parts = time.monotonic(), []
    scripts = [x for x in PARTS if x.name in wanted and x.name in SCRIPTS]
    if scripts:
        parts += run_scripts(scripts, work, dry, cuda, a.jobs or (len(SCRIPTS) if cuda else 2))
    for x in [x for x in PARTS if x.name in wanted and x.name not in SCRIPTS]:
        budget = x.gpu_s if cuda else x.cpu_s
        if cuda and not dry and time.monotonic() - started + budget > DEADLINE_S:
            parts.append(result(x, budget, None, None, None, skip=f"not started: it could end past {DEADLINE_S} s"))
            continue
        parts.append(run_other(x, work, dry, cuda))
    notes = [n.removeprefix("not run here: ") for x in parts for n in x["notes"] if n.startswith("not run here")]
    report = {"environment": environment(dry), "parts": parts, "not_executed": notes + NOT_EXECUTED}
    write(report, a.out, command_line())
    failed = [x["name"] for x in parts if x["status"] != "ran"]
    print(f"gpu_first_run: {len(parts) - len(failed)} of {len(parts)} parts ran; report: {a.out}"
          + (f"; not: {', '.join(failed)}" if failed else ""), flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
