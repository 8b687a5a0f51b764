"""Tests for common/rewards.py: extraction, symbolic checking, timeouts, format rewards."""

import os
import random
import signal
import time

import pytest

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
        old_pid = v._proc.pid
        t0 = time.perf_counter()
        assert v.verify(HANGS, "1") is False
        assert time.perf_counter() - t0 < 0.5 + 2
        assert v.verify("1/2", "0.5")
        assert v._proc.pid != old_pid
    assert v._proc is None  # closed by the context manager


def test_child_death_is_survived():
    with MathVerifier(timeout_s=TIMEOUT_S) as v:
        assert v.verify("1/2", "0.5")
        proc = v._proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
        assert v.verify("1/2", "0.5")  # died between checks: restarted transparently
        assert v._proc.pid != proc.pid


def test_close_then_reuse():
    v = MathVerifier(timeout_s=TIMEOUT_S)
    assert v.verify("68", "68") and v._proc is None  # exact match: no child started
    assert v.verify("1/2", "0.5")
    proc = v._proc
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
