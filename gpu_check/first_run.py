"""The first GPU run: every line docs/SCALING.md lists as needing CUDA, executed in one call, one report.

    python gpu_check/first_run.py --out docs/gpu_first_run.md     # on a GPU: ~3 min expected, 6.5 at most
    python gpu_check/first_run.py --dry_run --out /tmp/dry.md     # anywhere: every part at toy sizes
    python gpu_check/first_run.py --parts kernels,gpu_step ...    # some parts only

Each part (PARTS) runs in its own process within its time budget: one that fails, crashes or runs out of time is
recorded with its output's last lines and the others go on. The five scripts run at once through
gpu_check/sync_guard.py, then the other parts one at a time. Exit status 0 only if every part ran and passed.

On the project's lent GPU machine (no vLLM, no network), with math-verify's wheels in `.whl/` (docs/GUIDE.md, "The
first GPU check"): one call of the device tool with carry [".whl"] and timeout_s 540, this command (one line):

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
sys.path.insert(0, str(ROOT))

from gpu_check.report import NOT_EXECUTED, Findings, environment, write  # noqa: E402

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
    Part("gpu_step", 120, 300, "one update at Qwen2.5-Math-1.5B's shape: time, MFU, each phase's peak memory"),
]
# The rollout correction's figures (common/logprobs.py `figures`) say whether it acts: on a GPU
# --rollout_correction auto truncates, the trainer scoring in bf16.
CORRECTION_KEYS = ["train/rollout_logp_gap", "train/rollout_logp_gap_p99", "train/rollout_is_ratio_max",
                   "train/rollout_is_weight_mean", "train/rollout_is_corrected_frac"]  # fmt: skip
STEP_KEYS = ["train/reward", "train/accuracy", *CORRECTION_KEYS, "train/grad_norm", "time/step_s", "time/peak_mem_gb"]


def command(p: Part, work: Path, dry: bool) -> list[str]:
    """A part's process: a script under the sync guard, or this file's `--part`."""
    if p.name not in SCRIPTS:
        return [sys.executable, str(HERE / "first_run.py"), "--part", p.name, "--part_out", str(work / f"{p.name}.json")] + (["--dry_run"] if dry else [])  # fmt: skip
    flags = ["--rollout", "hf", "--precision", "auto", "--steps", "2", "--save_minutes", "0", "--log_samples", "0"]
    # G = 2: the demo's 36-token prompt is then longer than its completions' share of a shared row (~15-20 tokens
    # each), so the default shared-prompt layout computes less and runs; at G = 8 `select` falls back to padded.
    # (Longer prompts, few-shot or a longer system turn, take the demo model off what it learnt.)
    flags += ["--group_size", "2", "--prompts_per_step", "8" if dry else "64"]  # 16 rows; 128, as the default 16 x 8
    flags += ["--output_dir", str(work / p.name), "--overwrite"]
    guard = [sys.executable, str(HERE / "sync_guard.py"), "--report", str(work / f"{p.name}.syncs.json")]
    return guard + [str(ROOT / f"{p.name}.py"), *flags]


def findings(p: Part, work: Path, status: int | None, cuda: bool) -> dict:
    """A finished part's findings: a script's from its run directory and sync report, another's from its JSON."""
    f = Findings()
    f.check("the part's process exited 0", status == 0, "timed out" if status is None else status)
    if p.name in SCRIPTS:
        run_figures(f, work / p.name, cuda)
        syncs = work / f"{p.name}.syncs.json"
        if syncs.exists():
            sync_figures(f, json.loads(syncs.read_text()))
        f.check("the sync report was written", syncs.exists())
        return f.record()
    out = work / f"{p.name}.json"
    f.check("the part wrote its findings", out.exists())
    found = json.loads(out.read_text()) if out.exists() else f.record()
    return found | {"checks": f.checks | found["checks"]}


def run_figures(f: Findings, run: Path, cuda: bool) -> None:
    """Each step's figures from metrics.jsonl; the precision the run took from run_config.json."""
    metrics = run / "metrics.jsonl"
    metrics = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    f.check("2 steps logged", len(metrics) == 2, len(metrics))
    for i, m in enumerate(metrics, 1):
        f.figure(f"step {i}", {k.split("/")[1]: round(m[k], 8) for k in STEP_KEYS if isinstance(m.get(k), int | float)})
    if metrics:
        finite = lambda v: isinstance(v, int | float) and math.isfinite(v)
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


