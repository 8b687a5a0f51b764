"""Math datasets as rows {"problem", "answer": the gold answer the reward checks, "solution": a worked solution or
None (EDGE-GRPO's guided error correction)}, from local files, Hugging Face hub names, or "synthetic-arith". Every
hub dataset also loads from a local copy: `preset=` applies its field mapping.

Synthetic arithmetic, a task that needs no download (the CPU demo, the learning tests): the 100 single-digit sums.

The demo trains and evaluates on the same 100 problems: it shows RL raising a policy's accuracy, not generalisation
(`data.prepare synthetic` draws larger sets with them held out)."""

import json
import operator
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.cli import clear_errors, not_utf8, require
from common.prompts import (
    DAPO_PREFIX,
    DAPO_SUFFIX,
    few_shot_examples,
    few_shot_pool,
    format_few_shot_prompt,
    prompt_opens_think,
)

SYNTHETIC_NAME = "synthetic-arith"
# Single-digit sums: 100 problems, few enough that a ~1M-parameter model learns them in a minute of SFT.
SYNTHETIC_MAX_OPERAND = 9
SYNTHETIC_EVAL_SEED = 20250
SYNTHETIC_EVAL_SIZE = (SYNTHETIC_MAX_OPERAND + 1) ** 2
SYNTHETIC_TRAIN_SEED = 0
SYNTHETIC_TRAIN_SIZE = (SYNTHETIC_MAX_OPERAND + 1) ** 2
SYNTHETIC_EVAL_PATH = Path(__file__).resolve().parent.parent / "data" / "synthetic_arith_eval.jsonl"

_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def synthetic_arithmetic(
    n: int, seed: int, max_operand: int = 99, ops: str = "+", exclude: Iterable[str] = ()
) -> list[dict]:
    """`n` distinct problems "What is a <op> b?", a and b in [0, max_operand], each op of `ops` ("+-*") equally
    likely, deterministic given the arguments. "-" never goes negative (one less thing for a tiny model to learn);
    texts in `exclude` are never drawn (training sets exclude the evaluation set)."""
    if not ops or any(op not in _OPS for op in ops):
        raise ValueError(f"ops must be a non-empty string of {sorted(_OPS)}, got {ops!r}")
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    ops = "".join(dict.fromkeys(ops))  # "++-" -> "+-": duplicates would skew the op mix
    m = max_operand + 1
    space = sum(m * (m + 1) // 2 if op == "-" else m * m for op in ops)
    excluded = set(exclude)
    if n > space - len(excluded):  # conservative: some excluded texts may lie outside the space
        raise ValueError(
            f"asked for {n} distinct problems but only {space} exist "
            f"(ops={ops!r}, max_operand={max_operand}, {len(excluded)} excluded)"
        )
    rng = random.Random(seed)
    rows, seen = [], set(excluded)
    while len(rows) < n:
        op = rng.choice(ops)
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if op == "-" and a < b:
            a, b = b, a
        problem = f"What is {a} {op} {b}?"
        if problem in seen:
            continue
        seen.add(problem)
        c = _OPS[op](a, b)
        # The solution is short on purpose: a tiny model is SFT'd on it before RL.
        rows.append(
            {"problem": problem, "answer": str(c), "solution": f"{a} {op} {b} = {c}. The answer is \\boxed{{{c}}}."}
        )
    return rows


def synthetic_eval_set() -> list[dict]:
    """The fixed evaluation set shipped as data/synthetic_arith_eval.jsonl."""
    return synthetic_arithmetic(SYNTHETIC_EVAL_SIZE, seed=SYNTHETIC_EVAL_SEED, max_operand=SYNTHETIC_MAX_OPERAND)


DATA_FILE_EXTS = (".jsonl", ".json", ".parquet")


def strip_dapo_instruction(text: str) -> str:
    """The bare problem inside DAPO-Math-17k's "Answer:"-format wrapper, which contradicts the \\boxed{} templates
    (the `dapo_native` template puts it back for DAPO's own reward)."""
    text = text.strip()
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX) :]
    if text.endswith(DAPO_SUFFIX):
        text = text[: -len(DAPO_SUFFIX)]
    return text.strip()


@dataclass(frozen=True)
class FieldMap:
    """Where a dataset keeps problem / answer / solution (dotted paths reach nested fields)."""

    problem: str = "problem"
    answer: str = "answer"
    solution: str | None = "solution"
    problem_transform: Callable[[str], str] | None = None
    config: str | None = None  # hub config (subset) name


