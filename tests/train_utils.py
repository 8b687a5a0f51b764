"""Running the training scripts from tests, as a user would."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_script(script: str, out_dir: Path, *flags: str, timeout: int = 300) -> list[dict]:
    """Run a training script as a user would; return its metrics.jsonl rows."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(ROOT / script), "--output_dir", str(out_dir), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-4000:]}"
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
