"""A step's completions scored by the reward terms (`common.rewards`), as tensors on the training device
(`Scorer.score` -> `Scores`). It keeps no count: the run's health reads what it returns (`metrics.ScoreWatch`)."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.rewards import RewardFnError, Rewards, compute_rewards, reward_columns
from common.run_flags import RunFlags
from common.verifier import MathVerifier, default_workers


@dataclass
class Scores:
    """A step's rewards as tensors on the training device, one entry per completion."""

    reward: object  # [N] float: the sum of the reward terms
    accuracy: object  # [N] float: 0/1 correctness
    checked: object  # [N] bool: False where the verifier ran out of time before checking the answer
    record: Rewards | None = None  # the same as lists, each term's scores too, as `compute_rewards` gave them


@dataclass
class Scorer:
    verifier: object  # common.verifier.MathVerifier
    terms: list[str]  # --rewards
    custom: list  # --reward_fn's functions, probed at start
    opens_think: bool  # the template's prompt ends inside <think>
    decode: Callable[[list[int]], str]  # token ids -> text: the prompt as the policy saw it (--reward_fn columns)
    device: object  # where the tensors go

    def score(self, texts: list[str], rows: list[dict]) -> Scores:
        """Rewards of the step's completions `texts` (`rows`: each completion's dataset row). A --reward_fn of
        yours that raises, or returns other than one finite number per completion, stops the run in one line."""
        columns = reward_columns(rows, self.decode) if self.custom else None
        try:
            record = compute_rewards(
                texts, [row["answer"] for row in rows], self.terms, self.verifier,
                prompt_ends_with_think=self.opens_think, custom=self.custom, columns=columns,
            )  # fmt: skip
        except RewardFnError as e:
            raise SystemExit(f"error: --reward_fn: {e}") from None
        as_tensor = lambda x, dtype: torch.tensor(x, device=self.device, dtype=dtype)
        return Scores(
            as_tensor(record.total, torch.float32), as_tensor(record.accuracy, torch.float32),
            as_tensor(record.checked, torch.bool), record,
        )  # fmt: skip

    def close(self) -> None:
        self.verifier.close()


def open_scorer(run: RunFlags, terms: list[str], custom: list, opens_think: bool, tokenizer, device) -> Scorer:
    """The scorer, its verifier under --verifier_workers, --verifier_memory_mb and --reward_time_budget_s."""
    verifier = MathVerifier(
        workers=run.verifier_workers or default_workers(),
        memory_mb=run.verifier_memory_mb,
        budget_s=run.reward_time_budget_s or None,
    )
    return Scorer(verifier, terms, custom, opens_think, tokenizer.decode, device)


def without_unchecked_groups(advantages: torch.Tensor, checked: torch.Tensor, G: int) -> torch.Tensor:
    """`advantages` ([N] or [N, C]) with every group of G holding an unchecked answer (`checked` False) set to 0
    (every script does this): its rewards would score that answer wrong, a guess; no advantage beats a wrong one."""
    keep = checked.view(-1, G).all(1).repeat_interleave(G).float()
    return advantages * keep.view(-1, *[1] * (advantages.dim() - 1))
