"""common/math_data.py, common/prompts.py and common/math_data.py on local stand-ins of each paper's dataset
(tests/dataset_standins.py); data/prepare.py's own tests: tests/test_data_prepare.py."""

import json

import pytest
from dataset_standins import (
    dapo_rows,
    deepscaler_rows,
    distinct_problem,
    openr1_rows,
    openrs_rows,
    save,
    write_jsonl_file,
    write_parquet,
)

from common.math_data import (
    DAPO_PREFIX,
    DAPO_SUFFIX,
    SYNTHETIC_EVAL_PATH,
    SYNTHETIC_MAX_OPERAND,
    SYNTHETIC_TRAIN_SIZE,
    load_math_dataset,
    synthetic_arithmetic,
    synthetic_eval_set,
)
from common.prompts import format_prompt
from common.run_dir import write_jsonl
from data import prepare

# ---------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------


def test_templates_render():
    qm = format_prompt("What is {x}?")
    assert qm == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.<|im_end|>\n<|im_start|>user\nWhat is {x}?<|im_end|>\n<|im_start|>assistant\n"
    )
    r1 = format_prompt("P", "r1")
    assert r1.startswith("<|im_start|>system\nA conversation between User and Assistant.")
    assert "within \\boxed{} . The reasoning" in r1 and "NOT use other languages.<|im_end|>" in r1
    assert r1.endswith("<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\n")
    assert not r1.rstrip().endswith("<think>")
    assert format_prompt("P", "plain") == "Question: P\nAnswer:"


def test_unknown_template():
    with pytest.raises(ValueError, match="qwen_math"):
        format_prompt("P", "chatml")


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def test_load_plain_schema(tmp_path, fmt):
    src = save(deepscaler_rows(), tmp_path, fmt)
    rows = load_math_dataset(src)
    assert len(rows) == len(deepscaler_rows())
    assert rows[0] == {"problem": "Compute 1+1.", "answer": "2", "solution": "We add: $1+1=\\boxed{2}$."}
    assert rows[1]["solution"] is None  # empty solution -> None
    assert len(load_math_dataset(src, limit=5)) == 5


def test_load_dapo_schema_with_preset_and_dotted_paths(tmp_path, fmt):
    src = save(dapo_rows(), tmp_path, fmt)
    rows = load_math_dataset(src, preset="BytedTsinghua-SIA/DAPO-Math-17k")
    assert rows[0] == {"problem": "Let $x$ satisfy $x+1=3$. Find $x$.", "answer": "2", "solution": None}
    # The same through explicit fields: chat messages give the user content, wrapper kept.
    rows = load_math_dataset(src, problem_field="prompt.0.content", answer_field="reward_model.ground_truth")
    assert rows[0]["problem"].startswith("Solve the following") and rows[0]["answer"] == "2"
    rows = load_math_dataset(
        src, problem_field="prompt", answer_field="reward_model.ground_truth", solution_field="extra_info.index"
    )
    assert rows[2]["solution"] == "2"


def test_hub_name_mapping_used_for_hub(monkeypatch):
    import datasets

    calls = {}

    def fake_load_dataset(name, config=None, split=None):
        calls.update(name=name, config=config, split=split)
        return dapo_rows() if "DAPO" in name else openr1_rows()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = load_math_dataset("BytedTsinghua-SIA/DAPO-Math-17k")
    assert rows[-1] == {"problem": "Find the sum of {1, 2, 3}.", "answer": "6", "solution": None}
    assert calls == {"name": "BytedTsinghua-SIA/DAPO-Math-17k", "config": None, "split": "train"}
    rows = load_math_dataset("open-r1/OpenR1-Math-220k")
    assert calls == {"name": "open-r1/OpenR1-Math-220k", "config": "default", "split": "train"}
    assert rows[0] == {"problem": distinct_problem(0), "answer": "5", "solution": "Hence $\\boxed{5}$."}


def test_hub_unreachable_is_clear(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'x' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="without a network.*local"):
        load_math_dataset("someone/some-dataset")


