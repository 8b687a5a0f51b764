"""EDGE-GRPO (Zhang et al. 2025, arXiv 2507.21848): GRPO + Guided Error Correction + Entropy-Driven Advantage.

grpo_base.py plus two switchable remedies for "advantage collapse" (all G rewards equal -> A = 0):
- GEC: each incorrect completion (accuracy 0) is edited before scoring: p = 0.5, its EOS is dropped,
  REFLECTION appended and the policy continues (<= --gec_max_new_tokens) through the same rollout
  engine; p = 0.25, INJECTION of the gold answer + EOS is appended; p = 0.25, it is replaced by the
  reference solution + EOS. Rewards are recomputed; edits are trained on whole (as the authors' code).
- EDA (eqs. 3, 4, 6, 7): P_i = mean over o_i's tokens of H(softmax(logits_t / T)) under pi_old;
  A_hat_i = A_i / P_hat_i with P_hat_i = P_i / mean_group(P).
Ablations (Tables 1-2): Vanilla `--gec off --eda false`; +Force-R `--gec reflection_only --eda false`;
+Force-R & EDA `--gec reflection_only`; EDGE-GRPO: the defaults. Every decision where the paper is
silent (P_i under pi_old, floors, GEC seeding, the loss aggregation): docs/algorithms/edge_grpo.md.

    python edge_grpo.py                  # CPU demo: tiny model, synthetic arithmetic

"""

import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate.utils import set_seed
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.batching import pack, pad_right, select
from common.checkpoint import load_checkpoint, model_to_load, save_checkpoint
from common.cli import arg, check_run_flags, clear_errors, parse_args, require
from common.data import TEMPLATE_CHOICES, PromptSampler, load_prompts
from common.distributed import (
    global_sum,
    load_reference_model,
    make_accelerator,
    micro_batch,
    micro_batch_plan,
    peak_memory_gb,
    reduce_metrics,
    state_dict_for_sync,
)
from common.evaluate import evaluate, load_benchmarks, write_results
from common.health import NonFiniteGuard, SignalWatch
from common.logprobs import masked_mean, sequence_logprobs
from common.metrics import PhaseTimer, RunLogger, quiet_libraries
from common.rewards import MathVerifier, accuracy_reward, compute_rewards, default_workers
from common.rollout import Completion, check_context_length, make_engine, prompt_seeds, vllm_available
from common.run_dir import check_run_dir, start_run_dir


