"""Rewards for verifiable math: answer extraction, symbolic checking, format rewards.

    verifier = MathVerifier(timeout_s=5.0)
    total, acc = compute_rewards(completions, answers, ["accuracy", "boxed_format"], verifier)

The model's final answer is the last \\boxed{...} of a completion (or, without a
box, its last <answer>...</answer> block). It is compared to the gold answer
first by exact match after light normalisation, then symbolically with
HuggingFace's math-verify (sympy) in a child process that is killed when it
takes too long: sympy can hang on model-written expressions (10^{10^{10^{10}}})
in C code that no signal interrupts, so only a process boundary bounds it.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable

# ---------------------------------------------------------------------------
# Answer extraction
# ---------------------------------------------------------------------------

# `(?![A-Za-z])` so that e.g. `\boxedfoo` is not taken for a box.
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _closing_brace(text: str, open_idx: int) -> int | None:
    """Index of the `}` closing the `{` at text[open_idx], or None if unbalanced.

    A backslash escapes the next character, so `\\{`/`\\}` (literal braces in a
    set) are not counted and `\\\\{` (line break, then a group) is.
    """
    depth, i = 0, open_idx
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the LAST \\boxed{...} (also \\fbox{...} and the `\\boxed 5` space form) in text.

    Nested braces are handled (\\boxed{\\frac{1}{2}} -> "\\frac{1}{2}"). None if there
    is no box or the last box's braces are unbalanced (we do not fall back to an
    earlier box: a truncated final answer is no answer).
    """
    if not isinstance(text, str):
        return None
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    i = matches[-1].end()
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] == "{":
        close = _closing_brace(text, i)
        return None if close is None else text[i + 1 : close]
    # `\boxed 5`: the argument is the next run of non-space, non-`$` characters.
    token = re.match(r"[^\s$]+", text[i:])
    return token.group(0) if token else None


