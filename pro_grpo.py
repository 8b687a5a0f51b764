"""Pro-GRPO (Li et al. 2026, arXiv 2602.05281): GRPO + the Advantage Re-weighting Mechanism, one file.

grpo_base.py plus one idea: in groups with both right and wrong answers, each
advantage moves by how much more confident pi_old was in the prompt than in the
answer (`diff grpo_base.py pro_grpo.py`).

    A_i    = (r_i - mean(r)) / (std(r) + 1e-6)                      (unbiased std)
    c(o|q) = exp(mean_{t in T_low(o)} log pi_old(o_t | q, o_<t))    (eq. 6)
    c(q)   = exp(mean_{t in T_low(q)} log pi_old(q_t | q_<t))       (eq. 5)
    A~_i   = A_i + alpha * (c(q) - c(o_i|q))  in mixed groups, else A_i  (eq. 4, Algorithm 1)
    loss   = -min(rho * A~_i, clip(rho, 1 - eps_low, 1 + eps_high) * A~_i), token-mean (eq. 7)

T_low(x) is the ceil(20%) positions (at least one) of x whose token has the
lowest probability (`common.lowprob`). An answer more confident than the prompt
is pushed down, an unsure one up, so probability mass spreads over the correct
paths instead of collapsing onto the likeliest. `--confidence_rule` gives
Table 7's variants; `--confidence_baseline group_mean` the appendix's baseline
(eqs. 10, 18), which differs from eq. 4's c(q). Every decision where the paper
is silent or inconsistent: docs/algorithms/pro_grpo.md.

    python pro_grpo.py                   # CPU demo: tiny model, synthetic arithmetic

"""

import math
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
from common.lowprob import low_prob_confidence, low_prob_mask
from common.metrics import PhaseTimer, RunLogger, quiet_libraries
from common.rewards import MathVerifier, compute_rewards, default_workers
from common.rollout import check_context_length, make_engine, prompt_seeds, vllm_available
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
    rewards: str = arg("accuracy", "comma-separated reward terms: accuracy, boxed_format, think_format")
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
    # The method. Defaults: docs/algorithms/pro_grpo.md (the paper's Table 1).
    group_size: int = arg(8, "G: completions per prompt")
    temperature: float = arg(1.0, "sampling temperature T; log-probs are computed from logits / T")
    top_p: float = arg(1.0, "nucleus sampling")
    eps_low: float = arg(0.2, "clip range: rho >= 1 - eps_low")
    eps_high: float = arg(0.28, "clip range: rho <= 1 + eps_high (Table 1: [0.8, 1.28])")
    beta: float = arg(0.0, "k3 KL weight to the initial model (0: no reference model is loaded)")
    loss_agg: str = arg(
        "token-mean", "loss aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
    )
    mu: int = arg(1, "optimisation passes over each rollout batch")
    num_minibatches: int = arg(1, "optimiser steps per pass (the rollout batch split in this many)")
    alpha: float = arg(0.3, "re-weighting strength in eq. 4 (Table 6: 0 = plain GRPO, 0.3 best)")
    confidence_rule: str = arg(
        "cq-co",
        "bonus in mixed groups (Table 7): b - c(o), 1 - c(o), 1 - b - c(o), b the baseline",
        ["cq-co", "1-co", "1-cq-co"],
    )
    confidence_baseline: str = arg(
        "prompt",
        "b: the prompt confidence c(q) (eq. 4) or the group's mean answer confidence (appendix eqs. 10, 18)",
        ["prompt", "group_mean"],
    )
    low_prob_frac: float = arg(0.2, "share of positions in T_low (Sec. 3.2); 1.0 = plain length-normalised likelihood")
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
    require(
        math.isfinite(args.alpha) and args.alpha >= 0,
        f"--alpha must be a finite number >= 0 (got {args.alpha}; 0 is plain GRPO)",
    )
    require(0 < args.low_prob_frac <= 1, f"--low_prob_frac must be in (0, 1] (got {args.low_prob_frac})")


