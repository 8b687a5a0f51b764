"""A reward reads an answer format; the prompt must ask for it (issue 33, item 4 and its class: a text
format assumed, not checked). The table: template x reward x few-shot -> refused, warned, or fine; then
reward functions of your own that take the prompt and columns."""

import pytest

from common.prompts import format_few_shot_prompt, format_mismatch
from common.rewards import compute_rewards, reward_columns
from common.verifier import MathVerifier

SHOTS = [("What is 2 + 3?", "2 + 3 = 5. The answer is \\boxed{5}."), ("What is 1 + 1?", "\\boxed{2}")]
MINE = "Q: {problem}\nA:"
# (template, few-shot) -> verdict per reward: "ok", "warning" or "error"
TABLE = {
    ("qwen_math", 0): {"accuracy": "ok", "dapo": "error", "think_format": "warning"},
    ("qwen_math", 2): {"accuracy": "ok", "dapo": "error", "think_format": "warning"},
    ("r1", 0): {"accuracy": "ok", "dapo": "error", "think_format": "ok"},
    ("plain", 0): {"accuracy": "warning", "dapo": "warning", "think_format": "warning"},
    ("plain", 2): {"accuracy": "ok", "dapo": "error", "think_format": "warning"},  # the examples box
    (MINE, 0): {"accuracy": "warning", "dapo": "warning", "think_format": "warning"},
    (MINE, 2): {"accuracy": "ok", "dapo": "error", "think_format": "warning"},
    ("Answer on a last line 'Answer: X'.\n{problem}", 0): {
        "accuracy": "error",
        "dapo": "ok",
        "think_format": "warning",
    },
}


@pytest.mark.parametrize("reward", ["accuracy", "dapo", "think_format"])
@pytest.mark.parametrize("template, few_shot", list(TABLE))
def test_template_reward_few_shot(template, few_shot, reward):
    prompt = format_few_shot_prompt("What is 7 + 5?", template, SHOTS[:few_shot])
    found = format_mismatch([reward], prompt, template)
    assert (found[0] if found else "ok") == TABLE[template, few_shot][reward]
    if found:
        kind, line = found
        assert f"--rewards {reward} reads" in line and "\n" not in line and "--template" in line


def test_the_issue_case_names_the_fix():
    """`--rewards dapo` under the \\boxed{} template: every reward -1; refused, naming both ways out."""
    kind, line = format_mismatch(["dapo"], format_few_shot_prompt("1 + 1?", "qwen_math", []), "qwen_math")
    assert kind == "error"
    assert "asks for \\boxed{}" in line and "--template dapo_native" in line


def test_reward_functions_of_your_own_get_the_prompt_and_columns_as_keywords():
    rows = [
        {"problem": "1 + 1?", "answer": "2", "prompt_ids": [1, 2], "columns": {"level": 3, "answer": "2"}},
        {"problem": "2 + 2?", "answer": "4", "prompt_ids": [3], "columns": {"level": 5, "answer": "4"}},
    ]
    columns = reward_columns([rows[0], rows[0], rows[1]], decode=lambda ids: f"P{ids}")
    assert columns["prompts"] == ["P[1, 2]", "P[1, 2]", "P[3]"] and columns["level"] == [3, 3, 5]
    seen = {}

    def old_style(completions, answers, verifier):
        return [0.0] * len(completions)

    def named(completions, answers, verifier, level=None):
        seen["named"] = level
        return [float(x) for x in level]

    def trl_style(completions, answers, verifier, **kwargs):
        seen["trl"] = sorted(kwargs)
        return [0.5] * len(completions)

    with MathVerifier(workers=1) as verifier:
        r = compute_rewards(["a", "b", "c"], ["2", "2", "4"], [], verifier, custom=[old_style, named, trl_style],
                            columns=columns)  # fmt: skip
    assert seen["named"] == [3, 3, 5] and r.total == [3.5, 3.5, 5.5]
    assert seen["trl"] == ["answer", "level", "problems", "prompts"]


@pytest.mark.parametrize("template, few_shot", list(TABLE))
def test_the_evaluation_reads_as_accuracy_does(template, few_shot):
    """tools.evaluate and --eval_steps read the last \\boxed{}: the same table's accuracy column, said as theirs."""
    prompt = format_few_shot_prompt("What is 7 + 5?", template, SHOTS[:few_shot])
    found = format_mismatch(["accuracy"], prompt, template, who="this evaluation")
    assert (found[0] if found else "ok") == TABLE[template, few_shot]["accuracy"]
    if found:
        assert found[1].startswith(("this evaluation reads", "warning: this evaluation reads"))


def test_a_training_run_checks_at_start():
    """start_session's check, before any model loads: refused, warned, the stop strings said and returned."""
    from common.prompts import check_prompt_format

    class Tok:  # the prompt as token ids: one per character
        def __call__(self, text):
            return [ord(c) for c in text]

        def decode(self, ids):
            return "".join(map(chr, ids))

    tok, said = Tok(), []
    boxed = tok(format_few_shot_prompt("7 + 5?", "qwen_math", []))
    with pytest.raises(SystemExit, match="--rewards dapo reads an 'Answer: ...' last line, but the prompt"):
        check_prompt_format(["dapo"], boxed, tok, "qwen_math", 0, None, said.append)
    plain = tok(format_few_shot_prompt("7 + 5?", "plain", SHOTS))
    assert check_prompt_format(["accuracy"], plain, tok, "plain", 2, "</s>", said.append) == ["</s>", "\nQuestion:"]
    assert said == [
        "stop strings: '\\nQuestion:', implied by --few_shot 2 under --template plain, and --stop's ['</s>']"
    ]
    mine = "Answer on a last line 'Answer: X'.\n{problem}"
    said.clear()
    check_prompt_format(
        ["dapo"], tok(format_few_shot_prompt("7 + 5?", mine, [])), tok, mine, 0, None, said.append, True
    )
    assert len(said) == 1 and said[0].startswith("warning: --eval_steps' evaluation reads \\boxed{}, but the prompt")
