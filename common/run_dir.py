"""The run directory (`--output_dir`): one run per directory, locked while it runs, its flags kept.

    output_dir/
        run_config.json   {"flags": the run's flags, "history": one entry per start and resume}
        metrics.jsonl, samples.jsonl              the log (common/metrics.py)
        eval_results.json, eval_records.jsonl     the last evaluation; eval-*/: the others (tools.evaluate's too)
        checkpoint-<N>/, model/                   common/checkpoint.py
        .lock             pid, host and start time of the run using it (`RunLock`)

A fresh run refuses a directory holding a run with a checkpoint (`--resume` continues it, `--overwrite`
deletes it); one with no usable checkpoint starts over, saying so. A resume reads the run's flags from
run_config.json (`recorded_flags`) and refuses a change to what is trained (data, model, method).
"""

import atexit
import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

CONFIG = "run_config.json"
LOCK = ".lock"
LOGS = ("metrics.jsonl", "samples.jsonl", "eval_results.json", "eval_records.jsonl")


def _holds_a_run(path: Path) -> list[str]:
    names = (CONFIG, "metrics.jsonl", "samples.jsonl", "model")
    return sorted(p.name for p in path.iterdir() if p.name in names or p.name.startswith("checkpoint-"))


def _has_checkpoint(path: Path) -> bool:
    from common.checkpoint import checkpoint_problem, list_checkpoints

    return any(checkpoint_problem(c) is None for c in list_checkpoints(path)) or (path / "model").is_dir()


class RunLock:
    """An exclusive `flock` on `output_dir/.lock`, held by rank 0: the kernel drops it when the process dies
    (kill -9 too), so a dead run's lock is taken over. Without flock (some network filesystems): the pid."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # checked before (check_writable); a race or a mount that changed
            raise SystemExit(f"error: --output_dir: {self.path.parent} cannot be created ({e.strerror})") from None
        previous = self._read()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SystemExit(self._in_use(previous)) from None
        except OSError:  # no flock here (some network filesystems): the pid decides
            if previous and previous.get("host") == socket.gethostname() and _alive(previous.get("pid")):
                os.close(fd)
                raise SystemExit(self._in_use(previous)) from None
        if previous and previous.get("pid") != os.getpid():
            print(
                f"note: {self.path.parent} was locked by pid {previous.get('pid')} on {previous.get('host')} "
                f"(since {previous.get('since')}), which has ended without releasing it: taking it over"
            )
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}).encode())
        os.fsync(fd)
        self.fd = fd
        atexit.register(self.release)  # an error exit releases it too; a kill leaves it to the kernel

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text() or "null")
        except (OSError, ValueError):
            return None

    def _in_use(self, holder: dict | None) -> str:
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"
            if holder
            else "another process"
        )
        return (
            f"error: --output_dir: {self.path.parent} is in use by another run ({who}); wait for it to end, "
            "or pick another --output_dir"
        )


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def check_writable(output_dir: str | Path) -> None:
    """Refuse an --output_dir that is a file, sits under one, or cannot be written: tried, not judged from
    permission bits (root passes every `os.access` check; a read-only mount refuses it anyway)."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise SystemExit(f"error: --output_dir: {path} is a file, not a directory; pick another path")
    parent = path if path.exists() else next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        raise SystemExit(
            f"error: --output_dir: {path} cannot be created: {parent} is a file, not a directory; pick another path"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".writable-", dir=parent))  # what creating the run directory will do
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise SystemExit(
            f"error: --output_dir: {path} cannot be created in {parent} ({why}); pick a directory you can write to"
        ) from None


def check_run_dir(
    output_dir: str | Path, flags: dict, resumable: set[str], resume: bool, overwrite: bool, script: str | None = None
) -> None:
    """Refuse, in one line naming the flag and the fix, a run directory this run cannot use (module docstring);
    `script`: checked against the resumed run's. Reads only: every rank may call it."""
    check_writable(output_dir)
    path = Path(output_dir)
    if resume and (path / CONFIG).is_file():
        saved = _read_config(path, script)["flags"]
        # A flag the record lacks ran as its default: `common.cli.parse_args` judges that.
        changed = {k: (saved[k], v) for k, v in flags.items() if k not in resumable and k in saved and saved[k] != v}
        if changed:
            raise SystemExit(refused_changes(path, changed))
    elif not resume and not overwrite and path.is_dir() and _holds_a_run(path) and _has_checkpoint(path):
        raise SystemExit(
            f"error: --output_dir: {path} already holds a run ({', '.join(_holds_a_run(path)[:4])}); pass --resume to "
            "continue it, --overwrite to delete it and start over, or pick another directory"
        )