@dataclass
class Args:
    # What to train. Defaults run the CPU demo; the README gives each paper's real setting.
    model: str = arg("tiny", "HF hub name or local path; 'tiny' builds (or reuses) the CPU demo model")
    dataset: str = arg("synthetic-arith", "hub name, local .jsonl/.parquet, or 'synthetic-arith'")
    problem_field: str | None = arg(None, "dataset column holding the problem (default: known per dataset)")
    answer_field: str | None = arg(None, "dataset column holding the gold answer")
    solution_field: str | None = arg(None, "dataset column holding a reference solution")
    bad_rows: str = arg(
        "error", "rows without a problem or a usable answer: refuse the data, or drop them", ["error", "drop"]
    )
    template: str = arg(
        "qwen_math", "prompt template; *_native: rendered by the model's own chat template", TEMPLATE_CHOICES
    )
    rewards: str = arg("boxed_format,accuracy", "comma-separated reward terms: accuracy, boxed_format, think_format")
    output_dir: str = arg(f"runs/{Path(__file__).stem}", "run directory: metrics.jsonl, config.json, checkpoints")
    steps: int = arg(30, "optimisation steps (one rollout batch each)")
    epochs: float | None = arg(None, "if set, overrides --steps: passes over the dataset")
    prompts_per_step: int = arg(16, "prompts per step over all ranks; each gets --group_size completions")
    max_prompt_len: int = arg(512, "prompts longer than this (tokens) are dropped at load time")
    max_completion_len: int = arg(48, "max new tokens per completion")
    lr: float = arg(2e-4, "AdamW learning rate (the papers use 1e-6 on 1.5B-7B models)")
    warmup_steps: int = arg(0, "linear learning-rate warm-up steps")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    grad_clip: float = arg(1.0, "max global grad norm")
    micro_batch_size: int = arg(
        32, "sequences per forward/backward (gradient accumulation beyond), if --max_tokens_per_micro_batch is 0"
    )
    max_tokens_per_micro_batch: int = arg(
        0, "if > 0: micro-batches of length-sorted sequences, each within this many (padded) tokens"
    )
    seed: int = arg(0, "random seed (data order, sampling, init)")
    save_steps: int = arg(0, "save a checkpoint every N steps (0: only at the end)")
    keep_last: int = arg(2, "checkpoints kept on disk (0: all)")
    resume: bool = arg(False, "continue the run in --output_dir from its latest complete checkpoint")
    overwrite: bool = arg(False, "delete the run --output_dir holds and start a new one there")
    max_nonfinite_steps: int = arg(
        3,
        "stop the run after this many optimiser steps in a row with a NaN/inf loss or grad norm (each is skipped; 0: never stop)",
    )
    report_to: str = arg(
        "none", "experiment trackers beside metrics.jsonl: tensorboard, wandb, trackio, ... (accelerate's)"
    )
    log_samples: int = arg(
        4, "completions of each step written to samples.jsonl (prompt, completion, reward, advantage)"
    )
    warn_flat_steps: int = arg(
        10, "warn when every group's rewards have been equal for this many steps in a row (0: never)"
    )
    # The method. Defaults: docs/algorithms/edge_grpo.md (the authors' launch script).
    group_size: int = arg(8, "G: completions per prompt")
    temperature: float = arg(0.6, "sampling temperature T; log-probs are computed from logits / T")
    top_p: float = arg(1.0, "nucleus sampling")
    eps_low: float = arg(0.2, "clip range: rho >= 1 - eps_low")
    eps_high: float = arg(0.2, "clip range: rho <= 1 + eps_high")
    beta: float = arg(0.0, "k3 KL weight to the initial model (0: no reference model is loaded)")
    loss_agg: str = arg(
        "seq-mean-token-mean", "loss aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
    )
    mu: int = arg(1, "optimisation passes over each rollout batch")
    num_minibatches: int = arg(1, "optimiser steps per pass (the rollout batch split in this many)")
    gec: str = arg(
        "full",
        "Guided Error Correction of incorrect completions: full (0.5 / 0.25 / 0.25), reflection_only (+Force-R: p = 1), off",
        ["full", "reflection_only", "off"],
    )
    gec_max_new_tokens: int = arg(256, "GEC reflection branch: tokens the policy may add after the reflection prompt")
    eda: bool = arg(
        True, "Entropy-Driven Advantage A_i / (P_i / mean_group(P)) (eqs. 6, 7); `--eda false` turns it off"
    )
    eda_entropy_grad: bool = arg(False, "EDA with P_i from the training pass, gradient through 1 / P_i (authors' code)")
    # Systems.
    rollout: str = arg("vllm" if vllm_available() else "hf", "rollout engine", ["vllm", "hf"])
    precision: str = arg(
        "auto",
        "auto: fp32 weights + bf16 autocast on GPU, fp32 on CPU; bf16: bf16 weights too (half the memory, but lr-1e-6 updates round away)",
        ["auto", "bf16", "fp32"],
    )
    vllm_gpu_memory_utilization: float = arg(0.3, "share of GPU memory vLLM may take (weights + KV cache)")
    vllm_sleep: bool = arg(False, "release vLLM's GPU memory during the update (GPU only)")
    vllm_max_num_seqs: int = arg(0, "sequences vLLM decodes at once (0: this rank's whole rollout, at most 1024)")
    vllm_max_num_batched_tokens: int = arg(0, "tokens per vLLM forward, prefill chunks included (0: vLLM's default)")
    gradient_checkpointing: bool = arg(False, "recompute activations in backward to save memory")
    tis_cap: float = arg(
        0.0,
        "if > 0: weight each token's loss by min(pi_old / pi_rollout, tis_cap), correcting vLLM-vs-trainer mismatch",
    )
    verifier_workers: int = arg(0, "math-verify child processes per rank (0: a quarter of the cores, 1 to 4)")
    verifier_memory_mb: int = arg(2048, "address-space limit of each math-verify child in MB (0: none)")
    reward_time_budget_s: float = arg(
        60.0, "seconds per step for symbolic answer checks; answers unchecked by then score 0 (reward/timeouts)"
    )
    # Periodic evaluation (common/evaluate.py), logged as eval/<benchmark>/pass@k.
    eval_steps: int = arg(0, "evaluate every N steps and after the last (0: never)")
    eval_benchmarks: str = arg("synthetic", "comma-separated benchmark names (common.evaluate.BENCHMARKS) or name=FILE")
    eval_n: int = arg(4, "samples per eval problem: pass@1 is their mean, pass@k for k = 1, 2, 4 .. <= n")
    eval_temperature: float = arg(0.6, "eval sampling temperature")


