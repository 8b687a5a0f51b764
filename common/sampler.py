"""The per-step prompt sampler: a seeded, resumable order, each rank's share of every step."""

import math
import random


class PromptSampler:
    """`prompts_per_step` global prompts a step, epoch e shuffled with seed + e, each rank taking its contiguous
    share (a group stays on one rank). Batches run across epochs (each row once per epoch, none dropped); the
    cursor is global, so a run resumes on another world size."""

    def __init__(self, rows: list[dict], prompts_per_step: int, seed: int, rank: int = 0, world_size: int = 1):
        if not rows:
            raise ValueError("PromptSampler got an empty dataset")
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if prompts_per_step % world_size:
            raise ValueError(
                f"prompts_per_step ({prompts_per_step}) must be divisible by the "
                f"number of processes ({world_size}) so that each rank gets whole prompts"
            )
        self.rows, self.prompts_per_step, self.seed = rows, prompts_per_step, seed
        self.rank, self.world_size = rank, world_size
        self._epoch, self._pos, self._step = 0, 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed + epoch).shuffle(order)
        return order

    @property
    def epoch(self) -> int:
        """Epoch (0-based) the next prompt is drawn from."""
        return self._epoch

    @property
    def step(self) -> int:
        """Number of batches drawn so far."""
        return self._step

    def next_batch(self) -> list[dict]:
        """This rank's prompts for the next step (prompts_per_step // world_size rows)."""
        indices = []
        while len(indices) < self.prompts_per_step:
            take = min(self.prompts_per_step - len(indices), len(self._order) - self._pos)
            indices += self._order[self._pos : self._pos + take]
            self._pos += take
            if self._pos == len(self._order):  # epoch done: reshuffle with seed + epoch
                self._epoch, self._pos = self._epoch + 1, 0
                self._order = self._permutation(self._epoch)
        self._step += 1
        share = self.prompts_per_step // self.world_size
        mine = indices[self.rank * share : (self.rank + 1) * share]
        return [dict(self.rows[i]) for i in mine]  # copies: callers may annotate rows

    def state_dict(self) -> dict:
        return dict(epoch=self._epoch, pos=self._pos, step=self._step, seed=self.seed, num_rows=len(self.rows))

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != len(self.rows) or state["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for {state['num_rows']} rows / seed {state['seed']}, but this run has "
                f"{len(self.rows)} rows / seed {self.seed}: resume with the same dataset and seed"
            )
        self._epoch, self._pos, self._step = state["epoch"], state["pos"], state["step"]
        self._order = self._permutation(self._epoch)


def count_steps(steps: int, epochs: float | None, num_rows: int, prompts_per_step: int) -> tuple[int, str]:
    """The run's length in steps, and why (for the start line): `steps`, or `epochs` passes over `num_rows`
    prompts rounded up to whole steps. ValueError when one step alone would hold more than `epochs` asks."""
    if epochs is None:
        return steps, f"{steps} steps (--steps)"
    if prompts_per_step > epochs * num_rows:
        raise ValueError(
            f"--epochs {epochs:g} of {num_rows} prompts is less than one step of --prompts_per_step "
            f"{prompts_per_step} ({prompts_per_step / num_rows:.2f} epochs); lower --prompts_per_step, "
            "or give --steps instead of --epochs"
        )
    total = math.ceil(round(epochs * num_rows / prompts_per_step, 6))
    covered = total * prompts_per_step / num_rows
    rounded = f", rounded up to whole steps: {covered:.2f} epochs" if abs(covered - epochs) > 1e-6 else ""
    why = f"{total} steps (--epochs {epochs:g} of {num_rows} prompts at --prompts_per_step {prompts_per_step}{rounded})"
    return total, why