def sync_figures(f: Findings, syncs: dict) -> None:
    """The host syncs gpu_check/sync_guard.py saw in old_logprobs and update (none may be ours), and the layouts."""
    f.figure("sync detector", syncs["detector"])
    f.figure("host syncs by kind (old_logprobs + update, 2 steps)", syncs["by_kind"] or "none")
    f.check("old_logprobs and update were wrapped", syncs["wrapped"] == ["old_logprobs", "update"], syncs["wrapped"])
    ours = [f"{s['where']} x {s['count']}" for s in syncs["syncs"] if s["kind"] in ("ours", "backward")]
    f.check("no host sync of ours in scoring or update", not ours, "; ".join(ours))
    f.figure("micro-batches by layout", syncs["layouts"])
    shared = {phase: syncs["layouts"].get(phase, {}).get("shared", 0) for phase in ("old_logprobs", "update")}
    f.check("old_logprobs and update ran the shared-prompt layout", all(shared.values()), shared)
    rows = [[s["phase"], s["kind"], s["where"], s["count"]] for s in syncs["syncs"]]
    f.table("Host syncs seen", ["phase", "kind", "where", "count"], rows)


def launch(cmd: list[str], log: Path, threads: int) -> subprocess.Popen:
    """A part's process in its own session (a timeout then ends its children too), its output to `log`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_NUM_THREADS", str(threads))
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
    text = (log.read_text(errors="replace") if log.exists() else "").replace("\r", "\n")  # progress bars
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def result(p: Part, budget: int, took: float | None, found: dict, log: Path, skip: str = "") -> dict:
    """A part's entry in the report: "ran" when every check passed, else "failed" (or "skipped")."""
    ok = found["checks"] and all(c["ok"] for c in found["checks"].values())
    status = "skipped" if skip else "ran" if ok else "failed"
    print(f"{p.name}: {status}" + (f" in {took:.0f} s" if took is not None else ""), flush=True)
    error = skip or (tail(log) if status == "failed" else None)
    return {
        "name": p.name,
        "what": p.what,
        "budget_s": budget,
        "took_s": took,
        "status": status,
        "error": error,
    } | found


def run_parts(parts: list[Part], work: Path, dry: bool, cuda: bool, jobs: int, started: float) -> list[dict]:
    """`parts`, `jobs` at a time, each within its budget from its own start; on a GPU none starts past the deadline."""
    threads = max(1, len(os.sched_getaffinity(0)) // jobs)
    waiting, running, done = list(parts), [], {}
    while waiting or running:
        while waiting and len(running) < jobs:
            p = waiting.pop(0)
            budget, log = p.gpu_s if cuda else p.cpu_s, work / f"{p.name}.log"
            if cuda and not dry and time.monotonic() - started + budget > DEADLINE_S:
                skip = f"not started: it could end past {DEADLINE_S} s"
                done[p.name] = result(p, budget, None, Findings().record(), log, skip)
                continue
            running.append((p, launch(command(p, work, dry), log, threads), time.monotonic(), budget))
            print(f"{p.name}: started (budget {budget} s)", flush=True)
        time.sleep(0.5)
        for item in [r for r in running if r[1].poll() is not None or time.monotonic() > r[2] + r[3]]:
            p, proc, start, budget = item
            running.remove(item)
            status = finish(proc, start + budget)
            took, log = time.monotonic() - start, work / f"{p.name}.log"
            done[p.name] = result(p, budget, took, findings(p, work, status, cuda), log)
    return [done[p.name] for p in parts]


def run_part(name: str, out: Path, dry: bool) -> None:
    """`--part NAME`: one of the parts that run in this process, its findings written to `out`."""
    from gpu_check import kernels, parts, step

    fn = {"cuda_lines": parts.cuda_lines, "kernels": kernels.run, "logp_gap": parts.logp_gap, "gpu_step": step.run}
    out.write_text(json.dumps(fn[name](dry).record(), indent=1, default=str))


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
    wanted = a.parts.split(",")
    if unknown := set(wanted) - {x.name for x in PARTS}:
        p.error(f"--parts: unknown {sorted(unknown)}; parts: {', '.join(x.name for x in PARTS)}")
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="gpu_first_run."))
    work.mkdir(parents=True, exist_ok=True)
    print(f"first_run: {'dry run' if dry else 'full size'} on {'CUDA' if cuda else 'CPU'}; logs in {work}", flush=True)
    started = time.monotonic()
    scripts = [x for x in PARTS if x.name in wanted and x.name in SCRIPTS]
    others = [x for x in PARTS if x.name in wanted and x.name not in SCRIPTS]
    parts = run_parts(scripts, work, dry, cuda, a.jobs or (len(SCRIPTS) if cuda else 2), started)
    parts += run_parts(others, work, dry, cuda, 1, started)
    report = {"environment": environment(dry), "parts": parts, "not_executed": NOT_EXECUTED}
    write(report, a.out, " ".join(["python", Path(sys.argv[0]).as_posix(), *sys.argv[1:]]))
    failed = [x["name"] for x in parts if x["status"] != "ran"]
    print(f"first_run: {len(parts) - len(failed)} of {len(parts)} parts ran; report: {a.out}"
          + (f"; not: {', '.join(failed)}" if failed else ""), flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