def group_advantages(rewards: torch.Tensor, G: int, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each group of G (GRPO paper, eq. 3 of the four papers).

    A group whose rewards are all equal gets A = 0 ("advantage collapse").
    """
    r = rewards.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def prompt_confidence(prompt_logp: torch.Tensor, prompt_mask: torch.Tensor, fraction: float = 0.2) -> torch.Tensor:
    """c(q) of eq. 5 per row, from old_logprobs()'s prompt_logp [N, P-1] = log p(q_t | q_<t) for columns 1..P-1.

    prompt_mask [N, P] marks real prompt tokens (left padding is 0). A position
    counts only if the token before it is real too: a prompt's first token is
    predicted from nothing (or from padding), so it is left out.
    """
    predicted = prompt_mask[:, 1:] * prompt_mask[:, :-1]
    return low_prob_confidence(prompt_logp, predicted, fraction)


def reweighted_advantages(
    adv: torch.Tensor,
    rewards: torch.Tensor,
    b: torch.Tensor,
    c_o: torch.Tensor,
    G: int,
    alpha: float,
    rule: str = "cq-co",
):
    """A~_i = A_i + alpha * bonus_i in mixed groups, A_i elsewhere (eq. 4, Algorithm 1 lines 10-27).

    adv, rewards, c_o: [N], groups of G consecutive completions; b: [N // G], the baseline
    confidence of each group (c(q), or the group's mean c(o)). bonus (Table 7): "cq-co"
    b - c(o_i|q) (the method), "1-co" 1 - c(o_i|q), "1-cq-co" 1 - b - c(o_i|q). A group is
    mixed when its rewards are not all equal (0 < sum r < G for 0/1 rewards).
    Returns (A~ [N], mixed [N // G] bool).
    """
    r = rewards.view(-1, G)
    mixed = r.max(1).values != r.min(1).values
    b = b.repeat_interleave(G)
    bonus = {"cq-co": b - c_o, "1-co": 1 - c_o, "1-cq-co": 1 - b - c_o}[rule]
    return adv + alpha * bonus * mixed.repeat_interleave(G), mixed


def pro_advantages(rewards: torch.Tensor, old: dict, batch: dict, G: int, args: Args) -> tuple[torch.Tensor, dict]:
    """Pro-GRPO's advantage step on pi_old's prompt and answer log-probs, and its metrics
    (confidences, the re-weighting; NaN when a step has no such completion)."""
    mask = batch["completion_mask"]
    # c(q): the G rows of a prompt hold the same value; one per group.
    c_q = prompt_confidence(old["prompt_logp"], batch["prompt_mask"], args.low_prob_frac).view(-1, G).mean(1)
    c_o = low_prob_confidence(old["logp"], mask, args.low_prob_frac)
    base = group_advantages(rewards, G)
    b = c_q if args.confidence_baseline == "prompt" else c_o.view(-1, G).mean(1)
    adv, mixed = reweighted_advantages(base, rewards, b, c_o, G, args.alpha, args.confidence_rule)
    in_mixed = mixed.repeat_interleave(G)
    return adv, {
        "pro/conf_prompt": c_q.mean(),
        "pro/conf_answer_correct": c_o[rewards > 0].mean(),
        "pro/conf_answer_incorrect": c_o[rewards <= 0].mean(),
        "pro/lowprob_token_prob": masked_mean(old["logp"].exp(), low_prob_mask(old["logp"], mask, args.low_prob_frac)),
        "pro/mixed_group_frac": mixed.float().mean(),
        "pro/bonus_abs": (adv - base)[in_mixed].abs().mean(),
        "pro/adv_sign_flip_frac": (torch.sign(adv) != torch.sign(base))[in_mixed].float().mean(),
    }


# True: the confidences c(q), c(o) are pi_old's, needed before the first update.
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
    entropy under pi_old ([N, C] each) and, with a reference model, its log-probs.

    The whole sequence is scored, not only the completion, so that the same pass gives the
    prompt tokens' log p(q_t | q_<t) for c(q): "prompt_logp" [N, P-1], column j for token j + 1.
    """
    out = {k: torch.zeros_like(batch["completion_mask"]) for k in ("logp", "entropy", "ref_logp")}
    out["prompt_logp"] = torch.zeros_like(batch["prompt_mask"][:, 1:])
    P = batch["prompt_mask"].shape[1]
    with torch.no_grad():
        for idx in plan:
            mb = select(batch, idx)
            p, C = mb["prompt_mask"].shape[1], mb["completion_mask"].shape[1]
            logp, ent = sequence_logprobs(
                model, mb["input_ids"], mb["attention_mask"], args.temperature, with_entropy=True
            )
            out["logp"][idx, :C], out["entropy"][idx, :C] = logp[: len(idx), p - 1 :], ent[: len(idx), p - 1 :]
            out["prompt_logp"][idx, P - p : P - 1] = logp[: len(idx), : p - 1]
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
        check_context_length(
            model_path, args.max_prompt_len + args.max_completion_len, "--max_prompt_len + --max_completion_len"
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
    sampler = PromptSampler(rows, args.prompts_per_step, seed=args.seed, rank=rank, world_size=world)
    total_steps = math.ceil(args.epochs * len(rows) / args.prompts_per_step) if args.epochs else args.steps
    with clear_errors("--eval_benchmarks"):
        eval_sets = load_benchmarks(args.eval_benchmarks) if args.eval_steps else {}  # fail fast, before training

    # Rollout engine, rewards, logging.
    engine = make_engine(args, model_path, tokenizer, accelerator.unwrap_model(model), world, args.seed + rank)
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

        # 4. Advantages, re-weighted by pi_old's confidence in mixed groups (eqs. 4-6).
        advantages, info = pro_advantages(rewards, old, batch, G, args)

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
                                with_entropy=on_policy,
                            )
                            if on_policy:  # pi_old is this very policy: its log-probs are this pass's, detached
                                old["logp"][idx, : logp.shape[1]] = logp.detach()[: len(idx)]
                                old["entropy"][idx, : logp.shape[1]] = ent.detach()[: len(idx)]
                            loss, stats = policy_loss(
                                logp,
                                old["logp"][mb["rows"]],
                                advantages[mb["rows"]],
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
