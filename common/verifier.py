"""Symbolic answer checking with math-verify (sympy) in child processes, bounded in time and memory:
sympy can hang in C code no signal interrupts (10^{10^{10^{10}}}), so only a process boundary bounds it.

    with MathVerifier(workers=8) as verifier:
        verifier.verify_batch(["\\frac{1}{2}", "0.6"], ["0.5", "0.5"])   # [True, False]

The children fork from a warmed-up "zygote" (`_zygote`, started once with 'spawn', safe after torch / vLLM
threads exist; `Zygote` is the parent's handle), so a killed one is replaced in milliseconds, sharing its
memory, instead of by a new interpreter importing sympy (~1 s of CPU).
"""

import atexit
import contextlib
import ctypes
import logging
import math
import multiprocessing as mp
import os
import resource
import signal
import socket
import sys
import threading
import time
import types
import weakref
from collections import deque
from multiprocessing import connection as mp_connection
from multiprocessing import reduction

from common.answers import balanced, canonical_answer, math_verify_parse, normalize, set_against_ordered

# Longer answers never reach sympy (scored by exact match only): a real answer is short, and a giant
# expression (a 100k-digit number) would burn a full timeout and a child restart per completion.
MAX_ANSWER_CHARS = 1000
# A check that has used this much CPU will almost always time out: its child drops to the lowest CPU
# priority, leaving the cores to the quick checks, and is replaced once it answers. CPU time, not wall
# time: on a loaded machine a quick check can wait this long for a core, and nicing it would starve it.
NICE_AFTER_S = 0.5
NICE_POLL_S = 0.25


