"""Symbolic answer checking with math-verify (sympy) in child processes, bounded in time and memory:
sympy can hang in C code no signal interrupts (10^{10^{10^{10}}}), so only a process boundary bounds it.

    with MathVerifier(workers=8) as verifier:
        verifier.verify_batch(["\\frac{1}{2}", "0.6"], ["0.5", "0.5"])   # [True, False]

The children fork from a warmed-up "zygote" (common/verifier_processes.py), so a killed one is replaced in
milliseconds, sharing its memory, instead of by a new interpreter importing sympy (~1 s of CPU).
"""

import atexit
import math
import os
import threading
import time
import weakref
from collections import deque
from multiprocessing import connection as mp_connection

from common.answers import balanced, canonical_answer, normalize
from common.verifier_processes import Zygote, cpu_seconds

# Longer answers never reach sympy (scored by exact match only): a real answer is short, and a giant
# expression (a 100k-digit number) would burn a full timeout and a child restart per completion.
MAX_PRED_CHARS = 1000
MAX_GOLD_CHARS = 1000
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
        if len(pred) > MAX_PRED_CHARS or len(gold) > MAX_GOLD_CHARS or not balanced(pred):
            return False, pred, gold  # too long to be an answer, or not one group (`12} {13`)
        return None, pred, gold

    def _fast(self, pred, gold) -> bool | None:
        return self._triage(pred, gold)[0]

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
