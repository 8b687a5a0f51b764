"""Data files of every shape in every encoding (issue 33, items 5-6 and their class: a text format
assumed, not checked). Each cell: the file is read (the same rows), or refused in one line that names
the file, the line where there is one, and the fix."""

import json
import re
from pathlib import Path

import pytest

from common.math_data import load_math_dataset

ROWS = [{"problem": "Combien font 2 + 3 ? (café)", "answer": "5"}, {"problem": "Et 4 + 4 ?", "answer": "8"}]


def json_list(rows) -> str:
    return json.dumps(rows, ensure_ascii=False)


def json_lines(rows) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


# shape -> (file name, text, what loading gives: "rows" or an error pattern)
SHAPES = {
    "json list": ("d.json", json_list(ROWS), "rows"),
    "json lines in .json (datasets' to_json)": ("d.json", json_lines(ROWS), "rows"),
    "dict with a data key": ("d.json", json.dumps({"data": ROWS}, ensure_ascii=False), "rows"),
    "dict with a train key": ("d.json", json.dumps({"train": ROWS, "test": ROWS[:1]}, ensure_ascii=False), "rows"),
    ".jsonl": ("d.jsonl", json_lines(ROWS), "rows"),
    ".jsonl with a blank line": ("d.jsonl", json_lines(ROWS[:1]) + "\n  \n" + json_lines(ROWS[1:]), "rows"),
    ".jsonl with a bad line": ("d.jsonl", json_lines(ROWS[:1]) + '{"problem": "x",\n', r"d.jsonl: line 2 is not JSON"),
    ".json cut short": ("d.json", json_list(ROWS)[:-5], r"d.json: not JSON \(.* at line 1, column \d+\)"),
}
# encoding -> what loading a file so encoded gives: "rows", or the error pattern
ENCODINGS = {
    "utf-8": "rows",
    "utf-8-sig": "rows",  # a byte-order mark (Windows editors)
    "latin-1": r"line 1: byte 0xe9 \(column \d+\) is not UTF-8: .* iconv -f LATIN1 -t UTF-8 ",
    "utf-16": r"is UTF-16 .* iconv -f UTF-16 -t UTF-8 ",
}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("shape", SHAPES)
def test_text_data_files(tmp_path, shape, encoding):
    name, text, shape_gives = SHAPES[shape]
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    expected = ENCODINGS[encoding] if ENCODINGS[encoding] != "rows" else shape_gives
    if expected == "rows":
        rows = load_math_dataset(str(path))
        assert [(r["problem"], r["answer"]) for r in rows] == [(r["problem"], r["answer"]) for r in ROWS]
    else:
        with pytest.raises(ValueError, match=expected) as error:
            load_math_dataset(str(path))
        assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    assert [r["problem"] for r in load_math_dataset(str(tmp_path / "d.parquet"))] == [r["problem"] for r in ROWS]


def test_the_line_named_is_the_bad_one(tmp_path):
    """A latin-1 byte on line 3 of a long UTF-8 file: the message names line 3."""
    text = json_lines([{"problem": f"{i} + 1", "answer": str(i + 1)} for i in range(5)])
    lines = text.splitlines(keepends=True)
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(line.encode() for line in lines[:2]) + "é".encode("latin-1") + lines[2].encode())
    with pytest.raises(ValueError, match="d.jsonl: line 3: byte 0xe9"):
        load_math_dataset(str(path))


# Every reader of a text file a user gives, on a latin-1 file: one line naming the file, the line and the fix.
def _dataset(path):
    load_math_dataset(str(path))


def _benchmark(path):
    from common.evaluation import load_benchmarks

    load_benchmarks(f"mine={path}")


def _recipe(path):
    import grpo_base
    from common.cli import parse_args
    from common.run_flags import RunFlags

    parse_args(grpo_base.Args, RunFlags, argv=["--config", str(path)])


def _template(path):
    from common.prompts import format_prompt

    format_prompt("1 + 1?", str(path))


def _records(path):
    from tools.evaluate import rescore

    rescore(path)


def _metrics(path):
    import tools.plot as plot

    plot.read_metrics(path)


READERS = {  # reader -> (file name, its UTF-8 text, with one latin-1 "é" on line 2)
    "--dataset": (_dataset, "d.jsonl", '{"problem": "1 + 1?", "answer": "2"}\n{"problem": "é", "answer": "2"}\n'),
    "--benchmarks name=FILE": (_benchmark, "b.jsonl", '{"problem": "1?", "answer": "1"}\n{"problem": "é", "answer": "1"}\n'),
    "--config recipe": (_recipe, "r.yaml", "steps: 2\n# é\n"),
    "--template file": (_template, "t.txt", "Q: {problem}\nA (é):"),
    "--rescore records": (
        _records, "e.jsonl",
        '{"benchmark": "a", "answer": "1", "completions": ["x"], "num_tokens": [1], "finished": [true]}\n'
        '{"benchmark": "a", "answer": "é", "completions": ["x"], "num_tokens": [1], "finished": [true]}\n',
    ),
    "tools.plot metrics.jsonl": (_metrics, "metrics.jsonl", '{"step": 1, "train/reward": 0.5}\n{"step": 2, "n": "é"}\n'),
}  # fmt: skip


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_of_a_users_text_file_names_a_bad_encoding(tmp_path, reader):
    read, name, text = READERS[reader]
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    read(path)  # UTF-8: read
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises((ValueError, SystemExit)) as error:
        read(path)
    message = str(error.value)
    assert str(path) in message and "line 2: byte 0xe9" in message and "iconv -f LATIN1 -t UTF-8" in message
    assert "\n" not in message


