"""data/prepare.py and its filters (data/openr1.py, data/near_duplicates.py) on the stand-ins of
tests/dataset_standins.py: each paper's preset, its filters, and what it writes."""

import json

import pytest
from dataset_standins import (
    dapo_rows,
    deepscaler_rows,
    distinct_problem,
    openr1_row,
    openr1_rows,
    openrs_rows,
    run_prepare,
    save,
)

from common.math_data import iter_math_dataset, load_math_dataset, synthetic_eval_set
from common.prompts import format_prompt
from common.run_dir import iter_jsonl, write_jsonl
from data import near_duplicates, openr1, prepare


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