DATASET_PRESETS: dict[str, FieldMap] = {
    "agentica-org/DeepScaleR-Preview-Dataset": FieldMap(),
    # prompt = [{"role": "user", "content": <wrapped problem>}],
    # reward_model = {"ground_truth": ..., "style": "rule-lighteval/MATH_v2"}; no solution.
    "BytedTsinghua-SIA/DAPO-Math-17k": FieldMap(
        problem="prompt", answer="reward_model.ground_truth", solution=None, problem_transform=strip_dapo_instruction
    ),
    "knoveleng/open-rs": FieldMap(),
    # Configs "default" (94K) and "extended" (131K); EGPO draws from both.
    "open-r1/OpenR1-Math-220k": FieldMap(config="default"),
}


def _get_path(row: dict, path: str) -> Any:
    """row["a"]["b"] for path "a.b"; integer parts index lists. KeyError if absent."""
    value: Any = row
    for part in path.split("."):
        if isinstance(value, dict):
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit():
            value = value[int(part)]
        else:
            raise KeyError(part)
    return value


def _available_fields(row: dict, path: str) -> list[str]:
    """The keys present at the level where `path` stops resolving (for error messages)."""
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            break
        value = value[part]
    return sorted(value) if isinstance(value, dict) else []


def _as_text(value: Any) -> str:
    """Field value -> text; a chat-message list gives its (last) user message."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        user = [m for m in value if m.get("role") == "user"] or list(value)
        return str(user[-1].get("content", ""))
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], (str, int, float)):
        value = value[0]
    return str(value).strip()


def _is_answer(value: Any) -> bool:
    """A gold answer is a string or a number, or a one-item list of one; a bool, dict or longer list is not."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and bool(str(value).strip())


def _looks_like_path(source: str) -> bool:
    return os.path.exists(source) or source.endswith(DATA_FILE_EXTS) or source.startswith(("/", "./", "../", "~"))


def _data_files(directory: Path, split: str) -> list[Path]:
    """Data files in a directory (e.g. a hub snapshot): top level first, else recursive."""
    for pattern in ("*", "**/*"):
        files = sorted(p for p in directory.glob(pattern) if p.is_file() and p.name.endswith(DATA_FILE_EXTS))
        if files:
            break
    else:
        raise FileNotFoundError(f"no {'/'.join(DATA_FILE_EXTS)} file in directory {directory}")
    # Hub snapshots name shards after their split (train-00000-of-00002.parquet).
    files = [p for p in files if split in p.name] or files
    exts = {p.suffix for p in files}
    if len(exts) > 1:
        raise ValueError(f"directory {directory} mixes file types {sorted(exts)}; name one of its files instead")
    return files


def _json_lines(path: Path, lines: Iterator[str]) -> Iterator[dict]:
    """Rows of JSON Lines text (blank lines skipped); ValueError naming the line that is not a JSON object."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}: line {lineno} is not JSON ({e.msg}, column {e.colno}); fix or delete that line"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {lineno} is a JSON {type(row).__name__}, not an object of fields")
        yield row


def _json_rows(path: Path, text: str, split: str) -> list:
    """A .json file's rows: a list, a dict holding one ({"train": [...]}, {"data": [...]}), or one object per line
    (what `datasets`' to_json writes)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data" and text.lstrip().startswith("{"):  # one object per line
            return list(_json_lines(path, iter(text.splitlines())))
        raise ValueError(
            f"{path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno}); a .json file holds a list of rows, "
            "or one row per line"
        ) from None
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        data = lists.get(split) or lists.get("data") or (next(iter(lists.values())) if len(lists) == 1 else None)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of rows (or a dict holding one under 'data' or '{split}')")
    return data


def _read_file(path: Path, split: str) -> Iterator[dict]:
    """A data file's rows; text files are UTF-8 (a byte-order mark allowed, see `common.cli.not_utf8`)."""
    if path.suffix in (".jsonl", ".json"):
        try:
            with open(path, encoding="utf-8-sig") as f:
                if path.suffix == ".jsonl":
                    yield from _json_lines(path, f)
                else:
                    yield from _json_rows(path, f.read(), split)
        except UnicodeDecodeError:
            raise ValueError(not_utf8(path)) from None
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            yield from batch.to_pylist()
    else:
        raise ValueError(f"unsupported file type {path.suffix!r}; use one of {DATA_FILE_EXTS}")


def _raw_rows(source: str, split: str, config: str | None) -> Iterator[dict]:
    if _looks_like_path(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"dataset file not found: {source}")
        for f in _data_files(path, split) if path.is_dir() else [path]:
            yield from _read_file(f, split)
        return
    try:
        import datasets

        ds = datasets.load_dataset(source, config, split=split)
    except Exception as e:  # offline, unknown name, bad split: all surface here
        raise RuntimeError(
            f"could not load {source!r} (config={config}, split={split}) from the Hugging Face hub "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); without a network, download it "
            "elsewhere and pass a local .jsonl/.json/.parquet file (or a directory holding one)"
        ) from e
    yield from ds


