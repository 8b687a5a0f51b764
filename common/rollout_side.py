"""The rollout side of a session: the engine that samples the policy (`common.rollout`: vLLM in-process, or
transformers), the prompt sampler, each prompt's seed, and the engine's memory given to the trainer and
taken back with the new weights (`Rollout.sleep`, then `Rollout.sync_weights`). Built by `open_rollout`."""

from __future__ import annotations

from dataclasses import dataclass

from common.models import Precision
from common.rollout import RolloutEngine
from common.rollout_correction import RolloutCorrection, rollout_correction
from common.run_flags import RunFlags
from common.sampler import PromptSampler


@dataclass
class Rollout:
    engine: RolloutEngine  # common.rollout's VLLMEngine or HFEngine
    sampler: PromptSampler  # each step's prompts, this rank's share
    tokenizer: object  # the policy's: prompts in, completions out
    seed: int  # --seed
    prompts_per_step: int  # over all ranks
    rank: int
    correction: RolloutCorrection  # pi_old / pi_rollout weights on the loss (--rollout_correction, auto resolved)

    def seeds(self, step: int, n: int) -> list[int]:
        """One seed per prompt of this rank's `n` at `step`, from its place in the global batch
        (`common.rollout.prompt_seeds`): the samples do not depend on how the batch is split over ranks."""
        from common.rollout import prompt_seeds

        return prompt_seeds(self.seed, step, self.prompts_per_step, self.rank, n)

    def texts(self, completions: list) -> list[str]:
        """The completions as text (special tokens left out): what the rewards read."""
        return self.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)

    def sleep(self) -> None:
        """Give the engine's GPU memory (weights and KV cache) to the trainer's passes, with --vllm_sleep; a
        no-op otherwise. The engine must not sample until `sync_weights` wakes it."""
        self.engine.sleep()

    def sync_weights(self, trainer) -> None:
        """Wake the engine with the trainer's new weights (a slept vLLM wakes its weights to load them, its KV
        cache at the next generate): it samples from the new policy. A no-op for the HF engine, which
        samples the policy itself."""
        from common.distributed import state_dict_for_sync

        self.engine.load_weights(state_dict_for_sync(trainer.accelerator, trainer.model, self.engine.weight_dtype))

    def resume(self, state: dict, trainer) -> None:
        """After the trainer resumed from a checkpoint (`common.trainer.Trainer.resume`): its data order, and
        the engine's copy of the weights."""
        self.sampler.load_state_dict(state["sampler"])
        self.sync_weights(trainer)


@dataclass(frozen=True)
class EngineSize:
    """How each rank's rollout engine is sized (vLLM's arguments): the memory preflight plans it before any weight
    loads (`common.trainer.check_memory`), `rollout_engine` builds it."""

    max_model_len: int  # prompt + completion + any extra context (EDGE-GRPO's reflections)
    max_num_seqs: int  # sequences sampled at once: a step's rollout or an evaluation on this rank, at most 1,024
    max_num_batched_tokens: int | None  # None: vLLM's own


def engine_size(spec, run: RunFlags, world: int, eval_sets: dict) -> EngineSize:
    """The engine size of `spec` (`common.train_spec.TrainSpec`) under `run`'s flags on `world` ranks, for a step's
    rollout or an evaluation of `eval_sets`, whichever samples more sequences at once."""
    rows_per_rank = spec.prompts_per_step // world * spec.group_size
    eval_rows_per_rank = max((len(r) for r in eval_sets.values()), default=0) * run.eval_n // world
    return EngineSize(
        spec.max_prompt_len + spec.max_completion_len + spec.extra_context,
        run.vllm_max_num_seqs or min(1024, max(rows_per_rank, eval_rows_per_rank)),
        run.vllm_max_num_batched_tokens or None,
    )


def open_rollout(spec, run: RunFlags, model_path: str, tokenizer, trainer, precision: Precision, rows: list[dict],
                 size: EngineSize, stop: list[str], say) -> Rollout:  # fmt: skip
    """The rollout side of `spec` (`common.train_spec.TrainSpec`): the sampler over the training `rows`, the
    engine of --rollout (`rollout_engine`) of `size`, cutting completions at the `stop` strings, and the
    correction of its log-probs' difference from the trainer's in `precision` (said when one is in force)."""
    sampler = PromptSampler(rows, spec.prompts_per_step, seed=spec.seed, rank=trainer.rank, world_size=trainer.world)
    engine = rollout_engine(
        run, model_path, tokenizer, trainer.accelerator.unwrap_model(trainer.model), trainer.mode, precision,
        seed=spec.seed + trainer.rank, size=size, added_len=spec.max_completion_len + spec.extra_context, rows=rows,
        prompts_per_step=spec.prompts_per_step, group_size=spec.group_size, say=say, stop=stop,
    )  # fmt: skip
    correction = rollout_correction(
        spec.rollout_correction, spec.rollout_correction_min, spec.rollout_correction_max, precision, spec.top_p
    )
    if correction.mode != "none":
        say(f"rollout correction: {correction.describe()} (--rollout_correction {spec.rollout_correction})")
    return Rollout(engine, sampler, tokenizer, spec.seed, spec.prompts_per_step, trainer.rank, correction)


def rollout_engine(
    run: RunFlags, model_path: str, tokenizer, policy, mode, precision: Precision, *, seed: int, size: EngineSize,
    added_len: int, rows: list[dict], prompts_per_step: int, group_size: int, say, stop: list[str] = (),
):  # fmt: skip
    """The rollout engine of --rollout (`common.rollout.make_engine`) of `size` (`engine_size`); `seed`: this
    rank's; `added_len`: the tokens a sequence adds to its prompt (completion, extra context); `stop`: the stop
    strings. Says when its KV cache cannot hold a step at once."""
    from common.rollout import make_engine

    world = mode.world
    engine = make_engine(
        run.rollout, model_path, tokenizer, policy, seed=seed, world=world, max_model_len=size.max_model_len,
        dtype=precision.engine, gpu_memory_utilization=run.vllm_gpu_memory_utilization, sleep=run.vllm_sleep,
        max_num_seqs=size.max_num_seqs, max_num_batched_tokens=run.vllm_max_num_batched_tokens, synced=mode.sharded,
        per_prompt_seeds=run.per_prompt_seeds, stop=stop,
    )  # fmt: skip
    kv_note = engine.kv_cache_note(
        [len(r["prompt_ids"]) for r in rows], prompts_per_step // world, group_size, added_len
    )
    if kv_note:
        say(kv_note)
    return engine
