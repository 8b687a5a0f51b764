"""Evaluation: pass@k of a policy on benchmarks, from the training loop or `tools/evaluate.py`. Each problem is
rendered with the training template, sampled `n` times and checked with the training verifier; with c correct:

    pass@1 = c / n (mean over samples)
    pass@k = 1 - C(n - c, k) / C(n, k)    (Chen et al. 2021, unbiased, k <= n)

Summary keys: `eval/<benchmark>/pass@<k>` (and num_problems, response_len, truncated_frac), the same for `overall`
(weighted by problems: EDGE-GRPO's), and `eval/mean/pass@<k>` (the mean of benchmarks: CW-GRPO's, Pro-GRPO's).
Records keep the completion texts (`tools.evaluate --rescore`) and each one's `mean_logprob` (minus EGPO's eq. 5 at T = 1).

The papers' math benchmarks: where each lives on the hub, its problem and answer fields, and loading them by
name or from a local copy (`name=FILE`, `name=DIR`, a data directory; `name=FILE:problem=FIELD:answer=FIELD`).
Messages name no flag of the caller's (--benchmarks, --eval_benchmarks): the caller does."""

import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from common.answers import extract_answer, extract_boxed
from common.math_data import DATA_FILE_EXTS, SYNTHETIC_EVAL_PATH, SYNTHETIC_EVAL_SIZE, iter_math_dataset
from common.prompts import few_shot_examples, format_few_shot_prompt, prompt_seeds
from common.run_dir import write_jsonl
from common.verifier import MathVerifier

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
        return source, {}
    return m.group("path"), dict(item.split("=") for item in m.group("fields").split(":")[1:])


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
    return {
        name: load_benchmark(name, source, data_dir, limit, problem_field, answer_field, data_dir_flag)
        for name, source in items
    }


RESULTS_FILE = "eval_results.json"
RECORDS_FILE = "eval_records.jsonl"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) as 1 - prod_{i=n-c+1}^{n} (1 - k / i): no huge binomials."""
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    return [2**i for i in range(n.bit_length()) if 2**i <= n]


def summarize(records: list[dict], ks: list[int] | None = None) -> dict[str, float]:
    """Flat summary (see the module docstring) of scored records; k > a problem's n is skipped."""
    min_n = min(len(r["correct"]) for r in records)
    ks = sorted({k for k in (ks or default_ks(min_n)) if 1 <= k <= min_n} | {1})
    by_bench: dict[str, list[dict]] = {}
    for r in records:
        by_bench.setdefault(r["benchmark"], []).append(r)

    summary: dict[str, float] = {}
    totals = {k: 0.0 for k in ks}
    for bench, recs in by_bench.items():
        for k in ks:
            scores = [pass_at_k(len(r["correct"]), sum(r["correct"]), k) for r in recs]
            summary[f"eval/{bench}/pass@{k}"] = sum(scores) / len(scores)
            totals[k] += sum(scores)
        summary |= _lengths(f"eval/{bench}", recs)
    for k in ks:
        summary[f"eval/overall/pass@{k}"] = totals[k] / len(records)  # = total correct / total problems
    summary |= _lengths("eval/overall", records)
    for k in ks:
        summary[f"eval/mean/pass@{k}"] = sum(summary[f"eval/{b}/pass@{k}"] for b in by_bench) / len(by_bench)
    return summary


def _lengths(key: str, records: list[dict]) -> dict[str, float]:
    """The problems of `records`, and the mean length and truncated share of what was actually generated."""
    generated = [r for r in records if "skipped" not in r]
    completions = max(sum(len(r["num_tokens"]) for r in generated), 1)
    return {
        f"{key}/num_problems": len(records),
        f"{key}/response_len": sum(sum(r["num_tokens"]) for r in generated) / completions,
        f"{key}/truncated_frac": sum(sum(not f for f in r["finished"]) for r in generated) / completions,
    }


def evaluate(
    engine,
    tokenizer,
    benchmarks: dict[str, list[dict]],
    template: str,
    n: int,
    temperature: float,
    max_tokens: int,
    top_p: float = 1.0,
    seed: int = 0,
    verifier: MathVerifier | None = None,
    ks: list[int] | None = None,
    max_prompt_len: int | None = None,
    accelerator=None,
    say=None,
    few_shot: int = 0,
    few_shot_pool: list[dict] | None = None,
) -> tuple[dict[str, float], list[dict]]:
    """(flat summary, per-problem records) of n samples per problem of `benchmarks` with `engine`. A prompt over
    `max_prompt_len` is not generated and counts as wrong. Each rank samples every world-th problem and all get
    every record: the same summary as on one process (each problem's seed is its own). `say`: a line a benchmark;
    `few_shot`: K worked examples from `few_shot_pool` before each problem (`common.prompts`)."""
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    own_verifier = verifier is None
    verifier = verifier or MathVerifier()
    records: list[dict] = []
    try:
        first = 0  # problems seen so far: each problem's seed comes from its place among all of them
        for bench, rows in benchmarks.items():
            start = time.perf_counter()
            seeds = prompt_seeds(seed, 0, 0, 0, first + len(rows))[first:]  # unique across benchmarks too
            first += len(rows)
            mine = list(range(rank, len(rows), world))
            prompts = {i: prompt_ids(rows[i]["problem"], template, tokenizer, few_shot, few_shot_pool) for i in mine}
            keep = [i for i in mine if max_prompt_len is None or len(prompts[i]) <= max_prompt_len]
            # Called on every rank even with nothing to sample: a synced engine steps with its peers.
            groups = engine.generate(
                [prompts[i] for i in keep], n, max_tokens, temperature, top_p, seed=[seeds[i] for i in keep]
            )
            by_index = dict(zip(keep, groups))
            bench_records = [
                _record(bench, i, rows[i], prompts[i], by_index.get(i), n, max_prompt_len, tokenizer) for i in mine
            ]
            score_records(bench_records, verifier)
            bench_records = _gather(bench_records, accelerator)
            records += bench_records
            if say is not None:
                say(_bench_line(bench, len(rows), n, bench_records, time.perf_counter() - start))
    finally:
        if own_verifier:
            verifier.close()
    return summarize(records, ks), records


