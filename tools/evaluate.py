"""Evaluate a model: pass@k on the papers' math benchmarks (common/evaluation.py says how it is scored).

    python -m tools.evaluate --model runs/grpo_base                    # the CPU demo's run, offline
    python -m tools.evaluate --model runs/grpo_base --benchmarks math500,aime24 --n 8 --max_tokens 4096
    python -m tools.evaluate --rescore runs/grpo_base/eval_records.jsonl   # re-score, no generation

--model takes a training run (its exported model/, else its newest good checkpoint), a
checkpoint-N, a model directory or a hub name; results of a training run's model go next to
its metrics.jsonl, where tools/plot.py finds them, a checkpoint's in the run's eval-checkpoint-N/,
an evaluation with other settings (--benchmarks, --limit, --n, --temperature, ...) in a folder named by
them, eval-limit10-n2/; a folder holding an evaluation made with other settings is refused.
A run's (or checkpoint's) evaluation follows the run: its --template, --few_shot and --stop come
from its run_config.json unless given here, and the tool says which it used.
Benchmarks load by name from the hub or from local copies (--data_dir, or name=FILE);
--export_data DIR writes such copies on a machine with a network. Each paper's benchmark set
and decoding: docs/EVALUATION.md.
"""

import dataclasses
import hashlib
import re
from dataclasses import asdict, dataclass

from common.cli import arg, not_utf8, parse_args, require
from common.prompts import TEMPLATE_CHOICES, check_template, parse_stop
from common.run_flags import vllm_available

BENCHMARK_NAMES = "math500, aime24, aime25, amc23, amc, minerva, olympiadbench, gsm8k, synthetic"


@dataclass
class Args:
    # What to evaluate.
    model: str = arg(
        "tiny",
        "a training run, a checkpoint-N, a model directory or a hub name; 'tiny': the CPU demo model, 'smollm2': SmolLM2-135M-Instruct",
    )
    benchmarks: str = arg(
        "synthetic",
        f"comma-separated names ({BENCHMARK_NAMES}), each optionally =FILE or =DIR holding NAME.jsonl, "
        "FILE:problem=FIELD:answer=FIELD for a file in other fields",
    )
    data_dir: str | None = arg(None, "directory holding <benchmark>.jsonl local copies (looked up before the hub)")
    limit: int | None = arg(None, "evaluate only the first N problems of each benchmark (smoke tests)", at_least=1)
    problem_field: str | None = arg(None, "column holding the problem (default: known per benchmark, else 'problem')")
    answer_field: str | None = arg(None, "column holding the gold answer (default: known per benchmark, else 'answer')")
    template: str = arg(
        "qwen_math",
        "prompt template (a training run's: its own, unless given); *_native: the model's chat template",
        TEMPLATE_CHOICES,
    )
    few_shot: int = arg(
        0, "K worked examples before each problem (a training run's: its own, unless given)", at_least=0
    )
    stop: str | None = arg(
        None,
        "stop strings, comma-separated or repeated, \\n a new line (a training run's: its own, unless given); "
        "the few-shot format without chat markup adds its own ('\\nQuestion:' under plain)",
        repeatable=True,
    )
    few_shot_dataset: str | None = arg(
        None, "dataset with solutions the worked examples come from (default: a training run's --dataset and --seed)"
    )
    # Sampling.
    n: int = arg(8, "samples per problem", at_least=1)
    k: str | None = arg(None, "comma-separated k for pass@k (default: 1, 2, 4, ... up to n)")
    temperature: float = arg(
        0.6, "sampling temperature; 0: greedy decoding (with --n 1); vLLM takes 0.01 to 2", at_least=0
    )
    top_p: float = arg(1.0, "nucleus sampling", above=0, at_most=1)
    max_tokens: int = arg(4096, "max new tokens per completion", at_least=1)
    seed: int = arg(0, "sampling seed (each problem's own comes from it and the problem's place)", at_least=0)
    # Output and other modes.
    output_dir: str | None = arg(
        None,
        "where eval_results.json / eval_records.jsonl go (default: the run directory for a training run's model, else "
        "runs/eval/<model>; other settings than the defaults: a folder there named by them)",
    )
    rescore: str | None = arg(None, "re-score this eval_records.jsonl instead of generating")
    export_data: str | None = arg(None, "write each benchmark as DIR/<name>.jsonl and exit (for offline use)")
    # Systems.
    rollout: str = arg("vllm" if vllm_available() else "hf", "generation backend", ["vllm", "hf"])
    dtype: str = arg(
        "auto", "model dtype: auto = bfloat16 on GPU, float32 on CPU", ["auto", "bfloat16", "float16", "float32"]
    )
    batch_size: int = arg(64, "sequences per generate call (HF backend)", at_least=1)
    gpu_memory_utilization: float = arg(0.9, "share of GPU memory vLLM may take", above=0, at_most=1)