def test_missing_field_is_clear(tmp_path, fmt):
    src = save(openrs_rows(), tmp_path, fmt)
    with pytest.raises(ValueError, match=r"(?s)'question'.*level.*problem.*--problem_field"):
        load_math_dataset(src, problem_field="question")
    with pytest.raises(ValueError, match=r"(?s)'ground_truth'.*--answer_field"):
        load_math_dataset(src, answer_field="ground_truth")
    with pytest.raises(ValueError, match="--solution_field"):
        load_math_dataset(src, solution_field="reasoning")
    # Without an explicit request the solution is optional.
    rows = load_math_dataset(save([{"problem": "p", "answer": "1"}], tmp_path, fmt, "nosol"))
    assert rows == [{"problem": "p", "answer": "1", "solution": None}]


def test_missing_nested_field_lists_nested_keys(tmp_path):
    src = write_jsonl_file(dapo_rows(), tmp_path / "d.jsonl")
    with pytest.raises(ValueError, match=r"(?s)reward_model.answer.*ground_truth, style"):
        load_math_dataset(src, problem_field="prompt", answer_field="reward_model.answer")


def test_nonexistent_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_math_dataset(str(tmp_path / "nope.jsonl"))


def test_json_and_directory_sources(tmp_path):
    rows = openrs_rows()
    (tmp_path / "a.json").write_text(json.dumps({"train": rows[:2], "test": rows[2:]}))
    assert [r["answer"] for r in load_math_dataset(str(tmp_path / "a.json"))] == ["12", "3"]
    d = tmp_path / "snap" / "data"
    d.mkdir(parents=True)
    write_parquet(rows[:2], d / "train-00000-of-00002.parquet")
    write_parquet(rows[2:], d / "train-00001-of-00002.parquet")
    write_parquet(rows[:1], d / "test-00000-of-00001.parquet")
    assert len(load_math_dataset(str(tmp_path / "snap"))) == 4
    assert len(load_math_dataset(str(tmp_path / "snap"), split="test")) == 1


# ---------------------------------------------------------------------------
# Synthetic task
# ---------------------------------------------------------------------------


def test_synthetic_deterministic_and_correct():
    a = synthetic_arithmetic(300, seed=3, max_operand=50, ops="+-*")
    assert a == synthetic_arithmetic(300, seed=3, max_operand=50, ops="+-*")
    assert a != synthetic_arithmetic(300, seed=4, max_operand=50, ops="+-*")
    assert len({r["problem"] for r in a}) == 300
    ops_seen = set()
    for r in a:
        x, op, y = r["problem"].removeprefix("What is ").removesuffix("?").split()
        x, y = int(x), int(y)
        ops_seen.add(op)
        assert 0 <= x <= 50 and 0 <= y <= 50
        assert int(r["answer"]) == {"+": x + y, "-": x - y, "*": x * y}[op] >= 0
        assert r["solution"].endswith(f"\\boxed{{{r['answer']}}}.") and len(r["solution"]) < 60
    assert ops_seen == {"+", "-", "*"}
    with pytest.raises(ValueError):
        synthetic_arithmetic(5, seed=0, ops="/")
    with pytest.raises(ValueError, match="distinct"):
        synthetic_arithmetic(200, seed=0, max_operand=9)  # only 100 '+' problems exist


def test_shipped_eval_set_and_synthetic_source():
    shipped = load_math_dataset(str(SYNTHETIC_EVAL_PATH))
    assert shipped == synthetic_eval_set()
    assert load_math_dataset("synthetic-arith", split="test") == shipped
    train = load_math_dataset("synthetic-arith")
    # The demo task is small on purpose: train and eval are the same 100 problems, in other orders.
    assert len(train) == SYNTHETIC_TRAIN_SIZE == (SYNTHETIC_MAX_OPERAND + 1) ** 2
    assert {r["problem"] for r in train} == {r["problem"] for r in shipped}
    assert [r["problem"] for r in train] != [r["problem"] for r in shipped]


# ---------------------------------------------------------------------------
# Native chat templates (models whose chat format is not ChatML)
# ---------------------------------------------------------------------------

R1_DISTILL_LIKE = (  # the shape of DeepSeek-R1-Distill's template: system first, then user/assistant markers, <think> opened
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)


