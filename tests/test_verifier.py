"""Tests for common/verifier.py: verdicts (on the exact-match fast path and on math-verify's), per-check
timeouts, the batch budget's None, the pool and its children's lives."""

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from test_answers import DIGIT_ZEROS, SUB_DIGITS, SUP_DIGITS, fuzz_texts, in_script
from train_utils import ROOT

import common.verifier as verifier_module
from common.verifier import MAX_ANSWER_CHARS, MathVerifier, default_workers

TIMEOUT_S = 1.0
# A legal expression sympy never finishes with: comparing it to 1 evaluates a
# tower of powers in C code (the check hangs deterministically).
HANGS = "10^{10^{10^{10}}}"


@pytest.fixture(scope="module")
def shared():
    """One verifier for the whole module (its start-up, math-verify warmed up, costs seconds); each test
    sets what it needs on it."""
    with MathVerifier(timeout_s=30.0, workers=2) as v:
        yield v


@pytest.fixture
def judge(shared):
    """A long per-check timeout: for verdicts, which must not depend on how loaded the machine is."""
    return shared


@pytest.fixture
def verifier(shared, monkeypatch):
    """The module's verifier with a short per-check timeout (restored after the test), a clean counter,
    and `set(**settings)` to change more."""

    def set_(**settings):
        for name, value in settings.items():
            monkeypatch.setattr(shared, name, value)
        return shared

    set_(timeout_s=TIMEOUT_S)
    shared.take_timeouts()
    shared.set = set_
    yield shared
    del shared.set
    shared.take_timeouts()


# --- verdicts -----------------------------------------------------------------------------------------

SEPARATORS = [" ", "\u00a0", "\u2009", "\u202f", "\u3000", "\\,", "\\ ", "\\;", "~"]
FORMAT_CHARS = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u200e", "\u2062"]

VERDICTS = [
    (r"\frac{1}{2}", "0.5", True),
    ("0.5", r"\frac{1}{2}", True),
    (r"2\sqrt{3}", r"\sqrt{12}", True),
    ("68", "68", True),
    (r"\dfrac{3}{4}", "0.75", True),
    (r"\pi/3", r"\frac{\pi}{3}", True),
    ("(1, 2]", "(1,2]", True),
    (r"\{2,1\}", r"\{1,2\}", True),
    ("$5$", "5", True),
    (r"60^\circ", "60", True),
    ("60°", "60", True),
    (r"\text{(B)}", "B", True),
    ("3", "4", False),
    ("(1, 2)", "(1,2]", False),
    # Decision (math-verify's default, as in open-r1): an assignment counts as its
    # right-hand side, so "x=2" is a correct answer to gold "2" and vice versa.
    ("x=2", "2", True),
    ("2", "x=2", True),
    ("x=3", "2", False),
    ("1,2", "2,1", True),  # comma lists are sets
    ("50\\%", "50", True),  # a number matches its percentage form
    ("50", "50\\%", True),
    ("1 2", "12", False),  # separate numbers are not joined by dropping the space
    ("1 + 2", "1+2", True),  # layout spaces still do not matter
    ("１２", "12", True),  # fullwidth digits
    ("½", "\\frac{1}{2}", True),  # vulgar fraction
    ("−3", "-3", True),  # the Unicode minus sign
    # Superscripts and subscripts stay exponents and indices (NFKC made them digits: "10²" == "102").
    ("10²", "102", False),
    ("10²", "100", True),
    ("2⁻¹", "2-1", False),
    ("2⁻¹", "\\frac{1}{2}", True),
    ("x²", "x2", False),
    ("x²", "x^2", True),
    ("x²³", "x^{23}", True),
    ("10⁻²", "0.01", True),
    ("10⁻²", "10-2", False),
    ("e⁻¹", "\\frac{1}{e}", True),
    ("x₁", "x1", False),
    ("x₁", "x_1", True),
    # An explicit set never equals an interval or a tuple (math-verify paired their elements up).
    ("(1,2)", "\\{1,2\\}", False),
    ("\\{1,2\\}", "(1,2)", False),
    ("(2,1)", "\\{1,2\\}", False),
    ("\\{1,2\\}", "(2,1)", False),
    ("[1,2]", "\\{1,2\\}", False),
    ("(1,2]", "\\{1,2\\}", False),
    ("\\left(1,2\\right)", "\\left\\{1,2\\right\\}", False),
    ("(1,2)", "\\lbrace 1,2 \\rbrace", False),
    ("1,2", "\\{1,2\\}", True),  # a bare list is a set
    ("\\{1,2\\}", "1,2", True),
    ("1,2", "(1,2)", True),  # ... and, as math-verify decides, may name the point (1,2)
    ("\\{1\\}", "[1,1]", True),  # [1,1] is the set {1}
    # Other scripts' digits, invisible characters, thousands separators, scientific notation.
    ("٣", "3", True),
    ("٣٫٥", "3.5", True),
    ("٣٫٥", "\\frac{7}{2}", True),
    ("۱۲", "12", True),
    ("١٬٠٠٠", "1000", True),
    ("1 000 000", "10^6", True),
    ("1,000", "1000", True),
    ("10 00", "1000", False),  # not a thousands grouping
    ("1000 000", "1000000", False),
]
VERDICTS += [(in_script("305", z), "305", True) for z in DIGIT_ZEROS]
VERDICTS += [(in_script("306", z), "305", False) for z in DIGIT_ZEROS]
VERDICTS += [(in_script("-3.5", z), "-\\frac{7}{2}", True) for z in DIGIT_ZEROS]
VERDICTS += [(f"3{c}", str(3**d), True) for d, c in enumerate(SUP_DIGITS)]
VERDICTS += [(f"3{c}", f"3{d}", False) for d, c in enumerate(SUP_DIGITS)]
VERDICTS += [(f"x{c}", f"x_{d}", True) for d, c in enumerate(SUB_DIGITS)]
VERDICTS += [(f"x{c}", f"x{d}", False) for d, c in enumerate(SUB_DIGITS)]
for c in FORMAT_CHARS:
    VERDICTS += [
        (f"5{c}", "5", True),
        (f"1{c}2", "12", True),
        (f"{c}\\frac{{1}}{{2}}", "0.5", True),
        (f"5{c}", "6", False),
    ]