def validate(args: Args) -> list[int] | None:
    """The parsed --k (None: the default 1, 2, 4, ...), or one line naming the bad flag: among them, sampling
    the engine would refuse or change (`common.run_flags.sampling_problem`), before anything loads."""
    from common.run_flags import sampling_problem

    for flag, check in (("--template", check_template), ("--stop", parse_stop)):
        try:
            check(getattr(args, flag[2:]))
        except ValueError as e:
            raise SystemExit(f"error: {flag}: {e}") from None
    if not (args.rescore or args.export_data):  # they sample nothing
        names = {"temperature": "--temperature", "n": "--n", "rollout": "--rollout"}
        problem = sampling_problem(args.rollout, args.temperature, args.n, names)
        require(problem is None, str(problem))
    if not args.k:
        return None
    try:
        ks = [int(k) for k in args.k.split(",")]
    except ValueError:
        raise SystemExit(f"error: --k must be comma-separated whole numbers such as 1,4,8 (got {args.k!r})") from None
    require(all(k >= 1 for k in ks), f"--k values must be >= 1 (got {args.k})")
    if max(ks) > args.n and not args.rescore:
        print(f"note: pass@k needs k <= n; k > --n {args.n} is skipped")
    return ks


if __name__ == "__main__":  # --help and a bad flag's one-line error, before torch and the libraries load
    GIVEN: set[str] = set()
    ARGS = parse_args(Args, description=__doc__, given=GIVEN)
    KS = validate(ARGS)

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

# A training run's settings that change an evaluation's prompts: flag here -> the run's flag.
FROM_RUN = {"template": "template", "few_shot": "few_shot", "stop": "stop"}
# Flags named as a training run's that are the evaluation's own choice, not the run's, and why.
EVALUATION_OWN = {
    "model": "what is evaluated",
    "problem_field": "the benchmark's columns, not the training data's",
    "answer_field": "the benchmark's columns, not the training data's",
    "temperature": "the evaluation's sampling (each paper's: docs/EVALUATION.md), not the rollout's",
    "top_p": "the evaluation's sampling (each paper's: docs/EVALUATION.md), not the rollout's",
    "seed": "the evaluation's sampling seed (the run's --seed draws --few_shot's examples)",
    "output_dir": "where the results go",
    "rollout": "the engine: it samples the same model either way",
}
# Settings that make an evaluation a partial or differently sampled one: a quick check, never the run's own.
CHECK_SETTINGS = ("limit", "n", "max_tokens", "temperature", "top_p", "seed", "k")
# Every setting that sets an evaluation apart (not the engine or dtype): two that differ never share a folder.
SETTINGS = (*CHECK_SETTINGS, "benchmarks", "data_dir", "problem_field", "answer_field", "few_shot_dataset", *FROM_RUN)


