"""`accelerate launch` of a script under the real FSDP2 / DeepSpeed / DDP engine on CPU, from pytest.

    rc, out = launch("configs/accelerate/zero3.yaml", "tests/engines/probe.py", "--steps", "2")

The shipped YAML goes to the real launcher unchanged (only --num_processes and a free
--main_process_port on the command line); every rank starts in cpu_entry.py, which
lets accelerate apply the FSDP / DeepSpeed config on a CPU-only host (see there).
On timeout the launcher and all its workers are killed: torchrun starts each worker in
a session of its own, so the launcher's process group alone would leave them running.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "accelerate"
ENTRY = Path(__file__).resolve().with_name("cpu_entry.py")
PROBE = Path(__file__).resolve().with_name("probe.py")
TIMEOUT_RC = 124


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    config_yaml: str | os.PathLike,
    script: str | os.PathLike,
    *args: str,
    num_processes: int = 2,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    stop_when: Callable[[], bool] | None = None,
) -> tuple[int, str]:
    """Run `script args` on `num_processes` CPU ranks with the engine `config_yaml` selects.

    Returns (return code, stdout+stderr of the launcher and all ranks). On timeout every
    process of the launch is killed and the code is 124 (the output so far is returned,
    ending with a `[launch] TIMEOUT` line). Never raises for a failing script. `stop_when`, polled every 0.1 s,
    ends the launch as a timeout does once it is true (a test of the kill itself need not wait the timeout out).
    """
    full_env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "OMP_NUM_THREADS": "1",  # 2 ranks on 2 cores
        "PYTHONFAULTHANDLER": "1",  # a rank that aborts or segfaults prints every thread's Python stack
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    if not _has_gpu():
        full_env.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed: CPU by name, not by failed GPU detection
    for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        if not (env and name in env):
            full_env.pop(name, None)  # the YAML decides, not the caller's shell
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config_yaml),
        "--num_processes",
        str(num_processes),
        "--main_process_port",
        str(free_port()),
        str(ENTRY),
        str(script),
        *map(str, args),
    ]
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        start = time.monotonic()
        try:
            rc = _wait(proc, timeout, stop_when)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            rc = TIMEOUT_RC
        except BaseException:
            _kill_tree(proc)
            raise
        finally:
            _kill_tree(proc, only_if_alive=True)
        log.seek(0)
        out = log.read()
    if rc == TIMEOUT_RC:
        out += f"\n[launch] TIMEOUT after {time.monotonic() - start:.0f}s: all processes killed\n"
    return rc, out


def _wait(proc: subprocess.Popen, timeout: float, stop_when: Callable[[], bool] | None) -> int:
    """proc's return code; TimeoutExpired after `timeout` seconds or once stop_when() is true."""
    if stop_when is None:
        return proc.wait(timeout=timeout)
    end = time.monotonic() + timeout
    while time.monotonic() < end and not stop_when():
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
    raise subprocess.TimeoutExpired(proc.args, timeout)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _kill_tree(proc: subprocess.Popen, only_if_alive: bool = False) -> None:
    """SIGTERM then SIGKILL the launcher's process group and each descendant's group."""
    import psutil

    if only_if_alive and proc.poll() is not None:
        return
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    groups = {proc.pid}
    for p in procs:
        try:
            groups.add(os.getpgid(p.pid))
        except ProcessLookupError:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGTERM:
            _, alive = psutil.wait_procs(procs, timeout=5)
            if not alive:
                break
    psutil.wait_procs(procs, timeout=5)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def write_facts(out_dir: str | os.PathLike, rank: int, facts: dict) -> None:
    """A rank's facts, in a file of its own under `out_dir` (written whole, then renamed). Not on stdout: the
    ranks share the launcher's output, where another rank's lines can cut a long one in two."""
    path = Path(out_dir) / f"facts-rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(facts))
    path.with_suffix(".tmp").rename(path)


def read_facts(out_dir: str | os.PathLike) -> list[dict]:
    """The facts every rank wrote under `out_dir` (`write_facts`), rank 0 first."""
    files = sorted(Path(out_dir).glob("facts-rank*.json"), key=lambda f: int(f.stem.removeprefix("facts-rank")))
    return [json.loads(f.read_text()) for f in files]


def variant_config(src: str | os.PathLike, dst: str | os.PathLike, **changes) -> Path:
    """Copy a shipped YAML with changes: `fsdp_config={...}` / `deepspeed_config={...}` merge into
    that section (a value None deletes the key), any other key is set (None deletes it)."""
    config = yaml.safe_load(Path(src).read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            for k, v in value.items():
                if v is None:
                    config[key].pop(k, None)
                else:
                    config[key][k] = v
        elif value is None:
            config.pop(key, None)
        else:
            config[key] = value
    dst = Path(dst)
    dst.write_text(yaml.safe_dump(config, sort_keys=False))
    return dst