for sep in SEPARATORS:
    VERDICTS += [
        (f"1{sep}000", "1000", True),
        (f"1{sep}000{sep}000", "1000000", True),
        (f"-12{sep}345.5", "-12345.5", True),
        (f"1{sep}2", "12", False),
        (f"10{sep}00", "1000", False),
        (f"1{sep}000", "1", False),
    ]
VERDICTS += [
    (s, "1000", True)
    for s in ["1e3", "1E3", "1e+3", "1.0e3", "10e2", "0.1e4", "1\\times10^{3}", "1 \\times 10^3", "1\\cdot10^{3}"]
    + ["10^3", "10^{3}", "10³", "1{,}000"]
]
VERDICTS += [(s, "0.015", True) for s in ["1.5e-2", "1.5E-2", "15e-3", "1.5\\times10^{-2}", "1.5 \\cdot 10^{-2}"]]
VERDICTS += [
    ("1e4", "1000", False),
    ("1e3", "100", False),
    ("1e3", "3", False),
    ("1e100", "10^{100}", True),
    ("1e-40", "10^{-40}", True),
    ("2.5e3", "\\frac{5000}{2}", True),
    ("-1e3", "-1000", True),
]


@pytest.mark.parametrize("pred, gold, expected", VERDICTS, ids=lambda x: ascii(x) if isinstance(x, str) else str(x))
def test_verdict_on_both_paths(judge, pred, gold, expected):
    """The verdict is right whichever path gives it: the exact-match fast path says it or defers
    (None), and math-verify on the canonical answers says it too."""
    assert judge._triage(pred, gold)[0] in (None, expected)
    assert judge._slow(pred, gold) is expected
    assert judge.verify(pred, gold) is expected


def test_verify_batch_none_and_length(verifier):
    assert verifier.verify_batch([None, "7", "8"], ["7", "7", "7"]) == [False, True, False]
    with pytest.raises(ValueError):
        verifier.verify_batch(["1"], ["1", "2"])


def test_an_answer_is_one_balanced_group(verifier):
    assert verifier.verify("12} {13", "12") is False  # unbalanced: never wrapped in a box


# --- what a trainer must survive: adversarial output, hard answers, its own death -------------------

_rng = __import__("random").Random(0)
PATHOLOGICAL = [
    "\\boxed{" * 5000,
    "9" * 100_000,
    "x" * 1_000_000,
    HANGS,
    "\\frac{" * 300,
    "\\frac{" * 100 + "1",  # under the length cap: reaches sympy
    "{" * 900,
    "(" * 900,
    "\\sqrt{" * 150 + "2" + "}" * 150,
    bytes(_rng.randrange(256) for _ in range(800)).decode("latin-1"),
    "".join(chr(_rng.randrange(0x110000)) for _ in range(500)),  # includes lone surrogates
    "\ud800\udfff\x00\ufffd",
    "\\",
    "}{",
    "",
    "   ",
    "$$",
    "1e" + "9" * 5000,
    "²" * 900,
]


@pytest.mark.parametrize("pred", PATHOLOGICAL, ids=lambda p: repr(p[:20]) + f"..len{len(p)}")
def test_pathological_inputs_are_bounded(verifier, pred):
    assert verifier.verify("1/2", "0.5")  # ensure the children are up, so only this call is timed
    assert verifier.verify("2", "1") is False
    t0 = time.perf_counter()
    assert verifier.verify(pred, "1") is False
    assert time.perf_counter() - t0 < TIMEOUT_S + 2
    # still works afterwards (after a replacement if that call timed out)
    assert verifier.verify(r"\frac{1}{2}", "0.5")


