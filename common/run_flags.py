"""The flags every script shares for how a run goes (data columns, run directory, logging, health, systems,
evaluation), none of them the algorithm: each script's `Args` holds that. Parsed with `Args`
(`common.cli.parse_args(Args, RunFlags)`), read by `common.session`. Light on purpose: parsing must not import torch.
"""

import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path

from common.cli import arg, require


def vllm_available() -> bool:
    """Is vLLM installed? (Without importing it: that takes seconds.)"""
    return importlib.util.find_spec("vllm") is not None


@dataclass
class RunFlags:
    RESUMABLE = True  # by default `--resume` may change these flags: they say how a run goes, not what it trains
    START_FLAGS = ("resume", "overwrite", "output_dir")  # of one start: `--resume` never takes them from the record

    # Data: which columns of --dataset hold what.
    problem_field: str | None = arg(
        None, "dataset column holding the problem (default: known per dataset, else 'problem')", resumable=False
    )
    answer_field: str | None = arg(
        None, "dataset column holding the gold answer (default: known per dataset, else 'answer')", resumable=False
    )
    solution_field: str | None = arg(
        None, "dataset column holding a reference solution (EDGE-GRPO's GEC)", resumable=False
    )
    bad_rows: str = arg(
        "error",
        "rows without a problem or a usable answer: refuse the data, or drop them",
        ["error", "drop"],
        resumable=False,
    )
    # Run directory and checkpoints.
    output_dir: str | None = arg(
        None, "run directory (default: runs/<script name>): metrics.jsonl, run_config.json, checkpoint-N/, model/"
    )
    resume: bool = arg(False, "continue the run in --output_dir from its newest good checkpoint")
    overwrite: bool = arg(False, "delete the run --output_dir holds and start a new one there")
    save_minutes: float = arg(
        30.0, "save a checkpoint at the first step ending this many minutes after the last save (0: off)", at_least=0
    )
    save_steps: int = arg(
        0, "also save a checkpoint every N steps (0: off); the last step and a SIGTERM / Ctrl-C always save", at_least=0
    )
    keep_last: int = arg(
        2, "complete checkpoints kept (0: all); none is written on schedule while updates are skipped", at_least=0
    )
    # Logging.
    report_to: str = arg(
        "none",
        "experiment trackers beside metrics.jsonl, comma-separated, as accelerate names them: tensorboard, wandb, ...",
    )
    project: str = arg("grpo-zoo", "tracker project name (W&B project, TensorBoard top directory, ...)")
    run_name: str | None = arg(None, "tracker run name (default: the name of --output_dir)")
    log_every: int = arg(0, "print a line of the step's figures every N steps (0: the progress bar only)", at_least=0)
    log_samples: int = arg(
        4,
        "completions of each step written to samples.jsonl, one per group in turn (prompt, completion, reward, advantage)",
        at_least=0,
    )
    # Health: a run that diverges or cannot learn says so.
    max_nonfinite_steps: int = arg(
        3,
        "stop after this many optimiser steps in a row with a NaN/inf loss or gradient norm, each skipped (0: never stop)",
        at_least=0,
    )
    grad_spike_factor: float = arg(
        0.0,
        "skip an update whose gradient norm exceeds this many times the median of the last 50 (0: off; e.g. 10)",
        at_least=0,
    )
    warn_flat_steps: int = arg(
        10, "warn when every group's rewards have been equal for this many steps in a row (0: never)", at_least=0
    )
    # Systems: how the work is laid out on the hardware (none of these changes what is trained).
    rollout: str = arg("vllm" if vllm_available() else "hf", "rollout engine", ["vllm", "hf"])
    precision: str = arg(
        "auto",
        "auto: bf16-mixed on GPU, fp32 on CPU; bf16-mixed: fp32 weights + bf16 autocast, vLLM and the reference model in bf16 "
        "(the GPU's mode, on CPU too); bf16: bf16 weights too (half the memory, but lr-1e-6 updates round away); fp32",
        ["auto", "bf16-mixed", "bf16", "fp32"],
        resumable=False,
    )
    micro_batch_size: int = arg(
        32,
        "sequences per forward/backward (gradients accumulate beyond), if --max_tokens_per_micro_batch is 0",
        at_least=1,
    )
    max_tokens_per_micro_batch: int = arg(
        0, "if > 0: micro-batches of length-sorted sequences, each within this many (padded) tokens", at_least=0
    )
    micro_batch_memory_gb: float = arg(
        0.0,
        "activation memory a micro-batch may take, estimated from the model's shape: caps --micro_batch_size's "
        "sequences by their padded tokens (0: 1/8 of the device's memory)",
        at_least=0,
    )
    gradient_checkpointing: bool = arg(False, "recompute activations in backward to save memory")
    attn_implementation: str = arg(
        "auto",
        "the trainer's attention (auto: transformers' default, SDPA); flash_attention_2 needs the flash-attn package",
        ["auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention"],
    )
    padding_free: str = arg(
        "auto",
        "training and scoring passes on the real tokens only, packed into one row (auto: with flash or flex attention)",
        ["auto", "on", "off"],
    )
    share_prompts: bool = arg(
        True,
        "training and scoring passes compute each prompt once for all its completions (one row per group, "
        "a 4D attention mask) where that computes less (docs/SCALING.md#shared-prompts); SDPA and eager attention",
    )
    vllm_gpu_memory_utilization: float = arg(
        0.3, "share of GPU memory vLLM may take (weights + KV cache)", above=0, at_most=1
    )
    vllm_sleep: bool = arg(False, "release vLLM's GPU memory during the update (GPU only)")
    vllm_max_num_seqs: int = arg(
        0, "sequences vLLM decodes at once (0: this rank's whole rollout, at most 1024)", at_least=0
    )
    vllm_max_num_batched_tokens: int = arg(
        0, "tokens per vLLM forward, prefill chunks included (0: vLLM's default)", at_least=0
    )
    per_prompt_seeds: bool = arg(
        True,
        "vLLM: seed each prompt from its place in the global batch (samples independent of the process layout); "
        "false: the per-rank engine seed only (reproducible for the same layout; faster decoding on vLLM's V1 runner)",
    )
    # Completions: where the rollout and the evaluation cut them.
    stop: str | None = arg(
        None,
        "stop strings (vLLM's / TRL's stop): a completion ends before the first, comma-separated or repeated, "
        "\\n a new line; few-shot prompts without chat markup add their own ('\\nQuestion:' under plain)",
        resumable=False,
        repeatable=True,
    )
    # Reward checking.
    verifier_workers: int = arg(
        0, "math-verify child processes per rank (0: automatic, docs/algorithms/grpo_base.md)", at_least=0
    )
    verifier_memory_mb: int = arg(2048, "address-space limit of each math-verify child in MB (0: none)", at_least=0)
    reward_time_budget_s: float = arg(
        60.0,
        "seconds per step for symbolic answer checks; a group with an answer left unchecked trains on nothing (0: no limit)",
        at_least=0,
    )
    # Evaluation during training (logged as eval/<benchmark>/pass@k).
    eval_steps: int = arg(0, "evaluate every N steps, before the first and after the last (0: never)", at_least=0)
    eval_before: bool = arg(True, "with --eval_steps: evaluate the policy before the first step too")
    eval_benchmarks: str = arg(
        "synthetic",
        "comma-separated benchmark names (docs/EVALUATION.md), each optionally name=FILE or name=DIR holding "
        "name.jsonl (offline: local copies), FILE:problem=FIELD:answer=FIELD for a file in other fields",
    )
    eval_n: int = arg(4, "samples per eval problem: pass@1 is their mean, pass@k for k = 1, 2, 4 .. <= n", at_least=1)
    eval_temperature: float = arg(
        0.6, "eval sampling temperature; 0: greedy decoding (with --eval_n 1); vLLM takes 0.01 to 2", at_least=0
    )

    @staticmethod
    def recorded_flags(values: dict, script: str | None) -> tuple[dict, Path] | None:
        """`--resume` at parse time: what the run in --output_dir recorded (`common.run_dir.recorded_flags`)."""
        from common.run_dir import recorded_flags

        output_dir = values.get("output_dir") or (f"runs/{script}" if script else None)
        return recorded_flags(output_dir, script) if output_dir else None

    @staticmethod
    def refused_changes(path: Path, changed: dict) -> str:
        """See `common.run_dir.refused_changes`."""
        from common.run_dir import refused_changes

        return refused_changes(path, changed)

    def validate(self) -> None:
        """Cross-flag checks, before anything loads: one line each."""
        from common.prompts import parse_stop

        try:
            parse_stop(self.stop)
        except ValueError as e:
            require(False, str(e))
        require(
            not (self.resume and self.overwrite),
            "--resume and --overwrite contradict each other: continue the run, or start it over",
        )
        require(
            self.rollout != "vllm" or vllm_available(),
            "--rollout vllm: vLLM is not installed here (CPU: bash scripts/setup_cpu.sh; GPU: pip install -r "
            "requirements.txt); or sample with --rollout hf (a resume may change it)",
        )
        for name in filter(None, self.report_to.split(",")) if self.report_to != "none" else []:  # accelerate's names
            require(
                importlib.util.find_spec(name) is not None,
                f"--report_to {name}: no package {name} is installed (pip install {name})",
            )
        flash = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
        package = flash.get(self.attn_implementation)
        require(
            package is None or importlib.util.find_spec(package) is not None,
            f"--attn_implementation {self.attn_implementation}: the {package} package is not installed "
            "(pip install flash-attn --no-build-isolation on a CUDA machine), or use flex_attention or sdpa",
        )
        if self.eval_steps:  # sampling the rollout engine would refuse at the first evaluation, or change
            _check_sampling(self.rollout, self.eval_temperature, self.eval_n, "--eval_temperature", "--eval_n")


