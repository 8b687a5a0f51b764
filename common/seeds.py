"""Sampling seeds: one per prompt from its place in the run, one per completion from its prompt's."""

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
