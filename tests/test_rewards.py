"""Tests for common/rewards.py: extraction, symbolic checking, timeouts, format rewards."""

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from train_utils import ROOT

from common.rewards import (
    MAX_PRED_CHARS,
    REWARD_FUNCS,
    MathVerifier,
    accuracy_reward,
    boxed_format_reward,
    compute_rewards,
    extract_answer,
    extract_boxed,
    think_format_reward,
)

TIMEOUT_S = 1.0
# A legal expression sympy never finishes with: comparing it to 1 evaluates a
# tower of powers in C code (the check hangs deterministically).
HANGS = "10^{10^{10^{10}}}"


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(timeout_s=TIMEOUT_S) as v:
        yield v


# --- extraction ------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{\left\{ 1, 2 \right\}}", r"\left\{ 1, 2 \right\}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not counted
        (r"\boxed{\}}", r"\}"),
        ("no box here, the answer is 5", None),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{1} then \boxed{\frac{2}{3}", None),  # unbalanced last box: no fallback to an earlier one
        (r"\fbox{7}", "7"),
        (r"\boxed 5$ done", "5"),
        (r"\boxed {12}", "12"),
        (r"<answer>\boxed{42}</answer>", "42"),
        (r"\boxed{}", ""),
        (r"\boxedfoo{3}", None),
        ("", None),
        ("\\boxed{" * 5000, None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>hmm</think>\n<answer> 17 </answer>", "17"),
        ("<answer>1</answer> retry <answer>\n2\n</answer>", "2"),  # last block
        (r"<answer>the answer is \boxed{3}</answer>", "3"),  # box wins over the tag
        (r"\boxed{4} <answer>5</answer>", "4"),
        (r"\boxed{4 <answer>5</answer>", "5"),  # unbalanced box: tag fallback
        ("<answer>unterminated", None),
        ("just text", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# --- MathVerifier ------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
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
        (r"\text{(B)}", "B", True),
        ("3", "4", False),
        ("(1, 2)", "(1,2]", False),
        # Decision (math-verify's default, as in open-r1): an assignment counts as its
        # right-hand side, so "x=2" is a correct answer to gold "2" and vice versa.
        ("x=2", "2", True),
        ("2", "x=2", True),
        ("x=3", "2", False),
    ],
)
def test_verifier_equivalences(verifier, pred, gold, expected):
    assert verifier.verify(pred, gold) is expected


def test_verify_batch_none_and_length(verifier):
    assert verifier.verify_batch([None, "7", "8"], ["7", "7", "7"]) == [False, True, False]
    with pytest.raises(ValueError):
        verifier.verify_batch(["1"], ["1", "2"])


_rng = random.Random(0)
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
]


@pytest.mark.parametrize("pred", PATHOLOGICAL, ids=lambda p: repr(p[:20]) + f"..len{len(p)}")
def test_pathological_inputs_are_bounded(verifier, pred):
    assert verifier.verify("1", "1")  # ensure the child is up, so only this call is timed
    assert verifier.verify("2", "1") is False
    t0 = time.perf_counter()
    assert verifier.verify(pred, "1") is False
    assert time.perf_counter() - t0 < TIMEOUT_S + 2
    assert accuracy_reward([pred], ["1"], verifier) == [0.0]  # as a whole completion
    # still works afterwards (after a restart if that call timed out)
    assert verifier.verify(r"\frac{1}{2}", "0.5")


def test_length_cap_skips_sympy(verifier):
    long_but_right = "1" + " " * MAX_PRED_CHARS + "+0"
    t0 = time.perf_counter()
    assert verifier.verify(long_but_right, "1") is False
    assert time.perf_counter() - t0 < 0.1
    assert verifier.verify("1" + " " * MAX_PRED_CHARS, "1")  # exact match still counts


def test_timeout_kills_and_restarts_child():
    with MathVerifier(timeout_s=0.5) as v:
        assert v.verify("1/2", "0.5")
        old_pid = v._children[0].proc.pid
        t0 = time.perf_counter()
        assert v.verify(HANGS, "1") is False
        assert time.perf_counter() - t0 < 0.5 + 2
        assert v.take_timeouts() == 1 and v.take_timeouts() == 0
        assert v.verify("1/2", "0.5")
        assert v._children[0].proc.pid != old_pid
    assert v._children == []  # closed by the context manager


