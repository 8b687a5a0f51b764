"""Per-token log-probabilities, full-vocabulary entropy and sequence NLL.

All quantities come from `logits / T`, the distribution the rollout engine
sampled from (ALGORITHMS.md, notation). The vocabulary of Qwen2.5 has 151,936
entries, so the fp32 log-softmax is taken a chunk of rows at a time: at no
point does a second full-size fp32 copy of the [B, L, V] logits exist.
"""

import torch
import torch.nn.functional as F


def token_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_rows: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(token_t | <t) and, optionally, H(pi(. | <t)) for every position.

    logits: [..., V] (any dtype); tokens: [...] the sampled ids at the same positions.
    Returns fp32 tensors shaped like `tokens`. Differentiable w.r.t. logits.
    """
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} do not line up")
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_tokens = tokens.reshape(-1)
    logps, ents = [], []
    for start in range(0, flat_logits.shape[0], chunk_rows):
        # Only this chunk is upcast to fp32.
        chunk = flat_logits[start : start + chunk_rows].float() / temperature
        logp_all = F.log_softmax(chunk, dim=-1)
        logps.append(logp_all.gather(-1, flat_tokens[start : start + chunk_rows, None]).squeeze(-1))
        if with_entropy:
            # H = -sum p log p, from the same log-softmax (stable when p underflows).
            ents.append(-(logp_all.exp() * logp_all).sum(-1))
    logp = torch.cat(logps).view(tokens.shape)
    entropy = torch.cat(ents).view(tokens.shape) if with_entropy else None
    return logp, entropy


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    logits_to_keep: int | None = None,
    with_entropy: bool = False,
    chunk_rows: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Score `input_ids` [B, L] with a causal LM.

    Returns logp (and entropy) of shape [B, L - 1] for tokens 1..L-1, or [B, K]
    for the last K tokens when `logits_to_keep=K` (then only K logit rows are
    ever materialised: the completion part of a prompt+completion batch).
    """
    # position_ids from the mask so that left-padded prompts get the same
    # positions as the unpadded prompt had in the rollout engine.
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    kwargs = {}
    if logits_to_keep is not None:
        kwargs["logits_to_keep"] = logits_to_keep + 1
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs).logits
    logits = logits[:, :-1]  # the last position predicts beyond the sequence
    targets = input_ids[:, 1:] if logits_to_keep is None else input_ids[:, -logits_to_keep:]
    return token_logprobs(logits, targets, temperature, with_entropy, chunk_rows)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over mask (per row with dim=-1); an empty row gives 0, not NaN."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def sequence_nll(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of each sequence's tokens: [B, L] -> [B]."""
    return -masked_mean(logp, mask, dim=-1)