def launch_world() -> int:
    """The processes of this launch: WORLD_SIZE, set by torchrun (`accelerate launch`); 1 for `python script.py`."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_batch_split(prompts_per_step: int, group_size: int, num_minibatches: int, world: int) -> None:
    """Each rank owns --prompts_per_step / world whole groups and splits its rows into --num_minibatches steps: both
    must divide per rank (on the global batch, 8 ranks at 24 x 8 with 64 mini-batches would leave mini-batches of 0)."""
    require(
        prompts_per_step % world == 0,
        f"--prompts_per_step={prompts_per_step} must divide by the {world} processes: each rank owns whole prompt groups",
    )
    rows = prompts_per_step // world * group_size
    divisors = [d for d in range(1, rows + 1) if rows % d == 0]
    require(
        rows % num_minibatches == 0,
        f"--num_minibatches={num_minibatches} must divide each rank's rows: --prompts_per_step {prompts_per_step} / "
        f"{world} process{'es' * (world > 1)} x --group_size {group_size} = {rows}; use one of {', '.join(map(str, divisors))}",
    )


# vLLM 0.32's SamplingParams raises a temperature in (0, 0.01) to 0.01 (in its log only) and refuses one above 2.
VLLM_LOWEST, VLLM_HIGHEST = 0.01, 2.0


def sampling_problem(rollout: str, temperature: float, n: int, flags: dict[str, str]) -> str | None:
    """Why the `rollout` engine would refuse, or silently change, sampling `n` completions at `temperature`, as a
    line naming the caller's `flags`; None when it samples as asked. Temperature 0 is one completion a prompt:
    n repeats of it would give a pass@k that is pass@1."""
    t, samples, engine = flags["temperature"], flags["n"], flags["rollout"]
    if not math.isfinite(temperature):
        return f"{t} {temperature:g}: a temperature is a finite number (0 for greedy decoding)"
    if temperature == 0 and n > 1:
        lowest = f"of at least {VLLM_LOWEST:g}" if rollout == "vllm" else "above 0"
        return (
            f"{t} 0 is greedy decoding, one completion a prompt: use {samples} 1 (not {n}), or a temperature "
            f"{lowest} to sample {n}"
        )
    if rollout != "vllm":
        return None
    if 0 < temperature < VLLM_LOWEST:
        return (
            f"{t} {temperature:g}: vLLM samples at {VLLM_LOWEST:g} at the lowest (it would raise it, saying so only in "
            f"its log); use {VLLM_LOWEST:g} or more" + (", or 0 for greedy decoding" if n == 1 else "")
        )
    if temperature > VLLM_HIGHEST:
        return f"{t} {temperature:g}: vLLM samples at temperatures up to {VLLM_HIGHEST:g}; use {engine} hf above it"
    return None


def check_rollout_sampling(rollout: str, temperature: float, group_size: int) -> None:
    """The rollout's sampling as its engine takes it: vLLM would raise a temperature under 0.01 to 0.01 while the
    trainer scores at the asked one (every ratio off), and refuses one above 2."""
    _check_sampling(rollout, temperature, group_size, "--temperature", "--group_size")


def _check_sampling(rollout: str, temperature: float, n: int, temperature_flag: str, n_flag: str) -> None:
    """See `sampling_problem`."""
    names = {"temperature": temperature_flag, "n": n_flag, "rollout": "--rollout"}
    problem = sampling_problem(rollout, temperature, n, names)
    require(problem is None, str(problem))


def check_correction(mode: str, low: float | None, high: float | None, top_p: float) -> None:
    """--rollout_correction's flags together. No correction with --top_p < 1: the engines' log-probs are renormalised
    over the nucleus, the trainer's are not, so pi_old / pi_rollout sits below 1 by the dropped mass (and the nucleus
    comes from the engine's bf16 logits: the trainer cannot rebuild it exactly, nor cheaply)."""
    require(
        mode in ("auto", "none") or top_p == 1,
        f"--rollout_correction {mode} with --top_p {top_p:g}: the rollout's log-probs are renormalised over the "
        "top-p nucleus and the trainer's are not, so the weights would sit below 1; use --top_p 1 or "
        "--rollout_correction none",
    )
    require(
        mode != "none" or (low is None and high is None),
        "--rollout_correction_min / _max with --rollout_correction none: nothing to bound; name a mode",
    )
    if low is not None and high is not None:
        require(
            low < high,
            f"--rollout_correction_min {low:g} is not below --rollout_correction_max {high:g}: nothing would be kept",
        )
