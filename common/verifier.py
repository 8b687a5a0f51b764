"""Symbolic answer checking with math-verify in child processes, bounded in time and memory.

    with MathVerifier(workers=2) as verifier:
        verifier.verify_batch(["\\frac{1}{2}", "0.6"], ["0.5", "0.5"])   # [True, False]

An answer that the exact-match fast path (`common.answers.normalize`) cannot settle
goes to HuggingFace's math-verify (sympy) in a child process that is killed when it
takes too long: sympy can hang on model-written expressions (10^{10^{10^{10}}}) in C
code that no signal interrupts, so only a process boundary bounds it.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import multiprocessing as mp
import os
import sys
import threading
import time
import types
import weakref
from multiprocessing import connection as mp_connection

from common.answers import balanced, canonical_unicode, normalize

# Answers longer than this never reach sympy (a prediction scores False, a gold answer
# only by exact match). A real final answer is short; a long "answer" is a rambling or
# degenerate generation, and parsing/simplifying a giant expression (thousands of
# nested \frac, a 100k-digit number) costs seconds of CPU each and would burn a full
# timeout plus a child restart per completion.
MAX_PRED_CHARS = 1000
MAX_GOLD_CHARS = 1000


def default_workers() -> int:
    """Verifier children per trainer process: a quarter of the cores this process may use,
    shared by the ranks of a node (accelerate's LOCAL_WORLD_SIZE), between 1 and 4."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(4, cores // (4 * local_ranks)))


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


def _die_with_parent(parent_pid: int) -> None:
    """Make this child exit when the trainer does, however it ends (kill -9 included):
    the kernel's parent-death signal on Linux, and a watchdog thread on the parent's pid
    (for the case the signal cannot cover: the parent gone before it was set)."""
    import signal

    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(0)

    if os.getppid() != parent_pid:
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def _worker(conn, parent_pid: int, memory_mb: int) -> None:
    """Child process loop: receive (pred, gold), reply with a bool; None stops it."""
    import logging
    import resource
    import signal

    _die_with_parent(parent_pid)
    # Ctrl-C reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # math-verify warns once that its timeouts are off, and logs every parse failure.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)
    try:
        from math_verify import parse, verify

        # Warm up (grammar building, lazy imports) so the first real check is not
        # charged for it against the parent's timeout.
        verify(_mv_parse("\\frac{1}{2}", parse), _mv_parse("0.5", parse), timeout_seconds=None)
        if memory_mb > 0:  # a check that needs more address space fails (MemoryError: False)
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, resource.RLIM_INFINITY))
            b"x" * 2**20  # noqa: B018 - there is headroom left to work in
    except Exception as e:  # noqa: BLE001 - report any startup failure to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))

    golds: dict[str, list] = {}  # each gold answer parsed once
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # parent is gone
            return
        if msg is None:
            return
        pred, gold = msg
        try:
            if gold not in golds:
                if len(golds) >= 4096:
                    golds.clear()
                golds[gold] = _mv_parse(gold, parse)
            # math-verify's own timeouts use signal.alarm: whole seconds only, one
            # alarm per parse/comparison (so no bound on the sum), and unable to stop
            # C-level big-integer work. The parent's kill is the real bound.
            ok = bool(verify(golds[gold], _mv_parse(pred, parse), timeout_seconds=None))
        except BaseException:  # noqa: BLE001 - RecursionError, MemoryError, sympy internals
            ok = False
        conn.send(ok)


