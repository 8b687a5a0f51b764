"""The papers' math benchmarks: where each lives on the hub, its problem and answer fields, and loading them by
name or from a local copy (`name=FILE`, `name=DIR`, a data directory; `name=FILE:problem=FIELD:answer=FIELD`).
Messages name no flag of the caller's (--benchmarks, --eval_benchmarks): the caller does.
"""

import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from common.answers import extract_boxed
from common.math_data import DATA_FILE_EXTS, iter_math_dataset
from common.synthetic import SYNTHETIC_EVAL_PATH, SYNTHETIC_EVAL_SIZE

AGGREGATES = ("overall", "mean")  # reserved names in the summary keys


def _last_boxed(text: str) -> str:
    """Minerva's gold answer: the last \\boxed{} of the reference solution."""
    boxed = extract_boxed(text)
    return boxed.strip() if boxed else text  # already bare (a local copy in our format)


def _after_hashes(text: str) -> str:
    """GSM8K's gold answer follows "####" at the end of the worked solution; "1,000" -> "1000"."""
    answer = text.rsplit("####", 1)[-1].strip()
    return answer.replace(",", "") if re.fullmatch(r"-?[\d,]+(\.\d+)?", answer) else answer


class Benchmark(NamedTuple):
    """Where a benchmark lives on the hub and which fields hold the problem and the gold answer."""

    hub: str | None  # None: local file only
    config: str | None
    split: str
    problem_field: str
    answer_field: str
    answer_transform: Callable[[str], str] | None = None  # raw answer field -> gold answer (idempotent)
    size: int | None = None  # problems in the hub version (papers' tables give these counts)
    local: str | None = None  # default local file (no hub version)


# The versions the papers' evaluation stacks load (open-r1 lighteval tasks, CW-GRPO's App. A); AIME24 as CW-GRPO's
# (HuggingFaceH4/aime_2024, string answers), not Maxwell-Jia/AIME_2024.
BENCHMARKS: dict[str, Benchmark] = {
    "math500": Benchmark("HuggingFaceH4/MATH-500", None, "test", "problem", "answer", size=500),
    "aime24": Benchmark("HuggingFaceH4/aime_2024", None, "train", "problem", "answer", size=30),
    "aime25": Benchmark("yentinglin/aime_2025", None, "train", "problem", "answer", size=30),
    # AMC 2023, 40 problems (CW-GRPO, Pro-GRPO).
    "amc23": Benchmark("knoveleng/AMC-23", None, "train", "problem", "answer", size=40),
    # EDGE-GRPO's "AMC (83)": AMC 2022 + 2023, the AI-MO validation set (answers are floats: 27.0).
    "amc": Benchmark("AI-MO/aimo-validation-amc", None, "train", "problem", "answer", size=83),
    "minerva": Benchmark("knoveleng/Minerva-Math", None, "train", "problem", "solution", _last_boxed, size=272),
    "olympiadbench": Benchmark("knoveleng/OlympiadBench", None, "train", "question", "answer", size=675),
    "gsm8k": Benchmark("openai/gsm8k", "main", "test", "question", "answer", _after_hashes, size=1319),
    # The CPU demo's fixed arithmetic problems, shipped in the repo.
    "synthetic": Benchmark(
        None, None, "test", "problem", "answer", size=SYNTHETIC_EVAL_SIZE, local=str(SYNTHETIC_EVAL_PATH)
    ),
}


_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


def _clean_answer(answer: str) -> str:
    """Integer-valued float answers ("27.0", AMC's floats) -> "27": the exact-match path then hits."""
    m = re.fullmatch(r"(-?\d+)\.0+", answer.strip())
    return m.group(1) if m else answer.strip()


# "PATH:problem=FIELD:answer=FIELD": a local file (or hub name) whose problem / gold answer are in other fields.
_MAPPED = re.compile(r"(?P<path>.+?)(?P<fields>(?::(?:problem|answer)=[^:=,]+)+)")
MAP_HINT = "map them: {name}=PATH:problem=FIELD:answer=FIELD"


