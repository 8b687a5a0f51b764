"""Evaluate a model: pass@k on the papers' math benchmarks (common/evaluation.py says how it is scored).

    python -m tools.evaluate --model runs/grpo_base                    # the CPU demo's run, offline
    python -m tools.evaluate --model runs/grpo_base --benchmarks math500,aime24 --n 8 --max_tokens 4096
    python -m tools.evaluate --rescore runs/grpo_base/eval_records.jsonl   # re-score, no generation

--model takes a training run (its exported model/, else its newest good checkpoint), a
checkpoint-N, a model directory or a hub name; results of a training run's model go next to
its metrics.jsonl, where tools/plot.py finds them, a checkpoint's in the run's eval-checkpoint-N/.
Benchmarks load by name from the hub or from local copies (--data_dir, or name=FILE);
--export_data DIR writes such copies on a machine with a network. Each paper's benchmark set
and decoding: docs/EVALUATION.md.
"""

from dataclasses import asdict, dataclass

from common.cli import arg, parse_args, require
from common.prompts import TEMPLATE_CHOICES
from common.run_flags import vllm_available

BENCHMARK_NAMES = "math500, aime24, aime25, amc23, amc, minerva, olympiadbench, gsm8k, synthetic"


@dataclass
class Args:
    # What to evaluate.
    model: str = arg(
        "tiny",
        "a training run, a checkpoint-N, a model directory or a hub name; 'tiny': the CPU demo model, 'smollm2': SmolLM2-135M-Instruct",
    )
    benchmarks: str = arg("synthetic", f"comma-separated names ({BENCHMARK_NAMES}), each optionally =FILE")
    data_dir: str | None = arg(None, "directory holding <benchmark>.jsonl local copies (looked up before the hub)")
    limit: int | None = arg(None, "evaluate only the first N problems of each benchmark (smoke tests)", at_least=1)
    problem_field: str | None = arg(None, "column holding the problem (default: known per benchmark, else 'problem')")
    answer_field: str | None = arg(None, "column holding the gold answer (default: known per benchmark, else 'answer')")
    template: str = arg("qwen_math", "prompt template (use the one the model was trained with)", TEMPLATE_CHOICES)
    few_shot: int = arg(0, "K worked examples before each problem (use the training run's --few_shot)", at_least=0)
    few_shot_dataset: str | None = arg(
        None, "dataset with solutions the worked examples come from (default: a training run's --dataset and --seed)"
    )
    # Sampling.
    n: int = arg(8, "samples per problem", at_least=1)
    k: str | None = arg(None, "comma-separated k for pass@k (default: 1, 2, 4, ... up to n)")
    temperature: float = arg(0.6, "sampling temperature (0: greedy, vLLM only)", at_least=0)
    top_p: float = arg(1.0, "nucleus sampling", above=0, at_most=1)
    max_tokens: int = arg(4096, "max new tokens per completion", at_least=1)
    seed: int = arg(0, "sampling seed")
    # Output and other modes.
    output_dir: str | None = arg(
        None,
        "where eval_results.json / eval_records.jsonl go (default: the run directory for a training run's model, else runs/eval/<model>)",
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
    """The parsed --k (None: the default 1, 2, 4, ...), or one line naming the bad flag."""
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
    ARGS = parse_args(Args, description=__doc__)
    KS = validate(ARGS)

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def checkpoint_of(model_path: str, run: Path | None) -> str | None:
    """ "checkpoint-N" when the model evaluated is one of a training run's checkpoints, else None."""
    parent = Path(model_path).parent
    return parent.name if run is not None and parent.name.startswith("checkpoint-") else None


def output_dir(args: Args, model_path: str, run: Path | None) -> Path:
    """--output_dir, else the training run's directory (beside its metrics.jsonl; a checkpoint's results in
    its own eval-checkpoint-N/, never over the final model's), else runs/eval/<model>."""
    if args.output_dir:
        return Path(args.output_dir)
    if run is not None:
        checkpoint = checkpoint_of(model_path, run)
        return run / f"eval-{checkpoint}" if checkpoint else run
    return (
        Path("runs")
        / "eval"
        / (Path(model_path).resolve().name if Path(model_path).exists() else args.model.replace("/", "__"))
    )


def few_shot_pool_for(args: Args, run: Path | None) -> list[dict] | None:
    """The rows --few_shot draws its worked examples from, as training drew them (`common.prompts.few_shot_pool`):
    from --few_shot_dataset, else the training run's --dataset with its --seed, else synthetic-arith."""
    if not args.few_shot:
        return None
    from common.cli import clear_errors
    from common.math_data import load_math_dataset
    from common.prompts import few_shot_pool

    flags = (
        json.loads((run / "run_config.json").read_text())["flags"]
        if run and (run / "run_config.json").is_file()
        else {}
    )
    source = args.few_shot_dataset or flags.get("dataset", "synthetic-arith")
    with clear_errors("--few_shot_dataset"):
        rows = load_math_dataset(source)
    with clear_errors("--few_shot"):
        return few_shot_pool(
            [r for r in rows if r["problem"].strip() and r["answer"] is not None], args.few_shot, flags.get("seed", 0)
        )


def rescore_main(args: Args, ks: list[int] | None) -> None:
    from common.evaluation import RESULTS_FILE, format_table, rescore, write_results

    try:
        summary, records = rescore(args.rescore, ks=ks)
    except (ValueError, FileNotFoundError) as e:  # a bad file: a message, not a traceback
        raise SystemExit(f"error: --rescore: {e}") from None
    out = Path(args.output_dir) if args.output_dir else Path(args.rescore).parent
    previous = out / RESULTS_FILE
    config = json.loads(previous.read_text()).get("config", {}) if previous.is_file() else {}
    path = write_results(out, summary, records, config | {"rescored_from": str(args.rescore)})
    print(format_table(summary))
    print(f"wrote {path}")


def main(args: Args, ks: list[int] | None) -> None:
    if args.rescore:
        return rescore_main(args, ks)
    from common.benchmarks import load_benchmarks
    from common.cli import clear_errors
    from common.jsonl import write_jsonl
    from common.models import offline_unless_hub_reachable

    offline_unless_hub_reachable()  # no minute of retries before a one-line error
    with clear_errors("--benchmarks"):
        benchmarks = load_benchmarks(args.benchmarks, args.data_dir, args.limit, args.problem_field, args.answer_field)
    if args.export_data:
        for name, rows in benchmarks.items():
            print(f"{name}: {write_jsonl(rows, Path(args.export_data) / f'{name}.jsonl')} problems")
        return

    from common.console import quiet_libraries
    from common.evaluation import evaluate, format_table, write_results
    from common.models import context_length, hub_error, load_tokenizer, model_to_load
    from common.prompts import few_shot_examples, format_few_shot_prompt
    from common.rollout import make_engine

    quiet_libraries()
    model_path, run = model_to_load(args.model)
    print(f"evaluating {model_path}")  # which checkpoint of a run, for the record
    with clear_errors("--model"):
        try:
            tokenizer = load_tokenizer(model_path)
        except OSError:
            if os.environ.get("HF_HUB_OFFLINE") == "1" and not Path(model_path).exists():
                raise hub_error("--model", model_path) from None
            raise
    pool = few_shot_pool_for(args, run)
    shots = lambda problem: few_shot_examples(problem, pool, args.few_shot) if args.few_shot else []  # noqa: E731
    longest = max(
        len(
            tokenizer(
                format_few_shot_prompt(r["problem"], args.template, shots(r["problem"]), tokenizer),
                add_special_tokens=False,
            ).input_ids
        )
        for rows in benchmarks.values()
        for r in rows
    )
    max_model_len = longest + args.max_tokens
    if (limit := context_length(model_path)) and max_model_len > limit:
        print(
            f"note: prompt + --max_tokens ({max_model_len}) exceeds the model's context ({limit}); completions stop there"
        )
        max_model_len = limit
    engine = make_engine(
        args.rollout, model_path, tokenizer, seed=args.seed, max_model_len=max_model_len, dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, batch_size=args.batch_size,
    )  # fmt: skip
    start = time.perf_counter()
    summary, records = evaluate(
        engine, tokenizer, benchmarks, args.template, args.n, args.temperature, args.max_tokens, args.top_p,
        args.seed, ks=ks, say=print, few_shot=args.few_shot, few_shot_pool=pool,
    )  # fmt: skip
    out = output_dir(args, model_path, run)
    config = asdict(args) | {"model_path": model_path, "eval_s": round(time.perf_counter() - start, 1)}
    config |= {"checkpoint": checkpoint} if (checkpoint := checkpoint_of(model_path, run)) else {}
    path = write_results(out, summary, records, config)
    print(format_table(summary))
    print(f"wrote {path} and {out / 'eval_records.jsonl'}")


if __name__ == "__main__":
    main(ARGS, KS)