@contextlib.contextmanager
def _main_module_hidden():
    """Hide the parent's __main__ while a 'spawn' child is started.

    spawn re-imports the parent's main script in the child (as __mp_main__), i.e.
    a training script's top-level imports (torch, vLLM: seconds, hundreds of MB)
    at every (re)start. The child needs nothing from it: `_worker` lives here.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _Child:
    """One verifier process and the pipe to it."""

    def __init__(self, memory_mb: int, startup_timeout_s: float):
        ctx = mp.get_context("spawn")
        self.start_deadline = time.monotonic() + startup_timeout_s
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker, args=(child_conn, os.getpid(), memory_mb), daemon=True, name="MathVerifier"
        )
        with _main_module_hidden():
            self.proc.start()
        child_conn.close()  # so the parent sees EOF if the child dies
        self.ready = False
        self.task: int | None = None  # index of the pair it is checking
        self.deadline = math.inf

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the child has said it is ready (RuntimeError if it cannot start)."""
        if not self.ready:
            self.take_ready(self.conn.poll(timeout_s))

    def take_ready(self, readable: bool) -> None:
        """Read the child's start-up message if it has come (`readable`); RuntimeError if it
        reported an error, exited, or has not come within its start-up time."""
        status, detail = None, "no reply"
        try:
            if readable:
                status, detail = self.conn.recv()
            elif time.monotonic() < self.start_deadline:
                return
        except (EOFError, OSError):
            detail = "child exited during start-up"
        if status != "ready":
            self.kill()
            raise RuntimeError(f"MathVerifier child failed to start: {detail}")
        self.ready = True

    def kill(self) -> None:
        self.conn.close()
        self.proc.kill()  # the child holds no state worth a polite shutdown
        self.proc.join(timeout=5)


_LIVE_VERIFIERS: weakref.WeakSet[MathVerifier] = weakref.WeakSet()


@atexit.register
def _close_all_verifiers() -> None:
    for v in list(_LIVE_VERIFIERS):
        v.close()


