"""Evaluation: pass@k of a policy on benchmarks, from the training loop or `tools/evaluate.py`. Each problem is
rendered with the training template, sampled `n` times and checked with the training verifier; with c correct:

    pass@1 = c / n (mean over samples)
    pass@k = 1 - C(n - c, k) / C(n, k)    (Chen et al. 2021, unbiased, k <= n)

Summary keys: `eval/<benchmark>/pass@<k>` (and num_problems, response_len, truncated_frac), the same for `overall`
(weighted by problems: EDGE-GRPO's), and `eval/mean/pass@<k>` (the mean of benchmarks: CW-GRPO's, Pro-GRPO's).
Records keep the completion texts (`rescore`) and each one's `mean_logprob` (minus EGPO's eq. 5 at T = 1).
"""

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from common.answers import extract_answer
from common.cli import not_utf8
from common.completion import prompt_seeds
from common.eval_sets import AGGREGATES
from common.prompts import few_shot_examples, format_few_shot_prompt
from common.run_dir import read_jsonl, write_jsonl
from common.verifier import MathVerifier

RESULTS_FILE = "eval_results.json"
RECORDS_FILE = "eval_records.jsonl"


# vLLM 0.32's SamplingParams raises a temperature in (0, 0.01) to 0.01 (in its log only) and refuses one above 2.
VLLM_LOWEST, VLLM_HIGHEST = 0.01, 2.0


def sampling_problem(rollout: str, temperature: float, n: int, flags: dict[str, str]) -> str | None:
    """Why the `rollout` engine would refuse, or silently change, sampling `n` completions at `temperature`, as a
    line naming the caller's `flags`; None when it samples as asked. Temperature 0 is one completion a prompt:
    n repeats of it would give a pass@k that is pass@1."""
    t, samples, engine = flags["temperature"], flags["n"], flags["rollout"]
    if not math.isfinite(temperature):
        return f"{t} {temperature:g}: a temperature is a finite number (0 for greedy decoding)"
    if temperature == 0 and n > 1:
        lowest = f"of at least {VLLM_LOWEST:g}" if rollout == "vllm" else "above 0"
        return (
            f"{t} 0 is greedy decoding, one completion a prompt: use {samples} 1 (not {n}), or a temperature "
            f"{lowest} to sample {n}"
        )
    if rollout != "vllm":
        return None
    if 0 < temperature < VLLM_LOWEST:
        return (
            f"{t} {temperature:g}: vLLM samples at {VLLM_LOWEST:g} at the lowest (it would raise it, saying so only in "
            f"its log); use {VLLM_LOWEST:g} or more" + (", or 0 for greedy decoding" if n == 1 else "")
        )
    if temperature > VLLM_HIGHEST:
        return f"{t} {temperature:g}: vLLM samples at temperatures up to {VLLM_HIGHEST:g}; use {engine} hf above it"
    return None


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
    sets: dict[str, list[dict]]  # `common.eval_sets.load_benchmarks`
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


def read_records(path: str | os.PathLike) -> list[dict]:
    """Records written by `write_results`, checked for the fields re-scoring needs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"records file not found: {path}")
    try:
        records = read_jsonl(path)
    except UnicodeDecodeError:
        raise ValueError(not_utf8(path)) from None
    needed = ("benchmark", "answer", "completions", "num_tokens", "finished")
    for lineno, rec in enumerate(records, 1):
        missing = [k for k in needed if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise ValueError(f"{path}: record {lineno}: not an evaluation record (missing {', '.join(missing)})")
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
