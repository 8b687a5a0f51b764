"""Test helpers: running the training scripts as a user would, checking engine log-probs."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Two short steps on the tiny models: what the scripts' end-to-end tests run.
TWO_STEPS = ("--steps", "2", "--prompts_per_step", "4", "--group_size", "4", "--max_completion_len", "16")


def run_script(script: str, out_dir: Path, *flags: str, timeout: int = 300) -> list[dict]:
    """Run a training script as a user would; return its metrics.jsonl rows."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(ROOT / script), "--output_dir", str(out_dir), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-4000:]}"
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


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