def validate(args: Args) -> None:
    """Refuse flag combinations that would fail deep inside torch or train silently wrong."""
    check_run_flags(args)
    require(
        args.group_size >= 2,
        f"--group_size must be >= 2 (got {args.group_size}): GRPO compares completions within a group",
    )
    n = args.prompts_per_step * args.group_size
    require(
        n % args.num_minibatches == 0,
        f"--num_minibatches={args.num_minibatches} must divide prompts_per_step * group_size = {n}",
    )
    require(0 <= args.eps_low < 1 and args.eps_high >= 0, "--eps_low must be in [0, 1) and --eps_high >= 0")
    require(args.temperature > 0, "--temperature must be > 0 (log-probs are computed from logits / T)")
    require(args.mu >= 1, "--mu must be >= 1")
    require(args.gec_max_new_tokens >= 1, "--gec_max_new_tokens must be >= 1")
    require(
        args.eda or not args.eda_entropy_grad,
        "--eda_entropy_grad needs --eda (it changes how EDA's entropy is computed)",
    )


def check_gec_data(rows: list[dict], gec: str) -> None:
    """Full GEC injects the gold answer and swaps in the reference solution: every problem needs both."""
    no_solution, no_answer = (sum(not (r[k] or "").strip() for r in rows) for k in ("solution", "answer"))
    require(
        gec != "full" or no_solution == no_answer == 0,  # reflection only needs no solution
        f"--gec full needs a reference solution and an answer for every problem, but {no_solution} of {len(rows)} rows lack a solution "
        f"and {no_answer} an answer. Name the columns with --solution_field / --answer_field, build the data with "
        "`python -m data.prepare edge` (it keeps problems with a boxed solution), or use --gec reflection_only / --gec off",
    )