def prompt_ids(problem: str, template: str, tokenizer, few_shot: int, pool: list[dict] | None) -> list[int]:
    """A problem as the policy's prompt: the template, and K worked examples from the pool before it."""
    examples = few_shot_examples(problem, pool, few_shot) if few_shot else []
    text = format_few_shot_prompt(problem, template, examples, tokenizer)
    return tokenizer(text, add_special_tokens=False).input_ids


def _record(bench: str, index: int, row: dict, prompt: list[int], group, n: int, max_prompt_len, tokenizer) -> dict:
    """A problem's record before scoring (`group` None: its prompt was too long, `skipped`, n empty completions)."""
    rec = {"benchmark": bench, "index": index, "problem": row["problem"], "answer": row["answer"]}
    rec["prompt_tokens"] = len(prompt)
    if group is None:
        rec |= {"skipped": f"prompt of {len(prompt)} tokens > max_prompt_len={max_prompt_len}"}
        rec |= {"completions": [""] * n, "num_tokens": [0] * n, "finished": [False] * n}
        rec["mean_logprob"] = [None] * n
        return rec
    rec["completions"] = tokenizer.batch_decode([c.token_ids for c in group], skip_special_tokens=True)
    rec |= {"num_tokens": [len(c.token_ids) for c in group], "finished": [c.finished for c in group]}
    rec["mean_logprob"] = [sum(c.logprobs) / len(c.logprobs) if c.logprobs else None for c in group]
    return rec


def _bench_line(bench: str, problems: int, n: int, records: list[dict], seconds: float) -> str:
    acc = sum(sum(r["correct"]) / n for r in records) / problems
    skipped = sum("skipped" in r for r in records)
    note = f", {skipped} prompts too long" if skipped else ""
    return f"{bench}: {problems} problems x {n} samples, pass@1 {100 * acc:.1f}%{note} ({seconds:.0f}s)"


@dataclass(frozen=True)
class TrainingEval:
    """The evaluation during training (--eval_steps): when it runs, on what, and how it samples."""

    every: int  # --eval_steps (0: never)
    benchmarks: str  # --eval_benchmarks as given, recorded with the results
    sets: dict[str, list[dict]]  # `common.evaluation.load_benchmarks`
    n: int  # samples per problem
    temperature: float
    template: str
    max_tokens: int  # the training completion length
    top_p: float
    seed: int
    max_prompt_len: int
    few_shot: int
    few_shot_pool: list[dict] | None

    def due(self, step: int, total_steps: int) -> bool:
        """Every `every` steps, and after the last."""
        return bool(self.every) and (step % self.every == 0 or step == total_steps)

    def run(self, engine, tokenizer, verifier: MathVerifier, accelerator) -> tuple[dict[str, float], list[dict]]:
        """pass@k of the policy `engine` samples, its problems split over the ranks (summary on every rank)."""
        return evaluate(
            engine, tokenizer, self.sets, self.template, self.n, self.temperature, self.max_tokens, self.top_p,
            seed=self.seed, verifier=verifier, max_prompt_len=self.max_prompt_len, accelerator=accelerator,
            few_shot=self.few_shot, few_shot_pool=self.few_shot_pool,
        )  # fmt: skip


def _gather(records: list[dict], accelerator) -> list[dict]:
    """Every rank's records, in problem order, on every rank."""
    if accelerator is None or accelerator.num_processes == 1:
        return records
    from accelerate.utils import gather_object

    return sorted(gather_object(records), key=lambda r: r["index"])


def score_records(records: list[dict], verifier: MathVerifier) -> None:
    """Fill each record's `predictions` and `correct` in place; an answer the verifier had no time
    for counts as wrong (an evaluation has no group to leave out)."""
    for rec in records:
        preds = [extract_answer(t) for t in rec["completions"]]
        rec["predictions"] = preds
        rec["correct"] = [
            bool(ok) for ok in verifier.verify_batch(preds, [rec["answer"]] * len(preds), budget_s=math.inf)
        ]


def write_results(out_dir: str | os.PathLike, summary: dict, records: list[dict], config: dict | None = None) -> Path:
    """`eval_results.json` ({"summary", "config"}) and `eval_records.jsonl` under out_dir; returns the JSON path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(records, out_dir / RECORDS_FILE)
    path = out_dir / RESULTS_FILE
    tmp = path.with_name(path.name + ".tmp")  # written whole, then renamed: a kill leaves the old file or none
    tmp.write_text(json.dumps({"summary": summary, "config": config or {}}, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path