def run_flags(run: Path | None) -> dict:
    """The flags a training run recorded (run_config.json), or {} (not a run, or a run without one)."""
    path = run / "run_config.json" if run else None
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())["flags"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f"error: --model: {path} is unreadable ({e}); pass --template and --few_shot yourself"
        ) from None


def follow_run(args: Args, flags: dict, given: set[str]) -> tuple[Args, dict, list[str]]:
    """`args` with the run's own settings (FROM_RUN) where this command did not give them; the settings given
    here over other values of the run's; and the lines that say which were used."""
    followed = {ours: flags[theirs] for ours, theirs in FROM_RUN.items() if theirs in flags and ours not in given}
    overridden = {
        ours: (flags[theirs], getattr(args, ours))
        for ours, theirs in FROM_RUN.items()
        if theirs in flags and ours in given and flags[theirs] != getattr(args, ours)
    }
    lines = []
    if shown := " ".join(
        f"--{k} {v!r}" if isinstance(v, str) else f"--{k} {v}" for k, v in followed.items() if v is not None
    ):
        lines.append(f"settings from the run's run_config.json: {shown}")
    lines += [f"--{k} {new!r} given here, over the run's {old!r}" for k, (old, new) in overridden.items()]
    if "dapo" in str(flags.get("rewards", "")).split(","):
        lines.append(
            "note: the run trained on DAPO's 'Answer:' reward; this evaluation reads the last \\boxed{} "
            "(docs/EVALUATION.md#each-papers-evaluation)"
        )
    return dataclasses.replace(args, **followed), overridden, lines


def check_tag(args: Args, overridden: dict, base: dict | None = None) -> str:
    """A folder name of the SETTINGS that differ from `base` (Args' defaults with the run's FROM_RUN values; None:
    those count only where `overridden`), "" when none: "limit10-n2", "template-r1", with a hash where a value is
    not a plain name, so that two evaluations never share a folder (tests/test_eval_folders.py)."""
    defaults = {f.name: f.default for f in dataclasses.fields(Args)} | (base or {})
    differ = {k: getattr(args, k) for k in SETTINGS if getattr(args, k) != defaults[k]}
    if base is None:  # the run's own values count only where given here over them
        differ = {k: v for k, v in differ.items() if k not in FROM_RUN} | {k: v for k, (_, v) in overridden.items()}
    parts, exact = [], True
    for key, value in differ.items():
        text, whole = _named(key, value)
        exact &= whole
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and key in CHECK_SETTINGS
        parts.append(key if text is None else f"{key}{text}" if number or key == "k" else f"{key}-{text}")
    tag = "-".join(parts)
    if not exact or len(tag) > 60:
        digest = hashlib.sha256(json.dumps(differ, sort_keys=True, default=str).encode()).hexdigest()[:8]
        tag = f"{tag[:60].rstrip('-_')}-{digest}"
    return tag


def _named(key: str, value) -> tuple[str | None, bool]:
    """(`value` as a folder name may say it, whether that says all of it): "1_4" for --k 1,4, "math500+aime24" for
    benchmark names, "mine" (not all) for a benchmark read from a file; (None, False) for a path or a stop string."""
    plain = re.compile(r"[A-Za-z0-9_.+]+")
    if key == "benchmarks":
        from common.evaluation import parse_benchmarks

        try:
            items = parse_benchmarks(value)
        except ValueError:
            items = [(value, value)]
        names = "+".join(name for name, _ in items)
        return (names, all(src is None for _, src in items)) if plain.fullmatch(names) else (None, False)
    if key == "k":
        return (value.replace(",", "_"), True) if re.fullmatch(r"[0-9,]+", value) else (None, False)
    text = str(value)
    return (text, True) if plain.fullmatch(text) else (None, False)


def settings_of(args: Args) -> dict:
    """The settings that set this evaluation apart (SETTINGS), as its eval_results.json records them."""
    return json.loads(json.dumps({k: getattr(args, k) for k in SETTINGS}))


