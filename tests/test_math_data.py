"""common/math_data.py, common/prompts.py, common/synthetic.py, and data/prepare.py on local stand-ins of each paper's dataset."""

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.cli import parse_args
from common.jsonl import iter_jsonl, write_jsonl
from common.math_data import DAPO_PREFIX, DAPO_SUFFIX, iter_math_dataset, load_math_dataset
from common.prompts import format_prompt
from common.synthetic import (
    SYNTHETIC_EVAL_PATH,
    SYNTHETIC_MAX_OPERAND,
    SYNTHETIC_TRAIN_SIZE,
    synthetic_arithmetic,
    synthetic_eval_set,
)
from data import near_duplicates, openr1, prepare


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


def openr1_row(problem, answer, verdicts=(True, True), solution=None, llama=None):
    """A row of OpenR1-Math-220k in its own columns: R1 generations with math-verify's (and, for some
    rows, a Llama judge's) verdict on each, and their count; a generation judged right boxes the answer."""
    return {
        "problem": problem,
        "solution": f"Hence $\\boxed{{{answer}}}$." if solution is None else solution,
        "answer": answer,
        "problem_type": "Algebra",
        "question_type": "math-word-problem",
        "source": "olympiads",
        "uuid": "u",
        "is_reasoning_complete": [True] * len(verdicts),
        "generations": [f"<think>...</think> so \\boxed{{{answer if v else 'wrong'}}}" for v in verdicts],
        "correctness_math_verify": list(verdicts),
        "correctness_llama": llama,
        "finish_reasons": ["stop"] * len(verdicts),
        "correctness_count": sum(map(bool, verdicts)) if llama is None else sum(map(bool, llama)),
        "messages": [{"role": "user", "content": problem}, {"role": "assistant", "content": "y"}],
    }


def distinct_problem(i, words=8):
    """Problem i: a sentence that shares few words with any other (no near-duplicates)."""
    rng = random.Random(i)
    return f"Problem {i}: " + " ".join(f"w{rng.randrange(10_000)}" for _ in range(words)) + " solve it."


def openr1_rows():
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
    rows = [openr1_row(distinct_problem(i), a) for i, a in enumerate(answers)]
    rows.append(openr1_row(rows[0]["problem"].replace(" ", "  "), "5", solution="dup"))  # duplicate
    rows.append(openr1_row("long " * 80 + "problem", "7"))
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
    """The authors' data script's rule: one value, so no separator outside thousands separators."""
    ok = ["5", "1,000", "12,345.5", "\\frac{1}{2}", "\\boxed{3}", "x^2+1", "x=5", "brand"]
    bad = ["", " ", "2, 3", "x=1 \\text{ or } x=2", "3 and 4", "\\boxed{1}\\boxed{2}", "proof", "a=1; b=2"]
    bad += ["(1, 2)", "[0, 1)", "\\{1,2\\}", "x=y=2", "1，2", "1,00"]  # tuples, intervals and sets too
    assert all(openr1.is_single_value_answer(a) for a in ok)
    assert not any(openr1.is_single_value_answer(a) for a in bad)


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


def openr1_summaries(src, subset="default"):
    rows = iter_math_dataset(src, preset="open-r1/OpenR1-Math-220k", keep=openr1.OPENR1_COLUMNS)
    return [openr1.openr1_summary(r, subset) for r in rows]


def test_prepare_egpo_filters(tmp_path, fmt, tiny_tokenizer_path):
    src = save(openr1_rows(), tmp_path, fmt)
    rows = openr1_summaries(src)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    short = len(tok(format_prompt(rows[0]["problem"], "qwen_math"), add_special_tokens=False)["input_ids"])
    long = len(tok(format_prompt(rows[-1]["problem"], "qwen_math"), add_special_tokens=False)["input_ids"])
    assert long > short + 30
    train, val = openr1.prepare_egpo(rows, tiny_tokenizer_path, max_prompt_tokens=short + 5, n=100, val_size=2)
    assert len(val) == 2 and not {r["problem"] for r in val} & {r["problem"] for r in train}
    assert sorted(r["answer"] for r in train + val) == sorted(["5", "1,000", "\\frac{1}{2}"])
    # The long prompt survives a larger budget.
    assert sum(map(len, openr1.prepare_egpo(rows, tok, max_prompt_tokens=long, n=100, val_size=2))) == 4
    # The response limit (the matching solution's tokens) applies.
    with pytest.raises(ValueError, match="only 0 rows left"):
        openr1.prepare_egpo(rows, tok, max_prompt_tokens=long, n=100, val_size=2, max_response_tokens=1)
    with pytest.raises(ValueError, match="--tokenizer"):
        openr1.prepare_egpo(rows, None)
    with pytest.raises(ValueError, match="validation"):
        openr1.prepare_egpo(rows, tok, max_prompt_tokens=long, val_size=4)