def split_fields(source: str) -> tuple[str, dict[str, str]]:
    """ "data/x.jsonl:problem=question:answer=gold" -> ("data/x.jsonl", {"problem": "question", "answer": "gold"});
    a source without such a tail -> (source, {})."""
    m = _MAPPED.fullmatch(source)
    if not m:
        if other := re.search(r":(\w*)=", source):
            raise ValueError(
                f"{source!r}: ':{other.group(1)}=' maps no field; name the fields as PATH:problem=FIELD:answer=FIELD"
            )
        return source, {}
    pairs = [item.split("=") for item in m.group("fields").split(":")[1:]]
    if len({k for k, _ in pairs}) < len(pairs):
        raise ValueError(f"{source!r} maps a field twice; name each of problem and answer once")
    return m.group("path"), dict(pairs)


def _local_copy(name: str, where: str) -> str | None:
    """`where`/<name>.jsonl (or .json, .parquet) if `where` is a directory holding one, else None."""
    return next((str(p) for ext in DATA_FILE_EXTS if (p := Path(where) / f"{name}{ext}").is_file()), None)


def load_benchmark(
    name: str,
    source: str | None = None,
    data_dir: str | None = None,
    limit: int | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
    data_dir_flag: str | None = None,
) -> list[dict]:
    """Rows `{"problem", "answer"}` of one benchmark. `source`: a file, directory or hub name instead of the hub
    dataset (needed for a name not in `BENCHMARKS`), in our fields or the hub's, or those its tail maps
    (`split_fields`) or `*_field` name; `data_dir`: searched for `<name>.jsonl` first; `data_dir_flag`: its flag."""
    if not _NAME_RE.fullmatch(name) or name in AGGREGATES:
        raise ValueError(
            f"invalid benchmark name {name!r}: use letters, digits, '_', '-', '.', and not {' or '.join(AGGREGATES)}"
        )
    spec = BENCHMARKS.get(name)
    mapped = {}
    if source is not None:
        source, mapped = split_fields(source)
        if Path(source).is_dir():
            source = _local_copy(name, source) or source  # else the directory is the data (a hub snapshot's shards)
    if source is None and data_dir is not None:
        source = _local_copy(name, data_dir)
    if source is None and spec is not None:
        source = spec.local
    if spec is None:
        if source is None:
            raise ValueError(
                f"unknown benchmark {name!r} and no file for it; known: {', '.join(BENCHMARKS)}. Give it a file: "
                f"{name}=path/to/{name}.jsonl (fields problem and answer, or {MAP_HINT.format(name=name)})"
            )
        spec = Benchmark(None, None, "test", "problem", "answer")
    problem_field, answer_field = mapped.get("problem", problem_field), mapped.get("answer", answer_field)
    named = bool(problem_field or answer_field)
    if named:
        spec = spec._replace(
            problem_field=problem_field or spec.problem_field, answer_field=answer_field or spec.answer_field
        )

    rows = _read_rows(name, spec, source, named, limit, data_dir_flag)
    out = []
    for r in rows:
        answer = spec.answer_transform(r["answer"]) if spec.answer_transform else r["answer"]
        out.append({"problem": r["problem"], "answer": _clean_answer(answer)})
    if not out:
        raise ValueError(f"benchmark {name!r}: no problems in {source or spec.hub}")
    return out


