"""Tests for common/rewards.py: the reward terms, a step's rewards (an unchecked answer is neither right
nor wrong), and loading a reward function of your own."""

import math
import time

import pytest
from test_answers import fuzz_texts
from test_verifier import PATHOLOGICAL

from common.rewards import (
    REWARD_FUNCS,
    RewardFnError,
    Rewards,
    accuracy_reward,
    boxed_format_reward,
    compute_rewards,
    custom_scores,
    dapo_normalize,
    dapo_reward,
    load_reward_fn,
    probe_reward_fn,
    think_answer_format_reward,
    think_format_reward,
)
from common.verifier import MathVerifier


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(timeout_s=30.0) as v:
        yield v


class StubVerifier:
    """Verdicts given in advance, as MathVerifier.verify_batch returns them (None: out of budget)."""

    def __init__(self, verdicts):
        self.verdicts = verdicts
        self.calls = []

    def verify_batch(self, preds, golds, budget_s=None):
        self.calls.append((preds, golds))
        return list(self.verdicts)


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


def test_think_answer_format_reward():
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
    assert think_answer_format_reward(good) == [1.0] * len(good)
    assert think_answer_format_reward(bad) == [0.0] * len(bad)


def test_think_format_reward_is_the_papers_matched_think_tags():
    """CW-GRPO App. C: 1.0 for properly matched <think> tags; the answer after them is free (an
    R1-Distill model seldom writes <answer>, which the stricter term demands)."""
    good = [
        "<think>r</think>",
        "<think>reason</think>\nSo the answer is \\boxed{5}.",
        "<think>a</think><answer>5</answer>",
        "preamble <think>a</think> 5",
    ]
    bad = [
        "reason</think> 5",  # no opening tag
        "<think>never closed",
        "</think><think>",  # in the wrong order
        "<think>a</think><think>b</think>",  # two pairs
        "<think><think>a</think>",  # nested
        "no tags",
        "",
    ]
    assert think_format_reward(good) == [1.0] * len(good)
    assert think_format_reward(bad) == [0.0] * len(bad)
    assert think_answer_format_reward(good[:2]) == [0.0, 0.0]  # what the old think_format scored


def test_think_format_rewards_prompt_ends_with_think():
    completions = [
        "reasoning\n</think>\n<answer>5</answer>",
        "<think>reasoning</think><answer>5</answer>",
        "reasoning</think><think>again</think><answer>5</answer>",
        "reasoning with no closing tag <answer>5</answer>",
    ]
    for fn in (think_format_reward, think_answer_format_reward):
        assert fn(completions) == [0.0, 1.0, 0.0, 0.0]
        assert fn(completions, prompt_ends_with_think=True) == [1.0, 1.0, 0.0, 0.0]
    assert think_format_reward(["reasoning</think> 5"], prompt_ends_with_think=True) == [1.0]


def test_dapo_reward_reads_the_answer_line_and_normalises_like_dapo():
    """DAPO's reward: the last "Answer:" line of the final 300 characters, Minerva-normalised, as text; +-1."""
    cases = [  # (completion, gold, reward)
        ("Work.\nAnswer: 5", "5", 1.0),
        ("answer :  $\\frac{1}{2}$", "\\frac{1}{2}", 1.0),  # any case, spaces, $...$
        ("Answer: x = 1,000", "1000", 1.0),  # the right side of "=", thousands separators
        ("Answer: 45^\\circ", "45", 1.0),  # units and degree signs dropped
        ("Answer: \\frac12", "\\frac{1}{2}", 1.0),  # shorthand TeX
        ("Answer: 10 \\text{ cm}", "10", 1.0),
        ("Answer: 1\nAnswer: 2", "2", 1.0),  # the last one counts
        ("Answer: 0.5", "\\frac{1}{2}", -1.0),  # text, not symbolic equivalence
        ("The answer is \\boxed{5}", "5", -1.0),  # no "Answer:" line: a box is not read
        ("Answer: 5\n" + "x" * 300, "5", -1.0),  # outside the last 300 characters
        ("", "5", -1.0),
    ]
    completions, golds, expected = zip(*cases)
    assert dapo_reward(list(completions), list(golds)) == list(expected)
    assert dapo_normalize("\\text{(A)}") == "(A)" and dapo_normalize("\\boxed{7}") == "7"


def test_compute_rewards_with_dapo_takes_its_verdict_as_accuracy(verifier):
    completions = ["Answer: 0.5", "Answer: 1/2", "\\boxed{0.5}"]
    r = compute_rewards(completions, ["0.5"] * 3, ["dapo"], verifier)
    assert r.total == [1.0, -1.0, -1.0]
    assert r.accuracy == [1.0, 0.0, 0.0] and r.checked == [True] * 3  # DAPO's verdict, not math-verify's