# Every reader of a data file checks every row for its fields (issue 40, item 8: the check read row 0 only, so a
# file whose first row lacked the answer was refused as if no row had one). A file of 9 rows in its own fields
# (q, a, s), one of them (first, middle, last) or all lacking one field: each reader's verdict.
FIELDS = {"problem": "q", "answer": "a", "solution": "s"}
LACKING = {"first": [0], "middle": [4], "last": [8], "all": list(range(9))}


def fields_file(tmp_path, key: str, where: str) -> str:
    rows = [
        {"id": i, "q": f"What is {i} + 1?", "a": str(i + 1), "s": f"{i} + 1 = \\boxed{{{i + 1}}}"} for i in range(9)
    ]
    for i in LACKING[where]:
        del rows[i][FIELDS[key]]
    path = tmp_path / "d.jsonl"
    path.write_text(json_lines(rows))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from common.models import SHIPPED_DIR

    return AutoTokenizer.from_pretrained(SHIPPED_DIR)


@pytest.mark.parametrize("bad_rows", ["error", "drop"])
@pytest.mark.parametrize("where", LACKING)
@pytest.mark.parametrize("key", FIELDS)
def test_training_data_is_checked_in_every_row(tmp_path, tokenizer, key, where, bad_rows):
    from common.math_data import load_prompts

    path, said = fields_file(tmp_path, key, where), []
    columns = {f"{k}_field": v for k, v in FIELDS.items()}
    load = lambda: load_prompts(path, tokenizer, "qwen_math", 256, bad_rows=bad_rows, say=said.append, **columns)  # noqa: E731
    first, field = LACKING[where][0], FIELDS[key]
    if where == "all":  # the field's name is wrong, whatever --bad_rows says
        with pytest.raises(SystemExit, match=rf"--dataset: {key} field '{field}' not found in any row of .*d.jsonl "
                           rf"\(9 rows; row 0's fields: .*\)\. Pass --{key}_field"):  # fmt: skip
            load()
        return
    lacking = rf"1 of 9 rows lacking the {key} field '{field}' \(the first: row {first}, with fields [a-z, ]+\)"
    if bad_rows == "error":
        with pytest.raises(
            SystemExit, match=rf"^error: --dataset: {lacking}; .*\(--{key}_field\), or --bad_rows drop$"
        ):
            load()
        return
    rows, _ = load()
    assert len(rows) == 8 and f"What is {first} + 1?" not in {r["problem"] for r in rows}
    assert len(said) == 1 and re.fullmatch(f"dropped {lacking}", said[0]), said
    assert all(r["solution"] and r["answer"] for r in rows)


@pytest.mark.parametrize("where", LACKING)
@pytest.mark.parametrize("key", ["problem", "answer"])
def test_a_benchmark_file_is_checked_in_every_row(tmp_path, key, where):
    from common.evaluation import load_benchmark

    source = f"{fields_file(tmp_path, key, where)}:problem=q:answer=a"
    if where == "all":
        with pytest.raises(ValueError, match=rf"benchmark 'mine': {key} field '{FIELDS[key]}' not found in any row .*"
                           r"Or map them: mine=PATH:problem=FIELD:answer=FIELD"):  # fmt: skip
            load_benchmark("mine", source)
        return
    first = LACKING[where][0]
    with pytest.raises(ValueError, match=rf"benchmark 'mine': 1 of 9 rows of .*d.jsonl lack a problem or a usable gold "
                       rf"answer \(row {first} lacks the {key} field '{FIELDS[key]}' \(its fields: "):  # fmt: skip
        load_benchmark("mine", source)


@pytest.mark.parametrize("where", LACKING)
@pytest.mark.parametrize("key", FIELDS)
def test_the_data_commands_read_every_row_too(tmp_path, key, where):
    """load_math_dataset (data.prepare, data.hard_subset): a field no row has is refused; rows lacking one are kept
    with an empty value, for the command to drop as it drops empty answers; a solution field not asked for is
    optional, and the rows that have one keep it wherever the first row lacking one is."""
    path = fields_file(tmp_path, key, where)
    columns = {f"{k}_field": v for k, v in FIELDS.items()}
    if where == "all":
        with pytest.raises(ValueError, match=rf"{key} field '{FIELDS[key]}' not found in any row"):
            load_math_dataset(path, **columns)
    else:
        rows = load_math_dataset(path, **columns)
        assert len(rows) == 9 and [i for i, r in enumerate(rows) if not r[key]] == LACKING[where]
    if key == "solution":  # not asked for (the default field, "solution"): optional, wherever rows lack it
        rows = load_math_dataset(_renamed(path, "s", "solution"), "train", "q", "a")
        assert [i for i, r in enumerate(rows) if r["solution"] is None] == LACKING[where]


def _renamed(path: str, old: str, new: str) -> str:
    """A copy of the JSON Lines file `path` with its field `old` named `new`."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    out = Path(path).with_name(f"renamed-{Path(path).name}")
    out.write_text(json_lines([{(new if k == old else k): v for k, v in r.items()} for r in rows]))
    return str(out)
