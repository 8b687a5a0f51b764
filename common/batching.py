"""Prompt + completion token lists -> padded training tensors."""

import torch


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int, device=None) -> dict[str, torch.Tensor]:
    """Left-pad prompts to P and right-pad completions to C, then concatenate.

    The layout [pad.. prompt | completion ..pad] puts every completion at
    columns P..P+C-1, so the completion's log-probs are the last C positions
    (`logits_to_keep=C`) and `completion_mask` is [N, C].
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    P = max(map(len, prompts))
    C = max(1, max(map(len, completions)))
    ids, attn, cmask = [], [], []
    for p, c in zip(prompts, completions):
        ids.append([pad_id] * (P - len(p)) + p + c + [pad_id] * (C - len(c)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
        cmask.append([1] * len(c) + [0] * (C - len(c)))
    return {
        "input_ids": torch.tensor(ids, device=device),
        "attention_mask": torch.tensor(attn, device=device),
        "completion_mask": torch.tensor(cmask, device=device, dtype=torch.float32),
        "prompt_mask": torch.tensor(attn, device=device, dtype=torch.float32)[:, :P],
    }


def pad_right(rows: list[list[float]], width: int, value: float = 0.0, device=None) -> torch.Tensor:
    """Ragged per-token lists (e.g. the engine's log-probs) -> [N, width] tensor."""
    return torch.tensor([r[:width] + [value] * (width - len(r[:width])) for r in rows], device=device, dtype=torch.float32)