@pytest.mark.parametrize("n", [1_000, 100_000, 1_000_000])
def test_the_format_rewards_are_linear(n):
    """Degenerate repetition (the R1 template's `<answer>` * 16000 took 7.8 s before) costs linear time."""
    texts = fuzz_texts(n)
    t0 = time.perf_counter()
    for text in texts:
        boxed_format_reward([text])
        think_format_reward([text], prompt_ends_with_think=True)
        think_answer_format_reward([text], prompt_ends_with_think=True)
        dapo_reward([text], ["1"])
    per_char = (time.perf_counter() - t0) / sum(map(len, texts))
    assert per_char < 2e-6, f"{per_char * 1e6:.2f} us per character"


# --- accuracy and compute_rewards -------------------------------------------------------------


def test_accuracy_reward(verifier):
    completions = [r"so \boxed{\frac{1}{2}}", "<answer>0.5</answer>", r"\boxed{3}", "no answer", r"\boxed{0.5"]
    assert accuracy_reward(completions, ["0.5"] * 5, verifier) == [1.0, 1.0, 0.0, 0.0, 0.0]
    # An answer is one balanced group: `<answer>12} {13</answer>` used to be graded as 12.
    assert accuracy_reward(["<think>x</think> <answer>12} {13</answer>"], ["12"], verifier) == [0.0]


def test_pathological_completions_score_zero(verifier):
    """Whole completions of adversarial output: no answer or a wrong one, quickly."""
    t0 = time.perf_counter()
    assert accuracy_reward(PATHOLOGICAL, ["1"] * len(PATHOLOGICAL), verifier) == [0.0] * len(PATHOLOGICAL)
    assert time.perf_counter() - t0 < 5


def test_accuracy_reward_passes_unchecked_through():
    stub = StubVerifier([True, None, False])
    assert accuracy_reward([r"\boxed{1}", r"\boxed{2}", "none"], ["1", "2", "3"], stub) == [1.0, None, 0.0]
    assert stub.calls == [(["1", "2", None], ["1", "2", "3"])]  # what was extracted, None for nothing


def test_compute_rewards(verifier):
    completions = [
        r"<think>a</think><answer>\boxed{\frac{1}{2}}</answer>",  # right, boxed, R1 format
        r"wrong: \boxed{3}",  # wrong, boxed
        "<think>a</think><answer>0.5</answer>",  # right, R1 format, no box
        "no answer at all",
    ]
    answers = ["0.5"] * 4
    r = compute_rewards(completions, answers, ["accuracy", "boxed_format", "think_answer_format"], verifier)
    assert isinstance(r, Rewards)
    assert r.accuracy == [1.0, 0.0, 1.0, 0.0]
    assert r.total == [3.0, 1.0, 2.0, 0.0]
    assert r.checked == [True] * 4  # no budget: everything checked ("no answer" is checked: wrong)
    r = compute_rewards(completions, answers, ["boxed_format"], verifier)
    assert r.total == [1.0, 1.0, 0.0, 0.0] and r.accuracy == [1.0, 0.0, 1.0, 0.0]  # accuracy logged anyway
    r = compute_rewards(["a</think><answer>1</answer>"], ["1"], ["think_format"], verifier, prompt_ends_with_think=True)
    assert r.total == [1.0]
    # every REWARD_FUNCS entry takes (completions, answers, verifier)
    for fn in REWARD_FUNCS.values():
        assert len(fn(completions, answers, verifier)) == len(completions)


def test_compute_rewards_marks_unchecked_answers():
    """An answer the verifier's budget left unchecked is neither right nor wrong: accuracy 0 in the sums,
    `checked` False (the scripts give its whole group advantage 0)."""
    completions = [r"\boxed{1}", r"\boxed{2}", r"\boxed{3}"]
    r = compute_rewards(completions, ["1", "2", "3"], ["accuracy", "boxed_format"], StubVerifier([True, None, False]))
    assert r.checked == [True, False, True]
    assert r.accuracy == [1.0, 0.0, 0.0]
    assert r.total == [2.0, 1.0, 1.0]


def test_compute_rewards_with_a_real_budget(verifier, monkeypatch):
    for name, value in {"timeout_s": 5.0, "workers": 1, "budget_s": 0.5}.items():
        monkeypatch.setattr(verifier, name, value)
    hard = r"\boxed{10^{10^{10^{10}}}}"
    completions = [hard, r"\boxed{\frac{1}{2}}", r"\boxed{0.5}"]
    r = compute_rewards(completions, ["1", "0.5", "0.5"], ["accuracy"], verifier)
    assert verifier.take_timeouts() == 0
    assert r.checked == [False, False, True]  # the hard one holds the only child; "0.5" is an exact match
    assert r.accuracy == [0.0, 0.0, 1.0]


