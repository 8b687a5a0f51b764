"""The run directory (`--output_dir`): one run per directory, its flags kept, checked before anything loads.

    output_dir/
        run_config.json   {"flags": the run's flags, "history": one entry per start and resume}
        metrics.jsonl     one row per step; samples.jsonl: a few completions per step (common/metrics.py)
        checkpoint-<N>/   common/checkpoint.py
        model/            the final model, HF format (transformers and vLLM load it)

A fresh run refuses a directory that already holds a run (it would interleave two
runs' metrics, and `--keep_last` would count the old run's checkpoints as the
newest): `--resume` continues that run, `--overwrite` deletes it first. A resume
refuses flags that change what is trained (data, model, method) and names them;
flags that only change how (lengths of the run, logging, memory settings) may differ
and are recorded in the history.
"""

import json
import os
import shutil
import time
from pathlib import Path

CONFIG = "run_config.json"

# Flags a resume may change: how the run goes on, not what it trains.
RESUMABLE = {
    "resume", "overwrite", "output_dir", "steps", "epochs", "save_steps", "keep_last", "eval_steps",
    "eval_benchmarks", "eval_n", "eval_temperature", "micro_batch_size", "max_tokens_per_micro_batch",
    "gradient_checkpointing", "rollout", "vllm_gpu_memory_utilization", "vllm_sleep", "vllm_max_num_seqs",
    "vllm_max_num_batched_tokens", "verifier_workers", "verifier_memory_mb", "reward_time_budget_s",
    "max_nonfinite_steps", "warn_flat_steps", "log_samples", "report_to",
}  # fmt: skip


def _holds_a_run(path: Path) -> list[str]:
    names = (CONFIG, "metrics.jsonl", "samples.jsonl", "model")
    return sorted(p.name for p in path.iterdir() if p.name in names or p.name.startswith("checkpoint-"))


def check_run_dir(output_dir: str, flags: dict, resume: bool, overwrite: bool) -> None:
    """Refuse, with one line naming the flag and the fix, an output directory this run cannot use.
    Reads only: every rank may call it (then rank 0 calls `start_run_dir`)."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise SystemExit(f"error: --output_dir: {path} is a file, not a directory; pick another path")
    parent = path if path.exists() else next((p for p in path.parents if p.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SystemExit(f"error: --output_dir: {parent} is not writable; pick a directory you can write to")
    if resume and overwrite:
        raise SystemExit("error: --resume and --overwrite contradict each other: continue the run, or start it over")
    held = _holds_a_run(path) if path.is_dir() else []
    if resume:
        if not (path / CONFIG).is_file():
            raise SystemExit(
                f"error: --resume: {path} holds no run ({CONFIG} missing); run without --resume to start one"
            )
        saved = json.loads((path / CONFIG).read_text())["flags"]
        changed = {k: (saved.get(k), v) for k, v in flags.items() if k not in RESUMABLE and saved.get(k) != v}
        if changed:
            diff = "; ".join(f"--{k} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
            raise SystemExit(
                f"error: --resume: {path} was trained with other settings ({diff}); resume with the run's own "
                "flags, or start a new run in another --output_dir"
            )
    elif held and not overwrite:
        raise SystemExit(
            f"error: --output_dir: {path} already holds a run ({', '.join(held[:4])}); pass --resume to continue it, "
            "--overwrite to delete it and start over, or pick another directory"
        )


def start_run_dir(output_dir: str, flags: dict, resume: bool, overwrite: bool) -> None:
    """Rank 0, after `check_run_dir` passed on every rank: clear an overwritten run, write the flags."""
    path = Path(output_dir)
    if overwrite and path.is_dir():
        for name in _holds_a_run(path) + [p.name for p in path.glob("checkpoint-*.tmp")]:
            target = path / name
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        for extra in ("eval_results.json", "eval_records.jsonl", "config.json"):
            (path / extra).unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    config = json.loads((path / CONFIG).read_text()) if resume else {"flags": flags, "history": []}
    changed = {k: v for k, v in flags.items() if config["flags"].get(k) != v}
    config["history"].append(
        {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": "resume" if resume else "start"}
        | ({"changed": changed} if resume and changed else {})
    )
    tmp = path / (CONFIG + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, default=str))
    os.replace(tmp, path / CONFIG)
