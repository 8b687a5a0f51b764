"""The papers' math benchmarks: where each lives on the hub, which fields hold the problem and the
gold answer, and loading them by name or from a local copy (`--benchmarks math500=FILE`, or a
directory holding `<name>.jsonl`; `python -m tools.evaluate --export_data DIR` writes such copies
on a machine with a network)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from common.answers import extract_boxed
from common.math_data import DATA_FILE_EXTS, load_math_dataset
from common.synthetic import SYNTHETIC_EVAL_PATH, SYNTHETIC_EVAL_SIZE

AGGREGATES = ("overall", "mean")  # reserved names in the summary keys


def _last_boxed(text: str) -> str:
    """Minerva keeps its gold answer as the last \\boxed{} of the reference solution."""
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


# The versions the papers' own evaluation stacks load (Open-RS / open-r1 lighteval
# tasks, which CW-GRPO names in its App. A table). AIME24 is HuggingFaceH4/aime_2024
# (CW-GRPO's choice; the 30 problems of AIME 2024 I+II, string answers), not
# Maxwell-Jia/AIME_2024 (same problems, capitalised fields, integer answers).
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


def load_benchmark(
    name: str,
    source: str | None = None,
    data_dir: str | None = None,
    limit: int | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
) -> list[dict]:
    """Rows `{"problem", "answer"}` of one benchmark.

    source: a local file/directory or hub name to read instead of the registry's
        hub dataset (required for names not in `BENCHMARKS`).
    data_dir: a directory searched for `<name>.jsonl` (or .json / .parquet) first.
    A local file may be a dump of the hub dataset (its own field names) or rows
    already in our `{"problem", "answer"}` form; both are accepted.
    problem_field / answer_field: where the problem and the gold answer are, instead (dotted for nested).
    """
    if not _NAME_RE.fullmatch(name) or name in AGGREGATES:
        raise ValueError(
            f"invalid benchmark name {name!r}: use letters, digits, '_', '-', '.', and not {' or '.join(AGGREGATES)}"
        )
    spec = BENCHMARKS.get(name)
    if source is None and data_dir is not None:
        source = next((str(p) for ext in DATA_FILE_EXTS if (p := Path(data_dir) / f"{name}{ext}").exists()), None)
    if source is None and spec is not None:
        source = spec.local
    if spec is None:
        if source is None:
            raise ValueError(
                f"unknown benchmark {name!r} and no file for it; known: {', '.join(BENCHMARKS)}. "
                f"Pass a file as --benchmarks {name}=path/to/{name}.jsonl (fields problem, answer)."
            )
        spec = Benchmark(None, None, "test", "problem", "answer")
    named = bool(problem_field or answer_field)
    if named:
        spec = spec._replace(
            problem_field=problem_field or spec.problem_field, answer_field=answer_field or spec.answer_field
        )

    rows = _read_rows(name, spec, source, named, limit)
    out = []
    for r in rows:
        answer = spec.answer_transform(r["answer"]) if spec.answer_transform else r["answer"]
        out.append({"problem": r["problem"], "answer": _clean_answer(answer)})
    if not out:
        raise ValueError(f"benchmark {name!r}: no problems in {source or spec.hub}")
    return out


def _read_rows(name: str, spec: Benchmark, source: str | None, named: bool, limit: int | None) -> list[dict]:
    """`load_benchmark`'s rows before their answers are cleaned: from the hub (`source` None), from `source` in the
    fields the user `named`, or from `source` in our own fields, else in the hub dataset's."""
    if source is None:  # the hub
        try:
            rows = load_math_dataset(
                spec.hub,
                spec.split,
                spec.problem_field,
                spec.answer_field,
                solution_field=None,
                limit=limit,
                config=spec.config,
            )
        except RuntimeError:
            raise RuntimeError(
                f"benchmark {name!r}: could not load {spec.hub} from the Hugging Face hub; "
                f"without a network, pass a local copy: --benchmarks {name}=path/to/{name}.jsonl, or "
                f"--data_dir DIR holding {name}.jsonl (`python -m tools.evaluate --export_data DIR "
                f"--benchmarks {name}` writes one on a machine that reaches the hub)."
            ) from None
    elif named:  # the fields the user named, and no others
        rows = load_math_dataset(
            source, spec.split, spec.problem_field, spec.answer_field, solution_field=None, limit=limit
        )
    else:
        try:  # our own format first: every shipped or exported copy is in it
            rows = load_math_dataset(source, spec.split, "problem", "answer", limit=limit)
        except ValueError as ours:  # a raw dump of the hub dataset, in its own fields
            try:
                rows = load_math_dataset(
                    source, spec.split, spec.problem_field, spec.answer_field, solution_field=None, limit=limit
                )
            except ValueError:
                if "field" not in str(ours):  # unreadable (bad JSON, ...), not a field mismatch
                    raise ValueError(f"benchmark {name!r}: {ours}") from None
                fields = {"problem, answer", f"{spec.problem_field}, {spec.answer_field}"}
                detail = str(ours).split(". Pass")[0]  # load_math_dataset's hint names training flags
                raise ValueError(
                    f"benchmark {name!r}: {source} needs the fields {' or '.join(sorted(fields))} ({detail})"
                ) from None
    return rows


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
) -> dict[str, list[dict]]:
    """All benchmarks of a `--benchmarks` string, in order: {name: rows} (`*_field`: `load_benchmark`'s)."""
    items = parse_benchmarks(text)
    names = [name for name, _ in items]
    if len(set(names)) < len(names):
        raise ValueError(f"a benchmark is named twice in {text!r}")
    return {name: load_benchmark(name, source, data_dir, limit, problem_field, answer_field) for name, source in items}
