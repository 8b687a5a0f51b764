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

from __future__ import annotations

import argparse
import random

from common.cli import clear_errors
from common.data import TEMPLATE_CHOICES, format_prompt, load_math_dataset, write_jsonl
from common.rewards import MathVerifier, accuracy_reward


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

    accuracies = []
    for start in tqdm(range(0, len(rows), batch_size), desc="sampling", unit="batch"):
        chunk = rows[start : start + batch_size]
        prompts = [
            tokenizer(format_prompt(r["problem"], template, tokenizer), add_special_tokens=False).input_ids
            for r in chunk
        ]
        groups = engine.generate(prompts, samples, max_tokens, temperature, top_p, seed=seed + start)
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


def make_engine(args, tokenizer):
    """The rollout engine the training scripts use, with the same stop tokens."""
    import torch

    from common.rollout import HFEngine, VLLMEngine, stop_token_ids

    stop_ids = stop_token_ids(tokenizer, args.model)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    if args.rollout == "vllm":
        return VLLMEngine(
            args.model,
            stop_ids,
            max_model_len=args.max_prompt_len + args.max_tokens,
            seed=args.seed,
            dtype=str(dtype).removeprefix("torch."),
            gpu_memory_utilization=args.gpu_memory_utilization,
        )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(
        "cuda" if torch.cuda.is_available() else "cpu"
    )
    return HFEngine(
        model.eval(), stop_ids, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )


def main(argv: list[str] | None = None) -> None:
    from common.rollout import vllm_available

    p = argparse.ArgumentParser(
        prog="python -m data.hard_subset", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="model that judges difficulty (paper: Qwen/Qwen2.5-Math-7B)")
    p.add_argument("--source", required=True, help="problems to rank: local file/directory or hub name")
    p.add_argument("--output", required=True, help="JSONL file to write")
    p.add_argument("--n", type=int, default=1000, help="problems to keep")
    p.add_argument("--samples", type=int, default=8, help="completions per problem")
    p.add_argument("--seed", type=int, default=42, help="sampling seed and tie-break shuffle")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top_p", type=float, default=1.0)
    p.add_argument("--max_tokens", type=int, default=1024, help="max new tokens per completion")
    p.add_argument("--max_prompt_len", type=int, default=512, help="longer prompts (tokens) are skipped")
    p.add_argument("--template", default="qwen_math", choices=TEMPLATE_CHOICES)
    p.add_argument("--rollout", default="vllm" if vllm_available() else "hf", choices=["vllm", "hf"])
    p.add_argument("--gpu_memory_utilization", type=float, default=0.9)
    p.add_argument("--split", default="train")
    p.add_argument("--problem_field", default=None)
    p.add_argument("--answer_field", default=None)
    p.add_argument("--solution_field", default=None)
    args = p.parse_args(argv)
    if args.n < 1 or args.samples < 1 or args.max_tokens < 1:
        raise SystemExit("error: --n, --samples and --max_tokens must be >= 1")

    from transformers import AutoTokenizer

    rows = load_math_dataset(args.source, args.split, args.problem_field, args.answer_field, args.solution_field)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
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
    engine = make_engine(args, tokenizer)
    with MathVerifier() as verifier:
        accuracies = sample_accuracies(
            kept,
            engine,
            tokenizer,
            verifier,
            args.samples,
            args.max_tokens,
            args.temperature,
            args.top_p,
            args.template,
            args.seed,
        )
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
        main()
