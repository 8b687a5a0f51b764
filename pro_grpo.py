"""Pro-GRPO (Li et al. 2026, arXiv 2602.05281): GRPO + the Advantage Re-weighting Mechanism, one file, top to bottom.

grpo_base.py plus one idea: in groups with both right and wrong answers, each advantage moves
by how much more confident pi_old was in the prompt than in the answer (`diff grpo_base.py pro_grpo.py`).

    A_i    = (r_i - mean(r)) / (std(r) + 1e-6)                      (unbiased std)
    c(o|q) = exp(mean_{t in T_low(o)} log pi_old(o_t | q, o_<t))    (eq. 6)
    c(q)   = exp(mean_{t in T_low(q)} log pi_old(q_t | q_<t))       (eq. 5)
    A~_i   = A_i + alpha * (c(q) - c(o_i|q))  in mixed groups, else A_i  (eq. 4, Algorithm 1)
    loss   = -min(rho * A~_i, clip(rho, 1 - eps_low, 1 + eps_high) * A~_i), token-mean (eq. 7)

T_low(x) is the ceil(20%) positions (at least one) of x whose token has the lowest probability
(`common.logprobs`). An answer more confident than the prompt is pushed down, an unsure one up,
so probability mass spreads over the correct paths instead of collapsing onto the likeliest.
--confidence_rule gives Table 7's variants; --confidence_baseline group_mean the appendix's
baseline (eqs. 10, 18), which differs from eq. 4's c(q). Every decision where the paper is
silent or inconsistent: docs/algorithms/pro_grpo.md.

    python pro_grpo.py                        # CPU demo: a tiny model learns to box its sums
    accelerate launch --config_file configs/accelerate/zero3.yaml pro_grpo.py \\
        --config recipes/pro_grpo_qwen2.5-7b.yaml
"""

from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from common.batching import pack, rows_with_loss
from common.cli import arg, flag_record, parse_args
from common.logprobs import CORRECTIONS, low_prob_mask, masked_mean
from common.metrics import global_sum
from common.prompts import TEMPLATE_CHOICES
from common.rewards import without_unchecked_groups
from common.run_flags import RunFlags, check_batch_split, check_correction, check_rollout_sampling, launch_world
from common.session import spec_from, start_session