FIELD_HINT = (
    "Pass --{key}_field with the field that holds the {key} (dotted paths such as reward_model.ground_truth reach "
    "nested fields)."
)  # how a training run or a data command maps a field; a benchmark says it its own way (`common.evaluation`)


class _Lacking:
    """The rows that lack a field (its path does not resolve): how many, and the first one's fields."""

    def __init__(self, source: str, fields: dict[str, str | None], required: set[str], hint: str):
        self.source, self.fields, self.required, self.hint = source, fields, required, hint
        self.rows = 0
        self.count = dict.fromkeys(fields, 0)
        self.first: dict[str, list[str]] = {}  # key -> the fields of the first row lacking it

    def read(self, raw: dict) -> tuple[dict, dict[str, tuple[str, list[str]]]]:
        """The row's value of each field (None where absent), and {required key it lacks: (path, fields there)}."""
        self.rows += 1
        row, lacks = {}, {}
        for key, path in self.fields.items():
            try:
                row[key] = None if path is None else _get_path(raw, path)
            except (KeyError, IndexError, TypeError):
                row[key] = None
                self.count[key] += 1
                have = _available_fields(raw, path)
                self.first.setdefault(key, have)
                if key in self.required:
                    lacks[key] = (path, have)
        return row, lacks

    def check(self) -> None:
        """ValueError when no row read has a required field: its name is wrong, not its rows."""
        for key in sorted(self.required, key=list(self.fields).index):
            if self.rows and self.count[key] == self.rows:
                have = ", ".join(self.first[key]) or "none"
                rows = "1 row" if self.rows == 1 else f"{self.rows} rows"
                raise ValueError(
                    f"{key} field {self.fields[key]!r} not found in any row of {self.source} ({rows}; row 0's "
                    f"fields: {have}). {self.hint.format(key=key)}"
                )


def iter_math_dataset(
    source: str,
    split: str = "train",
    problem_field: str | None = None,
    answer_field: str | None = None,
    solution_field: str | None = None,
    limit: int | None = None,
    preset: str | None = None,
    config: str | None = None,
    strict: bool = False,
    keep: tuple[str, ...] = (),
    columns: bool = False,
    hint: str = FIELD_HINT,
) -> Iterator[dict]:
    """Stream the rows of `load_math_dataset`; a field no row has raises ValueError with `hint`, the fix.
    `strict`: an answer that is not `_is_answer` is None, and a row lacking a field says so in "lacks", for
    `load_prompts` to refuse or drop. `keep`: source columns passed through; `columns`: the whole source row (for
    `common.rewards.reward_columns`)."""
    if source == SYNTHETIC_NAME:
        yield from _synthetic_rows(split, limit)
        return
    preset = preset or source
    fmap = DATASET_PRESETS.get(preset)
    if fmap is None and preset != source:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(DATASET_PRESETS)}")
    fmap = fmap or FieldMap()
    fields = {
        "problem": problem_field or fmap.problem,
        "answer": answer_field or fmap.answer,
        "solution": solution_field or fmap.solution,
    }
    lacking = _Lacking(source, fields, {"problem", "answer"} | ({"solution"} if solution_field else set()), hint)
    for raw in _raw_rows(source, split, config or fmap.config):
        if limit is not None and lacking.rows >= limit:
            break
        row, lacks = lacking.read(raw)
        problem = _as_text(row["problem"])
        if fmap.problem_transform is not None and not problem_field:
            problem = fmap.problem_transform(problem)
        solution = _as_text(row["solution"]) or None
        answer = _as_text(row["answer"]) if not strict or _is_answer(row["answer"]) else None
        kept = {k: raw.get(k) for k in keep} | ({"columns": dict(raw)} if columns else {})
        marked = {"lacks": lacks} if strict and lacks else {}
        yield {"problem": problem, "answer": answer or (None if strict else ""), "solution": solution, **kept, **marked}
    lacking.check()


def _synthetic_rows(split: str, limit: int | None) -> list[dict]:
    if split == "train":
        rows = synthetic_arithmetic(SYNTHETIC_TRAIN_SIZE, seed=SYNTHETIC_TRAIN_SEED, max_operand=SYNTHETIC_MAX_OPERAND)
    elif split in ("test", "eval", "validation"):
        rows = synthetic_eval_set()
    else:
        raise ValueError(f"{SYNTHETIC_NAME} has splits 'train' and 'test', not {split!r}")
    return rows[:limit]