def test_child_death_is_survived():
    with MathVerifier(timeout_s=TIMEOUT_S) as v:
        assert v.verify("1/2", "0.5")
        proc = v._children[0].proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
        assert v.verify("1/2", "0.5")  # died between checks: restarted transparently
        assert v._children[0].proc.pid != proc.pid


def test_close_then_reuse():
    v = MathVerifier(timeout_s=TIMEOUT_S)
    assert v.verify("68", "68") and v._children == []  # exact match: no child started
    assert v.verify("1/2", "0.5")
    proc = v._children[0].proc
    v.close()
    assert not proc.is_alive()
    assert v.verify("0.25", "1/4")  # lazily restarted
    v.close()


# --- format rewards ------------------------------------------------------------


def test_boxed_format_reward():
    completions = [
        r"so \boxed{5}",
        r"\boxed{\frac{1}{2}}",
        r"\boxed{}",
        r"\boxed{  }",
        r"\boxed{5",
        "the answer is 5",
        r"\boxed{1} and \boxed{2",
    ]
    assert boxed_format_reward(completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_think_format_reward():
    good = [
        "<think>\nreason\n</think>\n<answer>\n5\n</answer>",
        "<think>r</think><answer>5</answer>",
        "<think>multi\nline\nreasoning</think>  \n <answer>x</answer>",
    ]
    bad = [
        "<think>r</think>",  # no answer
        "<answer>5</answer>",  # no think
        "reason</think><answer>5</answer>",  # no opening tag
        "<think>a</think><think>b</think><answer>5</answer>",  # two thinks
        "<think>a</think><answer>5</answer><answer>6</answer>",  # two answers
        "<think>a</think><answer>5</answer> trailing text",
        "preamble <think>a</think><answer>5</answer>",
        "<answer>5</answer><think>a</think>",
        "",
    ]
    assert think_format_reward(good) == [1.0] * len(good)
    assert think_format_reward(bad) == [0.0] * len(bad)


def test_think_format_reward_prompt_ends_with_think():
    completions = [
        "reasoning\n</think>\n<answer>5</answer>",
        "<think>reasoning</think><answer>5</answer>",
        "reasoning</think><think>again</think><answer>5</answer>",
        "reasoning with no closing tag <answer>5</answer>",
    ]
    assert think_format_reward(completions) == [0.0, 1.0, 0.0, 0.0]
    assert think_format_reward(completions, prompt_ends_with_think=True) == [1.0, 1.0, 0.0, 0.0]


# --- compute_rewards -------------------------------------------------------------


def test_compute_rewards(verifier):
    completions = [
        r"<think>a</think><answer>\boxed{\frac{1}{2}}</answer>",  # right, boxed, R1 format
        r"wrong: \boxed{3}",  # wrong, boxed
        "<think>a</think><answer>0.5</answer>",  # right, R1 format, no box
        "no answer at all",
    ]
    answers = ["0.5"] * 4
    total, acc = compute_rewards(completions, answers, ["accuracy", "boxed_format", "think_format"], verifier)
    assert acc == [1.0, 0.0, 1.0, 0.0]
    assert total == [3.0, 1.0, 2.0, 0.0]
    total, acc = compute_rewards(completions, answers, ["boxed_format"], verifier)
    assert total == [1.0, 1.0, 0.0, 0.0] and acc == [1.0, 0.0, 1.0, 0.0]
    total, _ = compute_rewards(
        ["a</think><answer>1</answer>"], ["1"], ["think_format"], verifier, prompt_ends_with_think=True
    )
    assert total == [1.0]
    # every REWARD_FUNCS entry takes (completions, answers, verifier)
    for fn in REWARD_FUNCS.values():
        assert len(fn(completions, answers, verifier)) == len(completions)


def test_compute_rewards_unknown_name(verifier):
    with pytest.raises(ValueError, match="valid choices.*accuracy.*boxed_format.*think_format"):
        compute_rewards(["x"], ["1"], ["accuracy", "lenght_penalty"], verifier)


# --- what a trainer must survive: adversarial output, hard answers, its own death -------------------

FUZZ_UNITS = [
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "\\boxed{",
    "\\boxed ",
    "{",
    "}",
    "\\",
    "^ ",
    " ",
    "$",
    "1",
    "\\fbox{",
]


@pytest.mark.parametrize("n", [1_000, 100_000, 1_000_000])
def test_everything_that_parses_model_output_is_linear(n):
    """Degenerate repetition (the R1 template's `<answer>` * 16000 took 7.8 s before) costs linear time:
    1M characters of any mix of tags, braces and spaces are parsed within a fixed budget."""
    rng = random.Random(n)
    texts = [unit * (n // len(unit)) for unit in FUZZ_UNITS]  # one tag repeated
    texts += ["".join(rng.choice(FUZZ_UNITS) for _ in range(n // 4))[:n] for _ in range(4)]  # mixes
    texts += ["<answer>" * (n // 16) + "</answer>" * (n // 18), "\\boxed{" + "{" * (n // 2) + "}" * (n // 2)]
    v = MathVerifier()  # only its fast path runs: these answers are too long for a child
    t0 = time.perf_counter()
    for text in texts:
        extract_answer(text)
        boxed_format_reward([text])
        think_format_reward([text], prompt_ends_with_think=True)
        v._fast(text, "1")
    per_char = (time.perf_counter() - t0) / sum(map(len, texts))
    assert per_char < 2e-6, f"{per_char * 1e6:.2f} us per character"  # linear: ~0.1 us; quadratic: seconds
    assert v._children == []


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("1 2", "12", False),  # separate numbers are not joined by dropping the space
        ("1 + 2", "1+2", True),  # layout spaces still do not matter
        ("１２", "12", True),  # fullwidth digits (NFKC)
        ("½", "\\frac{1}{2}", True),  # vulgar fraction
        ("−3", "-3", True),  # the Unicode minus sign
    ],
)
def test_unicode_and_whitespace_verdicts(verifier, pred, gold, expected):
    assert verifier.verify(pred, gold) is expected


def test_an_answer_is_one_balanced_group(verifier):
    """`<answer>12} {13</answer>` used to be wrapped as \\boxed{12} {13} and graded as 12."""
    assert extract_answer("<answer>12} {13</answer>") is None
    assert accuracy_reward(["<think>x</think> <answer>12} {13</answer>"], ["12"], verifier) == [0.0]
    assert extract_answer("<answer>\\{1, 2\\}</answer>") == "\\{1, 2\\}"  # escaped braces are literal
    assert extract_answer("<answer>a<answer> 7 </answer>") == "7"  # the last complete block
    assert verifier.verify("12} {13", "12") is False  # unbalanced: never wrapped


def test_a_pool_checks_in_parallel_and_a_budget_bounds_the_batch():
    with MathVerifier(timeout_s=3.0, workers=2) as v:
        preds = [HANGS, "1/2", HANGS, "0.25"]
        t0 = time.perf_counter()
        assert v.verify_batch(preds, ["1", "0.5", "1", "1/4"]) == [False, True, False, True]
        assert time.perf_counter() - t0 < 3.0 + 2.5  # the two hangs run side by side: one timeout, not two
        assert v.take_timeouts() == 2
        t0 = time.perf_counter()
        assert v.verify_batch([HANGS] * 4 + ["1/2"], ["1"] * 4 + ["0.5"], budget_s=1.0) == [False] * 5
        assert time.perf_counter() - t0 < 1.0 + 2.0
        assert v.take_timeouts() == 5  # the two running and the three never started
        assert v.verify("1/2", "0.5")  # the replaced children work


def test_children_run_under_the_memory_limit():
    with MathVerifier(memory_mb=1536) as v:
        assert v.verify("1/2", "0.5")
        limits = open(f"/proc/{v._children[0].proc.pid}/limits").read()
        assert re.search(r"Max address space\s+1610612736\s", limits), limits
    with pytest.raises(RuntimeError, match="failed to start"):
        MathVerifier(memory_mb=1).verify("1/2", "0.5")  # too small to work in: a setup error, said so


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_children_die_with_the_trainer(sig):
    """A trainer killed while its child grinds on `2^{10^{10}}` leaves no child behind."""
    code = (
        "from common.rewards import MathVerifier\n"
        "v = MathVerifier(timeout_s=600, workers=2)\n"
        "v._ensure_children()\n"
        "print(*(c.proc.pid for c in v._children), flush=True)\n"
        "v.verify_batch(['2^{10^{10}}', '10^{10^{10^{10}}}'], ['1', '1'])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(map(_alive, pids))
    time.sleep(1.0)  # both are mid-check
    proc.send_signal(sig)
    proc.wait(10)
    deadline = time.monotonic() + 5
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, pids)), "a verifier child outlived its trainer"
