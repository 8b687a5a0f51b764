"""common/math_data.py, common/prompts.py, common/synthetic.py, and data/prepare.py on local stand-ins of each paper's dataset."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.cli import parse_args
from common.jsonl import write_jsonl
from common.math_data import DAPO_PREFIX, DAPO_SUFFIX, load_math_dataset
from common.prompts import format_prompt
from common.synthetic import (
    SYNTHETIC_EVAL_PATH,
    SYNTHETIC_MAX_OPERAND,
    SYNTHETIC_TRAIN_SIZE,
    synthetic_arithmetic,
    synthetic_eval_set,
)
from data import prepare


def run_prepare(argv):
    """`python -m data.prepare ARGV` in process."""
    prepare.main(parse_args(prepare.Args, argv=argv))


# ---------------------------------------------------------------------------
# Stand-in files in each dataset's real schema
# ---------------------------------------------------------------------------


def write_parquet(rows, path):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_jsonl_file(rows, path):
    write_jsonl(rows, path)
    return str(path)


def deepscaler_rows():
    # DeepScaleR: problem / answer / solution; many solutions are empty or unboxed.
    return [
        {"problem": "Compute 1+1.", "answer": "2", "solution": "We add: $1+1=\\boxed{2}$."},
        {"problem": "Find x if 2x=6.", "answer": "3", "solution": ""},
        {"problem": "What is 2^3?", "answer": "8", "solution": "2^3 = 8, so the answer is 8."},
        {
            "problem": "Simplify \\frac{4}{6}.",
            "answer": "\\frac{2}{3}",
            "solution": "Divide by 2: \\boxed{\\frac{2}{3}}",
        },
    ] + [
        {"problem": f"Compute {i}+{i}.", "answer": str(2 * i), "solution": f"Twice {i} is \\boxed{{{2 * i}}}."}
        for i in range(2, 40)
    ]


def dapo_row(problem, answer, index):
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": f"{DAPO_PREFIX}\n\n{problem}\n\n{DAPO_SUFFIX}", "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": str(index)},
    }


def dapo_rows():
    # DAPO-Math-17k repeats every problem many times.
    rows = []
    for _ in range(3):
        rows.append(dapo_row("Let $x$ satisfy $x+1=3$. Find $x$.", "2", len(rows)))
        rows.append(dapo_row("How many primes are below 10?", "4", len(rows)))
    rows.append(dapo_row("Find the sum of {1, 2, 3}.", "6", len(rows)))
    return rows


def openr1_rows():
    base = {
        "problem_type": "Algebra",
        "question_type": "math-word-problem",
        "source": "olympiads",
        "uuid": "u",
        "is_reasoning_complete": [True],
        "generations": ["..."],
        "correctness_math_verify": [True],
        "correctness_llama": None,
        "finish_reasons": None,
        "correctness_count": 1,
        "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
    }
    answers = [
        "5",
        "2, 3",
        "x=1 \\text{ or } x=2",
        "",
        "(1, 2)",
        "1,000",
        "\\boxed{1}\\boxed{2}",
        "proof",
        "[0, 1)",
        "a=1; b=2",
        "\\frac{1}{2}",
    ]
    rows = [
        {**base, "problem": f"Problem {i}: solve it.", "answer": a, "solution": f"sol {i}"}
        for i, a in enumerate(answers)
    ]
    rows.append({**base, "problem": "Problem 0:  solve it.", "answer": "5", "solution": "dup"})  # duplicate
    rows.append({**base, "problem": "long " * 40 + "problem", "answer": "7", "solution": "s"})
    return rows


def openrs_rows():
    return [
        {"problem": "What is 3*4?", "solution": "3*4=\\boxed{12}", "answer": "12", "level": "Level 1"},
        {"problem": "What is 5-2?", "solution": "\\boxed{3}", "answer": "3", "level": "Level 1"},
        {"problem": "Prove it.", "solution": "...", "answer": None, "level": "Level 5"},
        {"problem": "What is 9/3?", "solution": "\\boxed{3}", "answer": "  ", "level": "Level 2"},
    ]


@pytest.fixture(params=["jsonl", "parquet"])
def fmt(request):
    return request.param


def save(rows, tmp_path, fmt, name="data"):
    path = tmp_path / f"{name}.{fmt}"
    return write_parquet(rows, path) if fmt == "parquet" else write_jsonl_file(rows, path)


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
    assert rows[0] == {"problem": "Problem 0: solve it.", "answer": "5", "solution": "sol 0"}


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
# data.prepare filters
# ---------------------------------------------------------------------------


def test_prepare_edge(tmp_path, fmt, capsys):
    src = save(deepscaler_rows(), tmp_path, fmt)
    rows = load_math_dataset(src, preset="agentica-org/DeepScaleR-Preview-Dataset")
    kept = prepare.prepare_edge(rows, n=None)
    assert len(kept) == len(rows) - 2  # empty and unboxed solutions dropped
    assert {"Find x if 2x=6.", "What is 2^3?"}.isdisjoint(r["problem"] for r in kept)
    sub = prepare.prepare_edge(rows, n=20, seed=42)
    assert len(sub) == 20 and sub == prepare.prepare_edge(rows, n=20, seed=42)
    assert sub != prepare.prepare_edge(rows, n=20, seed=43)
    assert "42 -> 40" in capsys.readouterr().out  # counts are printed
    # Through the CLI.
    out = tmp_path / "edge.jsonl"
    run_prepare(["edge", "--source", src, "--output", str(out), "--n", "20"])
    assert load_math_dataset(str(out)) == sub


def test_single_value_answer():
    ok = ["5", "(1, 2)", "1,000", "[0, 1)", "\\frac{1}{2}", "\\{1,2\\}", "\\boxed{3}", "x^2+1"]
    bad = ["", " ", "2, 3", "x=1 \\text{ or } x=2", "3 and 4", "\\boxed{1}\\boxed{2}", "proof", "a=1; b=2"]
    assert all(prepare.is_single_value_answer(a) for a in ok)
    assert not any(prepare.is_single_value_answer(a) for a in bad)


@pytest.fixture(scope="module")
def tiny_tokenizer_path(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["Problem solve it long please reason step"], trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    )
    path = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    return str(path)


def test_prepare_egpo(tmp_path, fmt, tiny_tokenizer_path):
    src = save(openr1_rows(), tmp_path, fmt)
    rows = load_math_dataset(src, preset="open-r1/OpenR1-Math-220k")
    from transformers import AutoTokenizer

    from common.prompts import format_prompt

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    short = len(tok(format_prompt("Problem 0: solve it.", "qwen_math"), add_special_tokens=False)["input_ids"])
    long = len(tok(format_prompt(rows[-1]["problem"], "qwen_math"), add_special_tokens=False)["input_ids"])
    assert long > short + 30
    kept = prepare.prepare_egpo(rows, tiny_tokenizer_path, max_prompt_tokens=short + 5)
    assert [r["answer"] for r in kept] == ["5", "(1, 2)", "1,000", "[0, 1)", "\\frac{1}{2}"]
    # The long prompt survives a larger budget.
    assert len(prepare.prepare_egpo(rows, tok, max_prompt_tokens=long)) == 6
    with pytest.raises(ValueError, match="--tokenizer"):
        prepare.prepare_egpo(rows, None)
    out = tmp_path / "egpo.jsonl"
    run_prepare(
        [
            "egpo",
            "--source",
            src,
            "--output",
            str(out),
            "--tokenizer",
            tiny_tokenizer_path,
            "--max_prompt_tokens",
            str(short + 5),
        ]
    )
    assert load_math_dataset(str(out)) == kept
    with pytest.raises(ValueError, match="--tokenizer"):
        run_prepare(["egpo", "--source", src, "--output", str(out)])


def test_prepare_cw(tmp_path, fmt):
    src = save(openrs_rows(), tmp_path, fmt)
    out = tmp_path / "cw.jsonl"
    run_prepare(["cw", "--source", src, "--output", str(out)])
    rows = load_math_dataset(str(out))
    assert rows == [
        {"problem": "What is 3*4?", "answer": "12", "solution": "3*4=\\boxed{12}"},
        {"problem": "What is 5-2?", "answer": "3", "solution": "\\boxed{3}"},
    ]


def test_prepare_pro(tmp_path, fmt, capsys):
    src = save(dapo_rows(), tmp_path, fmt)
    out = tmp_path / "pro.jsonl"
    run_prepare(["pro", "--source", src, "--output", str(out)])
    rows = load_math_dataset(str(out))
    assert rows == [
        {"problem": "Let $x$ satisfy $x+1=3$. Find $x$.", "answer": "2", "solution": None},
        {"problem": "How many primes are below 10?", "answer": "4", "solution": None},
        {"problem": "Find the sum of {1, 2, 3}.", "answer": "6", "solution": None},
    ]
    assert "7 -> 3" in capsys.readouterr().out
    # Also unwraps when the problem field is given explicitly (wrapper still present).
    rows = prepare.prepare_pro(load_math_dataset(src, problem_field="prompt", answer_field="reward_model.ground_truth"))
    assert rows[0]["problem"] == "Let $x$ satisfy $x+1=3$. Find $x$."


def test_prepare_synthetic(tmp_path):
    out = tmp_path / "syn.jsonl"
    run_prepare(["synthetic", "--output", str(out), "--n", "300", "--ops", "+-", "--max_operand", "20"])
    rows = load_math_dataset(str(out))
    assert len(rows) == 300 and rows == prepare.prepare_synthetic(300, 42, 20, "+-")
    assert all(int(r["answer"]) >= 0 for r in rows)


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


def test_prepared_synthetic_training_set_holds_no_evaluation_problem(tmp_path):
    """The docs promise it; before, `prepare synthetic` wrote the 100 evaluation sums themselves."""
    out = tmp_path / "train.jsonl"
    run_prepare(["synthetic", "--output", str(out), "--n", "2000"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2000
    assert not {r["problem"] for r in rows} & {r["problem"] for r in synthetic_eval_set()}


def test_prepare_refuses_to_write_an_empty_training_set(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit, match="no rows left to write"):
        run_prepare(["cw", "--source", str(empty), "--output", str(tmp_path / "out.jsonl")])
    assert not (tmp_path / "out.jsonl").exists()


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