def load_math_dataset(
    source: str,
    split: str = "train",
    problem_field: str | None = None,
    answer_field: str | None = None,
    solution_field: str | None = None,
    limit: int | None = None,
    preset: str | None = None,
    config: str | None = None,
) -> list[dict]:
    """Rows `{"problem": str, "answer": str, "solution": str | None}` (an empty answer kept as "").

    source: a .jsonl / .json / .parquet file, a directory of them (shards named after `split` first), a hub name, or
    "synthetic-arith" (split "train" or "test": the 100 sums in two orders). *_field: dotted paths to nested fields
    (reward_model.ground_truth), over `DATASET_PRESETS`; a chat message list gives its last user message. preset: a
    known dataset's mapping for a local copy of it. config: hub subset (default: the preset's)."""
    return list(iter_math_dataset(source, split, problem_field, answer_field, solution_field, limit, preset, config))


def _usable_rows(rows: list[dict], dataset: str, bad_rows: str, say) -> list[dict]:
    """`rows` without those lacking a field or a problem or a usable answer: refused (`bad_rows="error"`, naming
    how many and the first) or dropped with a count."""
    lacking = {i for i, r in enumerate(rows) if r.get("lacks")}
    bad = [i for i, r in enumerate(rows) if i not in lacking and (not r["problem"].strip() or r["answer"] is None)]
    what, flags = [], []
    for key in ("problem", "answer", "solution"):
        some = [i for i in sorted(lacking) if key in rows[i]["lacks"]]
        if some:
            path, have = rows[some[0]]["lacks"][key]
            what.append(
                f"{len(some)} of {len(rows)} rows lacking the {key} field {path!r} (the first: row {some[0]}, "
                f"with fields {', '.join(have) or 'none'})"
            )
            flags.append(f"--{key}_field")
    if bad:
        first = rows[bad[0]]
        what.append(
            f"{len(bad)} of {len(rows)} rows have no problem or no usable gold answer "
            f"(row {bad[0]}: answer {first['answer']!r}, problem {first['problem'][:60]!r})"
        )
    if not what:
        return rows
    fix = f"fix the data, name the fields ({', '.join(flags or ['--answer_field'])}), or --bad_rows drop"
    require(bad_rows == "drop", f"--dataset: {'; '.join(what)}; {fix}")
    say(f"dropped {'; '.join(what)}")
    dropped = lacking | set(bad)
    rows = [r for i, r in enumerate(rows) if i not in dropped]
    require(rows, f"--dataset: no usable row left in {dataset}")
    return rows


def load_prompts(
    dataset: str,
    tokenizer,
    template: str,
    max_prompt_len: int,
    *,
    problem_field: str | None = None,
    answer_field: str | None = None,
    solution_field: str | None = None,
    bad_rows: str = "error",
    say: Callable[[str], None] = print,
    few_shot: int = 0,
    seed: int = 0,
) -> tuple[list[dict], bool]:
    """The rows of `dataset` with their prompts tokenised ("prompt_ids"; longer than `max_prompt_len`: dropped), and
    whether the prompt opens the <think> block. A bad row would train at reward 0 (`_usable_rows`); a repeated
    problem is kept. few_shot K: K worked examples before each problem (`few_shot_pool`), kept as "shots"."""
    with clear_errors("--dataset"):
        rows = list(iter_math_dataset(dataset, problem_field=problem_field, answer_field=answer_field,
                                      solution_field=solution_field, strict=True, columns=True))  # fmt: skip
    require(rows, f"--dataset: {dataset} has no rows")
    rows = _usable_rows(rows, dataset, bad_rows, say)
    repeated = len(rows) - len({r["problem"] for r in rows})
    if repeated:
        say(f"note: {repeated} of {len(rows)} problems in --dataset repeat an earlier one (kept)")
        golds: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            golds.setdefault(r["problem"], []).append(i)
        conflicts = [ix for ix in golds.values() if len({str(rows[i]["answer"]).strip() for i in ix}) > 1]
        if conflicts:
            first = conflicts[0]
            say(
                f"warning: {len(conflicts)} of the repeated problems in --dataset have different gold answers, e.g. rows "
                f"{', '.join(map(str, first[:4]))}: {[rows[i]['answer'] for i in first[:4]]!r} for "
                f"{rows[first[0]]['problem'][:60]!r}; each copy is trained on its own answer (fix the data)"
            )
    if few_shot:
        with clear_errors("--few_shot"):
            pool = few_shot_pool(rows, few_shot, seed)
        for r in rows:
            r["shots"] = few_shot_examples(r["problem"], pool, few_shot)
    with clear_errors("--template"):
        for r in rows:
            r["prompt_ids"] = tokenizer(
                format_few_shot_prompt(r["problem"], template, r.get("shots", []), tokenizer), add_special_tokens=False
            ).input_ids
        opens_think = prompt_opens_think(template, tokenizer)
    kept = [r for r in rows if len(r["prompt_ids"]) <= max_prompt_len]
    require(kept, f"--max_prompt_len: all {len(rows)} prompts are longer than {max_prompt_len} tokens; raise it")
    if len(kept) < len(rows):
        say(f"dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than --max_prompt_len={max_prompt_len}")
    return kept, opens_think
