"""DeepScaleR-Hard-1K (EDGE-GRPO, arXiv 2507.21848): the problems a model answers least often.

The paper has Qwen2.5-Math-7B answer each DeepScaleR problem that has a boxed reference
solution 8 times and keeps the 1K problems with the lowest accuracy (~80% of them never
answered correctly). Here every problem gets `--samples` completions from the training
scripts' rollout engine (common.rollout: vLLM, or transformers with `--rollout hf`), rendered
with the training template and checked by the training reward's verifier. Problems are ranked
by accuracy, lowest first; ties (most of them: 0/8) are broken by a shuffle seeded with
`--seed`. The hardest `--n` are written, hardest first, each with its `model_accuracy`.

    python -m data.prepare edge --n 100000 --output data/deepscaler_boxed.jsonl   # the whole boxed pool (~2K)
    python -m data.hard_subset --model Qwen/Qwen2.5-Math-7B --source data/deepscaler_boxed.jsonl \\
        --output data/deepscaler_hard_1k.jsonl --n 1000 --samples 8

Not stated by the paper, so chosen here: temperature 0.6 and 1024 new tokens (its training
sampling settings), the qwen_math template, and prompts longer than `--max_prompt_len`
skipped (training drops them too).
"""

import random
from dataclasses import dataclass

from common.cli import arg, clear_errors, parse_args
from common.math_data import load_math_dataset
from common.prompts import TEMPLATE_CHOICES, format_prompt
from common.rewards import accuracy_reward
from common.run_dir import write_jsonl
from common.run_flags import vllm_available
from common.verifier import MathVerifier


def sample_accuracies(
    rows: list[dict],
    engine,
    tokenizer,
    verifier: MathVerifier,
    samples: int = 8,
    max_tokens: int = 1024,
    temperature: float = 0.6,
    top_p: float = 1.0,
    template: str = "qwen_math",
    seed: int = 0,
    batch_size: int = 256,
) -> list[float]:
    """Each row's accuracy over `samples` completions from `engine` (`generate` as in common.rollout)."""
    from tqdm import tqdm

    from common.prompts import prompt_seeds

    accuracies = []
    for start in tqdm(range(0, len(rows), batch_size), desc="sampling", unit="batch"):
        chunk = rows[start : start + batch_size]
        prompts = [
            tokenizer(format_prompt(r["problem"], template, tokenizer), add_special_tokens=False).input_ids
            for r in chunk
        ]
        seeds = prompt_seeds(seed, 0, 0, 0, start + len(chunk))[start:]  # one per problem, from its index
        groups = engine.generate(prompts, samples, max_tokens, temperature, top_p, seed=seeds)
        texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for g in groups for c in g]
        correct = accuracy_reward(texts, [r["answer"] for r in chunk for _ in range(samples)], verifier)
        accuracies += [sum(correct[i * samples : (i + 1) * samples]) / samples for i in range(len(chunk))]
    return accuracies


def hardest(rows: list[dict], accuracies: list[float], n: int, seed: int) -> list[dict]:
    """The `n` rows with the lowest accuracy, hardest first; equal accuracies in a seeded random order."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    order.sort(key=lambda i: accuracies[i])  # stable: the shuffle decides among ties
    return [{**rows[i], "model_accuracy": accuracies[i]} for i in order[:n]]


@dataclass
class Args:
    # What to rank.
    model: str = arg("", "model that judges difficulty (paper: Qwen/Qwen2.5-Math-7B)", required=True)
    source: str = arg("", "problems to rank: local file/directory or hub name", required=True)
    output: str = arg("", "JSONL file to write", required=True)
    split: str = arg("train", "split of the source")
    problem_field: str | None = arg(None, "column holding the problem")
    answer_field: str | None = arg(None, "column holding the gold answer")
    solution_field: str | None = arg(None, "column holding a reference solution")
    n: int = arg(1000, "problems to keep", at_least=1)
    # Sampling.
    samples: int = arg(8, "completions per problem", at_least=1)
    seed: int = arg(42, "sampling seed and tie-break shuffle")
    temperature: float = arg(0.6, "sampling temperature", above=0)
    top_p: float = arg(1.0, "nucleus sampling", above=0, at_most=1)
    max_tokens: int = arg(1024, "max new tokens per completion", at_least=1)
    max_prompt_len: int = arg(512, "longer prompts (tokens) are skipped", at_least=1)
    template: str = arg("qwen_math", "prompt template", TEMPLATE_CHOICES)
    # Systems.
    rollout: str = arg("vllm" if vllm_available() else "hf", "generation backend", ["vllm", "hf"])
    gpu_memory_utilization: float = arg(0.9, "share of GPU memory vLLM may take", above=0, at_most=1)


def main(args: Args) -> None:
    from common.models import load_tokenizer
    from common.rollout import make_engine

    rows = load_math_dataset(args.source, args.split, args.problem_field, args.answer_field, args.solution_field)
    tokenizer = load_tokenizer(args.model)
    kept = [
        r
        for r in rows
        if len(tokenizer(format_prompt(r["problem"], args.template, tokenizer), add_special_tokens=False).input_ids)
        <= args.max_prompt_len
    ]
    print(
        f"{len(rows)} problems loaded, {len(rows) - len(kept)} skipped (prompt > --max_prompt_len {args.max_prompt_len} tokens)"
    )
    if len(kept) < args.n:
        print(f"warning: only {len(kept)} problems, fewer than --n {args.n}; all are kept (ranked)")
    engine = make_engine(
        args.rollout, args.model, tokenizer, seed=args.seed, max_model_len=args.max_prompt_len + args.max_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )  # fmt: skip
    with MathVerifier() as verifier:
        sampling = (args.samples, args.max_tokens, args.temperature, args.top_p, args.template, args.seed)
        accuracies = sample_accuracies(kept, engine, tokenizer, verifier, *sampling)
    selected = hardest(kept, accuracies, args.n, args.seed)
    never = sum(r["model_accuracy"] == 0 for r in selected)
    print(
        f"mean accuracy: all {sum(accuracies) / max(1, len(accuracies)):.3f}, kept "
        f"{sum(r['model_accuracy'] for r in selected) / max(1, len(selected)):.3f}; "
        f"{never} of {len(selected)} kept never answered correctly in {args.samples} samples"
    )
    print(f"wrote {write_jsonl(selected, args.output)} rows to {args.output}")


if __name__ == "__main__":
    with clear_errors():  # user errors: one line, no traceback
        main(parse_args(Args, description=__doc__))
