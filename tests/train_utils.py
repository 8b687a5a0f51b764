"""Test helpers: running the training scripts as a user would, building their flags, checking engine log-probs."""

import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["grpo_base.py", "edge_grpo.py", "egpo.py", "cw_grpo.py", "pro_grpo.py"]
# The baselines the papers compare against (issue 35): the same skeleton, run from baselines/. Each has its own
# oracle test with its demo and SmolLM2 runs (tests/test_<name>.py), so the suites over SCRIPTS leave them out.
BASELINES = sorted(f"baselines/{p.name}" for p in (ROOT / "baselines").glob("*.py") if p.stem != "__init__")
# Two short steps on the tiny models: what the scripts' end-to-end tests run.
TWO_STEPS = ("--steps", "2", "--prompts_per_step", "4", "--group_size", "4", "--max_completion_len", "16")
ONE_STEP = ("--steps", "1", *TWO_STEPS[2:])


def user_env(**extra) -> dict:
    """A user's shell: without the variables vLLM sets inside this test process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_DIST")}
    return env | {"PYTHONUNBUFFERED": "1"} | extra


def run_cli(script: str, *flags: str, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """A script or tool (`python -m tools.x` as "tools/x.py") run as a user runs it; returns the finished process."""
    target = [sys.executable, str(ROOT / script)] if not script.startswith(("tools/", "data/")) else [
        sys.executable, "-m", script.removesuffix(".py").replace("/", ".")
    ]  # fmt: skip
    cmd = [*target, *flags]
    return subprocess.run(cmd, cwd=ROOT, env=env or user_env(), capture_output=True, text=True, timeout=timeout)


def run_script(script: str, out_dir: Path, *flags: str, timeout: int = 300) -> list[dict]:
    """Run a training script as a user would; return its metrics.jsonl rows (it must succeed)."""
    proc = run_cli(script, "--output_dir", str(out_dir), *flags, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-4000:]}"
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def script_flags(script: str, **values):
    """(Args, RunFlags) of a training script with these values, as its command line would give them."""
    from common.run_flags import RunFlags

    module = importlib.import_module(script.removesuffix(".py").replace("/", "."))  # baselines/x.py: baselines.x
    names = {f.name for f in dataclasses.fields(module.Args)}
    args = module.Args(**{k: v for k, v in values.items() if k in names})
    run = RunFlags(**{k: v for k, v in values.items() if k not in names})
    return args, run


def max_logp_error(model, prompts, groups, temperature: float) -> float:
    """Largest |engine logp - HF logp| over every sampled token; NaN counts as infinitely wrong."""
    import torch

    from common.logprobs import sequence_logprobs

    worst = 0.0
    for prompt, group in zip(prompts, groups):
        for c in group:
            ids = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logp, _ = sequence_logprobs(
                    model, ids, torch.ones_like(ids), temperature, logits_to_keep=len(c.token_ids)
                )
            err = (logp[0] - torch.tensor(c.logprobs)).abs().max().item()
            worst = max(worst, math.inf if math.isnan(err) else err)
    return worst


def grpo_advantage(group: list[float]) -> list[float]:
    """GRPO's A_i in plain Python, for the methods' oracles: (r_i - mean r) / (unbiased std of r + 1e-6)."""
    mean = sum(group) / len(group)
    std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
    return [(x - mean) / (std + 1e-6) for x in group]


def uneven_mask(lengths: list[int], width: int):
    """[len(lengths), width] float64: ones on each completion's first `lengths[i]` tokens."""
    import torch

    return torch.tensor([[1.0] * k + [0.0] * (width - k) for k in lengths], dtype=torch.float64)


def as_completions(token_lists: list[list[int]], finished: bool = True) -> list:
    """Token lists as the rollout engine's completions (log-prob 0 for every token)."""
    from common.prompts import Completion

    return [Completion(list(t), [0.0] * len(t), finished) for t in token_lists]


def scoring_session(model, micro_batch_size: int = 8, ref_model=None, layout: str = "padded"):
    """What the scripts' old_logprobs() reads of a session, for a model alone (one process, fixed micro-batches)."""
    from types import SimpleNamespace

    from common.batching import micro_batches

    def plan(batch, rows):
        lens = batch["prompt_mask"].sum(1).long().tolist(), batch["completion_mask"].sum(1).long().tolist()
        return micro_batches(*lens, rows, micro_batch_size)

    from common.trainer import Trainer

    s = SimpleNamespace(model=model, ref_model=ref_model, micro_batch_plan=plan, layout=layout)
    s.micro_batches = lambda batch, rows, train=False: Trainer.micro_batches(s, batch, rows, train)  # the real seam
    return s


def demo_learns(script: str, tmp_path: Path, *flags: str) -> list[dict]:
    """A baseline's slow check: its CPU demo accuracy rises over the learning test's steps, as tests/test_learning.py
    holds the five scripts to (on SmolLM2: the stored comparison's runs, docs/results_real.md). Returns its rows."""
    from test_learning import MARGIN, ROLLOUT, STEPS

    rows = run_script(script, tmp_path / "demo", *flags, "--rollout", ROLLOUT, "--steps", str(STEPS))
    accuracy = [r["train/accuracy"] for r in rows]
    assert sum(accuracy[-2:]) / 2 > accuracy[0] + MARGIN, accuracy
    return rows
