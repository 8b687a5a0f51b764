"""Build a CPU demo model into a directory of your choice; its model is below.

    python -m tools.tiny_model --output /tmp/tiny            # then: python grpo_base.py --model /tmp/tiny

`--model tiny` does not need this: it loads the model shipped in models/tiny-arith, whose tiny_model.json
holds the command that made it. A rebuild differs from it by this machine's CPU kernels and thread count,
so the README's demo figures are not a rebuild's.

The model: a byte-level BPE tokenizer trained on the synthetic task's text (digits split one by one, Qwen chat
markup as special tokens) and a ~1M-parameter Qwen2 (head_dim 32: vLLM's CPU attention takes only 32 or 64).
Tests build random ones.

The warm-start SFT is deliberately noisy: half of its solutions state the sum
without `\\boxed{}` ("3 + 4 = 7. The answer is 7."), which the verifier
cannot read, so the SFT policy is right well under half the time although it
mostly knows the sums. RL from the verifiable reward must find and reinforce
the boxed answer: the RLVR effect in miniature (sharpening what the policy
can already produce, as in the first steps of real runs), not new arithmetic.
"""

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from common.checkpoint import write_manifest
from common.cli import arg, parse_args
from common.math_data import SYNTHETIC_MAX_OPERAND, SYNTHETIC_TRAIN_SEED, SYNTHETIC_TRAIN_SIZE, synthetic_arithmetic
from common.models import SHIPPED_DIR
from common.prompts import TEMPLATES, format_prompt

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VERSION = 2  # of the recipe below; recorded in the model's tiny_model.json
RECIPE = "tiny_model.json"


def build_tokenizer(corpus: list[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    # Digits one per token: arithmetic is then learnable digit by digit.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )


def tiny_qwen2_config(vocab_size: int, eos_id: int, pad_id: int, hidden: int = 128, layers: int = 4) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32,
        num_key_value_heads=max(1, hidden // 64),
        head_dim=32,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        torch_dtype="float32",
    )


def unboxed(row: dict) -> str:
    """The row's solution with the answer left out of \\boxed{}: right, but unverifiable."""
    return row["solution"].replace(f"\\boxed{{{row['answer']}}}", row["answer"])


def sft(
    model,
    tokenizer,
    rows: list[dict],
    template: str,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    noise: float,
    progress: bool = False,
) -> None:
    """Supervised warm-start on prompt -> solution<eos> (loss on the solution only); a `noise` share is unboxed."""
    from tqdm import tqdm

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    examples = []
    for r in rows:
        p = tokenizer(format_prompt(r["problem"], template), add_special_tokens=False).input_ids
        for solution in (r["solution"], unboxed(r)):
            c = tokenizer(solution, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            examples.append((p + c, [-100] * len(p) + c))
    model.train()
    for _ in tqdm(range(steps), desc="demo model SFT", unit="step", disable=not progress, dynamic_ncols=True):
        # examples alternate boxed / unboxed for each problem
        picks = [2 * rng.randrange(len(rows)) + (rng.random() < noise) for _ in range(batch_size)]
        seqs, labels = zip(*(examples[i] for i in picks))
        width = max(map(len, seqs))
        ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in seqs])
        lab = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
        loss = model(input_ids=ids, attention_mask=(lab != -100) | (ids != tokenizer.pad_token_id), labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def build_tiny_model(
    output: str | Path,
    sft_steps: int = 500,
    sft_lr: float = 3e-3,
    sft_noise: float = 0.5,
    seed: int = 0,
    template: str = "qwen_math",
    threads: int | None = None,
    manifest: bool = True,
    progress: bool = False,
) -> Path:
    """Tokenizer + model (+ SFT warm-start) saved as a HF directory with its MANIFEST.json (tests' scratch models
    go without) and its recipe (tiny_model.json). `threads`: torch's, for the build (None: as set)."""
    output = Path(output)
    if output.exists():
        raise SystemExit(f"error: --output: {output} exists; remove it or choose another directory")
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        # The RL training problems (the demo evaluates on the same 100 sums: it shows RL, not generalisation).
        rows = synthetic_arithmetic(SYNTHETIC_TRAIN_SIZE, seed=SYNTHETIC_TRAIN_SEED, max_operand=SYNTHETIC_MAX_OPERAND)
        corpus = [format_prompt(r["problem"], t) for r in rows for t in TEMPLATES] + [r["solution"] for r in rows]
        corpus += [
            "Wait! Something is wrong here. After verification, the correct answer is \\boxed{}.",
            "<think></think><answer></answer>",
        ]
        tokenizer = build_tokenizer(corpus)
        config = tiny_qwen2_config(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
        model = Qwen2ForCausalLM(config)
        if sft_steps:
            sft(model, tokenizer, rows, template, sft_steps, sft_lr, 32, seed, sft_noise, progress)
        recipe = {"version": VERSION, "sft_steps": sft_steps, "sft_noise": sft_noise, "seed": seed}
        recipe |= {"threads": torch.get_num_threads(), "torch": torch.__version__}
    finally:
        torch.set_num_threads(saved_threads)
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a build that was killed
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(tmp)
    (tmp / RECIPE).write_text(json.dumps(recipe | {"command": build_command(output, recipe)}, indent=1) + "\n")
    if manifest:
        write_manifest(tmp)
    tmp.rename(output)  # atomic: a half-built directory is never used
    return output


def build_command(output: Path, recipe: dict) -> str:
    """The command that rebuilds a model from its recipe (tiny_model.json)."""
    flags = f"--sft_steps {recipe['sft_steps']} --sft_noise {recipe['sft_noise']} --seed {recipe['seed']}"
    return f"python -m tools.tiny_model --output {output} {flags} --threads {recipe['threads']}"


DEFAULT_OUTPUT = Path.home() / ".cache" / "grpo-zoo" / "tiny-arith-rebuilt"


@dataclass
class Args:
    # What to build.
    output: str = arg(str(DEFAULT_OUTPUT), "directory to write the model and tokenizer to (must not exist)")
    sft_steps: int = arg(500, "supervised warm-start steps (0: a random model)", at_least=0)
    sft_noise: float = arg(0.5, "share of SFT solutions without \\boxed{}", at_least=0, at_most=1)
    seed: int = arg(0, "random seed")
    threads: int = arg(1, "torch threads for the build (the weights depend on them)", at_least=1)


if __name__ == "__main__":
    args = parse_args(Args, description=__doc__)
    path = build_tiny_model(
        args.output, args.sft_steps, sft_noise=args.sft_noise, seed=args.seed, threads=args.threads, progress=True
    )
    if path.resolve() == SHIPPED_DIR:
        print(
            f"rebuilt the shipped demo model {path}: measure the README's demo figures again (scripts/compare_demo.sh)"
        )
    else:
        print(
            f"built {path}: train on it with --model {path}. Its weights differ from the shipped models/tiny-arith "
            "(`--model tiny`) by this machine's kernels and threads, so the README's demo figures are not its figures."
        )