@dataclass
class Args:
    # What to train. The defaults run the CPU demo; recipes/ holds each paper's setting.
    model: str = arg(
        "tiny",
        "HF hub name or local path (a run or checkpoint directory too); 'tiny' is the shipped CPU demo model, 'smollm2' is SmolLM2-135M-Instruct (python -m tools.smollm2 converts it)",
    )
    dataset: str = arg("synthetic-arith", "hub name, local .jsonl/.json/.parquet, or 'synthetic-arith'")
    template: str = arg(
        "qwen_math", "prompt template; *_native: rendered by the model's own chat template", TEMPLATE_CHOICES
    )
    few_shot: int = arg(
        0, "K worked examples from the dataset's solutions before each problem (earlier chat turns)", at_least=0
    )
    rewards: str = arg(
        "accuracy", "comma-separated reward terms: accuracy, boxed_format, think_format, think_answer_format, dapo"
    )
    reward_fn: str | None = arg(
        None, "your own reward terms, comma-separated module:function or file.py:function (README)"
    )
    steps: int = arg(30, "optimisation steps (one rollout batch each)", at_least=1, resumable=True)
    epochs: float | None = arg(None, "if set, overrides --steps: passes over the dataset", above=0, resumable=True)
    prompts_per_step: int = arg(16, "prompts per step over all ranks; each gets --group_size completions", at_least=1)
    max_prompt_len: int = arg(512, "prompts longer than this (tokens) are dropped at load time", at_least=1)
    max_completion_len: int = arg(48, "max new tokens per completion", at_least=1)
    seed: int = arg(0, "random seed (data order, sampling, init)", at_least=0)
    # Optimiser.
    lr: float = arg(2e-4, "AdamW learning rate (the papers use 1e-6 on 1.5B-7B models)", above=0, resumable=True)
    lr_schedule: str = arg("constant", "after the warm-up", ["constant", "cosine", "linear"], resumable=True)
    warmup_steps: int = arg(0, "linear learning-rate warm-up (optimiser steps)", at_least=0, resumable=True)
    weight_decay: float = arg(0.01, "AdamW weight decay (verl's default)", at_least=0)
    adam_beta1: float = arg(0.9, "AdamW beta1", at_least=0, below=1)
    adam_beta2: float = arg(0.999, "AdamW beta2", at_least=0, below=1)
    grad_clip: float = arg(1.0, "max global gradient norm", above=0, resumable=True)
    # The method. Defaults: docs/algorithms/pro_grpo.md (the paper's Table 1).
    group_size: int = arg(8, "G: completions per prompt", at_least=2)
    temperature: float = arg(1.0, "sampling temperature T; log-probs are computed from logits / T", above=0)
    top_p: float = arg(1.0, "nucleus sampling", above=0, at_most=1)
    eps_low: float = arg(0.2, "clip range: rho >= 1 - eps_low", at_least=0, below=1)
    eps_high: float = arg(0.28, "clip range: rho <= 1 + eps_high (Table 1: [0.8, 1.28])", at_least=0)
    beta: float = arg(0.0, "k3 KL weight to the initial model (0: no reference model is loaded)", at_least=0)
    loss_agg: str = arg(
        "token-mean", "loss aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
    )
    mu: int = arg(1, "optimisation passes over each rollout batch", at_least=1)
    num_minibatches: int = arg(1, "optimiser steps per pass (the rollout batch split in this many)", at_least=1)
    rollout_correction: str = arg(
        "auto",
        "pi_old / pi_rollout weights on the loss (docs/algorithms/grpo_base.md#rollout-correction); auto: "
        "token_truncate where the trainer or vLLM computes in bf16, else none",
        CORRECTIONS,
    )
    rollout_correction_min: float | None = arg(None, "the correction's lower bound (None: its mode's)", at_least=0)
    rollout_correction_max: float | None = arg(None, "the correction's upper bound (None: its mode's)", above=0)
    alpha: float = arg(0.3, "re-weighting strength in eq. 4 (Table 6: 0 = plain GRPO, 0.3 best)", at_least=0)
    confidence_rule: str = arg(
        "cq-co", "Table 7's bonus: b - c(o), 1 - c(o), 1 - b - c(o)", ["cq-co", "1-co", "1-cq-co"]
    )
    confidence_baseline: str = arg(
        "prompt", "b: c(q) (eq. 4) or the group's mean c(o) (eqs. 10, 18)", ["prompt", "group_mean"]
    )
    low_prob_frac: float = arg(0.2, "share of positions in T_low (Sec. 3.2); 1: all of them", above=0, at_most=1)


def validate(args: Args, run: RunFlags) -> None:
    """Cross-flag checks (each flag's own range is checked as it is parsed), before anything loads."""
    check_batch_split(args.prompts_per_step, args.group_size, args.num_minibatches, launch_world())
    check_correction(args.rollout_correction, args.rollout_correction_min, args.rollout_correction_max, args.top_p)
    check_rollout_sampling(run.rollout, args.temperature, args.group_size)
    run.validate()


