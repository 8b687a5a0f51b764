"""What a rollout engine returns, where a completion ends (a stop token, or before the first stop string:
`cut_at_stop`, as if sampled on to EOS and cut afterwards), and the sampling seeds.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # engine's log pi_old(token | prefix) under logits / T
    finished: bool  # ended on a stop token or a stop string (False: cut at max_tokens)


class CutEngine:
    """What both rollout engines share: `stop` strings, `decode` (token ids -> text, the one every stop decision
    uses), and `generate`: the engine's `sample`, each completion then cut at the stop strings."""

    def __init__(self, stop: Iterable[str], decode: Callable[[list[int]], str] | None):
        self.stop, self.decode = tuple(stop), decode
        if self.stop and decode is None:
            raise ValueError("stop strings need `decode`: the engine cuts each completion by its text")

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | list[int] | None = None,
    ) -> list[list[Completion]]:
        """n completions for each prompt (a list of token ids); `seed`: one for the call or one per prompt."""
        return cut_groups(self.sample(prompts, n, max_tokens, temperature, top_p, seed), self.stop, self.decode)


def stop_token_ids(tokenizer, model_path: str) -> list[int]:
    """Token ids that end a completion: every EOS the tokenizer and configs name, and `<|im_end|>` when the
    vocabulary has it (a base model such as Qwen2.5-Math-1.5B ends a chat answer with it, unlisted)."""
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
    """`c` cut to the longest prefix whose text (`decode`'s) ends before the first `stop` string, as vLLM cuts
    the text (a token straddling it goes too), and finished."""
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


SEED_STRIDE = 1_000_003  # prime: runs with nearby --seed values share no seeds


def prompt_seeds(seed: int, step: int, prompts_per_step: int, rank: int, num_local: int) -> list[int]:
    """One seed per prompt of this rank's share, from (seed, step, its place in the global batch) only: 1 or 8
    processes sample the same completions (HFEngine exactly; vLLM on GPU up to rounding)."""
    first = step * prompts_per_step + rank * num_local  # the prompt's index among all prompts of the run
    return [seed + (first + i) * SEED_STRIDE for i in range(num_local)]


def completion_seed(prompt_seed: int, index: int) -> int:
    """The seed of the `index`-th completion of a prompt seeded `prompt_seed` (the HF engine's rows)."""
    return (prompt_seed * SEED_STRIDE + index) % 2**63
