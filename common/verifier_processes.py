"""The processes behind `common.verifier.MathVerifier`: the zygote (`_zygote`), started once with 'spawn'
(a fresh interpreter, safe after torch / vLLM threads exist), which warms math-verify up and forks a checking
child (`_worker`, `_check`) per request; and the parent's handle on it (`Zygote`), the one thing here that
runs in the parent."""

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import resource
import signal
import socket
import sys
import threading
import time
import types
from multiprocessing import connection as mp_connection
from multiprocessing import reduction

from common.answers import balanced, explicit_set

# Answer forms whose first check imports or builds something (roots, sets, intervals, relations, matrices):
# the zygote checks them once, so that no child pays for it against its timeout.
_WARM_UP = [
    ("\\frac{1}{2}", "0.5"), ("\\sqrt{95823}", "39\\sqrt{63}"), ("\\{1,2\\}", "(1,2)"), ("2,1", "1,2"),
    ("[1, 3)", "[1,3)"), ("(2,1)", "(1,2)"), ("x=2", "2"), ("1<x<2", "(1,2)"), ("50\\%", "0.5"),
    ("\\pi/3", "\\frac{\\pi}{3}"), ("3.0", "3"), ("x^2+2x+1", "(x+1)^2"), ("60^\\circ", "60"),
    ("\\text{east}", "east"), ("1\\times10^{3}", "1000"), ("2+3i", "3i+2"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"), ("\\log_2 8", "3"),
    ("\\sin(\\pi/6)", "1/2"),
]  # fmt: skip


def cpu_seconds(pid: int | None = None) -> float | None:
    """CPU seconds (user + system) of this process (pid None) or another (/proc; None if unreadable)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _mv_parse(s: str, parse) -> list:
    """math-verify's parse of an answer, wrapped in \\boxed{} (if balanced, so no brace closes it early) so
    that its LaTeX extractor takes the whole string (bare "(1,2]" is not recognised); else plain text."""
    s = s.strip().strip("$").strip()
    wrapped = parse("\\boxed{" + s + "}", parsing_timeout=None) if balanced(s) else None
    return wrapped or parse(s, parsing_timeout=None)


def _set_against_ordered(gold: str, gold_parsed: list, pred: str, pred_parsed: list) -> bool:
    """Is one answer a set in set braces and the other an interval or a tuple? Never equal, though
    math-verify pairs them up ("(1,2)" = {1,2}, and sorting a tuple, "(2,1)" = {1,2})."""
    from sympy import FiniteSet, Interval, Tuple

    def shape(text: str, parsed: list) -> str | None:
        first = parsed[0] if parsed else None
        if isinstance(first, (Interval, Tuple)):
            return "ordered"
        if isinstance(first, FiniteSet) and explicit_set(text):
            return "set"
        return None

    return {shape(gold, gold_parsed), shape(pred, pred_parsed)} == {"set", "ordered"}


def _die_with_parent(parent_pid: int, watchdog: bool) -> None:
    """Exit when the parent does, even by kill -9: the parent-death signal on Linux, and (`watchdog`) a
    thread polling the parent's pid for what it cannot cover (the parent gone before, or not Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(0)
    if watchdog:

        def watch():
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(0)

        threading.Thread(target=watch, daemon=True).start()


def _zygote(conn, parent_pid: int) -> None:
    """The process the children fork from (no thread, so forking is safe). It warms math-verify up, then
    serves the parent's requests on `conn`: ("fork", memory_mb): a child, its pid and then its socket
    (SCM_RIGHTS); ("nice", pid); ("kill", pid): kill and reap; None or EOF: kill all and exit. Only it reaps
    its children, so a pid it is asked about is never another process's (a dead child stays a zombie)."""
    _die_with_parent(parent_pid, watchdog=False)  # elsewhere the EOF on `conn` tells it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    # math-verify warns once that its timeouts are off, and logs every parse failure.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)
    try:
        from math_verify import parse, verify

        for pred, gold in _WARM_UP:
            _check(pred, gold, {}, parse, verify)
    except Exception as e:  # noqa: BLE001 - report any startup failure to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))

    children: set[int] = set()
    dying: set[int] = set()  # killed, not reaped yet
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            msg = None
        if msg is None:
            break
        op, arg = msg
        if op == "fork":
            ours, theirs = socket.socketpair()
            zygote_pid = os.getpid()
            pid = os.fork()
            if pid == 0:  # the child: never returns into this loop
                try:
                    conn.close()
                    ours.close()
                    _die_with_parent(zygote_pid, watchdog=True)
                    _worker(mp_connection.Connection(theirs.detach()), arg, parse, verify)
                finally:
                    os._exit(0)
            theirs.close()
            children.add(pid)
            conn.send(pid)
            reduction.send_handle(conn, ours.fileno(), parent_pid)
            ours.close()
        elif op == "nice" and arg in children:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, arg, 19)
        elif op == "kill" and arg in children:
            children.discard(arg)
            with contextlib.suppress(OSError):
                os.kill(arg, signal.SIGKILL)
            dying.add(arg)
        for pid in list(dying):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            dying.discard(pid)
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in children | dying:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    os._exit(0)  # no interpreter teardown (sympy's objects: ~0.5 s); nothing is left to flush