def test_compute_rewards_unknown_name(verifier):
    with pytest.raises(ValueError, match="valid choices.*accuracy.*boxed_format.*think_format"):
        compute_rewards(["x"], ["1"], ["accuracy", "lenght_penalty"], verifier)


# --- your own reward ---------------------------------------------------------------------------


def brevity(completions, answers, verifier):
    return [-len(c) / 100 for c in completions]


def test_custom_reward_terms_are_added():
    r = compute_rewards(["ab", r"\boxed{1}"], ["1", "1"], ["accuracy"], StubVerifier([False, True]), custom=[brevity])
    assert r.total == pytest.approx([-0.02, 1.0 - 0.09])


@pytest.mark.parametrize("bad", [[1.0], [1.0, float("nan")], [1.0, math.inf], [1.0, "1"]])
def test_a_custom_term_must_give_one_finite_number_per_completion(bad):
    with pytest.raises(ValueError, match="one finite number per completion"):
        compute_rewards(["a", "b"], ["1", "1"], [], StubVerifier([False, False]), custom=[lambda c, a, v: bad])


def test_load_reward_fn(tmp_path):
    assert load_reward_fn("test_rewards:brevity") is brevity
    assert load_reward_fn("common.rewards:boxed_format_reward") is boxed_format_reward
    path = tmp_path / "my_rewards.py"
    path.write_text("def short(completions, answers, verifier):\n    return [0.0 for _ in completions]\n")
    assert load_reward_fn(f"{path}:short")(["x"], ["1"], None) == [0.0]
    for spec, reason in [
        ("no_colon", "is not module:function"),
        ("common.rewards:", "is not module:function"),
        ("common.rewards:not-a-name", "is not module:function"),
        ("no_such_module_xyz:f", "cannot import"),
        (f"{tmp_path}/missing.py:f", "cannot import"),
        ("common.rewards:nothing_here", "has no function"),
        ("common.rewards:REWARD_FUNCS", "has no function"),
    ]:
        with pytest.raises(ValueError, match=reason):
            load_reward_fn(spec)


def numpy_float32(completions, answers, verifier):
    import numpy as np

    return np.array([len(c) for c in completions], dtype=np.float32) / 100


def none_on_empty(completions, answers, verifier):
    return [None if not c else 1.0 for c in completions]


def raises_on_empty(completions, answers, verifier):
    return [1 / len(c) for c in completions]


def test_a_custom_term_may_return_numpy_or_torch_numbers():
    import numpy as np
    import torch

    texts = ["ab", "abcd"]
    assert custom_scores(numpy_float32, texts, ["1", "1"], None) == pytest.approx([0.02, 0.04])
    for scores in (
        [np.float32(0.5), np.int64(2)],
        np.array([0.5, 2.0]),
        torch.tensor([0.5, 2.0]),
        (0.5, 2),
        iter([0.5, 2]),
    ):
        assert custom_scores(lambda c, a, v, s=scores: s, texts, ["1", "1"], None) == [0.5, 2.0]


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        (None, r"<lambda> returned NoneType None for 2 completions"),
        ("12", r"<lambda> returned str '12' for 2 completions"),
        ([1.0, None], r"<lambda> returned NoneType None for completion 1 \(of 2: 'b'\)"),
        ([1.0, "1"], r"<lambda> returned str '1' for completion 1"),
        ([[1.0], [2.0]], r"<lambda> returned list \[1.0\] for completion 0"),
        ([1.0, True], r"returned True for completion 1"),
        (__import__("numpy").float32(1.0), r"returned float32 np.float32\(1.0\) for 2 completions"),
    ],
)
def test_a_bad_custom_value_names_the_function_the_completion_and_the_value(returns, message):
    with pytest.raises(RewardFnError, match=message):
        custom_scores(lambda c, a, v: returns, ["a", "b"], ["1", "1"], None)


def test_a_custom_term_that_raises_names_the_completion_it_fails_on():
    with pytest.raises(
        RewardFnError, match=r"raises_on_empty raised ZeroDivisionError: division by zero on completion 2"
    ):
        custom_scores(raises_on_empty, ["a", "b", "", "c"], ["1"] * 4, None)


def two_args(completions, answers):  # a --reward_fn that cannot take the verifier (tests/test_train_e2e.py)
    return [0.0 for _ in completions]


def test_the_probe_runs_the_function_before_any_model_loads():
    """The probe's stand-ins include an empty completion: a function that breaks on it stops the run at once."""
    rows = [{"problem": "What is 3 + 4?", "answer": "7"}]
    assert probe_reward_fn(brevity, rows, None) is brevity
    with pytest.raises(RewardFnError, match="none_on_empty returned NoneType None for completion 3"):
        probe_reward_fn(none_on_empty, rows, None)