def default_workers() -> int:
    """Verifier children per trainer process: two per usable core, shared by a node's ranks
    (LOCAL_WORLD_SIZE), between 8 and 16. More than cores on purpose: a hard answer waits out its timeout
    niced (`NICE_AFTER_S`), so the pool's size is how many can wait at once (~15 MB each; 8 children, 5 s
    timeout: 1.6 hard answers a second; benchmarks/rewards.py)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(8, min(16, 2 * cores // local_ranks))


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
            golds[gold] = math_verify_parse(gold, parse)
        parsed = math_verify_parse(pred, parse)
        # math-verify's own timeouts (signal.alarm: whole seconds, one per call, blind to C-level big-integer
        # work) are off: the parent's kill is the bound.
        if set_against_ordered(gold, golds[gold], pred, parsed):
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


class _Child:
    """One checking process (a child of the zygote) and the socket to it."""

    def __init__(self, pid: int, conn, start_deadline: float):
        self.pid = pid
        self.conn = conn
        self.start_deadline = start_deadline
        self.ready = False
        self.task: int | None = None  # index of the pair it is checking
        self.started = math.inf  # when that check was sent
        self.deadline = math.inf
        self.cpu_base = 0.0  # its CPU time when that check was sent (as it last reported)
        self.next_look = math.inf  # when to look at that check's CPU time next
        self.niced = False

    def grinding(self, now: float) -> bool:
        """Has its check used NICE_AFTER_S of CPU (of wall time where there is no /proc)?"""
        self.next_look = now + NICE_POLL_S
        cpu = cpu_seconds(self.pid)
        return (now - self.started if cpu is None else cpu - self.cpu_base) >= NICE_AFTER_S


_LIVE_VERIFIERS: "weakref.WeakSet[MathVerifier]" = weakref.WeakSet()


@atexit.register
def _close_all_verifiers() -> None:
    for v in list(_LIVE_VERIFIERS):
        v.close()


class MathVerifier:
    """math-verify in up to `workers` children, a batch spread over them in order (so a budget leaves the
    batch's tail unchecked: as few groups as can be). A check waits at most `timeout_s` and may use
    `memory_mb` MB of address space (0: no limit); one that times out (or whose child dies) scores False,
    counts in `take_timeouts()`, and its child is replaced. The children start lazily and die with the
    trainer (even kill -9), on `close()` or exit: nothing a model writes may crash or hang the trainer.
    Calls are serialised by a lock. Failing to start within `startup_timeout_s` (math-verify missing,
    `memory_mb` too small) raises RuntimeError: a setup error, not a wrong answer."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        workers: int = 1,
        memory_mb: int = 2048,
        budget_s: float | None = None,
        startup_timeout_s: float = 120.0,
    ):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.timeout_s = timeout_s
        self.budget_s = budget_s  # default budget of a verify_batch call (None: no limit)
        self.workers = workers
        self.memory_mb = memory_mb
        self.startup_timeout_s = startup_timeout_s
        self._zygote: Zygote | None = None
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self.timeouts = 0  # checks scored False for running out of time, since the last take_timeouts()
        _LIVE_VERIFIERS.add(self)

    def _fork(self) -> _Child:
        """A new child from the zygote, (re)starting the zygote if there is none or it has died."""
        for attempt in range(2):
            if self._zygote is None or not self._zygote.proc.is_alive():
                self._kill_all()  # its children died with it (Linux); never touch their pids again
                self._zygote = Zygote(self.startup_timeout_s)
            try:
                pid, conn = self._zygote.fork(self.memory_mb, self.startup_timeout_s)
            except (OSError, EOFError):
                if attempt:
                    raise RuntimeError("MathVerifier cannot start a child: its zygote keeps failing") from None
                self._zygote.proc.kill()  # unresponsive or gone: start a new one
                self._zygote.proc.join(timeout=5)
                continue
            child = _Child(pid, conn, time.monotonic() + self.startup_timeout_s)
            self._children.append(child)
            return child
        raise AssertionError("unreachable")

    def _retire(self, child: _Child) -> None:
        """Kill a child (stuck, dead, niced or unwanted); its successor is forked when there is work."""
        self._children.remove(child)
        child.conn.close()
        self._zygote.tell("kill", child.pid)

    def _ensure_children(self, n: int | None = None) -> None:
        """At least `n` (default: `workers`) live, ready children; those that died in between replaced."""
        n = self.workers if n is None else min(n, self.workers)
        if self._zygote is not None and not self._zygote.proc.is_alive():
            self._kill_all()
        for c in [c for c in self._children if c.ready and c.conn.poll()]:  # EOF: died between checks
            self._retire(c)
        for c in self._children[self.workers :]:  # `workers` was lowered
            self._retire(c)
        while len(self._children) < n:
            self._fork()
        deadline = time.monotonic() + self.startup_timeout_s
        for c in self._children:  # forked together, so their start-ups overlap
            if not c.ready:
                self._take_ready(c, c.conn.poll(max(0.0, deadline - time.monotonic())))

    def _take_ready(self, child: _Child, readable: bool) -> None:
        """Read a child's start-up message if `readable`; retired and RuntimeError if it failed, exited or is late."""
        status, detail = None, "no reply"
        try:
            if readable:
                status, detail = child.conn.recv()
            elif time.monotonic() < child.start_deadline:
                return
        except (EOFError, OSError):
            detail = "child exited during start-up"
        if status != "ready":
            self._retire(child)
            raise RuntimeError(f"MathVerifier child failed to start: {detail}")
        child.ready, child.cpu_base = True, detail

    def _check_in_children(self, pairs: list[tuple[str, str]], budget_s: float) -> list[bool | None]:
        """Check (pred, gold) pairs on the children, in order: False for a timeout (counted in `timeouts`),
        None for a pair still unchecked after `budget_s` seconds."""
        self._ensure_children(len(pairs))
        results: list[bool | None] = [None] * len(pairs)
        todo = deque(range(len(pairs)))
        end = time.monotonic() + budget_s
        while todo or any(c.task is not None for c in self._children):
            now = time.monotonic()
            if now >= end:
                break
            while todo and len(self._children) < min(self.workers, len(pairs)):
                self._fork()  # the successor of a retired child, ready within milliseconds
            for c in self._children:
                if c.ready and c.task is None and todo:
                    c.task, c.started, c.deadline = todo.popleft(), now, now + self.timeout_s
                    c.next_look = now + NICE_AFTER_S
                    try:
                        c.conn.send(pairs[c.task])
                    except (OSError, ValueError):  # died: the wait below sees EOF
                        pass
            # Busy children, and successors still starting up (they take work once ready).
            waiting = [c for c in self._children if c.task is not None or not c.ready]
            wakes = [end] + [
                c.start_deadline if not c.ready else c.deadline if c.niced else min(c.deadline, c.next_look)
                for c in waiting
            ]
            readable = set(mp_connection.wait([c.conn for c in waiting], timeout=max(0.0, min(wakes) - now)))
            now = time.monotonic()
            for c in waiting:
                if not c.ready:
                    self._take_ready(c, c.conn in readable)
                    continue
                if c.conn in readable:
                    try:
                        ok, c.cpu_base = c.conn.recv()
                        results[c.task], c.task = bool(ok), None
                        if c.niced:  # cannot be given its priority back: a fresh one replaces it
                            self._retire(c)
                        continue
                    except (EOFError, OSError):  # died mid-check (segfault, OOM kill)
                        pass
                elif now < c.deadline:
                    if not c.niced and now >= c.next_look and c.grinding(now):
                        self._zygote.tell("nice", c.pid)
                        c.niced = True
                    continue
                results[c.task] = False  # timed out or died: scores False, like math-verify's own timeout
                self.timeouts += 1
                self._retire(c)
        for c in [c for c in self._children if c.task is not None]:  # out of budget: left unchecked (None)
            self._retire(c)
        return results

    def _triage(self, pred, gold) -> tuple[bool | None, str, str]:
        """(the verdict without a child, or None if it needs math-verify; both answers canonical)."""
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False, "", ""
        pred, gold = canonical_answer(pred), canonical_answer(gold)
        p, g = normalize(pred), normalize(gold)
        if not p or not g:
            return False, pred, gold
        if p == g:
            return True, pred, gold
        if max(len(pred), len(gold)) > MAX_ANSWER_CHARS or not balanced(pred):
            return False, pred, gold  # too long to be an answer, or not one group (`12} {13`)
        return None, pred, gold

    def _slow(self, pred: str, gold: str) -> bool:
        """math-verify's verdict on the canonical answers, skipping the fast path (for tests)."""
        _, pred, gold = self._triage(pred, gold)
        with self._lock:
            return self._check_in_children([(pred, gold)], math.inf)[0]

    def verify(self, pred: str, gold: str) -> bool:
        """Is `pred` mathematically equivalent to `gold` (no time budget)? As math-verify decides: "x=2"
        matches "2", "1,2" matches "2,1", "50\\%" matches "50"; an explicit set never matches "(1,2)"."""
        return bool(self.verify_batch([pred], [gold], budget_s=math.inf)[0])

    def verify_batch(
        self, preds: list[str | None], golds: list[str], budget_s: float | None = None
    ) -> list[bool | None]:
        """`verify` over pairs; a None prediction is False. A pair still unchecked after `budget_s` (default
        the verifier's; None or math.inf: no limit) gets None, neither right nor wrong."""
        if len(preds) != len(golds):
            raise ValueError(f"got {len(preds)} predictions for {len(golds)} gold answers")
        triaged = [(False, "", "") if p is None else self._triage(p, g) for p, g in zip(preds, golds)]
        verdicts: list[bool | None] = [v for v, _, _ in triaged]
        slow = [i for i, v in enumerate(verdicts) if v is None]
        budget = self.budget_s if budget_s is None else budget_s
        if slow and budget is not None and budget <= 0:
            return verdicts  # no time at all: the slow ones stay None
        if slow:
            with self._lock:
                pairs = [triaged[i][1:] for i in slow]
                checked = self._check_in_children(pairs, math.inf if budget is None else budget)
            for i, ok in zip(slow, checked):
                verdicts[i] = ok
        return verdicts

    def take_timeouts(self) -> int:
        """Checks scored False for a timeout or a dead child since the last call (`reward/timeouts`);
        pairs a budget left unchecked are not counted."""
        n, self.timeouts = self.timeouts, 0
        return n

    def close(self) -> None:
        """Kill the children. The verifier stays usable: the next check starts new ones."""
        with self._lock:
            self._kill_all()

    def _kill_all(self) -> None:
        children, self._children = self._children, []
        for c in children:
            c.conn.close()
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.kill()  # it kills and reaps the children

    def __enter__(self) -> "MathVerifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._kill_all()  # no lock: nobody else can hold a reference any more
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn modules down
            pass