def _worker(conn, memory_mb: int, parse, verify) -> None:
    """A checking child: receive (pred, gold), reply (verdict, CPU seconds); None or EOF stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if memory_mb > 0:  # a check that needs more address space fails (MemoryError: False)
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, resource.RLIM_INFINITY))
            b"x" * 2**20  # noqa: B018 - there is headroom left to work in
    except Exception as e:  # noqa: BLE001 - report any startup failure to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", cpu_seconds()))

    golds: dict[str, list] = {}  # each gold answer parsed once
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # parent is gone
            return
        if msg is None:
            return
        ok = _check(*msg, golds, parse, verify)
        conn.send((ok, cpu_seconds()))  # the CPU time so far: the parent's baseline for the next check


def _check(pred: str, gold: str, golds: dict[str, list], parse, verify) -> bool:
    """math-verify's verdict on one pair (`golds`: parsed gold answers, filled here)."""
    try:
        if gold not in golds:
            if len(golds) >= 4096:
                golds.clear()
            golds[gold] = _mv_parse(gold, parse)
        parsed = _mv_parse(pred, parse)
        # math-verify's own timeouts (signal.alarm: whole seconds, one per call, blind to C-level big-integer
        # work) are off: the parent's kill is the bound.
        if _set_against_ordered(gold, golds[gold], pred, parsed):
            return False
        return bool(verify(golds[gold], parsed, timeout_seconds=None))
    except BaseException:  # noqa: BLE001 - RecursionError, MemoryError, sympy internals
        return False


class Zygote:
    """The parent's handle on the zygote process and its request pipe."""

    def __init__(self, startup_timeout_s: float):
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()  # a socket pair: file descriptors can pass through it
        self.proc = ctx.Process(target=_zygote, args=(child_conn, os.getpid()), daemon=True, name="MathVerifier")
        # Hide __main__ from 'spawn', which would re-import the training script (torch, vLLM: seconds, hundreds
        # of MB); `_zygote` needs nothing from it.
        main, sys.modules["__main__"] = sys.modules["__main__"], types.ModuleType("__main__")
        try:
            self.proc.start()
        finally:
            sys.modules["__main__"] = main
        child_conn.close()  # so the parent sees EOF if it dies
        if not self.conn.poll(startup_timeout_s):
            self.kill()
            raise RuntimeError(f"MathVerifier failed to start: math-verify not ready in {startup_timeout_s:g} s")
        try:
            status, detail = self.conn.recv()
        except (EOFError, OSError):
            status, detail = None, "its process exited during start-up"
        if status != "ready":
            self.kill()
            raise RuntimeError(f"MathVerifier failed to start: {detail}")

    def fork(self, memory_mb: int, timeout_s: float) -> tuple[int, mp_connection.Connection]:
        """A new child's pid and socket (not ready until it says so); OSError/EOFError if the zygote is gone."""
        self.conn.send(("fork", memory_mb))
        if not self.conn.poll(timeout_s):
            raise OSError("the verifier's zygote did not answer")
        pid = self.conn.recv()
        return pid, mp_connection.Connection(reduction.recv_handle(self.conn))

    def tell(self, op: str, pid: int) -> None:
        with contextlib.suppress(OSError, ValueError):  # gone: its children went with it
            self.conn.send((op, pid))

    def kill(self) -> None:
        """Stop it; it kills and reaps its children first."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(timeout=5)
        self.conn.close()
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
