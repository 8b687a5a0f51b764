"""Pro-GRPO (Li et al. 2026, arXiv 2602.05281): GRPO + the Advantage Re-weighting Mechanism, one file.

Each step: sample prompts -> G completions per prompt (vLLM) -> rewards ->
old log-probs of prompt and completion tokens -> GRPO advantages re-weighted
by confidence -> clipped-surrogate updates -> push the new weights into vLLM -> log.

    A_i    = (r_i - mean(r)) / (std(r) + 1e-6)                      (unbiased std)
    c(o|q) = exp(mean_{t in T_low(o)} log pi_old(o_t | q, o_<t))    (eq. 6)
    c(q)   = exp(mean_{t in T_low(q)} log pi_old(q_t | q_<t))       (eq. 5)
    A~_i   = A_i + alpha * (c(q) - c(o_i|q))  in mixed groups, else A_i  (eq. 4, Algorithm 1)
    loss   = -min(rho * A~_i, clip(rho, 1 - eps_low, 1 + eps_high) * A~_i), token-mean (eq. 7)

T_low(x) is the ceil(20%) positions (at least one) of x whose token has the
lowest probability (Sec. 3.2, appendix eq. 12; `common.lowprob`). An answer
more confident than the prompt is pushed down (less credit when right, more
blame when wrong), an unsure one up, so probability mass spreads over the
correct paths instead of collapsing onto the likeliest; the bonus lies in
[-alpha, alpha].

Decisions (ALGORITHMS.md section 4 and the paper's gaps):
- Mixed group = rewards not all equal (0 < sum r < G for 0/1 rewards), as in
  Algorithm 1; eq. 4 also writes the all-correct case as "otherwise", but both
  uniform cases keep A_i (= 0), so no signal is made up where there is none.
- c(q) and c(o|q) come from pi_old (the no-grad pass before the update) and are
  constants in the loss. c(q) is computed over the prompt tokens as the model
  sees them (chat template included); the first prompt token has no prediction.
- `--confidence_rule` gives Table 7's bonus variants: cq-co = c(q) - c(o)
  (the method), 1-co = 1 - c(o), 1-cq-co = 1 - c(q) - c(o).
- Loss: `token-mean` over each mini-batch (DAPO's token-level loss, the verl
  GRPO setting of Table 1). Algorithm 1 writes a token mean per group summed
  over prompts; the two differ only in how groups of unequal length weigh.

    python pro_grpo.py                   # CPU demo: tiny model, synthetic arithmetic
    accelerate launch pro_grpo.py --model Qwen/Qwen2.5-7B --dataset data/dapo_math_17k.jsonl ...  (docs/algorithms/pro_grpo.md)
"""

import math
from dataclasses import asdict, dataclass

import torch
from accelerate.utils import set_seed
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.batching import pack, pad_right
from common.checkpoint import load_checkpoint, save_checkpoint
from common.cli import arg, clear_errors, parse_args, require
from common.data import TEMPLATE_CHOICES, PromptSampler, format_prompt, load_math_dataset, prompt_opens_think
from common.distributed import global_sum, make_accelerator, micro_batch, peak_memory_gb, reduce_metrics, state_dict_for_sync
from common.evaluate import evaluate, load_benchmarks, write_results
from common.logprobs import masked_mean, sequence_logprobs
from common.lowprob import low_prob_confidence, low_prob_mask
from common.metrics import PhaseTimer, RunLogger
from common.rewards import REWARD_FUNCS, MathVerifier, compute_rewards
from common.rollout import HFEngine, VLLMEngine, prompt_seeds, stop_token_ids, vllm_available
from common.tiny_model import ensure_tiny_model