def test_openr1_summary_buckets_and_boxed_match():
    def summary(**kw):
        return openr1.openr1_summary(openr1_row("P", "4", **kw), "extended")

    assert summary(verdicts=[True, True])["bucket"] == "entirely_correct"
    assert summary(verdicts=[True, False, True])["bucket"] == "mixed"
    assert summary(verdicts=[False, False])["bucket"] == "entirely_incorrect"
    assert summary(verdicts=[True])["bucket"] is None  # fewer than two generations
    row = openr1_row("P", "4", verdicts=[False, False]) | {"correctness_count": 1}  # a Llama-judged one
    assert openr1.openr1_summary(row, "default")["bucket"] == "mixed"  # the dataset's count decides
    assert openr1.openr1_summary(row | {"correctness_count": 3}, "default")["bucket"] is None  # inconsistent
    assert summary(solution="$\\boxed{ 4 }$")["response"] == "$\\boxed{ 4 }$"  # the solution first
    assert summary(verdicts=[False, True], solution="so 4")["response"].endswith("\\boxed{4}")  # else a generation
    assert summary(verdicts=[False, False], solution="so 4")["response"] is None  # no box matches
    assert summary(verdicts=[False, False], solution="\\boxed{4}, then \\boxed{5}")["response"] is None  # the last box
    row = openr1_row("P", "1,000", verdicts=[False, False], solution="$\\boxed{{1000}}$")
    assert openr1.openr1_summary(row, "default")["response"] is not None  # light normalisation
    assert summary()["subset"] == "extended"


def openr1_snapshot(tmp_path, fmt, cells):
    """A local copy laid out as the hub repository: data/ (default) and extended/, one shard each.
    cells: {(subset, bucket): count}; plus 5 default rows whose boxes never match the answer."""
    verdicts = {"mixed": [True, False], "entirely_correct": [True, True], "entirely_incorrect": [False, False]}
    rows = {"default": [], "extended": []}
    for (subset, bucket), count in cells.items():
        start = sum(len(r) for r in rows.values())
        rows[subset] += [openr1_row(distinct_problem(start + i), str(i), verdicts[bucket]) for i in range(count)]
    rows["default"] += [openr1_row(f"unmatched {i}?", "9", [False, False], solution="no box") for i in range(5)]
    for subset, folder in openr1.OPENR1_SUBSET_DIRS.items():
        (tmp_path / folder).mkdir()
        save(rows[subset], tmp_path / folder, fmt, name="train-00000-of-00001")
    return str(tmp_path)