def extract_answer(text: str) -> str | None:
    """The model's final answer.

    The last boxed content; if there is none (or it is unbalanced), the stripped
    content of the last <answer>...</answer> block (R1-style template); else None.
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    if not isinstance(text, str):
        return None
    blocks = _ANSWER_RE.findall(text)
    return blocks[-1].strip() if blocks else None


# ---------------------------------------------------------------------------
# Exact-match fast path
# ---------------------------------------------------------------------------

_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*(?=\{)")
# `(?![A-Za-z])` keeps `\rightarrow`, `\leftarrow` intact.
_DROP_RE = re.compile(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[!,;:]|\^\s*\{?\s*\\circ\s*\}?")


def _normalize(s: str) -> str:
    """Light normalisation for the exact-match fast path (not a semantic check).

    Only used to skip the child process when two answers are textually the
    same; anything cleverer is math-verify's job.
    """
    s = s.strip().strip("$").strip()
    # A whole-answer `\text{...}` wrapper ("\text{east}" -> "east"); only when its
    # brace closes at the very end, so `\text{a}+\text{b}` is left alone.
    m = _TEXT_WRAPPER_RE.match(s)
    if m and _closing_brace(s, m.end()) == len(s) - 1:
        s = s[m.end() + 1 : -1]
    s = _DROP_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = "".join(s.split())
    return s.rstrip(".")


# ---------------------------------------------------------------------------
# Symbolic check in a child process
# ---------------------------------------------------------------------------

# Predictions longer than this score False without reaching sympy. A real final
# answer is short; a long "answer" is a rambling or degenerate generation, and
# parsing/simplifying a giant expression (thousands of nested \frac, a 100k-digit
# number) costs seconds of CPU each and would burn a full timeout plus a child
# restart per completion.
MAX_PRED_CHARS = 1000


def _mv_parse(s: str, parse) -> list:
    """Parse one answer string with math-verify.

    Wrapping in \\boxed{} makes math-verify's LaTeX extractor take the whole string
    as the answer: bare "\\frac{1}{2}", "2\\sqrt{3}" or "(1,2]" are otherwise not
    recognised. Free text ("x = 3 apples", "$5$ cm") falls back to plain parsing.
    """
    s = s.strip().strip("$").strip()
    return parse("\\boxed{" + s + "}", parsing_timeout=None) or parse(s, parsing_timeout=None)


def _worker(conn) -> None:
    """Child process loop: receive (pred, gold), reply with a bool; None stops it."""
    import logging
    import signal

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
    except Exception as e:  # noqa: BLE001 - report any startup failure to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # parent is gone
            return
        if msg is None:
            return
        pred, gold = msg
        try:
            # math-verify's own timeouts use signal.alarm: whole seconds only, one
            # alarm per parse/comparison (so no bound on the sum), and unable to stop
            # C-level big-integer work. The parent's kill is the real bound.
            ok = bool(verify(_mv_parse(gold, parse), _mv_parse(pred, parse), timeout_seconds=None))
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


_LIVE_VERIFIERS: weakref.WeakSet[MathVerifier] = weakref.WeakSet()


@atexit.register
def _close_all_verifiers() -> None:
    for v in list(_LIVE_VERIFIERS):
        v.close()


class MathVerifier:
    """Symbolic answer checking with math-verify, bounded in time per call.

    math_verify.parse/verify run in a persistent child process started with the
    'spawn' context (a fresh interpreter, so it is safe to use after torch / vLLM
    threads exist; fork would copy their locks mid-state). Each check waits at most
    `timeout_s` seconds; on timeout or child death the child is killed and
    restarted and that check scores False. Nothing a model can output may crash
    or hang it. The child starts lazily on first use and is killed by `close()`,
    the context manager, garbage collection or interpreter exit (it is also a
    daemon process, and exits by itself when the parent's pipe closes).

    Not for concurrent use from several threads at once (calls are serialised by
    a lock). Start-up (a fresh child, ~1 s) is bounded separately by
    `startup_timeout_s`, and failing to start (e.g. math-verify not installed)
    raises RuntimeError: that is a setup error, not a wrong answer.
    """

    def __init__(self, timeout_s: float = 5.0, startup_timeout_s: float = 120.0):
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._proc = None
        self._conn = None
        self._ready = False
        self._lock = threading.Lock()
        self.timeouts = 0  # checks cut off by the time limit (scored False), since the last take_timeouts()
        _LIVE_VERIFIERS.add(self)

    # -- child lifecycle ----------------------------------------------------

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child_conn,), daemon=True, name="MathVerifier")
        with _main_module_hidden():
            proc.start()
        child_conn.close()  # so the parent sees EOF if the child dies
        self._proc, self._conn, self._ready = proc, parent_conn, False

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready = None, None, False
        if conn is not None:
            conn.close()
        if proc is not None:
            proc.kill()  # the child holds no state worth a polite shutdown
            proc.join(timeout=5)

    def _ensure_ready(self) -> None:
        if self._proc is not None and not self._proc.is_alive():
            self._kill()  # died between checks: not this check's fault
        if self._proc is None:
            self._start()
        if self._ready:
            return
        status, detail = None, "no reply"
        try:
            if self._conn.poll(self.startup_timeout_s):
                status, detail = self._conn.recv()
        except (EOFError, OSError):
            detail = "child exited during start-up"
        if status != "ready":
            self._kill()
            raise RuntimeError(f"MathVerifier child failed to start: {detail}")
        self._ready = True

    def _ask_child(self, pred: str, gold: str) -> bool:
        with self._lock:
            self._ensure_ready()
            try:
                self._conn.send((pred, gold))
                if self._conn.poll(self.timeout_s):
                    return bool(self._conn.recv())
            except (EOFError, OSError):  # child died mid-check (segfault, OOM kill)
                pass
            # Timed out or died: replace the child now, so its start-up overlaps
            # with whatever the caller does next.
            self.timeouts += 1
            self._kill()
            self._start()
            return False

    # -- public API -----------------------------------------------------------

    def verify(self, pred: str, gold: str) -> bool:
        """True if the predicted answer is mathematically equivalent to the gold answer.

        Decided behaviours (from math-verify): "x=2" matches "2" (an assignment
        counts as its right-hand side), "1,2" matches "2,1" (comma lists are
        sets), a number matches its percentage form ("50\\%" vs "50").
        """
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False
        p, g = _normalize(pred), _normalize(gold)
        if not p or not g:
            return False
        if p == g:
            return True
        if len(pred) > MAX_PRED_CHARS:
            return False
        return self._ask_child(pred, gold)

    def verify_batch(self, preds: list[str | None], golds: list[str]) -> list[bool]:
        """`verify` over pairs; a None prediction (nothing extracted) is False without IPC."""
        if len(preds) != len(golds):
            raise ValueError(f"got {len(preds)} predictions for {len(golds)} gold answers")
        return [pred is not None and self.verify(pred, gold) for pred, gold in zip(preds, golds)]

    def take_timeouts(self) -> int:
        """Checks scored False for running out of time since the last call (the `reward/timeouts` metric)."""
        n, self.timeouts = self.timeouts, 0
        return n

    def close(self) -> None:
        """Kill the child. The verifier stays usable: the next check starts a new one."""
        with self._lock:
            self._kill()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._kill()  # no lock: nobody else can hold a reference any more
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn modules down
            pass


# ---------------------------------------------------------------------------
# Reward functions
# ---------------------------------------------------------------------------
# Every REWARD_FUNCS entry can be called as fn(completions, answers, verifier);
# the format rewards accept and ignore the last two.


def accuracy_reward(completions: list[str], answers: list[str], verifier: MathVerifier) -> list[float]:
    """1.0 if extract_answer(completion) is equivalent to the gold answer, else 0.0."""
    preds = [extract_answer(c) for c in completions]
    return [float(ok) for ok in verifier.verify_batch(preds, answers)]


def boxed_format_reward(
    completions: list[str], answers: list[str] | None = None, verifier: MathVerifier | None = None
) -> list[float]:
    """1.0 if the completion has a complete (balanced) final box with non-empty content, else 0.0.

    "Final box" is what extract_boxed finds, so this rewards exactly the answers
    the accuracy reward can read (an unbalanced last box scores 0).
    """
    return [float(bool((extract_boxed(c) or "").strip())) for c in completions]


_THINK_FORMAT_RE = re.compile(r"^<think>\n?.*?\n?</think>\s*<answer>\n?.*?\n?</answer>$", re.DOTALL)
_THINK_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def think_format_reward(
    completions: list[str],
    answers: list[str] | None = None,
    verifier: MathVerifier | None = None,
    *,
    prompt_ends_with_think: bool = False,
) -> list[float]:
    """R1 format: 1.0 for `<think>...</think> <answer>...</answer>`, exactly one of each tag, else 0.0.

    With `prompt_ends_with_think=True` (chat templates that end the prompt with
    "<think>"), the completion is judged as if that "<think>" were its start, so
    it may begin with the reasoning directly; a completion that repeats the
    "<think>" tag itself is accepted too.
    """
    scores = []
    for c in completions:
        if prompt_ends_with_think and not c.startswith("<think>"):
            c = "<think>" + c
        # Count first: it rules out nested/repeated tags the lazy regex would accept.
        ok = all(c.count(tag) == 1 for tag in _THINK_TAGS) and _THINK_FORMAT_RE.match(c) is not None
        scores.append(float(ok))
    return scores


REWARD_FUNCS: dict[str, Callable[..., list[float]]] = {
    "accuracy": accuracy_reward,
    "boxed_format": boxed_format_reward,
    "think_format": think_format_reward,
}


def compute_rewards(
    completions: list[str],
    answers: list[str],
    reward_names: list[str],
    verifier: MathVerifier,
    *,
    prompt_ends_with_think: bool = False,
) -> tuple[list[float], list[float]]:
    """(total reward per completion = sum of the named rewards, 0/1 accuracy per completion).

    Accuracy is always computed (it is the metric to log even when training on
    format rewards) and reused if "accuracy" is among the rewards.
    """
    unknown = [name for name in reward_names if name not in REWARD_FUNCS]
    if unknown:
        raise ValueError(f"unknown reward name(s) {unknown}; valid choices: {sorted(REWARD_FUNCS)}")
    accuracy = accuracy_reward(completions, answers, verifier)
    total = [0.0] * len(completions)
    for name in reward_names:
        if name == "accuracy":
            scores = accuracy
        elif name == "think_format":
            scores = think_format_reward(completions, prompt_ends_with_think=prompt_ends_with_think)
        else:
            scores = REWARD_FUNCS[name](completions, answers, verifier)
        total = [t + s for t, s in zip(total, scores)]
    return total, accuracy