def group_advantages(rewards: torch.Tensor, G: int, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each group of G (GRPO paper, eq. 3 of the four papers).

    A group whose rewards are all equal gets A = 0 ("advantage collapse").
    """
    r = rewards.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def entropy_driven_advantages(
    adv: torch.Tensor, P: torch.Tensor, P_group_mean: torch.Tensor, floor: float = 1e-6
) -> torch.Tensor:
    """EDA (eqs. 6, 7): A_hat_i = A_i / P_hat_i, P_hat_i = P_i / mean_group(P) (all [n]): confident completions get larger |A|.

    Both entropies are floored at `floor`: zero entropy gives a large but finite A_hat, an all-zero group keeps A.
    """
    return adv * P_group_mean.clamp(min=floor) / P.clamp(min=floor)


def edge_advantages(rewards: torch.Tensor, old: dict, batch: dict, G: int, args: Args) -> tuple[torch.Tensor, dict]:
    """GRPO's advantage, rescaled by EDA on pi_old's entropies (eqs. 3, 6, 7) unless --eda false;
    metrics: the advantage variance without EDA (paper Fig. 5) and the mean P_i (eq. 3)."""
    base = group_advantages(rewards, G)
    P = masked_mean(old["entropy"], batch["completion_mask"], dim=-1)  # eq. 3: each completion's mean token entropy
    adv = entropy_driven_advantages(base, P, P.view(-1, G).mean(1).repeat_interleave(G)) if args.eda else base
    return adv, {"edge/adv_var_within_group_before_eda": base.view(-1, G).var(1).mean(), "edge/entropy_P": P.mean()}


REFLECTION = " Wait! Something is wrong here."
INJECTION = (
    "\nWait! Something is wrong here. After verification, the correct answer is \\boxed{{{}}}."  # .format(answer)
)


def guided_error_correction(
    prompts,
    completions,
    accuracy,
    answers,
    solutions,
    tokenizer,
    engine,
    rng,
    mode="full",
    max_new_tokens=256,
    temperature=1.0,
    top_p=1.0,
    seeds=None,
):
    """GEC: edit every completion with accuracy 0; returns (edited completions, branch name or None each).

    mode "full": reflection (p = 0.5), answer injection (0.25), reference solution (0.25); "reflection_only"
    (+Force-R): reflection, p = 1. Reflections continue in one `engine.generate` call on prompt + completion
    + REFLECTION, each under its completion's seed (`seeds`, one per completion); the others end on the
    completion's stop token (the tokenizer's EOS if it was cut off). Inserted tokens get log-prob NaN:
    the engine never sampled them."""
    eos_id = tokenizer.eos_token_id
    reflection_ids = tokenizer(REFLECTION, add_special_tokens=False).input_ids
    edited, branches, regenerate = list(completions), [None] * len(completions), []
    for i, (c, acc) in enumerate(zip(completions, accuracy)):
        if acc > 0:
            continue
        body, body_logp = (c.token_ids[:-1], c.logprobs[:-1]) if c.finished else (c.token_ids, c.logprobs)
        eos = c.token_ids[-1] if c.finished else eos_id
        u = rng.random() if mode == "full" else 0.0  # one draw per incorrect completion, in order
        if u < 0.5:
            branches[i], new = "reflection", reflection_ids
            regenerate.append(i)
        elif u < 0.75:
            branches[i], new = (
                "injection",
                tokenizer(INJECTION.format(answers[i]), add_special_tokens=False).input_ids + [eos],
            )
        else:
            branches[i], new = "replacement", tokenizer(solutions[i], add_special_tokens=False).input_ids + [eos]
            body, body_logp = [], []
        edited[i] = Completion(body + new, body_logp + [math.nan] * len(new), finished=branches[i] != "reflection")
    if regenerate:
        seed = None if seeds is None else [seeds[i] for i in regenerate]
        conts = engine.generate(
            [prompts[i] + edited[i].token_ids for i in regenerate], 1, max_new_tokens, temperature, top_p, seed=seed
        )
        for i, [cont] in zip(regenerate, conts):
            edited[i] = Completion(
                edited[i].token_ids + cont.token_ids, edited[i].logprobs + cont.logprobs, cont.finished
            )
    return edited, branches


def gec_metrics(branches, rollout_accuracy, accuracy) -> dict:
    """Per-step counts (per rank): completions edited by each branch; edits correct afterwards (all, and reflections:
    the policy's own corrections); the policy's own accuracy before GEC."""
    fixed = [b for b, acc in zip(branches, accuracy) if b is not None and acc > 0]
    counts = {f"gec/{name}": branches.count(name) for name in ("reflection", "injection", "replacement")}
    return counts | {
        "gec/fixed": len(fixed),
        "gec/reflection_fixed": fixed.count("reflection"),
        "gec/rollout_accuracy": sum(rollout_accuracy) / len(rollout_accuracy),
    }


# True: EDA's entropies P_i are pi_old's, needed before the first update.
NEEDS_PI_OLD = True


def policy_loss(logp, old_logp, adv, mask, args, num_seqs, num_tokens, ref_logp=None, rollout_logp=None):
    """Clipped surrogate (PPO/GRPO), per token, aggregated with global denominators.

    logp/mask: [n, C] of one micro-batch; old_logp, ref_logp, rollout_logp and token-level adv
    may be wider (the whole batch's C) and are cut to C; adv: [n] or [n, C].
    num_seqs/num_tokens: sizes of the whole mini-batch this micro-batch belongs to,
    so summing micro-batch losses gives exactly the mini-batch loss.
    --tis_cap C > 0: each token's surrogate is weighted by min(pi_old / pi_rollout, C), the
    rollout engine's log-probs against the trainer's (truncated importance sampling).
    Returns the loss and token sums for the step's metrics (clipped below / above, k3 KL,
    tokens whose importance weight was capped, tokens).
    """
    C = logp.shape[1]
    adv = adv[:, None] if adv.dim() == 1 else adv[:, :C]
    old_logp = old_logp[:, :C]
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - args.eps_low, 1 + args.eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    tis = torch.ones_like(logp)
    if args.tis_cap > 0:  # engine-inserted tokens (NaN log-prob) keep weight 1
        tis = torch.exp(old_logp - rollout_logp[:, :C]).nan_to_num(nan=1.0).clamp(max=args.tis_cap).detach()
        per_token = per_token * tis
    if args.beta > 0:
        d = ref_logp[:, :C] - logp
        per_token = per_token + args.beta * (torch.exp(d) - d - 1)  # k3 estimator
    masked = per_token * mask
    if args.loss_agg == "token-mean":
        loss = masked.sum() / num_tokens
    elif args.loss_agg == "seq-mean-token-mean":
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / num_seqs
    else:  # seq-mean-token-sum-norm (Dr. GRPO): a constant denominator
        loss = masked.sum() / (num_seqs * args.max_completion_len)
    with torch.no_grad():
        sums = {
            "clip_low": (((ratio < 1 - args.eps_low) & (adv < 0)) * mask).sum().item(),  # the clip bounds a decrease
            "clip_high": (((ratio > 1 + args.eps_high) & (adv > 0)) * mask).sum().item(),  # ... an increase
            "approx_kl": ((ratio - 1 - (logp - old_logp)) * mask).sum().item(),  # k3 KL(pi_old || pi_theta)
            "tis_capped": ((tis >= args.tis_cap) * mask).sum().item() if args.tis_cap > 0 else 0.0,
            "tokens": mask.sum().item(),
        }
    return loss, sums


def old_logprobs(model, batch, args, plan, ref_model=None):
    """No-grad pass over the rollout batch, micro-batch by micro-batch (`plan`): log-probs and
    entropy under pi_old ([N, C] each) and, with a reference model, its log-probs."""
    out = {k: torch.zeros_like(batch["completion_mask"]) for k in ("logp", "entropy", "ref_logp")}
    with torch.no_grad():
        for idx in plan:
            mb = select(batch, idx)
            C = mb["completion_mask"].shape[1]
            logp, ent = sequence_logprobs(
                model, mb["input_ids"], mb["attention_mask"], args.temperature, logits_to_keep=C, with_entropy=True
            )
            out["logp"][idx, :C], out["entropy"][idx, :C] = logp[: len(idx)], ent[: len(idx)]
            if ref_model is not None:
                out["ref_logp"][idx, :C] = sequence_logprobs(
                    ref_model, mb["input_ids"], mb["attention_mask"], args.temperature, logits_to_keep=C
                )[0][: len(idx)]
    return out


def main(args: Args) -> None:
    validate(args)
    quiet_libraries()  # our progress bar and lines; library notices that need no action are filtered
    gpu = torch.cuda.is_available()
    precision = "bf16" if gpu and args.precision != "fp32" else "no"
    accelerator = make_accelerator(precision, args.grad_clip, args.micro_batch_size, args.report_to, args.output_dir)
    rank, world = accelerator.process_index, accelerator.num_processes
    require(
        args.prompts_per_step % world == 0,
        f"--prompts_per_step={args.prompts_per_step} must divide by the {world} processes: each rank owns whole prompt groups",
    )
    check_run_dir(args.output_dir, asdict(args), args.resume, args.overwrite)  # before anything loads
    set_seed(args.seed + rank)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32  # master weights
    model_path, _ = model_to_load(args.model)  # a run or checkpoint directory works too

    # Policy, optimiser, data.
    with clear_errors("--model"):
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        # GEC continues prompt + completion + reflection by up to gec_max_new_tokens.
        gec_extra_len = 0 if args.gec == "off" else len(tokenizer(REFLECTION).input_ids) + args.gec_max_new_tokens
        check_context_length(
            model_path,
            args.max_prompt_len + args.max_completion_len + gec_extra_len,
            "--max_prompt_len + --max_completion_len + GEC's reflection and --gec_max_new_tokens",
        )
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    if tokenizer.pad_token_id is None:  # padding is masked out; any id will do
        tokenizer.pad_token = tokenizer.eos_token
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    ref_model = None
    if args.beta > 0:  # only then: all four papers train without it
        ref_model = load_reference_model(model_path, torch.bfloat16 if gpu else torch.float32, accelerator.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, args.warmup_steps)))
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(scheduler)  # stepped once per optimiser step, on every rank

    rows, opens_think = load_prompts(args, tokenizer, say=print if accelerator.is_main_process else lambda _: None)
    check_gec_data(rows, args.gec)
    sampler = PromptSampler(rows, args.prompts_per_step, seed=args.seed, rank=rank, world_size=world)
    total_steps = math.ceil(args.epochs * len(rows) / args.prompts_per_step) if args.epochs else args.steps
    with clear_errors("--eval_benchmarks"):
        eval_sets = load_benchmarks(args.eval_benchmarks) if args.eval_steps else {}  # fail fast, before training

    # Rollout engine, rewards, logging.
    engine = make_engine(
        args, model_path, tokenizer, accelerator.unwrap_model(model), world, args.seed + rank, gec_extra_len
    )
    start_step = 0
    if args.resume:  # weights, optimiser, scheduler, RNG; then the data order and vLLM's copy
        state = load_checkpoint(accelerator, args.output_dir)
        start_step = state["step"]
        sampler.load_state_dict(state["sampler"])
        engine.load_weights(state_dict_for_sync(accelerator, model))
    verifier = MathVerifier(
        workers=args.verifier_workers or default_workers(),
        memory_mb=args.verifier_memory_mb,
        budget_s=args.reward_time_budget_s or None,
    )
    reward_names = args.rewards.split(",")
    if accelerator.is_main_process:  # everything has loaded: now the run directory is this run's
        start_run_dir(args.output_dir, asdict(args), args.resume, args.overwrite)
    trackers = accelerator if args.report_to != "none" else None  # TensorBoard, W&B, ... beside metrics.jsonl
    logger = RunLogger(args.output_dir, total_steps, accelerator.is_main_process, start_step, trackers, asdict(args))
    G = args.group_size
    guard, watch = (
        NonFiniteGuard(args.max_nonfinite_steps),
        SignalWatch(args.warn_flat_steps, say=logger.write if accelerator.is_main_process else lambda _: None),
    )

    def run_eval():  # every rank evaluates with its own engine; the logged numbers are means over ranks
        return evaluate(
            engine,
            tokenizer,
            eval_sets,
            args.template,
            args.eval_n,
            args.eval_temperature,
            args.max_completion_len,
            args.top_p,
            seed=args.seed + rank,
            verifier=verifier,
            max_prompt_len=args.max_prompt_len,
        )

    if args.eval_steps and start_step == 0:  # step 0: the policy before training, every curve's starting point
        logger.log(0, reduce_metrics(accelerator, run_eval()[0]), advance=False)

    metrics = {}
    for step in range(start_step, total_steps):
        timer = PhaseTimer(sync=torch.cuda.synchronize if gpu else None)
        batch_rows = sampler.next_batch()

        # 1. Rollout: G completions per prompt from pi_old.
        with timer("rollout"):
            # One seed per prompt, from its place in the global batch: the same samples on any number of ranks.
            seeds = prompt_seeds(args.seed, step, args.prompts_per_step, rank, len(batch_rows))
            groups = engine.generate(
                [r["prompt_ids"] for r in batch_rows],
                G,
                args.max_completion_len,
                args.temperature,
                args.top_p,
                seed=seeds,
            )
        rollout_rows = [r for r in batch_rows for _ in range(G)]
        completions = [c for g in groups for c in g]
        texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)

        # 1b. GEC: edit the incorrect completions; everything below scores and trains on the edited ones.
        branches, rollout_acc = [None] * len(completions), None
        if args.gec != "off":
            with timer("gec"):
                answers = [r["answer"] for r in rollout_rows]
                rollout_acc = accuracy_reward(texts, answers, verifier)
                completions, branches = guided_error_correction(
                    [r["prompt_ids"] for r in rollout_rows],
                    completions,
                    rollout_acc,
                    answers,
                    [r["solution"] for r in rollout_rows],
                    tokenizer,
                    engine,
                    random.Random(f"gec-{args.seed}-{rank}-{step}"),
                    args.gec,
                    args.gec_max_new_tokens,
                    args.temperature,
                    args.top_p,
                    seeds=prompt_seeds(
                        args.seed + 1, step, args.prompts_per_step * G, rank, len(completions)
                    ),  # one per completion
                )
                texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)

        # 2. Rewards.
        with timer("scoring"):
            rewards, accuracy = compute_rewards(
                texts, [r["answer"] for r in rollout_rows], reward_names, verifier, prompt_ends_with_think=opens_think
            )
            rewards = torch.tensor(rewards, device=accelerator.device)
            accuracy = torch.tensor(accuracy, device=accelerator.device)

        # 3. Old log-probs (and token entropy) from the trainer, before any update.
        with timer("old_logp"):
            engine.sleep()
            batch = pack(
                [r["prompt_ids"] for r in rollout_rows],
                [c.token_ids for c in completions],
                tokenizer.pad_token_id,
                accelerator.device,
            )
            mask = batch["completion_mask"]
            n = len(completions)
            on_policy = not NEEDS_PI_OLD and args.mu == 1 and args.num_minibatches == 1 and ref_model is None
            plan = micro_batch_plan(
                accelerator, model, batch, list(range(n)), args.micro_batch_size, args.max_tokens_per_micro_batch
            )
            # On-policy, pi_old's log-probs come from the update's own pass (filled in below).
            old = old_logprobs(model, batch, args, [] if on_policy else plan, ref_model)
            rollout_logp = pad_right([c.logprobs for c in completions], mask.shape[1], device=accelerator.device)

        # 4. Advantages; EDA rescales them by the group-normalised policy entropy under pi_old (eqs. 3, 6, 7).
        advantages, info = edge_advantages(rewards, old, batch, G, args)

        # 5. Clipped-surrogate updates: mu passes, num_minibatches optimiser steps each.
        with timer("update"):
            model.train()
            mb_size = n // args.num_minibatches
            sums = dict.fromkeys(("clip_low", "clip_high", "approx_kl", "tis_capped", "tokens", "loss", "skipped"), 0.0)
            for _ in range(args.mu):
                order = torch.randperm(n).tolist() if args.num_minibatches > 1 else list(range(n))
                for start in range(0, n - mb_size + 1, mb_size):
                    rows_mb = order[start : start + mb_size]
                    if args.num_minibatches > 1:
                        plan = micro_batch_plan(
                            accelerator, model, batch, rows_mb, args.micro_batch_size, args.max_tokens_per_micro_batch
                        )
                    # Global denominators: DDP averages gradients over ranks, so per-rank
                    # losses are divided by (global count / world) to make the mean exact.
                    num_tokens = global_sum(accelerator, mask[rows_mb].sum().item()) / world
                    step_loss = 0.0
                    for i, idx in enumerate(plan):
                        mb = select(batch, idx)
                        with micro_batch(accelerator, model, last=i == len(plan) - 1):  # grads sync on the last
                            logp, ent = sequence_logprobs(
                                model,
                                mb["input_ids"],
                                mb["attention_mask"],
                                args.temperature,
                                logits_to_keep=mb["completion_mask"].shape[1],
                                with_entropy=on_policy or args.eda_entropy_grad,
                            )
                            if on_policy:  # pi_old is this very policy: its log-probs are this pass's, detached
                                old["logp"][idx, : logp.shape[1]] = logp.detach()[: len(idx)]
                                old["entropy"][idx, : logp.shape[1]] = ent.detach()[: len(idx)]
                            adv = advantages[mb["rows"]]
                            # --eda_entropy_grad (authors' code): P_i from this pass, with its gradient through 1 / P_i.
                            if args.eda_entropy_grad:
                                P_mean = (
                                    masked_mean(old["entropy"], mask, dim=-1).view(-1, G).mean(1).repeat_interleave(G)
                                )
                                adv = entropy_driven_advantages(
                                    group_advantages(rewards, G)[mb["rows"]],
                                    masked_mean(ent, mb["completion_mask"], dim=-1),
                                    P_mean[mb["rows"]],
                                )
                            loss, stats = policy_loss(
                                logp,
                                old["logp"][mb["rows"]],
                                adv,
                                mb["completion_mask"],
                                args,
                                len(rows_mb),
                                num_tokens,
                                old["ref_logp"][mb["rows"]],
                                rollout_logp[mb["rows"]],
                            )
                            accelerator.backward(loss)
                        step_loss += loss.item()
                        sums = {k: v + stats.get(k, 0.0) for k, v in sums.items()}
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)
                    # The mini-batch loss (each rank holds its share x world); a NaN/inf update is skipped.
                    step_loss = global_sum(accelerator, step_loss) / world
                    if guard.check(step + 1, step_loss, grad_norm, scheduler.get_last_lr()[0]):
                        optimizer.step()
                        scheduler.step()
                    sums["loss"] += step_loss
                    sums["skipped"] += guard.in_a_row > 0
                    optimizer.zero_grad()

        # 6. Sync: the rollout engine samples from the new policy next step.
        with timer("sync"):
            engine.load_weights(state_dict_for_sync(accelerator, model))

        # 7. Log.
        r_grp = rewards.view(-1, G)
        lengths = mask.sum(-1)
        step_s = sum(timer.seconds.values())
        tok = global_sum(
            accelerator,
            {k: sums[k] for k in ("clip_low", "clip_high", "approx_kl", "tis_capped", "tokens")}
            | {"entropy": (old["entropy"] * mask).sum().item(), "mask": mask.sum().item()},
        )
        metrics = {
            "train/reward": rewards.mean(),
            "train/accuracy": accuracy.mean(),
            "train/response_len": lengths.mean(),
            "train/truncated_frac": sum(not c.finished for c in completions) / n,
            "train/entropy": tok["entropy"] / max(tok["mask"], 1),
            "train/zero_adv_group_frac": (r_grp.max(1).values == r_grp.min(1).values).float().mean(),
            "train/adv_var_within_group": (
                advantages if advantages.dim() == 1 else masked_mean(advantages, mask, dim=-1)
            )
            .view(-1, G)
            .var(1)
            .mean(),
            "train/rollout_logp_gap": masked_mean(
                (rollout_logp.nan_to_num() - old["logp"]).abs(), mask * rollout_logp.isfinite()
            ),
            "train/grad_norm": math.nan
            if grad_norm is None
            else grad_norm,  # None: DeepSpeed clips inside its own step
            "train/lr": scheduler.get_last_lr()[0],
            "train/clip_frac_low": tok["clip_low"] / max(tok["tokens"], 1),
            "train/clip_frac_high": tok["clip_high"] / max(tok["tokens"], 1),
            "train/approx_kl": tok["approx_kl"] / max(tok["tokens"], 1),
            "train/tis_capped_frac": tok["tis_capped"] / max(tok["tokens"], 1),
            "train/loss": sums["loss"] / (args.mu * args.num_minibatches),
            "train/skipped_steps": sums["skipped"],
            "reward/timeouts": verifier.take_timeouts(),
            **info,
            **gec_metrics(branches, rollout_acc or accuracy.tolist(), accuracy.tolist()),
            **{f"time/{k}_s": v for k, v in timer.seconds.items()},
            "time/step_s": step_s,
            "time/tokens_per_s": lengths.sum() / step_s,
            "time/peak_mem_gb": peak_memory_gb(),
        }
        if args.eval_steps and ((step + 1) % args.eval_steps == 0 or step + 1 == total_steps):
            with timer("eval"):
                summary, records = run_eval()
            metrics |= summary | {"time/eval_s": timer.seconds["eval"]}
            if step + 1 == total_steps and accelerator.is_main_process:
                write_results(
                    args.output_dir,
                    summary,
                    records,
                    {"step": step + 1, "benchmarks": args.eval_benchmarks, "n": args.eval_n},
                )
        metrics = reduce_metrics(accelerator, {k: float(v) for k, v in metrics.items()})
        metrics["train/epoch"] = sampler.epoch
        logger.log(step + 1, metrics)
        logger.log_samples(
            step + 1,
            [  # the first group's first completions, to read what the policy writes
                {
                    "problem": rollout_rows[i]["problem"],
                    "completion": texts[i],
                    "reward": rewards[i],
                    "advantage": advantages[i].mean(),
                }
                for i in range(min(args.log_samples, n))
            ],
        )
        watch.update(step + 1, metrics["train/zero_adv_group_frac"], metrics["train/truncated_frac"])
        if (args.save_steps and (step + 1) % args.save_steps == 0) or step + 1 == total_steps:
            save_checkpoint(
                accelerator,
                model,
                tokenizer,
                args.output_dir,
                step + 1,
                {"sampler": sampler.state_dict()},
                args.keep_last,
                export=step + 1 == total_steps,  # the final model at the run's root: output_dir/model
            )

    logger.close(metrics)  # one closing line: the final figures and where the model is
    verifier.close()


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__))
