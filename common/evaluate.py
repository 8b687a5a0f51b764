"""Evaluation: pass@k on the papers' math benchmarks, from the CLI or from a training loop.

    python -m common.evaluate --model runs/grpo_base --benchmarks math500,aime24 \\
        --n 8 --temperature 0.6 --max_tokens 4096   # newest checkpoint; results next to metrics.jsonl
    python -m common.evaluate --rescore runs/grpo_base/eval_records.jsonl   # re-score, no generation

Each problem is rendered with the training prompt template, sampled `n` times
and checked with the training reward's verifier (`MathVerifier`). Per problem
with c correct of n samples:

    pass@1 = c / n (mean over samples)
    pass@k = 1 - C(n - c, k) / C(n, k)    (Chen et al. 2021, unbiased, k <= n)

A benchmark's score is the mean over its problems. Two averages over
benchmarks are reported: `overall`, weighted by problem count (EDGE-GRPO's
"total correct / total problems"), and `mean`, the plain mean of the
benchmark scores (the "Avg." column of CW-GRPO and Pro-GRPO).

Summary keys are flat and ready to log next to the training metrics:
`eval/<benchmark>/pass@<k>`, `eval/<benchmark>/num_problems`,
`eval/<benchmark>/response_len`, `eval/<benchmark>/truncated_frac`, the same
for `overall`, and `eval/mean/pass@<k>`. Per-problem records keep the
completion texts, so `rescore` can re-check them (e.g. after a verifier fix)
without generating again.

Benchmarks load from the Hugging Face hub by name (`BENCHMARKS`) or from a
local copy: `--benchmarks math500=path/to/file.jsonl` or `--data_dir DIR`
holding `<name>.jsonl`. `--export_data DIR` writes such copies (on a machine
with a network).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from common.cli import arg, parse_args, require
from common.data import (
    SYNTHETIC_EVAL_PATH,
    SYNTHETIC_EVAL_SIZE,
    TEMPLATE_CHOICES,
    format_prompt,
    load_math_dataset,
    write_jsonl,
)
from common.rewards import MathVerifier, extract_answer, extract_boxed

RESULTS_FILE = "eval_results.json"
RECORDS_FILE = "eval_records.jsonl"
AGGREGATES = ("overall", "mean")  # reserved names in the summary keys


# ---------------------------------------------------------------------------
# Benchmarks
# ---------------------------------------------------------------------------


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
_LOCAL_EXTS = (".jsonl", ".json", ".parquet")


def _clean_answer(answer: str) -> str:
    """Integer-valued float answers ("27.0", AMC's floats) -> "27": the exact-match path then hits."""
    m = re.fullmatch(r"(-?\d+)\.0+", answer.strip())
    return m.group(1) if m else answer.strip()


def load_benchmark(
    name: str, source: str | None = None, data_dir: str | None = None, limit: int | None = None
) -> list[dict]:
    """Rows `{"problem", "answer"}` of one benchmark.

    source: a local file/directory or hub name to read instead of the registry's
        hub dataset (required for names not in `BENCHMARKS`).
    data_dir: a directory searched for `<name>.jsonl` (or .json / .parquet) first.
    A local file may be a dump of the hub dataset (its own field names) or rows
    already in our `{"problem", "answer"}` form; both are accepted.
    """
    if not _NAME_RE.fullmatch(name) or name in AGGREGATES:
        raise ValueError(
            f"invalid benchmark name {name!r}: use letters, digits, '_', '-', '.', and not {' or '.join(AGGREGATES)}"
        )
    spec = BENCHMARKS.get(name)
    if source is None and data_dir is not None:
        source = next((str(p) for ext in _LOCAL_EXTS if (p := Path(data_dir) / f"{name}{ext}").exists()), None)
    if source is None and spec is not None:
        source = spec.local
    if spec is None:
        if source is None:
            raise ValueError(
                f"unknown benchmark {name!r} and no file for it; known: {', '.join(BENCHMARKS)}. "
                f"Pass a file as --benchmarks {name}=path/to/{name}.jsonl (fields problem, answer)."
            )
        spec = Benchmark(None, None, "test", "problem", "answer")

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
        except RuntimeError as e:
            raise RuntimeError(
                f"benchmark {name!r}: could not load {spec.hub} from the Hugging Face hub ({e.__cause__ or e}).\n"
                f"Without a network, pass a local copy: --benchmarks {name}=path/to/{name}.jsonl, or "
                f"--data_dir DIR holding {name}.jsonl (`python -m common.evaluate --export_data DIR "
                f"--benchmarks {name}` writes one on a machine that reaches the hub)."
            ) from None
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
    out = []
    for r in rows:
        answer = spec.answer_transform(r["answer"]) if spec.answer_transform else r["answer"]
        out.append({"problem": r["problem"], "answer": _clean_answer(answer)})
    if not out:
        raise ValueError(f"benchmark {name!r}: no problems in {source or spec.hub}")
    return out


def parse_benchmarks(text: str) -> list[tuple[str, str | None]]:
    """ "math500,aime24=data/aime24.jsonl" -> [("math500", None), ("aime24", "data/aime24.jsonl")]."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, source = item.partition("=")
        out.append((name.strip(), source.strip() or None))
    if not out:
        raise ValueError("no benchmark given")
    return out


def load_benchmarks(text: str, data_dir: str | None = None, limit: int | None = None) -> dict[str, list[dict]]:
    """All benchmarks of a `--benchmarks` string, in order: {name: rows}."""
    items = parse_benchmarks(text)
    names = [name for name, _ in items]
    if len(set(names)) < len(names):
        raise ValueError(f"a benchmark is named twice in {text!r}")
    return {name: load_benchmark(name, source, data_dir, limit) for name, source in items}


# ---------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k).

    Product form, 1 - prod_{i=n-c+1}^{n} (1 - k / i): no huge binomials, so
    it stays exact-ish for n in the thousands.
    """
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    return [2**i for i in range(n.bit_length()) if 2**i <= n]


def score_records(records: list[dict], verifier: MathVerifier) -> None:
    """Fill each record's `predictions` and `correct` from its completion texts (in place)."""
    for rec in records:
        preds = [extract_answer(t) for t in rec["completions"]]
        rec["predictions"] = preds
        rec["correct"] = verifier.verify_batch(preds, [rec["answer"]] * len(preds))


def summarize(records: list[dict], ks: list[int] | None = None) -> dict[str, float]:
    """Flat summary (see the module docstring) of scored records; k > a problem's n is skipped."""
    if not records:
        raise ValueError("no records to summarize")
    min_n = min(len(r["correct"]) for r in records)
    if min_n == 0:
        raise ValueError("a record has no completions")
    ks = sorted({k for k in (ks or default_ks(min_n)) if 1 <= k <= min_n} | {1})
    by_bench: dict[str, list[dict]] = {}
    for r in records:
        by_bench.setdefault(r["benchmark"], []).append(r)

    summary: dict[str, float] = {}
    totals = {k: 0.0 for k in ks}
    n_problems, n_completions, n_tokens, n_truncated = 0, 0, 0, 0
    for bench, recs in by_bench.items():
        for k in ks:
            scores = [pass_at_k(len(r["correct"]), sum(r["correct"]), k) for r in recs]
            summary[f"eval/{bench}/pass@{k}"] = sum(scores) / len(scores)
            totals[k] += sum(scores)
        generated = [r for r in recs if "skipped" not in r]  # lengths of what was actually generated
        tokens = sum(sum(r["num_tokens"]) for r in generated)
        completions = sum(len(r["num_tokens"]) for r in generated)
        truncated = sum(sum(not f for f in r["finished"]) for r in generated)
        summary[f"eval/{bench}/num_problems"] = len(recs)
        summary[f"eval/{bench}/response_len"] = tokens / max(completions, 1)
        summary[f"eval/{bench}/truncated_frac"] = truncated / max(completions, 1)
        n_problems += len(recs)
        n_completions, n_tokens, n_truncated = n_completions + completions, n_tokens + tokens, n_truncated + truncated
    for k in ks:
        summary[f"eval/overall/pass@{k}"] = totals[k] / n_problems  # = total correct / total problems
    summary["eval/overall/num_problems"] = n_problems
    summary["eval/overall/response_len"] = n_tokens / max(n_completions, 1)
    summary["eval/overall/truncated_frac"] = n_truncated / max(n_completions, 1)
    for k in ks:
        summary[f"eval/mean/pass@{k}"] = sum(summary[f"eval/{b}/pass@{k}"] for b in by_bench) / len(by_bench)
    return summary


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------


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
    verbose: bool = False,
) -> tuple[dict[str, float], list[dict]]:
    """Sample n completions per problem with `engine` and score them.

    engine: a `common.rollout` engine (the training loop's live one works: the
        HF engine samples from the training model itself, vLLM from its synced copy).
    benchmarks: {name: rows with "problem" and "answer"} (`load_benchmarks`).
    max_prompt_len: prompts longer than this (tokens) are not generated (a vLLM
        engine built for training would reject them) and count as wrong; their
        records say so.
    Returns (flat summary, per-problem records).
    """
    from common.rollout import HFEngine, prompt_seeds

    if isinstance(engine, HFEngine) and temperature <= 0:
        raise ValueError(
            "the HF engine samples (do_sample=True) and needs temperature > 0; "
            "use the vLLM engine for greedy decoding, or a small temperature such as 0.1"
        )
    own_verifier = verifier is None
    verifier = verifier or MathVerifier()
    records: list[dict] = []
    try:
        first = 0  # problems seen so far: each problem's seed comes from its place among all of them
        for bench, rows in benchmarks.items():
            start = time.perf_counter()
            prompts = [
                tokenizer(format_prompt(r["problem"], template, tokenizer), add_special_tokens=False).input_ids
                for r in rows
            ]
            keep = [i for i, p in enumerate(prompts) if max_prompt_len is None or len(p) <= max_prompt_len]
            # One seed per problem (from its index): vLLM's GPU sampler draws from (seed, position),
            # so a seed shared by all prompts would correlate their samples.
            seeds = prompt_seeds(seed, 0, 0, 0, first + len(rows))[first:]  # unique across benchmarks too
            first += len(rows)
            groups = (
                engine.generate(
                    [prompts[i] for i in keep], n, max_tokens, temperature, top_p, seed=[seeds[i] for i in keep]
                )
                if keep
                else []
            )
            by_index = dict(zip(keep, groups))
            for i, r in enumerate(rows):
                group = by_index.get(i)
                rec = {
                    "benchmark": bench,
                    "index": i,
                    "problem": r["problem"],
                    "answer": r["answer"],
                    "prompt_tokens": len(prompts[i]),
                }
                if group is None:
                    rec.update(
                        skipped=f"prompt of {len(prompts[i])} tokens > max_prompt_len={max_prompt_len}",
                        completions=[""] * n,
                        num_tokens=[0] * n,
                        finished=[False] * n,
                    )
                else:
                    rec.update(
                        completions=tokenizer.batch_decode([c.token_ids for c in group], skip_special_tokens=True),
                        num_tokens=[len(c.token_ids) for c in group],
                        finished=[c.finished for c in group],
                    )
                records.append(rec)
            bench_records = records[-len(rows) :]
            score_records(bench_records, verifier)
            if verbose:
                acc = sum(sum(r["correct"]) / n for r in bench_records) / len(rows)
                skipped = f", {len(rows) - len(keep)} prompts too long" if len(keep) < len(rows) else ""
                print(
                    f"{bench}: {len(rows)} problems x {n} samples, pass@1 {100 * acc:.1f}%{skipped} "
                    f"({time.perf_counter() - start:.0f}s)",
                    flush=True,
                )
    finally:
        if own_verifier:
            verifier.close()
    return summarize(records, ks), records