def test_native_template_uses_the_models_chat_template(tiny_random_model):
    from copy import deepcopy

    from common.prompts import R1_SYSTEM, prompt_opens_think
    from common.rewards import compute_rewards
    from common.verifier import MathVerifier

    tok = deepcopy(tiny_random_model[1])
    tok.chat_template = R1_DISTILL_LIKE
    text = format_prompt("What is 2 + 2?", "r1_native", tok)
    assert text.startswith(tok.bos_token or "") and R1_SYSTEM in text
    assert text.endswith("<｜User｜>What is 2 + 2?<｜Assistant｜><think>\n")
    assert prompt_opens_think("r1_native", tok) and not prompt_opens_think("r1")
    # The completion then starts inside <think>: the format reward must know it.
    completion = "2 + 2 = 4.</think> <answer>\\boxed{4}</answer>"
    with MathVerifier() as v:
        r = compute_rewards([completion], ["4"], ["accuracy", "think_format"], v, prompt_ends_with_think=True)
    assert (r.total, r.accuracy) == ([2.0], [1.0])


def test_native_template_without_a_chat_template_is_refused(tiny_random_model):
    with pytest.raises(ValueError, match="has none; use 'r1'"):
        format_prompt("What is 2 + 2?", "r1_native", tiny_random_model[1])
    with pytest.raises(ValueError, match="needs|has none"):
        format_prompt("What is 2 + 2?", "r1_native")


QWEN_LIKE = (  # the shape of Qwen2.5's template: a default system turn when the messages bring none
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are Qwen.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_user_templates_wrap_the_problem_in_one_user_message(tiny_random_model):
    """dapo_native: DAPO-Math-17k's own prompt (its "Answer:" instruction, which the dapo reward reads);
    evalscope_native: evalscope's default zero-shot math prompt. Both keep the model's default system turn."""
    from copy import deepcopy

    tok = deepcopy(tiny_random_model[1])
    tok.chat_template = QWEN_LIKE
    problem = "Find $x$ if $2x = 6$."
    dapo = format_prompt(problem, "dapo_native", tok)
    assert dapo == (
        f"<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\n{DAPO_PREFIX}\n\n{problem}\n\n"
        f"{DAPO_SUFFIX}<|im_end|>\n<|im_start|>assistant\n"
    )
    # data.prepare pro strips exactly this wrapper from the dataset's prompts: the template puts it back.
    wrapped = {"problem": f"{DAPO_PREFIX}\n\n{problem}\n\n{DAPO_SUFFIX}", "answer": "3", "solution": None}
    assert prepare.prepare_pro([wrapped])[0]["problem"] == problem
    evalscope = format_prompt(problem, "evalscope_native", tok)
    assert "<|im_start|>user\nFind $x$ if $2x = 6$.\nPlease reason step by step, and put your final answer within " in (
        evalscope
    )
    with pytest.raises(ValueError, match="has none; use a template without '_native'"):
        format_prompt(problem, "dapo_native", tiny_random_model[1])


def test_repeated_problems_with_different_gold_answers_are_warned_about(tmp_path, tiny_random_model):
    from common.math_data import load_prompts

    rows = [
        {"problem": "1 + 1?", "answer": "2"},
        {"problem": "1 + 1?", "answer": "2"},  # a plain repeat: a note only
        {"problem": "2 + 2?", "answer": "4"},
        {"problem": "2 + 2?", "answer": "5"},  # the same problem, another answer
        {"problem": "3 + 3?", "answer": 6},
        {"problem": "3 + 3?", "answer": "6"},  # the same answer, as a number and as text
    ]
    write_jsonl(rows, tmp_path / "d.jsonl")
    said = []
    kept, _ = load_prompts(str(tmp_path / "d.jsonl"), tiny_random_model[1], "qwen_math", 512, say=said.append)
    assert len(kept) == 6 and said[0] == "note: 3 of 6 problems in --dataset repeat an earlier one (kept)"
    assert said[1].startswith(
        "warning: 1 of the repeated problems in --dataset have different gold answers, e.g. rows 2, 3"
    )
    assert len(said) == 2