def test_length_cap_skips_sympy(verifier):
    long_but_right = "1" + " " * MAX_ANSWER_CHARS + "+0"
    t0 = time.perf_counter()
    assert verifier.verify(long_but_right, "1") is False
    assert time.perf_counter() - t0 < 0.1
    assert verifier.verify("1" + " " * MAX_ANSWER_CHARS, "1")  # exact match still counts


@pytest.mark.parametrize("n", [1_000, 100_000, pytest.param(1_000_000, marks=pytest.mark.slow)])
def test_the_fast_path_is_linear(n):
    """The fast path reads whole completions' worth of degenerate output in linear time, and never
    starts a child for them (they are too long to be answers)."""
    texts = fuzz_texts(n)
    v = MathVerifier()
    t0 = time.perf_counter()
    for text in texts:
        v._triage(text, "1")
    per_char = (time.perf_counter() - t0) / sum(map(len, texts))
    assert per_char < 2e-6, f"{per_char * 1e6:.2f} us per character"  # linear: ~0.3 us; quadratic: seconds
    assert v._zygote is None and v._children == []


def test_timeout_kills_and_replaces_the_child(verifier):
    v = verifier.set(timeout_s=0.5, workers=1)
    assert v.verify("1/2", "0.5")
    old_pid = v._children[0].pid
    t0 = time.perf_counter()
    assert v.verify(HANGS, "1") is False  # a timeout is a wrong answer, as in math-verify
    assert time.perf_counter() - t0 < 0.5 + 2
    assert v.take_timeouts() == 1 and v.take_timeouts() == 0
    assert v.verify("1/2", "0.5")
    assert v._children[0].pid != old_pid
    assert not _alive(old_pid)


def test_hard_answers_cost_their_timeout_and_no_restart(verifier):
    """A killed child's successor is forked from the warm zygote in milliseconds: four hard answers on one
    child cost four timeouts, not four timeouts plus four interpreter start-ups (~1.2 s each before)."""
    v = verifier.set(timeout_s=0.5, workers=1)
    v._ensure_children()
    t0 = time.perf_counter()
    assert v.verify_batch([HANGS] * 4 + ["1/2"], ["1"] * 4 + ["0.5"]) == [False] * 4 + [True]
    assert time.perf_counter() - t0 < 4 * 0.5 + 1.5
    assert v.take_timeouts() == 4


def test_the_budget_leaves_unchecked_answers_none(verifier):
    """Out of budget, an answer is neither right nor wrong (None; the scripts then train its group on
    nothing), and is not a timeout; `budget_s=None` means the verifier's own budget, math.inf none."""
    v = verifier.set(timeout_s=1.0, workers=2, budget_s=0.5)
    v._ensure_children()
    t0 = time.perf_counter()
    assert v.verify_batch([HANGS, HANGS, "1/2"], ["1", "1", "0.5"]) == [None] * 3  # both children stuck
    assert time.perf_counter() - t0 < 0.5 + 1.0
    assert v.take_timeouts() == 0
    # One child grinds on the hard answer; the other checks the rest within the budget.
    assert v.verify_batch(["1/2", HANGS, "0.25", "3"], ["0.5", "1", "1/4", "4"]) == [True, None, True, False]
    assert v.take_timeouts() == 0
    assert v.verify_batch([HANGS, "1/2"], ["1", "0.5"], budget_s=math.inf) == [False, True]
    assert v.take_timeouts() == 1
    # No time at all: what the fast path settles is settled, the rest is None.
    assert v.verify_batch([None, "5", "1/2"], ["5", "5", "0.5"], budget_s=0) == [False, True, None]
    v.set(budget_s=0)
    assert v.verify_batch(["1/2"], ["0.5"]) == [None]  # budget_s=None: the verifier's own
    assert v.verify("1/2", "0.5") is True  # verify() has no budget
    v.set(budget_s=None)  # no budget of its own: no limit
    assert v.verify_batch(["1/2"], ["0.5"]) == [True]