# ---------------------------------------------------------------------------
# Results on disk
# ---------------------------------------------------------------------------


def write_results(out_dir: str | os.PathLike, summary: dict, records: list[dict], config: dict | None = None) -> Path:
    """`eval_results.json` ({"summary", "config"}) and `eval_records.jsonl` under out_dir; returns the JSON path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(records, out_dir / RECORDS_FILE)
    path = out_dir / RESULTS_FILE
    path.write_text(json.dumps({"summary": summary, "config": config or {}}, indent=2, default=str) + "\n")
    return path


def read_records(path: str | os.PathLike) -> list[dict]:
    """Records written by `write_results`, checked for the fields re-scoring needs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"records file not found: {path}")
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from None
            missing = [
                k
                for k in ("benchmark", "answer", "completions", "num_tokens", "finished")
                if not isinstance(rec, dict) or k not in rec
            ]
            if missing:
                raise ValueError(f"{path}:{lineno}: not an evaluation record (missing {', '.join(missing)})")
            records.append(rec)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def rescore(
    records_path: str | os.PathLike, verifier: MathVerifier | None = None, ks: list[int] | None = None
) -> tuple[dict[str, float], list[dict]]:
    """Re-check saved completions against their gold answers (no generation): (summary, records)."""
    records = read_records(records_path)
    own_verifier = verifier is None
    verifier = verifier or MathVerifier()
    try:
        score_records(records, verifier)
    finally:
        if own_verifier:
            verifier.close()
    return summarize(records, ks), records


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def format_table(summary: dict) -> str:
    """Markdown table: one row per benchmark (+ overall, mean), pass@k in %, lengths in tokens."""
    rows: dict[str, dict[str, float]] = {}
    for key, value in summary.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "eval":
            rows.setdefault(parts[1], {})[parts[2]] = value
    ks = sorted({int(m[5:]) for r in rows.values() for m in r if m.startswith("pass@")})
    header = ["benchmark", "problems", *[f"pass@{k} (%)" for k in ks], "response len", "truncated (%)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    order = [b for b in rows if b not in AGGREGATES] + [b for b in AGGREGATES if b in rows]
    for bench in order:
        r = rows[bench]
        label = {"overall": "overall (per problem)", "mean": "mean (per benchmark)"}.get(bench, bench)
        cells = [
            label,
            str(int(r["num_problems"])) if "num_problems" in r else "",
            *[_pct(r[f"pass@{k}"]) if f"pass@{k}" in r else "" for k in ks],
            f"{r['response_len']:.0f}" if "response_len" in r else "",
            _pct(r["truncated_frac"]) if "truncated_frac" in r else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


@dataclass
class Args:
    model: str = arg(
        "tiny",
        "model directory, checkpoint-N directory, training run directory (its newest "
        "checkpoint), or HF hub name; 'tiny' = the CPU demo model",
    )
    benchmarks: str = arg("synthetic", f"comma-separated names ({', '.join(BENCHMARKS)}), each optionally =FILE")
    data_dir: str | None = arg(None, "directory holding <benchmark>.jsonl local copies (looked up before the hub)")
    limit: int | None = arg(None, "evaluate only the first N problems of each benchmark (smoke tests)")
    n: int = arg(8, "samples per problem")
    k: str | None = arg(None, "comma-separated k for pass@k (default: 1, 2, 4, ... up to n)")
    temperature: float = arg(0.6, "sampling temperature (0: greedy, vLLM only)")
    top_p: float = arg(1.0, "nucleus sampling")
    max_tokens: int = arg(4096, "max new tokens per completion")
    template: str = arg("qwen_math", "prompt template (use the one the model was trained with)", TEMPLATE_CHOICES)
    rollout: str = arg("vllm" if importlib.util.find_spec("vllm") else "hf", "generation backend", ["vllm", "hf"])
    dtype: str = arg(
        "auto",
        "model dtype: auto = bfloat16 on GPU, float32 on CPU (both backends)",
        ["auto", "bfloat16", "float16", "float32"],
    )
    seed: int = arg(0, "sampling seed")
    output_dir: str | None = arg(
        None,
        "where eval_results.json / eval_records.jsonl go (default: the training "
        "run directory when --model is one of its checkpoints, else runs/eval/<model>)",
    )
    rescore: str | None = arg(None, "re-score this eval_records.jsonl instead of generating")
    export_data: str | None = arg(None, "write each benchmark as DIR/<name>.jsonl and exit (for offline use)")
    batch_size: int = arg(64, "sequences per generate call (HF backend)")
    gpu_memory_utilization: float = arg(0.9, "share of GPU memory vLLM may take")


def resolve_model(model: str) -> tuple[str, Path]:
    """(model path to load, default output directory) for --model (`common.checkpoint.model_to_load`).

    A model from a training run (the run directory, or one of its checkpoints) has its results
    written to the run directory, next to metrics.jsonl, where `common.plot` looks; anything
    else (a model directory, a hub name) to runs/eval/<name>.
    """
    from common.checkpoint import model_to_load

    path, run = model_to_load(model)
    if run is not None:
        return path, run
    if model == "tiny":
        return path, Path("runs/eval/tiny")
    if Path(path).exists():
        return path, Path("runs") / "eval" / Path(path).resolve().name
    return path, Path("runs") / "eval" / model.replace("/", "__")  # a hub name


def _make_engine(args: Args, model_path: str, tokenizer, max_prompt_tokens: int):
    import torch
    from transformers import AutoModelForCausalLM

    from common.rollout import HFEngine, VLLMEngine, context_length, stop_token_ids

    stop_ids = stop_token_ids(tokenizer, model_path)
    if args.rollout == "vllm":
        max_model_len = max_prompt_tokens + args.max_tokens
        limit = context_length(model_path)
        if limit and max_model_len > limit:
            print(
                f"note: prompt + --max_tokens ({max_model_len}) exceeds the model's context ({limit}); "
                f"completions stop at {limit} tokens in all"
            )
            max_model_len = limit
        return VLLMEngine(
            model_path,
            stop_ids,
            max_model_len=max_model_len,
            seed=args.seed,
            dtype={"auto": "bfloat16" if torch.cuda.is_available() else "float32"}.get(args.dtype, args.dtype),
            gpu_memory_utilization=args.gpu_memory_utilization,
        ), max_model_len
    cuda = torch.cuda.is_available()
    dtype = {
        "auto": torch.bfloat16 if cuda else torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "float32": torch.float32,
    }[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to("cuda" if cuda else "cpu").eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    return HFEngine(model, stop_ids, pad, batch_size=args.batch_size), None


def validate(args: Args) -> list[int] | None:
    """One line per bad flag, before any model loads; returns the parsed --k."""
    require(args.n >= 1, f"--n must be >= 1 (got {args.n}): samples per problem")
    require(args.max_tokens >= 1, f"--max_tokens must be >= 1 (got {args.max_tokens})")
    require(args.temperature >= 0 and 0 < args.top_p <= 1, "--temperature must be >= 0 and --top_p in (0, 1]")
    require(args.limit is None or args.limit >= 1, f"--limit must be >= 1 (got {args.limit})")
    if not args.k:
        return None
    try:
        ks = [int(k) for k in args.k.split(",")]
    except ValueError:
        raise SystemExit(f"error: --k must be comma-separated whole numbers such as 1,4,8 (got {args.k!r})") from None
    require(all(k >= 1 for k in ks), f"--k values must be >= 1 (got {args.k})")
    return ks


def main(args: Args) -> None:
    ks = validate(args)
    if ks and max(ks) > args.n and not args.rescore:
        print(f"note: pass@k needs k <= n; k > --n {args.n} is skipped")

    if args.rescore:
        try:
            summary, records = rescore(args.rescore, ks=ks)
        except (ValueError, FileNotFoundError) as e:  # a bad file: a message, not a traceback
            raise SystemExit(f"error: {e}") from None
        out_dir = Path(args.output_dir) if args.output_dir else Path(args.rescore).parent
        previous = out_dir / RESULTS_FILE
        config = json.loads(previous.read_text()).get("config", {}) if previous.is_file() else {}
        path = write_results(out_dir, summary, records, config | {"rescored_from": str(args.rescore)})
        print(format_table(summary))
        print(f"wrote {path}")
        return

    try:
        benchmarks = load_benchmarks(args.benchmarks, args.data_dir, args.limit)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    if args.export_data:
        for name, rows in benchmarks.items():
            print(f"{name}: {write_jsonl(rows, Path(args.export_data) / f'{name}.jsonl')} problems")
        return

    from transformers import AutoTokenizer

    model_path, default_out = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    longest = max(
        len(tokenizer(format_prompt(r["problem"], args.template, tokenizer), add_special_tokens=False).input_ids)
        for rows in benchmarks.values()
        for r in rows
    )
    engine, max_model_len = _make_engine(args, model_path, tokenizer, longest)
    start = time.perf_counter()
    summary, records = evaluate(
        engine,
        tokenizer,
        benchmarks,
        args.template,
        args.n,
        args.temperature,
        args.max_tokens,
        args.top_p,
        args.seed,
        ks=ks,
        verbose=True,
    )
    out_dir = Path(args.output_dir) if args.output_dir else default_out
    config = asdict(args) | {
        "model_path": model_path,
        "max_model_len": max_model_len,
        "eval_s": round(time.perf_counter() - start, 1),
    }
    path = write_results(out_dir, summary, records, config)
    print(format_table(summary))
    print(f"wrote {path} and {out_dir / RECORDS_FILE}")


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__))