class MathVerifier:
    """Symbolic answer checking with math-verify, bounded in time and memory.

    math_verify.parse/verify run in `workers` persistent child processes started
    with the 'spawn' context (fresh interpreters, so safe to use after torch / vLLM
    threads exist; fork would copy their locks mid-state), a batch spread over them.
    Each check waits at most `timeout_s` seconds and may use `memory_mb` MB of
    address space (0: no limit); on timeout or child death the child is killed and
    restarted and that check scores False. `verify_batch(..., budget_s=...)` also
    bounds a whole batch: what is unchecked when the budget runs out scores False.
    Both count in `timeouts` (the `reward/timeouts` metric). The children start
    lazily, die with the trainer (even kill -9), and are killed by `close()`, the
    context manager, garbage collection or interpreter exit. Nothing a model can
    output may crash or hang the trainer.

    Not for concurrent use from several threads at once (calls are serialised by
    a lock). Start-up (~1 s a child, in parallel) is bounded by `startup_timeout_s`,
    and failing to start (e.g. math-verify not installed, `memory_mb` too small)
    raises RuntimeError: that is a setup error, not a wrong answer.
    """

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
        self.budget_s = budget_s  # default time budget of a verify_batch call
        self.workers = workers
        self.memory_mb = memory_mb
        self.startup_timeout_s = startup_timeout_s
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self.timeouts = 0  # checks scored False for lack of time, since the last take_timeouts()
        _LIVE_VERIFIERS.add(self)

    # -- children -----------------------------------------------------------

    def _ensure_children(self) -> None:
        for c in [c for c in self._children if not c.proc.is_alive()]:  # died between checks
            c.kill()
            self._children.remove(c)
        while len(self._children) < self.workers:
            self._children.append(_Child(self.memory_mb, self.startup_timeout_s))
        for c in self._children:  # started together, so their start-ups overlap
            if not c.ready:
                c.wait_ready(self.startup_timeout_s)

    def _replace(self, child: _Child) -> None:
        """Kill a stuck or dead child and start its successor now, so that its start-up
        overlaps with whatever comes next."""
        child.kill()
        self._children[self._children.index(child)] = _Child(self.memory_mb, self.startup_timeout_s)

    def _check_in_children(self, pairs: list[tuple[str, str]], budget_s: float | None) -> list[bool]:
        """Check (pred, gold) pairs on the children; False for each one that times out or is left
        when the budget runs out (counted in `timeouts`)."""
        self._ensure_children()
        results = [False] * len(pairs)
        todo = list(range(len(pairs)))[::-1]  # popped from the end: in order
        end = time.monotonic() + budget_s if budget_s is not None else math.inf
        while todo or any(c.task is not None for c in self._children):
            now = time.monotonic()
            if now >= end:  # out of budget: everything unchecked scores 0
                busy = [c for c in self._children if c.task is not None]
                self.timeouts += len(todo) + len(busy)
                for c in busy:
                    self._replace(c)
                break
            for c in self._children:
                if c.ready and c.task is None and todo:
                    c.task, c.deadline = todo.pop(), now + self.timeout_s
                    try:
                        c.conn.send(pairs[c.task])
                    except (OSError, ValueError):  # died: the wait below sees EOF
                        pass
            # Busy children, and successors still starting up (they take work once ready).
            waiting = [c for c in self._children if c.task is not None or not c.ready]
            wake = min([end, *(c.deadline if c.ready else c.start_deadline for c in waiting)])
            readable = set(mp_connection.wait([c.conn for c in waiting], timeout=max(0.0, wake - now)))
            for c in waiting:
                if not c.ready:
                    c.take_ready(c.conn in readable)
                    continue
                if c.conn in readable:
                    try:
                        results[c.task] = bool(c.conn.recv())
                        c.task = None
                        continue
                    except (EOFError, OSError):  # died mid-check (segfault, OOM kill)
                        pass
                elif time.monotonic() < c.deadline:
                    continue
                self.timeouts += 1  # timed out or died: this check scores False
                self._replace(c)
        return results

    # -- public API -----------------------------------------------------------

    def _fast(self, pred, gold) -> bool | None:
        """The verdict without a child, or None if it needs math-verify."""
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False
        pred, gold = canonical_unicode(pred), canonical_unicode(gold)
        p, g = normalize(pred), normalize(gold)
        if not p or not g:
            return False
        if p == g:
            return True
        if len(pred) > MAX_PRED_CHARS or len(gold) > MAX_GOLD_CHARS or not balanced(pred):
            return False  # too long to be an answer, or not one group (`12} {13`)
        return None

    def verify(self, pred: str, gold: str) -> bool:
        """True if the predicted answer is mathematically equivalent to the gold answer.

        Decided behaviours (from math-verify): "x=2" matches "2" (an assignment
        counts as its right-hand side), "1,2" matches "2,1" (comma lists are
        sets), a number matches its percentage form ("50\\%" vs "50").
        """
        return self.verify_batch([pred], [gold])[0]

    def verify_batch(self, preds: list[str | None], golds: list[str], budget_s: float | None = None) -> list[bool]:
        """`verify` over pairs, spread over the children; a None prediction (nothing extracted) is
        False without IPC. Pairs still unchecked after `budget_s` seconds (default: the verifier's
        own; None: no limit) score False."""
        if len(preds) != len(golds):
            raise ValueError(f"got {len(preds)} predictions for {len(golds)} gold answers")
        verdicts = [None if p is None else self._fast(p, g) for p, g in zip(preds, golds)]
        slow = [i for i, v in enumerate(verdicts) if v is None and preds[i] is not None]
        if slow:
            with self._lock:
                pairs = [(canonical_unicode(preds[i]), canonical_unicode(golds[i])) for i in slow]
                budget_s = self.budget_s if budget_s is None else budget_s
                for i, ok in zip(slow, self._check_in_children(pairs, budget_s)):
                    verdicts[i] = ok
        return [bool(v) for v in verdicts]

    def take_timeouts(self) -> int:
        """Checks scored False for running out of time since the last call (the `reward/timeouts` metric)."""
        n, self.timeouts = self.timeouts, 0
        return n

    def close(self) -> None:
        """Kill the children. The verifier stays usable: the next check starts new ones."""
        with self._lock:
            self._kill_all()

    def _kill_all(self) -> None:
        children, self._children = self._children, []
        for c in children:
            c.kill()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._kill_all()  # no lock: nobody else can hold a reference any more
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn modules down
            pass