@dataclass
class Args:
    # What to train. Defaults run the CPU demo; the README gives each paper's real setting.
    model: str = arg("tiny", "HF hub name or local path; 'tiny' builds (or reuses) the CPU demo model")
    dataset: str = arg("synthetic-arith", "hub name, local .jsonl/.parquet, or 'synthetic-arith'")
    problem_field: str | None = arg(None, "dataset column holding the problem (default: known per dataset)")
    answer_field: str | None = arg(None, "dataset column holding the gold answer")
    solution_field: str | None = arg(None, "dataset column holding a reference solution")
    template: str = arg("qwen_math", "prompt template; *_native: rendered by the model's own chat template", TEMPLATE_CHOICES)
    rewards: str = arg("accuracy", "comma-separated reward terms: accuracy, boxed_format, think_format")
    output_dir: str = arg("runs/pro_grpo", "run directory: metrics.jsonl, config.json, checkpoints")
    steps: int = arg(30, "optimisation steps (one rollout batch each)")
    epochs: float | None = arg(None, "if set, overrides --steps: passes over the dataset")
    prompts_per_step: int = arg(16, "prompts per step over all ranks; each gets --group_size completions")
    max_prompt_len: int = arg(512, "prompts longer than this (tokens) are dropped at load time")
    max_completion_len: int = arg(48, "max new tokens per completion")
    lr: float = arg(2e-4, "AdamW learning rate (the papers use 1e-6 on 1.5B-7B models)")
    warmup_steps: int = arg(0, "linear learning-rate warm-up steps")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    grad_clip: float = arg(1.0, "max global grad norm")
    micro_batch_size: int = arg(32, "sequences per forward/backward (gradient accumulation beyond)")
    seed: int = arg(0, "random seed (data order, sampling, init)")
    save_steps: int = arg(0, "save a checkpoint every N steps (0: only at the end)")
    keep_last: int = arg(2, "checkpoints kept on disk (0: all)")
    resume: bool = arg(False, "continue from the latest complete checkpoint in --output_dir")
    # The method. Defaults: ALGORITHMS.md section 4 (paper Table 1).
    group_size: int = arg(8, "G: completions per prompt")
    temperature: float = arg(1.0, "sampling temperature T; log-probs are computed from logits / T")
    top_p: float = arg(1.0, "nucleus sampling")
    eps_low: float = arg(0.2, "clip range: rho >= 1 - eps_low")
    eps_high: float = arg(0.28, "clip range: rho <= 1 + eps_high (Table 1: [0.8, 1.28])")
    beta: float = arg(0.0, "k3 KL weight to the initial model (0: no reference model is loaded)")
    loss_agg: str = arg("token-mean", "loss aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
    mu: int = arg(1, "optimisation passes over each rollout batch")
    num_minibatches: int = arg(1, "optimiser steps per pass (the rollout batch split in this many)")
    alpha: float = arg(0.3, "re-weighting strength in eq. 4 (Table 6: 0 = plain GRPO, 0.3 best)")
    confidence_rule: str = arg("cq-co", "bonus in mixed groups (Table 7): c(q) - c(o), 1 - c(o), 1 - c(q) - c(o)", ["cq-co", "1-co", "1-cq-co"])
    low_prob_frac: float = arg(0.2, "share of positions in T_low (Sec. 3.2); 1.0 = plain length-normalised likelihood")
    # Systems.
    rollout: str = arg("vllm" if vllm_available() else "hf", "rollout engine", ["vllm", "hf"])
    precision: str = arg("auto", "auto: fp32 weights + bf16 autocast on GPU, fp32 on CPU; bf16: bf16 weights too (half the memory, but lr-1e-6 updates round away)", ["auto", "bf16", "fp32"])
    vllm_gpu_memory_utilization: float = arg(0.3, "share of GPU memory vLLM may take (weights + KV cache)")
    vllm_sleep: bool = arg(False, "release vLLM's GPU memory during the update (GPU only)")
    gradient_checkpointing: bool = arg(False, "recompute activations in backward to save memory")
    # Periodic evaluation (common/evaluate.py), logged as eval/<benchmark>/pass@k.
    eval_steps: int = arg(0, "evaluate every N steps and after the last (0: never)")
    eval_benchmarks: str = arg("synthetic", "comma-separated benchmark names (common.evaluate.BENCHMARKS) or name=FILE")
    eval_n: int = arg(4, "samples per eval problem: pass@1 is their mean, pass@k for k = 1, 2, 4 .. <= n")
    eval_temperature: float = arg(0.6, "eval sampling temperature")


def validate(args: Args) -> None:
    """Refuse flag combinations that would fail deep inside torch or train silently wrong."""
    require(args.group_size >= 2, f"--group_size must be >= 2 (got {args.group_size}): GRPO compares completions within a group")
    require(args.prompts_per_step >= 1 and args.max_completion_len >= 1 and args.micro_batch_size >= 1, "--prompts_per_step, --max_completion_len and --micro_batch_size must be >= 1")
    n = args.prompts_per_step * args.group_size
    require(n % args.num_minibatches == 0, f"--num_minibatches={args.num_minibatches} must divide prompts_per_step * group_size = {n}")
    require(0 <= args.eps_low < 1 and args.eps_high >= 0, "--eps_low must be in [0, 1) and --eps_high >= 0")
    require(args.temperature > 0, "--temperature must be > 0 (log-probs are computed from logits / T)")
    require(args.mu >= 1, "--mu must be >= 1")
    unknown = set(args.rewards.split(",")) - set(REWARD_FUNCS)
    require(not unknown, f"--rewards: unknown term(s) {sorted(unknown)}; choose from {sorted(REWARD_FUNCS)}")
    require(args.eval_steps >= 0 and args.eval_n >= 1 and args.eval_temperature > 0, "--eval_steps must be >= 0, --eval_n >= 1, --eval_temperature > 0")
    require(math.isfinite(args.alpha) and args.alpha >= 0, f"--alpha must be a finite number >= 0 (got {args.alpha}; 0 is plain GRPO)")
    require(0 < args.low_prob_frac <= 1, f"--low_prob_frac must be in (0, 1] (got {args.low_prob_frac})")


def group_advantages(rewards: torch.Tensor, G: int, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each group of G (GRPO eq. 3 of the papers).

    A group whose rewards are all equal gets A = 0 ("advantage collapse").
    """
    r = rewards.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def prompt_confidence(prompt_logp: torch.Tensor, prompt_mask: torch.Tensor, fraction: float = 0.2) -> torch.Tensor:
    """c(q) of eq. 5 per row, from score()'s prompt_logp [N, P-1] = log p(q_t | q_<t) for columns 1..P-1.

    prompt_mask [N, P] marks real prompt tokens (left padding is 0). A position
    counts only if the token before it is real too: a prompt's first token is
    predicted from nothing (or from padding), so it is left out.
    """
    predicted = prompt_mask[:, 1:] * prompt_mask[:, :-1]
    return low_prob_confidence(prompt_logp, predicted, fraction)


def pro_advantages(rewards: torch.Tensor, c_q: torch.Tensor, c_o: torch.Tensor, G: int, alpha: float, rule: str = "cq-co"):
    """A~_i = A_i + alpha * bonus_i in mixed groups, A_i elsewhere (eq. 4, Algorithm 1 lines 10-27).

    rewards, c_o: [N], groups of G consecutive completions; c_q: [N // G], one per prompt.
    bonus (Table 7): "cq-co" c(q) - c(o_i|q) (the method), "1-co" 1 - c(o_i|q),
    "1-cq-co" 1 - c(q) - c(o_i|q). A group is mixed when its rewards are not all
    equal (0 < sum r < G for 0/1 rewards). Returns (A~ [N], mixed [N // G] bool).
    """
    r = rewards.view(-1, G)
    mixed = r.max(1).values != r.min(1).values
    c_q = c_q.repeat_interleave(G)
    bonus = {"cq-co": c_q - c_o, "1-co": 1 - c_o, "1-cq-co": 1 - c_q - c_o}[rule]
    return group_advantages(rewards, G) + alpha * bonus * mixed.repeat_interleave(G), mixed


def policy_loss(logp, old_logp, adv, mask, args, num_seqs, num_tokens, ref_logp=None):
    """Clipped surrogate (PPO/GRPO), per token, aggregated with global denominators.

    logp/old_logp/mask: [n, C]; adv: [n] or [n, C] (token-level advantages).
    num_seqs/num_tokens: sizes of the whole mini-batch this micro-batch belongs to,
    so summing micro-batch losses gives exactly the mini-batch loss.
    """
    adv = adv[:, None] if adv.dim() == 1 else adv
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - args.eps_low, 1 + args.eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if args.beta > 0:
        d = ref_logp - logp
        per_token = per_token + args.beta * (torch.exp(d) - d - 1)  # k3 estimator
    masked = per_token * mask
    if args.loss_agg == "token-mean":
        loss = masked.sum() / num_tokens
    elif args.loss_agg == "seq-mean-token-mean":
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / num_seqs
    else:  # seq-mean-token-sum-norm (Dr. GRPO): a constant denominator
        loss = masked.sum() / (num_seqs * args.max_completion_len)
    with torch.no_grad():
        is_clipped = ((ratio < 1 - args.eps_low) & (adv < 0)) | ((ratio > 1 + args.eps_high) & (adv > 0))
        stats = {
            "clip_frac": masked_mean(is_clipped.float(), mask).item(),
            "approx_kl": masked_mean(ratio - 1 - (logp - old_logp), mask).item(),  # k3 KL(pi_old || pi_theta)
        }
    return loss, stats


def score(model, batch, args, ref_model=None):
    """No-grad pass over the rollout batch: log-probs (and entropy) under pi_old, micro-batch by micro-batch.

    The whole sequence is scored, not only the last C positions, so that the same
    pass gives the prompt tokens' log p(q_t | q_<t) for c(q): "prompt_logp" [N, P-1].
    The extra logit rows are P per sequence; the fp32 log-softmax stays chunked.
    """
    C = batch["completion_mask"].shape[1]
    P = batch["prompt_mask"].shape[1]
    out = {"logp": [], "entropy": [], "ref_logp": [], "prompt_logp": []}
    with torch.no_grad():
        for i in range(0, len(batch["input_ids"]), args.micro_batch_size):
            ids = batch["input_ids"][i : i + args.micro_batch_size]
            attn = batch["attention_mask"][i : i + args.micro_batch_size]
            logp, ent = sequence_logprobs(model, ids, attn, args.temperature, with_entropy=True)  # column j: token j + 1
            out["logp"].append(logp[:, P - 1 :])
            out["entropy"].append(ent[:, P - 1 :])
            out["prompt_logp"].append(logp[:, : P - 1])
            if ref_model is not None:
                out["ref_logp"].append(sequence_logprobs(ref_model, ids, attn, args.temperature, logits_to_keep=C)[0])
    return {k: torch.cat(v) if v else None for k, v in out.items()}


def main(args: Args) -> None:
    validate(args)
    gpu = torch.cuda.is_available()
    accelerator = make_accelerator("bf16" if gpu and args.precision != "fp32" else "no", args.grad_clip, args.micro_batch_size)
    rank, world = accelerator.process_index, accelerator.num_processes
    require(args.prompts_per_step % world == 0, f"--prompts_per_step={args.prompts_per_step} must divide by the {world} processes: each rank owns whole prompt groups")
    set_seed(args.seed + rank)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32  # master weights
    model_path = str(ensure_tiny_model()) if args.model == "tiny" else args.model

    # Policy, optimiser, data.
    with clear_errors("--model"):
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    if tokenizer.pad_token_id is None:  # padding is masked out; any id will do
        tokenizer.pad_token = tokenizer.eos_token
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    ref_model = None
    if args.beta > 0:  # only then: all four papers train without it
        ref_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if gpu else torch.float32).to(accelerator.device).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, args.warmup_steps)))
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(scheduler)  # stepped once per optimiser step, on every rank

    with clear_errors("--dataset"):
        rows = load_math_dataset(args.dataset, problem_field=args.problem_field, answer_field=args.answer_field, solution_field=args.solution_field)
    with clear_errors("--template"):
        for r in rows:
            r["prompt_ids"] = tokenizer(format_prompt(r["problem"], args.template, tokenizer), add_special_tokens=False).input_ids
        opens_think = prompt_opens_think(args.template, tokenizer)  # then completions start inside <think>
    n_rows = len(rows)
    rows = [r for r in rows if len(r["prompt_ids"]) <= args.max_prompt_len]
    if len(rows) < n_rows and accelerator.is_main_process:
        print(f"dropped {n_rows - len(rows)} of {n_rows} prompts longer than --max_prompt_len={args.max_prompt_len}")
    sampler = PromptSampler(rows, args.prompts_per_step, seed=args.seed, rank=rank, world_size=world)
    total_steps = math.ceil(args.epochs * len(rows) / args.prompts_per_step) if args.epochs else args.steps
    with clear_errors("--eval_benchmarks"):
        eval_sets = load_benchmarks(args.eval_benchmarks) if args.eval_steps else {}  # fail fast, before training

    # Rollout engine, rewards, logging.
    stop_ids = stop_token_ids(tokenizer, model_path)
    if args.rollout == "vllm":
        engine = VLLMEngine(
            model_path, stop_ids, max_model_len=args.max_prompt_len + args.max_completion_len, seed=args.seed + rank,
            dtype="bfloat16" if gpu and args.precision != "fp32" else "float32", gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            enable_sleep_mode=args.vllm_sleep, distributed=world > 1,
        )
    else:
        engine = HFEngine(accelerator.unwrap_model(model), stop_ids, tokenizer.pad_token_id)
    start_step = 0
    if args.resume:  # weights, optimiser, scheduler, RNG; then the data order and vLLM's copy
        state = load_checkpoint(accelerator, args.output_dir)
        start_step = state["step"]
        sampler.load_state_dict(state["sampler"])
        engine.load_weights(state_dict_for_sync(accelerator, model))
    verifier = MathVerifier()
    reward_names = args.rewards.split(",")
    logger = RunLogger(args.output_dir, total_steps, asdict(args), enabled=accelerator.is_main_process, initial_step=start_step)
    G = args.group_size

    def run_eval():  # every rank evaluates with its own engine; the logged numbers are means over ranks
        return evaluate(engine, tokenizer, eval_sets, args.template, args.eval_n, args.eval_temperature, args.max_completion_len, args.top_p, seed=args.seed + rank, verifier=verifier, max_prompt_len=args.max_prompt_len)

    if args.eval_steps and start_step == 0:  # step 0: the policy before training, every curve's starting point
        logger.log(0, reduce_metrics(accelerator, run_eval()[0]), advance=False)

    for step in range(start_step, total_steps):
        timer = PhaseTimer(sync=torch.cuda.synchronize if gpu else None)
        batch_rows = sampler.next_batch()

        # 1. Rollout: G completions per prompt from pi_old.
        with timer("rollout"):
            engine.wake_up()
            seeds = prompt_seeds(args.seed, step, args.prompts_per_step, rank, len(batch_rows))  # the same samples on any number of ranks
            groups = engine.generate([r["prompt_ids"] for r in batch_rows], G, args.max_completion_len, args.temperature, args.top_p, seed=seeds)
        rollout_rows = [r for r in batch_rows for _ in range(G)]
        completions = [c for g in groups for c in g]
        texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)

        # 2. Rewards.
        with timer("scoring"):
            rewards, accuracy = compute_rewards(texts, [r["answer"] for r in rollout_rows], reward_names, verifier, prompt_ends_with_think=opens_think)
            rewards = torch.tensor(rewards, device=accelerator.device)
            accuracy = torch.tensor(accuracy, device=accelerator.device)

        # 3. Old log-probs (and token entropy) from the trainer, before any update.
        with timer("old_logp"):
            engine.sleep()
            batch = pack([r["prompt_ids"] for r in rollout_rows], [c.token_ids for c in completions], tokenizer.pad_token_id, accelerator.device)
            mask = batch["completion_mask"]
            old = score(model, batch, args, ref_model)
            rollout_logp = pad_right([c.logprobs for c in completions], mask.shape[1], device=accelerator.device)

        # 4. Advantages, re-weighted by pi_old's confidence in mixed groups (eqs. 4-6).
        c_q = prompt_confidence(old["prompt_logp"], batch["prompt_mask"], args.low_prob_frac).view(-1, G).mean(1)  # G equal rows
        c_o = low_prob_confidence(old["logp"], mask, args.low_prob_frac)
        advantages, mixed = pro_advantages(rewards, c_q, c_o, G, args.alpha, args.confidence_rule)
        base_adv = group_advantages(rewards, G)
        in_mixed = mixed.repeat_interleave(G)

        # 5. Clipped-surrogate updates: mu passes, num_minibatches optimiser steps each.
        with timer("update"):
            model.train()
            n = len(completions)
            mb_size = n // args.num_minibatches
            update_stats = []
            for _ in range(args.mu):
                order = torch.randperm(n, device=accelerator.device) if args.num_minibatches > 1 else torch.arange(n, device=accelerator.device)
                for start in range(0, n - mb_size + 1, mb_size):
                    idx_mb = order[start : start + mb_size]
                    # Global denominators: DDP averages gradients over ranks, so per-rank
                    # losses are divided by (global count / world) to make the mean exact.
                    num_tokens = global_sum(accelerator, mask[idx_mb].sum().item()) / world
                    for i in range(0, len(idx_mb), args.micro_batch_size):
                        idx = idx_mb[i : i + args.micro_batch_size]
                        with micro_batch(accelerator, model, last=i + args.micro_batch_size >= len(idx_mb)):  # grads sync on the last
                            logp, _ = sequence_logprobs(model, batch["input_ids"][idx], batch["attention_mask"][idx], args.temperature, logits_to_keep=mask.shape[1])
                            ref = old["ref_logp"][idx] if ref_model is not None else None
                            loss, stats = policy_loss(logp, old["logp"][idx], advantages[idx], mask[idx], args, len(idx_mb), num_tokens, ref)
                            accelerator.backward(loss)
                        update_stats.append(stats | {"loss": loss.item()})
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()

        # 6. Sync: the rollout engine samples from the new policy next step.
        with timer("sync"):
            engine.wake_up()
            engine.load_weights(state_dict_for_sync(accelerator, model))

        # 7. Log.
        r_grp = rewards.view(-1, G)
        lengths = mask.sum(-1)
        step_s = sum(timer.seconds.values())
        metrics = {
            "reward": rewards.mean(),
            "accuracy": accuracy.mean(),
            "response_len": lengths.mean(),
            "truncated_frac": sum(not c.finished for c in completions) / n,
            "entropy": masked_mean(old["entropy"], mask),
            "zero_adv_group_frac": (r_grp.max(1).values == r_grp.min(1).values).float().mean(),
            "adv_var_within_group": advantages.view(-1, G).var(1).mean(),
            "rollout_logp_gap": masked_mean((rollout_logp - old["logp"]).abs(), mask),
            # Pro-GRPO: confidences and the re-weighting (NaN -> null when a step has no such completion).
            "conf_prompt": c_q.mean(),
            "conf_answer_correct": c_o[accuracy > 0].mean(),
            "conf_answer_incorrect": c_o[accuracy == 0].mean(),
            "lowprob_token_prob": masked_mean(old["logp"].exp(), low_prob_mask(old["logp"], mask, args.low_prob_frac)),
            "mixed_group_frac": mixed.float().mean(),
            "bonus_abs": (advantages - base_adv)[in_mixed].abs().mean(),
            "adv_sign_flip_frac": (torch.sign(advantages) != torch.sign(base_adv))[in_mixed].float().mean(),
            "grad_norm": grad_norm,
            "lr": scheduler.get_last_lr()[0],
            **{k: sum(s[k] for s in update_stats) / len(update_stats) for k in ("clip_frac", "approx_kl")},
            "loss": sum(s["loss"] for s in update_stats) / (args.mu * args.num_minibatches),
            **{f"{k}_s": v for k, v in timer.seconds.items()},
            "step_s": step_s,
            "tokens_per_s": lengths.sum() / step_s,
            "peak_mem_gb": peak_memory_gb(),
        }
        if args.eval_steps and ((step + 1) % args.eval_steps == 0 or step + 1 == total_steps):
            with timer("eval"):
                summary, records = run_eval()
            metrics |= summary | {"eval_s": timer.seconds["eval"]}
            if step + 1 == total_steps and accelerator.is_main_process:
                write_results(args.output_dir, summary, records, {"step": step + 1, "benchmarks": args.eval_benchmarks, "n": args.eval_n})
        metrics = reduce_metrics(accelerator, {k: float(v) for k, v in metrics.items()})
        metrics["epoch"] = sampler.epoch
        logger.log(step + 1, metrics)
        if (args.save_steps and (step + 1) % args.save_steps == 0) or step + 1 == total_steps:
            save_checkpoint(accelerator, model, tokenizer, args.output_dir, step + 1, {"sampler": sampler.state_dict()}, args.keep_last)

    logger.close()
    verifier.close()


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__))