def group_advantages(rewards: torch.Tensor, G: int, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each group of G (GRPO paper, eq. 3 of the four papers).
    A group whose rewards are all equal gets A = 0 ("advantage collapse")."""
    r = rewards.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def low_prob_confidence(logp: torch.Tensor, mask: torch.Tensor, fraction: float = 0.2) -> torch.Tensor:
    """c = exp(mean logp over the low-probability set T_low) per row (eqs. 5, 6), shape [B]; 1.0 for an empty row."""
    low = low_prob_mask(logp, mask, fraction).to(logp.dtype)
    return ((logp * low).sum(-1) / low.sum(-1).clamp(min=1)).exp()


def prompt_confidence(prompt_logp: torch.Tensor, prompt_mask: torch.Tensor, fraction: float = 0.2) -> torch.Tensor:
    """c(q) of eq. 5 per row, from old_logprobs()'s prompt_logp [N, P-1] = log p(q_t | q_<t) for columns 1..P-1.

    prompt_mask [N, P] marks real prompt tokens (left padding is 0). A position counts only if the
    token before it is real too: a prompt's first token is predicted from nothing (or from padding).
    """
    predicted = prompt_mask[:, 1:] * prompt_mask[:, :-1]
    return low_prob_confidence(prompt_logp, predicted, fraction)


def reweighted_advantages(adv, rewards, b, c_o, G: int, alpha: float, rule: str = "cq-co"):
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


def policy_loss(logp, old_logp, adv, mask, args, num_seqs, num_tokens, ref_logp=None, is_weight=None):
    """Clipped surrogate (PPO/GRPO) per token, aggregated as --loss_agg says.

    logp, mask: [n, C] of one micro-batch; old_logp, ref_logp, is_weight and a token-level adv
    may be wider (the whole batch's C) and are cut to C; adv: [n] or [n, C]. num_seqs / num_tokens:
    this rank's share of the mini-batch's sequences / tokens (the global count / the ranks), so
    that the micro-batches' losses, summed and averaged over ranks, are exactly the mini-batch's.
    is_weight: --rollout_correction's weight of each token (common/logprobs.py), or None.
    Returns the loss and token sums for the step's metrics (0-dim tensors, left on the device).
    """
    C = logp.shape[1]
    adv = adv[:, None] if adv.dim() == 1 else adv[:, :C]
    old_logp = old_logp[:, :C]
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - args.eps_low, 1 + args.eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if is_weight is not None:  # pi_old / pi_rollout, truncated or masked (--rollout_correction); no gradient
        per_token = per_token * is_weight[:, :C]
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
            "clip_low": (((ratio < 1 - args.eps_low) & (adv < 0)) * mask).sum(),  # the clip bounds a decrease
            "clip_high": (((ratio > 1 + args.eps_high) & (adv > 0)) * mask).sum(),  # ... an increase
            "approx_kl": ((ratio - 1 - (logp - old_logp)) * mask).sum(),  # k3 KL(pi_old || pi_theta)
            **({"kl_ref": ((torch.exp(d) - d - 1) * mask).sum()} if args.beta > 0 else {}),  # k3 KL(pi_theta || pi_ref)
            "tokens": mask.sum(),
        }
    return loss, sums


def old_logprobs(trainer, batch: dict, args: Args) -> dict:
    """No-grad pass of the trainer over the rollout batch, before any update: pi_old's log-probs and
    entropies [N, C], and the reference model's log-probs when --beta > 0.

    The whole sequence is scored, not only the completion, so that the same pass gives the prompt
    tokens' log p(q_t | q_<t) for c(q): "prompt_logp" [N, P-1], column j for token j + 1.
    """
    out = {k: torch.zeros_like(batch["completion_mask"]) for k in ("logp", "entropy", "ref_logp")}
    out["prompt_logp"] = torch.zeros_like(batch["prompt_mask"][:, 1:])
    P = batch["prompt_mask"].shape[1]
    with torch.no_grad():
        for mb in trainer.micro_batches(batch, range(len(batch["input_ids"]))):
            at, n, C = mb["rows"][: mb.n], mb.n, mb["completion_mask"].shape[1]  # the real rows, on the device
            p = mb["prompt_mask"].shape[1]
            logp, ent = mb.logprobs(trainer.model, args.temperature, with_entropy=True, whole=True)
            out["logp"][at, :C], out["entropy"][at, :C] = logp[:n, p - 1 :], ent[:n, p - 1 :]
            out["prompt_logp"][at, P - p : P - 1] = logp[:n, : p - 1]
            if trainer.ref_model is not None:
                out["ref_logp"][at, :C] = mb.logprobs(trainer.ref_model, args.temperature)[0][:n]
    return out


def update(trainer, batch: dict, old: dict, advantages: torch.Tensor, is_weight, args: Args, step: int) -> Counter:
    """Clipped-surrogate updates: --mu passes over the rollout batch, each in --num_minibatches optimiser
    steps, each over micro-batches whose gradients accumulate. Returns sums for the step's metrics, over
    all ranks. A row whose loss is identically 0 (advantage 0 everywhere, no KL term) is left out of the
    micro-batches; the denominators still count it. Statistics stay on the device until the optimiser step."""
    n = len(batch["input_ids"])
    size = n // args.num_minibatches
    live = rows_with_loss(advantages, batch["completion_mask"], args.beta > 0, is_weight)
    sums = Counter(skipped_rows=n - sum(live))
    trainer.model.train()
    for _ in range(args.mu):
        order = torch.randperm(n).tolist() if args.num_minibatches > 1 else list(range(n))
        for first in range(0, n, size):
            minibatch = order[first : first + size]  # rows of the batch
            num_tokens = (
                global_sum(trainer.accelerator, sum(batch["completion_lens"][i] for i in minibatch)) / trainer.world
            )
            local = Counter()
            for mb in trainer.micro_batches(batch, [i for i in minibatch if live[i]], train=True):
                at = mb["rows"]  # the micro-batch's rows of the batch, on the device
                logp, _ = mb.logprobs(trainer.model, args.temperature)
                loss, stats = policy_loss(
                    logp, old["logp"][at], advantages[at], mb["completion_mask"], args, len(minibatch), num_tokens,
                    old["ref_logp"][at], None if is_weight is None else is_weight[at],
                )  # fmt: skip
                trainer.accelerator.backward(loss)
                local.update(stats | {"loss": loss.detach()})
            opt = trainer.optimizer_step(step + 1, local)  # clip; a NaN/inf or spiking update is skipped
            sums.update(opt.sums | {"loss": opt.loss, "skipped": not opt.applied, "optimizer_steps": 1})
            sums["batch_tokens"] += num_tokens * trainer.world  # every completion token, trained or not
            sums["grad_norm"] = opt.grad_norm
    return sums


def step_metrics(
    trainer, scores, batch: dict, old: dict, advantages: torch.Tensor, sums: Counter, G: int, timer
) -> dict:  # fmt: skip
    """The step's figures (docs/algorithms/grpo_base.md#metrics): token-level ones weighted by tokens over all ranks;
    clip shares of every completion token of the batch, approx_kl of the tokens trained on."""
    mask = batch["completion_mask"]
    r = scores.reward.view(-1, G)
    per_seq_adv = advantages if advantages.dim() == 1 else masked_mean(advantages, mask, dim=-1)
    tok = {"entropy": (old["entropy"] * mask).sum(), "mask": mask.sum()}
    tok = global_sum(trainer.accelerator, tok)
    token_mean = lambda k, n="tokens": sums[k] / max(sums[n], 1)  # a sum over tokens, per token
    return {
        "train/reward": scores.reward.mean(),
        "train/accuracy": scores.accuracy.mean(),
        "train/response_len": mask.sum(-1).mean(),
        "train/truncated_frac": (~batch["finished"]).sum().item() / len(mask),
        "train/entropy": tok["entropy"] / max(tok["mask"], 1),
        "train/zero_adv_group_frac": (r.max(1).values == r.min(1).values).float().mean(),
        "train/adv_var_within_group": per_seq_adv.view(-1, G).var(1).mean(),
        "train/grad_norm": sums["grad_norm"],
        "train/clip_frac_low": token_mean("clip_low", "batch_tokens"),  # a flat row's tokens are never clipped
        "train/clip_frac_high": token_mean("clip_high", "batch_tokens"),
        "train/approx_kl": token_mean("approx_kl"),
        "train/kl_ref": token_mean("kl_ref") if "kl_ref" in sums else float("nan"),  # --beta 0: no reference (null)
        "train/loss": sums["loss"] / sums["optimizer_steps"],
        "train/skipped_steps": sums["skipped"],
        "train/skipped_rows": sums["skipped_rows"],
        "time/tokens_per_s": mask.sum() / sum(timer.seconds.values()),
    }


def main(args: Args, run: RunFlags) -> None:
    """1. Set up: the spec of what is trained; the session's trainer, rollout, rewards and I/O (common/session.py).
    Then each step:
    2. Rollout: G completions per prompt from pi_old.
    3. Rewards.
    4. pi_old's log-probs of the rollout, from the trainer before any update.
    5. Advantages.
    6. Clipped-surrogate updates.
    7. Sync: the rollout engine gets the new weights.
    8. Log, evaluate, save.
    """
    G = args.group_size
    s = start_session(
        Path(__file__).stem,
        spec_from(
            args, optimizer=partial(torch.optim.AdamW, lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), weight_decay=args.weight_decay),
            optimizer_steps_per_step=args.mu * args.num_minibatches, reference_model=args.beta > 0,
        ),
        run, flag_record(args, run),
    )  # fmt: skip

    with s:  # closed on any exit: the closing line after the last step, the bar's end before an error
        for step in s.steps():  # ends early, after saving a checkpoint, on SIGTERM / Ctrl-C
            timer = s.timer()
            prompt_rows = s.rollout.sampler.next_batch()

            # 2. Rollout: G completions per prompt from pi_old; one seed per prompt, from its place in the global batch.
            with timer("rollout"):
                seeds = s.rollout.seeds(step, len(prompt_rows))
                prompts = [row["prompt_ids"] for row in prompt_rows]
                groups = s.rollout.engine.generate(
                    prompts, G, args.max_completion_len, args.temperature, args.top_p, seed=seeds
                )
            rollout_rows = [row for row in prompt_rows for _ in range(G)]
            completions = [c for g in groups for c in g]
            texts = s.rollout.texts(completions)

            # 3. Rewards.
            with timer("scoring"):
                scores = s.rewards.score(texts, rollout_rows)
                s.io.score_watch.saw(scores)  # unchecked answers counted

            # 4. pi_old's log-probs (and token entropies) from the trainer, before any update.
            with timer("old_logp"):
                s.rollout.sleep()  # its memory to the trainer's passes, until step 7's sync wakes it
                prompt_ids = [row["prompt_ids"] for row in rollout_rows]
                batch = pack(prompt_ids, completions, s.rollout.tokenizer.pad_token_id, s.trainer.device)
                old = old_logprobs(s.trainer, batch, args)
                is_weight, corrected = s.rollout.correction.weights(old["logp"], batch)

            # 5. Advantages, re-weighted by pi_old's confidence in mixed groups (eqs. 4-6);
            # a group holding an answer the verifier had no time to check gets none.
            advantages, info = pro_advantages(scores.reward, old, batch, G, args)
            advantages = without_unchecked_groups(advantages, scores.checked, G)

            # 6. Clipped-surrogate updates.
            with timer("update"):
                sums = update(s.trainer, batch, old, advantages, is_weight, args, step)

            # 7. Sync: the rollout engine wakes with the new weights; it samples from the new policy next step.
            with timer("sync"):
                s.rollout.sync_weights(s.trainer)

            # 8. Log (a few completions too), evaluate, save.
            metrics = step_metrics(s.trainer, scores, batch, old, advantages, sums, G, timer) | info
            metrics |= s.rollout.correction.figures(s.trainer.accelerator, corrected)
            s.end_step(step + 1, metrics, timer, samples=(rollout_rows, texts, scores.reward, advantages))


if __name__ == "__main__":
    args, run = parse_args(Args, RunFlags, description=__doc__)
    validate(args, run)  # a bad flag: one line, before anything loads
    main(args, run)
