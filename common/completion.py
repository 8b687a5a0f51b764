"""What a rollout engine returns, and where a completion ends: stop tokens and stop strings.

A completion ends on a stop token (EOS, <|im_end|>: `stop_token_ids`) or before the first of the
run's stop strings (`--stop`, few-shot under `--template plain`). Both engines stop sampling a
sequence once its text holds a stop string, then cut it as `cut_at_stop` says: the tokens kept
are those of a run that sampled on to EOS and was cut afterwards, only sooner.
"""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # engine's log pi_old(token | prefix) under logits / T
    finished: bool  # ended on a stop token or a stop string (False: cut at max_tokens)


def stop_token_ids(tokenizer, model_path: str) -> list[int]:
    """Token ids that end a completion, for training, evaluation and data selection alike:
    the tokenizer's EOS, the model config's and generation config's EOS, and the chat
    end-of-turn `<|im_end|>` when the vocabulary has it (a base model such as
    Qwen2.5-Math-1.5B lists only `<|endoftext|>` but, prompted with chat markup, ends
    its answer with `<|im_end|>`)."""
    from transformers import AutoConfig, GenerationConfig

    ids = {tokenizer.eos_token_id}
    for load in (AutoConfig.from_pretrained, GenerationConfig.from_pretrained):
        try:
            eos = getattr(load(model_path), "eos_token_id", None)
        except (OSError, ValueError):  # no generation_config.json
            continue
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer and model config define no EOS token: generation would never stop")
    return sorted(ids)


def stop_at(text: str, stop: tuple[str, ...] | list[str]) -> int | None:
    """Where the first of the `stop` strings starts in `text` (None: none is in it)."""
    return min((i for s in stop if (i := text.find(s)) >= 0), default=None)


def cut_at_stop(c: Completion, stop: tuple[str, ...] | list[str], decode: Callable[[list[int]], str]) -> Completion:
    """`c` cut before the first of the `stop` strings in its text, as vLLM's `stop` cuts the text by default (the
    stop string excluded): its token ids and log-probs are cut to the longest prefix whose text ends before
    it (a token that straddles the stop string's start goes too), and it counts as finished (it stopped).
    `decode`: token ids -> text, the one decoding every stop decision uses (the engines' `decode`)."""
    if not stop or not c.token_ids:
        return c
    at = stop_at(decode(c.token_ids), stop)
    if at is None:
        return c
    keep, hi = 0, len(c.token_ids)  # the most tokens whose text is no longer than `at` (binary search)
    while keep < hi:
        mid = (keep + hi + 1) // 2
        keep, hi = (mid, hi) if len(decode(c.token_ids[:mid])) <= at else (keep, mid - 1)
    return Completion(c.token_ids[:keep], c.logprobs[:keep], finished=True)


def cut_groups(groups: list[list[Completion]], stop: tuple[str, ...], decode) -> list[list[Completion]]:
    """`groups` with every completion cut at the `stop` strings (`cut_at_stop`)."""
    if not stop:
        return groups
    return [[cut_at_stop(c, stop, decode) for c in group] for group in groups]


# Sampling seeds: one per prompt from its place in the run, one per completion from its prompt's.


# A prime stride between consecutive seeds: runs with nearby --seed values do not share seeds.
SEED_STRIDE = 1_000_003


def prompt_seeds(seed: int, step: int, prompts_per_step: int, rank: int, num_local: int) -> list[int]:
    """One sampling seed per prompt of this rank's share of the step's global batch.

    A prompt's seed depends on (seed, step, its place in the global batch) only, so
    the same run on 1 or 8 processes samples the same completions (HFEngine exactly;
    vLLM on GPU up to batch-dependent rounding).
    """
    first = step * prompts_per_step + rank * num_local  # the prompt's index among all prompts of the run
    return [seed + (first + i) * SEED_STRIDE for i in range(num_local)]


def completion_seed(prompt_seed: int, index: int) -> int:
    """The seed of the `index`-th completion of a prompt seeded `prompt_seed` (the HF engine's rows)."""
    return (prompt_seed * SEED_STRIDE + index) % 2**63