def recorded_flags(output_dir: str | Path, script: str | None) -> tuple[dict, Path] | None:
    """(The flags in force at the run's last start, run_config.json's path), what `--resume` goes on with; None:
    no record. `script`: checked against the one that started the run (None: not checked). Reads only."""
    path = Path(output_dir)
    if not (path / CONFIG).is_file():
        return None
    return _read_config(path, script)["flags"], path / CONFIG


def refused_changes(path: Path, changed: dict) -> str:
    """The one-line refusal of a resume that changes what is trained: `changed` is {flag: (recorded, given)}."""
    diff = "; ".join(f"--{k} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
    return (
        f"error: --resume: {path} was trained with other settings ({diff}); --resume reads the run's flags from "
        f"its {CONFIG}: leave these out (or give the recorded values), or start a new run in another --output_dir"
    )


def _read_config(path: Path, script: str | None) -> dict:
    """`path`/run_config.json, refused when unreadable or another script's."""
    try:
        config = json.loads((path / CONFIG).read_text())
        if not isinstance(config.get("flags"), dict):
            raise KeyError("flags")
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise SystemExit(
            f"error: --resume: {path / CONFIG} is unreadable ({type(e).__name__}: {e}); start over with --overwrite"
        ) from None
    started = [h["script"] for h in config.get("history", []) if isinstance(h, dict) and h.get("script")]
    if script and started and started[0] != script:
        raise SystemExit(
            f"error: --resume: {path} is a run of {started[0]}.py, not {script}.py; resume it with "
            f"python {started[0]}.py --resume --output_dir {path}, or start {script}.py in another --output_dir"
        )
    return config


def start_run_dir(
    output_dir: str | Path, flags: dict, resumed: bool, overwrite: bool, launch: dict | None = None
) -> None:
    """Rank 0, once the run has loaded: clear an overwritten run or one that saved no checkpoint; record the flags
    and how this start was launched (`launch`) in the history."""
    path = Path(output_dir)
    if path.is_dir() and not resumed and _holds_a_run(path):
        if not overwrite:
            print(f"note: {path} held a run with no usable checkpoint: starting over")
        stale = [p.name for p in [*path.glob("checkpoint-*.tmp"), *path.glob("eval-*")]]  # eval-*: of the old run
        for name in _holds_a_run(path) + stale + list(LOGS):
            target = path / name
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    config = json.loads((path / CONFIG).read_text()) if resumed else {"flags": flags, "history": []}
    changed = {k: v for k, v in flags.items() if config["flags"].get(k) != v}
    config["flags"] = config["flags"] | flags  # the values in force now; the history keeps what changed when
    config["history"].append(
        {"time": _now(), "event": "resume" if resumed else "start"}
        | (launch or {})
        | ({"changed": changed} if resumed and changed else {})
    )
    tmp = path / (CONFIG + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, default=str))
    os.replace(tmp, path / CONFIG)


def check_shared(output_dir: str | Path, accelerator) -> None:
    """Multi-node: stop, naming a host, if a rank cannot read a sentinel rank 0 wrote in the run directory
    (checkpoints hold every rank's files)."""
    if accelerator.num_processes == 1:
        return
    import torch
    from accelerate.utils import broadcast_object_list

    sentinel = Path(output_dir) / f".shared-{os.getpid()}"
    token = None
    if accelerator.is_main_process:
        token = f"{socket.gethostname()}-{time.time_ns()}"
        sentinel.write_text(token)
    token = broadcast_object_list([token], from_process=0)[0]
    sentinel_name = broadcast_object_list([sentinel.name], from_process=0)[0]
    try:
        seen = (Path(output_dir) / sentinel_name).read_text() == token
    except OSError:
        seen = False
    missing = accelerator.reduce(torch.tensor(float(not seen), device=accelerator.device), reduction="sum").item()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        sentinel.unlink(missing_ok=True)
    if missing:
        raise SystemExit(
            f"error: --output_dir: {output_dir} is not shared by every node ({missing:.0f} rank(s), e.g. on "
            f"{socket.gethostname() if not seen else 'another host'}, cannot see the files rank 0 writes there); "
            "put it on a filesystem every node mounts"
        )


# JSON Lines: the one reader and writer every module uses.
def iter_jsonl(path: str | os.PathLike, skip_torn_last_line: bool = False) -> Iterator[dict]:
    """The rows of a .jsonl file, blank lines skipped; bad JSON raises ValueError naming the line, except a last
    line cut short by a killed writer when `skip_torn_last_line`."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                if skip_torn_last_line and not line.endswith("\n"):  # only the last line can lack one
                    return
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from None


def read_jsonl(path: str | os.PathLike, skip_torn_last_line: bool = False) -> list[dict]:
    return list(iter_jsonl(path, skip_torn_last_line))


def write_jsonl(rows: Iterable[dict], path: str | os.PathLike) -> int:
    """Write rows as JSON lines (parent directories created, replaced whole); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