def check_folder(out: Path, settings: dict) -> None:
    """Refuse, before anything loads, to write over an evaluation in `out` made with other settings; the same
    settings, or a run's own evaluation (no settings recorded), evaluate again in place."""
    from common.evaluation import RESULTS_FILE

    path = out / RESULTS_FILE
    try:
        config = json.loads(path.read_text()).get("config", {}) if path.is_file() else {}
    except (OSError, ValueError, AttributeError):
        config = {}
    theirs = config.get("settings") or ({k: config.get(k) for k in SETTINGS} if "n" in config else None)
    if not theirs:
        return
    differ = [f"--{k} {theirs.get(k)!r} there, {settings[k]!r} here" for k in SETTINGS if theirs.get(k) != settings[k]]
    require(
        not differ,
        f"--output_dir: {out} holds an evaluation made with other settings ({'; '.join(differ)}); --output_dir sets "
        f"the folder: name another, or delete {path} to replace it",
    )


def checkpoint_of(model_path: str, run: Path | None) -> str | None:
    """ "checkpoint-N" when the model evaluated is one of a training run's checkpoints, else None."""
    parent = Path(model_path).parent
    return parent.name if run is not None and parent.name.startswith("checkpoint-") else None


def output_dir(args: Args, model_path: str, run: Path | None, tag: str = "") -> Path:
    """--output_dir, else the run's directory (a checkpoint's: eval-checkpoint-N/), else runs/eval/<model>; a quick
    check (`tag`) in eval-<tag>/ there, never over the evaluation `tools.plot --table` reads."""
    if args.output_dir:
        return Path(args.output_dir)
    if run is not None:
        name = "-".join(filter(None, ["eval", checkpoint_of(model_path, run), tag]))
        return run / name if name != "eval" else run
    base = (
        Path("runs")
        / "eval"
        / (Path(model_path).resolve().name if Path(model_path).exists() else args.model.replace("/", "__"))
    )
    return base / f"eval-{tag}" if tag else base


def few_shot_pool_for(args: Args, run: Path | None) -> list[dict] | None:
    """The rows --few_shot draws from, as training drew them (`common.prompts.few_shot_pool`): --few_shot_dataset,
    else the run's --dataset in its columns with its --seed, else synthetic-arith."""
    if not args.few_shot:
        return None
    from common.cli import clear_errors
    from common.math_data import iter_math_dataset
    from common.prompts import few_shot_pool

    flags = run_flags(run) if not args.few_shot_dataset else {}
    source = args.few_shot_dataset or flags.get("dataset", "synthetic-arith")
    columns = {k: flags.get(k) for k in ("problem_field", "answer_field", "solution_field")}  # the run's, as trained
    hint = (
        "Its fields are the training run's (problem_field, answer_field, solution_field in its run_config.json), "
        "else problem, answer and solution: pass a --few_shot_dataset in them."
    )
    with clear_errors("--few_shot_dataset"):
        rows = list(iter_math_dataset(source, **columns, strict=True, hint=hint))
    usable = [r for r in rows if r["problem"].strip() and r["answer"] is not None and not r.get("lacks")]
    with clear_errors("--few_shot"):  # rows training refuses or drops are left out, as training did
        return few_shot_pool(
            usable, args.few_shot, flags.get("seed", 0), fix="pass a --few_shot_dataset whose rows have solutions"
        )


def rescore(path: str | os.PathLike, ks: list[int] | None = None) -> tuple[dict[str, float], list[dict]]:
    """Re-check the completions an evaluation saved (`eval_records.jsonl`) against their gold answers, generating
    nothing: (summary, records)."""
    from common.evaluation import score_records, summarize
    from common.run_dir import read_jsonl
    from common.verifier import MathVerifier

    if not Path(path).is_file():
        raise FileNotFoundError(f"records file not found: {path}")
    try:
        records = read_jsonl(path)
    except UnicodeDecodeError:
        raise ValueError(not_utf8(path)) from None
    needed = ("benchmark", "answer", "completions", "num_tokens", "finished")
    for lineno, rec in enumerate(records, 1):
        if missing := [k for k in needed if not isinstance(rec, dict) or k not in rec]:
            raise ValueError(f"{path}: record {lineno}: not an evaluation record (missing {', '.join(missing)})")
    if not records:
        raise ValueError(f"{path}: no records")
    with MathVerifier() as verifier:
        score_records(records, verifier)
    return summarize(records, ks), records