def test_prepare_egpo_builds_the_papers_mix_and_validation_file(tmp_path, fmt, tiny_tokenizer_path, capsys):
    cells = {("default", "mixed"): 40, ("default", "entirely_correct"): 40, ("default", "entirely_incorrect"): 20,
             ("extended", "mixed"): 10, ("extended", "entirely_correct"): 1, ("extended", "entirely_incorrect"): 10}  # fmt: skip
    (tmp_path / "snap").mkdir()
    src = openr1_snapshot(tmp_path / "snap", fmt, cells)
    out = tmp_path / "egpo.jsonl"
    argv = ["egpo", "--source", src, "--output", str(out), "--tokenizer", tiny_tokenizer_path, "--n", "40"]
    run_prepare([*argv, "--val_size", "8"])
    train, val = list(iter_jsonl(out)), list(iter_jsonl(tmp_path / "egpo_val.jsonl"))
    assert (len(train), len(val)) == (32, 8) and not {r["problem"] for r in val} & {r["problem"] for r in train}

    def count(**kw):
        return sum(all(r[k] == v for k, v in kw.items()) for r in train + val)

    # 40 x 0.85 = 34 default rows: 20 mixed (0.60), 14 entirely correct (0.40), none entirely incorrect.
    assert (count(subset="default", bucket="mixed"), count(subset="default", bucket="entirely_correct")) == (20, 14)
    # 6 extended rows: 4 mixed, and the single entirely-correct row with one more filling its cell of 2.
    assert (count(subset="extended", bucket="mixed"), count(subset="extended", bucket="entirely_correct")) == (4, 1)
    assert count(subset="extended") == 6 and count(subset="default") == 34
    assert not any(r["problem"].startswith("unmatched") for r in train + val)  # the boxed-match filter
    assert "extended/entirely_correct has 1 rows, fewer than its 2" in capsys.readouterr().out
    assert load_math_dataset(str(out))[0].keys() == {"problem", "answer", "solution"}  # trains like any file
    # Seeded: the same command writes the same files; another seed another pool.
    run_prepare([*argv, "--val_size", "8", "--output", str(tmp_path / "again.jsonl")])
    assert list(iter_jsonl(tmp_path / "again.jsonl")) == train
    run_prepare([*argv, "--val_size", "8", "--seed", "7", "--output", str(tmp_path / "seed7.jsonl")])
    assert list(iter_jsonl(tmp_path / "seed7.jsonl")) != train
    # One subset, from a single file: no mix of subsets to make.
    run_prepare([*argv, "--subsets", "default", "--source", f"{src}/data", "--val_size", "8"])
    assert {r["subset"] for r in iter_jsonl(out)} == {"default"}
    with pytest.raises(ValueError, match="subset mix needs"):
        run_prepare([*argv, "--source", f"{src}/data"])
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


def test_egpo_near_duplicates_and_decontamination(tmp_path, tiny_tokenizer_path):
    """MinHash-LSH at the paper's 128 permutations / Jaccard 0.8: a problem with one word of 30 changed
    is a near-duplicate (dropped within its subset, kept in the other); a benchmark problem's
    near-duplicate is dropped with --decontaminate; distinct problems all stay."""
    assert near_duplicates.lsh_bands(0.8, 128) == (9, 13)
    base = distinct_problem(1, words=30)
    near = base.replace(base.split()[5], "changed")
    leaked = distinct_problem(2, words=30)
    rows = [openr1.openr1_summary(openr1_row(p, "3"), subset) for p, subset in
            [(base, "default"), (near, "default"), (near, "extended"), (leaked + " Then", "default")]
            + [(distinct_problem(10 + i, words=30), "default") for i in range(20)]]  # fmt: skip
    kept = near_duplicates.drop_near_duplicates(rows, 0.8)
    assert [(r["problem"], r["subset"]) for r in kept[:3]] == [
        (base, "default"),
        (near, "extended"),
        (leaked + " Then", "default"),
    ]
    assert len(kept) == len(rows) - 1
    kept = near_duplicates.drop_near_duplicates(rows, 0.8, test_problems=[leaked])
    assert len(kept) == len(rows) - 2 and all(not r["problem"].startswith(leaked) for r in kept)
    # Through the CLI: a local copy of a benchmark.
    src, bench, out = tmp_path / "openr1.jsonl", tmp_path / "math500.jsonl", tmp_path / "egpo.jsonl"
    write_jsonl([openr1_row(r["problem"], "3") for r in rows], src)
    write_jsonl([{"problem": leaked, "answer": "1"}], bench)
    argv = ["egpo", "--source", str(src), "--subsets", "default", "--output", str(out), "--tokenizer", tiny_tokenizer_path,
            "--val_size", "2"]  # fmt: skip
    run_prepare([*argv, "--decontaminate", f"math500={bench}"])
    problems = {r["problem"] for r in [*iter_jsonl(out), *iter_jsonl(tmp_path / "egpo_val.jsonl")]}
    assert base in problems and near not in problems and not any(p.startswith(leaked) for p in problems)
    with pytest.raises(ValueError, match="only 0 rows left"):  # every solution is longer than 1 token
        run_prepare([*argv, "--max_response_tokens", "1"])
    run_prepare([*argv, "--near_dup_threshold", "1"])  # exact duplicates only
    problems = {r["problem"] for r in [*iter_jsonl(out), *iter_jsonl(tmp_path / "egpo_val.jsonl")]}
    assert {base, near, leaked + " Then"} <= problems


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