def test_a_pool_checks_in_parallel(verifier):
    v = verifier.set(timeout_s=1.5, workers=2)
    v._ensure_children()
    t0 = time.perf_counter()
    assert v.verify_batch([HANGS, "1/2", HANGS, "0.25"], ["1", "0.5", "1", "1/4"]) == [False, True, False, True]
    assert time.perf_counter() - t0 < 2 * 1.5  # the two hangs run side by side: one timeout, not two
    assert v.take_timeouts() == 2
    assert v.verify("1/2", "0.5")  # the replaced children work


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_grinding_check_gets_the_lowest_priority(verifier):
    """A check that has used NICE_AFTER_S of CPU is niced, so hard answers waiting out their timeouts
    leave the cores to the quick checks."""
    v = verifier.set(timeout_s=60, workers=2)
    v._ensure_children()
    assert all(_nice(c.pid) == _nice(os.getpid()) for c in v._children)
    result = []
    worker = threading.Thread(target=lambda: result.extend(v.verify_batch([HANGS], ["1"])))
    worker.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(c.niced for c in v._children):
        time.sleep(0.05)
    busy = [c for c in v._children if c.task is not None]
    assert len(busy) == 1 and busy[0].niced
    time.sleep(0.2)  # the zygote has done it
    assert _nice(busy[0].pid) == 19
    idle = [c for c in v._children if c.task is None]
    assert all(_nice(c.pid) == _nice(os.getpid()) for c in idle)
    os.kill(busy[0].pid, signal.SIGKILL)  # end the check: a dead child's check scores False
    worker.join(10)
    assert result == [False]


def test_a_niced_child_is_replaced_once_it_answers(verifier, monkeypatch):
    v = verifier.set(timeout_s=30, workers=1)
    v._ensure_children()
    first = v._children[0].pid
    with monkeypatch.context() as m:
        m.setattr(verifier_module, "NICE_AFTER_S", 0.0)  # every check counts as grinding once looked at
        for _ in range(10):  # a check answered before its first look (a loaded machine) is never niced: again
            assert v.verify_batch(["\\sqrt{12}", "0.25"], ["2\\sqrt{3}", "1/4"]) == [True, True]
            if first not in [c.pid for c in v._children]:
                break
    assert first not in [c.pid for c in v._children] and not _alive(first)
    assert v.verify("1/2", "0.5")  # by a fresh child, at the usual priority
    assert _nice(v._children[0].pid) == _nice(os.getpid())


def test_child_death_is_survived(verifier):
    v = verifier.set(workers=1)
    assert v.verify("1/2", "0.5")
    pid = v._children[0].pid
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    assert v.verify("1/2", "0.5")  # died between checks: replaced transparently
    assert v._children[0].pid != pid


def test_children_run_under_the_memory_limit(verifier):
    v = verifier.set(memory_mb=1536, workers=1)
    v._ensure_children()
    for c in list(v._children):  # children forked from now on get the new limit
        v._retire(c)
    assert v.verify("1/2", "0.5")
    limits = open(f"/proc/{v._children[0].pid}/limits").read()
    assert re.search(r"Max address space\s+1610612736\s", limits), limits
    v.set(memory_mb=1)
    v._retire(v._children[0])
    with pytest.raises(RuntimeError, match="failed to start"):
        v.verify("1/2", "0.5")  # too small to work in: a setup error, said so
    assert v._children == []


def test_zygote_death_is_survived(verifier):
    assert verifier.verify("1/2", "0.5")
    zygote, child = verifier._zygote.proc.pid, verifier._children[0].pid
    os.kill(zygote, signal.SIGKILL)
    time.sleep(0.5)
    assert not _alive(child)  # its children die with it
    assert verifier.verify("1/2", "0.5")
    assert verifier._zygote.proc.pid != zygote


def test_close_then_reuse(verifier):
    v = MathVerifier(timeout_s=TIMEOUT_S)
    assert v.verify("68", "68") and v._zygote is None  # exact match: nothing started
    v.close()
    assert verifier.verify("1/2", "0.5")
    pids = [verifier._zygote.proc.pid, verifier._children[0].pid]
    verifier.close()
    assert not any(map(_alive, pids)) and verifier._zygote is None and verifier._children == []
    assert verifier.verify("0.25", "1/4")  # lazily restarted


def test_default_workers(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert 8 <= default_workers() <= 16
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert default_workers() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 8 ranks share the node's 64 cores
    assert default_workers() == 16
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert default_workers() == 8  # at least as many as can wait out hard answers side by side


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has exited
    except (FileNotFoundError, ProcessLookupError):  # reaped before or while /proc was read
        return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_children_die_with_the_trainer(sig):
    """A trainer killed while its children grind on `2^{10^{10}}` leaves no process behind."""
    code = (
        "from common.verifier import MathVerifier\n"
        "v = MathVerifier(timeout_s=600, workers=2)\n"
        "v._ensure_children()\n"
        "print(v._zygote.proc.pid, *(c.pid for c in v._children), flush=True)\n"
        "v.verify_batch(['2^{10^{10}}', '10^{10^{10^{10}}}'], ['1', '1'])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3 and all(map(_alive, pids))
    time.sleep(1.0)  # both children are mid-check
    proc.send_signal(sig)
    proc.wait(10)
    deadline = time.monotonic() + 5
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, pids)), "a verifier process outlived its trainer"