def rescore_main(args: Args, ks: list[int] | None) -> None:
    from common.evaluation import RESULTS_FILE, write_results

    try:
        summary, records = rescore(args.rescore, ks=ks)
    except (ValueError, FileNotFoundError) as e:  # a bad file: a message, not a traceback
        raise SystemExit(f"error: --rescore: {e}") from None
    here = Path(args.rescore).parent
    out = Path(args.output_dir) if args.output_dir else here
    made = here / RESULTS_FILE  # the settings that made the records, whichever folder the new summary goes to
    config = json.loads(made.read_text()).get("config", {}) if made.is_file() else {}
    config |= {"rescored_from": str(args.rescore), "k": args.k}
    if isinstance(config.get("settings"), dict):
        config["settings"] = config["settings"] | {"k": args.k}
        if out.resolve() != here.resolve():  # the same records re-scored in place keep their folder
            check_folder(out, config["settings"])
    path = write_results(out, summary, records, config)
    print(format_table(summary))
    print(f"wrote {path}")


def check_prompts(args: Args, benchmarks: dict, tokenizer, pool: list[dict] | None, model_path: str) -> int:
    """Refuse or warn when the prompts ask for another answer format than the \\boxed{} read
    (`common.prompts.format_mismatch`); the engine's context: longest prompt + --max_tokens, capped at the model's."""
    from common.cli import clear_errors
    from common.models import context_length
    from common.prompts import few_shot_examples, format_few_shot_prompt, format_mismatch

    shots = lambda problem: few_shot_examples(problem, pool, args.few_shot) if args.few_shot else []
    render = lambda problem: format_few_shot_prompt(problem, args.template, shots(problem), tokenizer)
    with clear_errors("--template"):
        prompt = render(next(iter(benchmarks.values()))[0]["problem"])
    if found := format_mismatch(["accuracy"], prompt, args.template, who="this evaluation"):  # it reads \boxed{}
        require(found[0] != "error", found[1])
        print(found[1])
    prompts = [render(r["problem"]) for rows in benchmarks.values() for r in rows]
    max_model_len = max(len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts) + args.max_tokens
    if (limit := context_length(model_path)) and max_model_len > limit:
        print(
            f"note: prompt + --max_tokens ({max_model_len}) exceeds the model's context ({limit}); completions stop there"
        )
        max_model_len = limit
    return max_model_len


def folder_for(args: Args, overridden: dict, model_path: str, run: Path | None) -> tuple[Path, str]:
    """(where the results go, its `check_tag`), checked by `check_folder` before anything loads."""
    recorded = run_flags(run)
    base = {ours: recorded[theirs] for ours, theirs in FROM_RUN.items() if theirs in recorded}
    tag = check_tag(args, overridden, {f.name: f.default for f in dataclasses.fields(Args)} | base)
    out = output_dir(args, model_path, run, tag)
    check_folder(out, settings_of(args))
    return out, tag


def write_evaluation(args: Args, out: Path, tag: str, model_path: str, run: Path | None, summary: dict,
                     records: list[dict], stops: list[str], seconds: float) -> None:  # fmt: skip
    """The results in `out` (`folder_for`), with the settings that made them; the table, and where they went."""
    from common.evaluation import write_results

    config = asdict(args) | {"model_path": model_path, "eval_s": round(seconds, 1)}
    config |= {"stop_strings": stops, "quick_check": tag or None, "settings": settings_of(args)}
    config |= {"checkpoint": checkpoint} if (checkpoint := checkpoint_of(model_path, run)) else {}
    path = write_results(out, summary, records, config)
    print(format_table(summary))
    print(f"wrote {path} and {out / 'eval_records.jsonl'}")
    if tag and not args.output_dir:
        where = "the run's own evaluation" if run is not None else "a full evaluation's"
        print(f"a quick check ({tag}): its results are in {out}, not over {where}")


