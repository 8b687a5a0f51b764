"""The processes behind `common.verifier.MathVerifier`: the zygote, started once with 'spawn', which imports
math-verify and warms it up, then forks a checking child per request (`_zygote`); a checking child's loop
(`_worker`) and the check it runs (`_check`, math-verify's parse and verify with the fixes it needs); and
the parent's handle on the zygote (`Zygote`). Everything here but `Zygote` runs in those processes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import sys
import threading
import time
import types
from multiprocessing import connection as mp_connection
from multiprocessing import reduction

from common.answers import balanced, explicit_set

# Answer forms whose first check imports or builds something (factorisation for roots, sets,
# intervals, relations, matrices): the zygote checks them once, so that no child pays for it
# against its timeout.
_WARM_UP = [
    ("\\frac{1}{2}", "0.5"),
    ("\\sqrt{95823}", "39\\sqrt{63}"),
    ("\\{1,2\\}", "(1,2)"),
    ("2,1", "1,2"),
    ("[1, 3)", "[1,3)"),
    ("(2,1)", "(1,2)"),
    ("x=2", "2"),
    ("1<x<2", "(1,2)"),
    ("50\\%", "0.5"),
    ("\\pi/3", "\\frac{\\pi}{3}"),
    ("3.0", "3"),
    ("x^2+2x+1", "(x+1)^2"),
    ("60^\\circ", "60"),
    ("\\text{east}", "east"),
    ("1\\times10^{3}", "1000"),
    ("2+3i", "3i+2"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\log_2 8", "3"),
    ("\\sin(\\pi/6)", "1/2"),
]


def cpu_seconds(pid: int | None = None) -> float | None:
    """CPU time (user + system) a process has used: this one (pid None), or another from /proc
    (None where there is no /proc, or the process is gone)."""
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
    """Parse one answer string with math-verify.

    Wrapping in \\boxed{} makes math-verify's LaTeX extractor take the whole string
    as the answer: bare "\\frac{1}{2}", "2\\sqrt{3}" or "(1,2]" are otherwise not
    recognised. Free text ("x = 3 apples", "$5$ cm") falls back to plain parsing.
    Only a balanced string is wrapped, so no brace can close the box early.
    """
    s = s.strip().strip("$").strip()
    wrapped = parse("\\boxed{" + s + "}", parsing_timeout=None) if balanced(s) else None
    return wrapped or parse(s, parsing_timeout=None)


def _set_against_ordered(gold: str, gold_parsed: list, pred: str, pred_parsed: list) -> bool:
    """Is one answer a set written in set braces and the other an interval or a tuple? Never equal:
    math-verify pairs the two ends of an open interval with a two-element set ("(1,2)" = {1,2}) and
    sorts a tuple's elements against a set's, so that "(2,1)" = {1,2}."""
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
    """Make this process exit when its parent does, however it ends (kill -9 included): the kernel's
    parent-death signal on Linux, and (`watchdog`) a thread polling the parent's pid for the case
    the signal cannot cover (the parent gone before it was set, or not Linux)."""
    import signal

    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    if os.getppid() != parent_pid:
        os._exit(0)
    if watchdog:

        def watch():
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(0)

        threading.Thread(target=watch, daemon=True).start()


def _quiet_math_verify() -> None:
    """math-verify warns once that its timeouts are off, and logs every parse failure."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)


def _zygote(conn, parent_pid: int) -> None:
    """The process the checking children are forked from. It imports math-verify and warms it up
    once, then serves the parent's requests on `conn`, in order:

        ("fork", memory_mb): fork a child; reply its pid, then pass the parent its end of the child's
                             socket (SCM_RIGHTS)
        ("nice", pid):       lower the child's CPU priority to the lowest
        ("kill", pid):       kill the child and reap it
        None (or EOF):       kill every child and exit

    Only this process kills and reaps its children, so a pid it is asked about is never another
    process's: a child that has exited stays a zombie (its pid reserved) until the parent says kill.
    It runs no thread, so forking it is safe.
    """
    import signal

    _die_with_parent(parent_pid, watchdog=False)  # elsewhere the EOF on `conn` tells it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    _quiet_math_verify()
    try:
        from math_verify import parse, verify

        # Grammar building and lazy imports happen here once, not in every child against its timeout.
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
    """A checking child (forked from the zygote): receive (pred, gold), reply with a bool; None or EOF
    stops it."""
    import resource
    import signal

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
        # math-verify's own timeouts use signal.alarm: whole seconds only, one
        # alarm per parse/comparison (so no bound on the sum), and unable to stop
        # C-level big-integer work. The parent's kill is the real bound.
        if _set_against_ordered(gold, golds[gold], pred, parsed):
            return False
        return bool(verify(golds[gold], parsed, timeout_seconds=None))
    except BaseException:  # noqa: BLE001 - RecursionError, MemoryError, sympy internals
        return False


@contextlib.contextmanager
def _main_module_hidden():
    """Hide the parent's __main__ while a 'spawn' child is started.

    spawn re-imports the parent's main script in the child (as __mp_main__), i.e.
    a training script's top-level imports (torch, vLLM: seconds, hundreds of MB)
    at every (re)start. The child needs nothing from it: `_zygote` lives here, in a module of its own.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class Zygote:
    """The parent's handle on the zygote process and its request pipe."""

    def __init__(self, startup_timeout_s: float):
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()  # a socket pair: file descriptors can pass through it
        self.proc = ctx.Process(target=_zygote, args=(child_conn, os.getpid()), daemon=True, name="MathVerifier")
        with _main_module_hidden():
            self.proc.start()
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
        """A new child's pid and the socket to it (not ready until it says so). OSError/EOFError if the zygote is gone."""
        self.conn.send(("fork", memory_mb))
        if not self.conn.poll(timeout_s):
            raise OSError("the verifier's zygote did not answer")
        pid = self.conn.recv()
        fd = reduction.recv_handle(self.conn)
        return pid, mp_connection.Connection(fd)

    def tell(self, op: str, pid: int) -> None:
        with contextlib.suppress(OSError, ValueError):  # gone: its children went with it
            self.conn.send((op, pid))

    def kill(self) -> None:
        """Stop it; it kills and reaps its children first (they would die with it anyway)."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(timeout=5)
        self.conn.close()
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