def _read_rows(name: str, spec: Benchmark, source: str | None, named: bool, limit: int | None,
               data_dir_flag: str | None) -> list[dict]:  # fmt: skip
    """`load_benchmark`'s rows before their answers are cleaned: from the hub (`source` None), or from `source` in the
    fields the user `named`, else in ours, else in the hub dataset's; every row checked (`_checked`)."""
    hint = f"Or {MAP_HINT.format(name=name)}."

    def read(where: str, fields: tuple[str, str]) -> list[dict]:
        config = spec.config if source is None else None
        rows = iter_math_dataset(where, spec.split, *fields, None, limit, config=config, strict=True, hint=hint)
        return _checked(name, where, list(rows))

    if source is None:  # the hub
        try:
            return read(spec.hub, (spec.problem_field, spec.answer_field))
        except RuntimeError:
            copy = f", or {data_dir_flag} DIR holding it" if data_dir_flag else ""
            raise RuntimeError(
                f"benchmark {name!r}: could not load {spec.hub} from the Hugging Face hub; without a network, give a "
                f"local copy: {name}=path/to/{name}.jsonl, or {name}=DIR holding {name}.jsonl{copy} (`python -m "
                f"tools.evaluate --export_data DIR --benchmarks {name}` writes one on a machine that reaches the hub)"
            ) from None
    if named:  # the fields the user named, and no others
        try:
            return read(source, (spec.problem_field, spec.answer_field))
        except BadRows:
            raise
        except ValueError as e:
            raise ValueError(f"benchmark {name!r}: {e}") from None
    try:  # our own format first: every shipped or exported copy is in it
        return read(source, ("problem", "answer"))
    except BadRows:
        raise
    except ValueError as ours:  # a raw dump of the hub dataset, in its own fields
        if "field" not in str(ours) or (spec.problem_field, spec.answer_field) == ("problem", "answer"):
            raise ValueError(f"benchmark {name!r}: {ours}") from None
        try:
            return read(source, (spec.problem_field, spec.answer_field))
        except ValueError:
            fields = " or ".join(sorted({"problem, answer", f"{spec.problem_field}, {spec.answer_field}"}))
            detail = str(ours).removesuffix(f" {hint}").removesuffix(".")
            raise ValueError(
                f"benchmark {name!r}: {source} needs the fields {fields} ({detail}); {MAP_HINT.format(name=name)}"
            ) from None


class BadRows(ValueError):
    """Some rows of a benchmark's file lack a field, a problem or a usable answer (the fields themselves exist)."""


def _checked(name: str, source: str, rows: list[dict]) -> list[dict]:
    """`rows`, or BadRows naming how many lack a field, a problem or a usable answer: none is dropped unsaid."""
    bad = [i for i, r in enumerate(rows) if r.get("lacks") or not r["problem"].strip() or r["answer"] is None]
    if not bad:
        return rows
    first = rows[bad[0]]
    if lacks := first.get("lacks"):
        key, (path, have) = next(iter(lacks.items()))
        why = f"lacks the {key} field {path!r} (its fields: {', '.join(have) or 'none'})"
    else:
        why = f"has answer {first['answer']!r} and problem {first['problem'][:60]!r}"
    raise BadRows(
        f"benchmark {name!r}: {len(bad)} of {len(rows)} rows of {source} lack a problem or a usable gold answer (row "
        f"{bad[0]} {why}); fix the file, or {MAP_HINT.format(name=name)}"
    )


def parse_benchmarks(text: str) -> list[tuple[str, str | None]]:
    """ "math500,aime24=data/aime24.jsonl" -> [("math500", None), ("aime24", "data/aime24.jsonl")]."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, source = item.partition("=")
        out.append((name.strip(), source.strip() or None))
    if not out:
        raise ValueError("no benchmark given")
    return out


def load_benchmarks(
    text: str,
    data_dir: str | None = None,
    limit: int | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
    data_dir_flag: str | None = None,
) -> dict[str, list[dict]]:
    """{name: rows} of a `--benchmarks` (or `--eval_benchmarks`) string, in order (`load_benchmark`)."""
    items = parse_benchmarks(text)
    names = [name for name, _ in items]
    if len(set(names)) < len(names):
        raise ValueError(f"a benchmark is named twice in {text!r}")
    return {
        name: load_benchmark(name, source, data_dir, limit, problem_field, answer_field, data_dir_flag)
        for name, source in items
    }