def main(args: Args, ks: list[int] | None, given: set[str] | None = None, engines: dict | None = None) -> None:
    """`given`: the flags set explicitly (None: those off their defaults). `engines`: earlier calls' engines, reused
    where made alike (scripts/comparison/evaluate_settings.py)."""
    if given is None:
        given = {f.name for f in dataclasses.fields(Args) if getattr(args, f.name) != f.default}
    if args.rescore:
        return rescore_main(args, ks)
    from common.cli import clear_errors
    from common.evaluation import load_benchmarks
    from common.models import offline_unless_hub_reachable
    from common.run_dir import write_jsonl

    offline_unless_hub_reachable()  # no minute of retries before a one-line error
    with clear_errors("--benchmarks"):
        benchmarks = load_benchmarks(
            args.benchmarks,
            args.data_dir,
            args.limit,
            args.problem_field,
            args.answer_field,
            data_dir_flag="--data_dir",
        )
    if args.export_data:
        for name, rows in benchmarks.items():
            print(f"{name}: {write_jsonl(rows, Path(args.export_data) / f'{name}.jsonl')} problems")
        return

    from common.evaluation import evaluate
    from common.metrics import quiet_libraries
    from common.models import hub_error, load_tokenizer, model_to_load
    from common.prompts import stop_strings
    from common.rollout import make_engine

    quiet_libraries()
    model_path, run = model_to_load(args.model)
    print(f"evaluating {model_path}")  # which checkpoint of a run, for the record
    args, overridden, lines = follow_run(args, run_flags(run), given)
    for line in lines:
        print(line)
    out, tag = folder_for(args, overridden, model_path, run)
    with clear_errors("--template"):  # a run's own template file may have moved since
        check_template(args.template)
    with clear_errors("--stop"):
        stops, stop_line = stop_strings(args.stop, args.template, args.few_shot)
    if stop_line:
        print(stop_line)
    with clear_errors("--model"):
        try:
            tokenizer = load_tokenizer(model_path)
        except OSError:
            if os.environ.get("HF_HUB_OFFLINE") == "1" and not Path(model_path).exists():
                raise hub_error("--model", model_path) from None
            raise
    pool = few_shot_pool_for(args, run)
    max_model_len = check_prompts(args, benchmarks, tokenizer, pool, model_path)
    made_with = dict(
        seed=args.seed, max_model_len=max_model_len, dtype=args.dtype, stop=tuple(stops),
        gpu_memory_utilization=args.gpu_memory_utilization, batch_size=args.batch_size,
    )  # fmt: skip
    engines = {} if engines is None else engines
    key = json.dumps([args.rollout, model_path, made_with], default=str)
    if key not in engines:
        engines[key] = make_engine(args.rollout, model_path, tokenizer, **made_with)
    engine = engines[key]
    start = time.perf_counter()
    summary, records = evaluate(
        engine, tokenizer, benchmarks, args.template, args.n, args.temperature, args.max_tokens, args.top_p,
        args.seed, ks=ks, say=print, few_shot=args.few_shot, few_shot_pool=pool,
    )  # fmt: skip
    write_evaluation(args, out, tag, model_path, run, summary, records, stops, time.perf_counter() - start)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def format_table(summary: dict) -> str:
    """Markdown table: one row per benchmark (+ overall, mean), pass@k in %, lengths in tokens."""
    from common.evaluation import AGGREGATES

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


if __name__ == "__main__":
    main(ARGS, KS, GIVEN)
