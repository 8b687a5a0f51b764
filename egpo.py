"""EGPO (Know What You Know: Metacognitive Entropy Calibration, arXiv 2602.22751), one file, top to bottom.

grpo_base.py plus one idea: each completion's group advantage is rescaled by how sure pi_old
was of it, asymmetrically by outcome, and entirely-incorrect groups get a damped negative
signal instead of none (`diff grpo_base.py egpo.py`).

    H_i     = -1/|o_i| sum_t log pi_old(o_it | q, o_<t)       (eq. 5: entropy proxy, the old log-probs)
    w_i     = mean_group(H) / (H_i + 1e-6)                     (eq. 7)
    w_i     = clamp(w_i, 1, lambda_max)  if r_i > 0            (eq. 8: a correct answer is never down-weighted,
              clamp(w_i, lambda_min, 1)  otherwise                      an incorrect one never up-weighted)
    A_i     = GRPO advantage; -1 in an entirely-incorrect group (eq. 13: negative sample reinforcement, NSR)
    A_hat_i = w_i * A_i                                        (replaces A_i in the clipped surrogate, eq. 12)

Entirely-correct groups keep A = 0. --variant c1..c6 gives the ablation rows of Table 2;
--entropy_span answer takes H over the tokens after the first `</think>`, as the authors' code does.
Every decision, and how this differs from the authors' code: docs/algorithms/egpo.md.

    python egpo.py                            # CPU demo: a tiny model learns to box its sums
    accelerate launch --config_file configs/accelerate/ddp_8gpu.yaml egpo.py \\
        --config recipes/egpo_qwen2.5-math-1.5b.yaml
"""

import math
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from common.batching import pack, rows_with_loss
from common.cli import arg, flag_record, parse_args, require
from common.logprobs import CORRECTIONS, masked_mean
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
    # The method. Defaults: docs/algorithms/egpo.md (the paper, the authors' code).
    group_size: int = arg(8, "G: completions per prompt", at_least=2)
    temperature: float = arg(1.0, "sampling temperature T; log-probs are computed from logits / T", above=0)
    top_p: float = arg(1.0, "nucleus sampling", above=0, at_most=1)
    eps_low: float = arg(0.2, "clip range: rho >= 1 - eps_low", at_least=0, below=1)
    eps_high: float = arg(0.2, "clip range: rho <= 1 + eps_high", at_least=0)
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
    lambda_max: float = arg(2.0, "upper clamp bound of a correct completion's weight (eq. 8)", at_least=1)
    lambda_min: float = arg(0.5, "lower clamp bound of an incorrect completion's weight (eq. 8)", above=0, at_most=1)
    nsr: bool = arg(True, "an entirely-incorrect group's completions get A = -1 (eq. 13); false: A = 0, as in GRPO")
    variant: str = arg("egpo", "Table 2's row: egpo, or ablation c1..c6", ["egpo", "c1", "c2", "c3", "c4", "c5", "c6"])
    entropy_span: str = arg(
        "response", "H over the response (paper) or after </think> (authors' code)", ["response", "answer"]
    )


def validate(args: Args, run: RunFlags) -> None:
    """Cross-flag checks (each flag's own range is checked as it is parsed), before anything loads."""
    check_batch_split(args.prompts_per_step, args.group_size, args.num_minibatches, launch_world())
    require(
        args.rewards == "accuracy" and not args.reward_fn,
        "--rewards must be 'accuracy' (and no --reward_fn): EGPO reads correctness as r_i > 0 from the binary outcome reward (eq. 1)",
    )
    check_correction(args.rollout_correction, args.rollout_correction_min, args.rollout_correction_max, args.top_p)
    check_rollout_sampling(run.rollout, args.temperature, args.group_size)
    run.validate()


def group_advantages(rewards: torch.Tensor, G: int, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each group of G (GRPO paper, eq. 3 of the four papers).
    A group whose rewards are all equal gets A = 0 ("advantage collapse")."""
    r = rewards.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def span_after(input_ids: torch.Tensor, completion_mask: torch.Tensor, marker: list[int]) -> torch.Tensor:
    """The completion tokens after the first `marker` (the ids of `</think>`) in each row, as the
    authors' code takes them; the whole completion where it does not occur (--entropy_span answer).
    input_ids: [N, P + C] as `pack` lays them out; completion_mask: [N, C]. Returns a mask like it."""
    C, k = completion_mask.shape[1], len(marker)
    span = completion_mask.clone()
    for i, row in enumerate(input_ids[:, -C:].tolist()):
        ends = [j + k for j in range(int(completion_mask[i].sum()) - k + 1) if row[j : j + k] == marker]
        span[i, : ends[0] if ends else 0] = 0
    return span


def renorm(w: torch.Tensor) -> torch.Tensor:
    """w / mean_group(w) (eq. 9); a group of all-zero weights (every H = 0) is a tie: all 1."""
    mean = w.mean(1, keepdim=True)
    return torch.where(mean > 0, w / mean.clamp(min=1e-30), 1.0)


def calibrated_advantages(
    rewards: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, G: int, args: Args, eps: float = 1e-6
):
    """Entropy-calibrated advantages A_hat = w * A (eqs. 5, 7, 8, 13; ablations C1-C6 of Table 2).

    rewards: [N] binary outcomes, N = groups * G; old_logp, mask: [N, C] under pi_old (mask: the
    tokens of the proxy). Returns A_hat [N] and per-completion diagnostics: the proxy H, the final
    weight w, whether the completion is in an NSR group, and which clamp bound its weight hit (nan: none).
    """
    r = rewards.view(-1, G)
    correct = r > 0
    nsr = ~correct.any(1, keepdim=True).expand_as(r) & args.nsr  # entirely-incorrect group, trained by NSR
    adv = torch.where(nsr, -1.0, group_advantages(rewards, G).view(-1, G))  # eq. 13; all-correct keep A = 0
    H = -masked_mean(old_logp, mask, dim=-1).view(-1, G)  # eq. 5: mean negative log-likelihood
    w = H.mean(1, keepdim=True) / (H + eps)  # eq. 7
    if args.variant == "c6":
        w = renorm(w)
    one, inf = torch.ones_like(w), torch.full_like(w, math.inf)
    lo = torch.where(correct, one, args.lambda_min * one)  # eq. 8: asymmetric
    hi = torch.where(correct, args.lambda_max * one, one)
    if args.variant == "c1":  # symmetric
        lo, hi = args.lambda_min * one, args.lambda_max * one
    elif args.variant == "c2":  # only incorrect answers are constrained
        lo, hi = torch.where(correct, -inf, lo), torch.where(correct, inf, hi)
    elif args.variant == "c3":  # only correct answers are constrained
        lo, hi = torch.where(correct, lo, -inf), torch.where(correct, hi, inf)
    bound = torch.where(w > hi, hi, torch.where(w < lo, lo, math.nan))
    w = torch.clamp(w, lo, hi)
    if args.variant == "c5":
        w = renorm(w)
    if args.variant == "c4":  # NSR without entropy damping
        w, bound = torch.where(nsr, 1.0, w), torch.where(nsr, math.nan, bound)
    info = {"H": H.view(-1), "w": w.view(-1), "nsr": nsr.reshape(-1), "bound": bound.view(-1)}
    return (w * adv).view(-1), info


def weight_stats(d: dict, rewards: torch.Tensor, G: int, args: Args) -> dict:
    """Weights of the completions that are trained (entirely-correct groups have A = 0): range and clamp shares."""
    trained = ~(rewards.view(-1, G) > 0).all(1, keepdim=True).expand(-1, G).reshape(-1)
    w, bound = d["w"][trained], d["bound"][trained]
    names = ["w_min", "w_mean", "w_max", "w_at_lambda_max_frac", "w_at_one_frac", "w_at_lambda_min_frac"]
    if w.numel() == 0:
        return dict.fromkeys(names, math.nan)
    shares = [(bound == v).float().mean() for v in (args.lambda_max, 1.0, args.lambda_min)]
    return dict(zip(names, [w.min(), w.mean(), w.max(), *shares]))


def egpo_advantages(rewards: torch.Tensor, old: dict, batch: dict, G: int, args: Args,
                    entropy_mask: torch.Tensor) -> tuple[torch.Tensor, dict]:  # fmt: skip
    """EGPO's advantage step on pi_old's log-probs, the proxy H over `entropy_mask`'s tokens, and its metrics: the
    proxy by outcome (Fig. 3; NaN when a step has none), the share of NSR groups, the weights and their clamps."""
    adv, d = calibrated_advantages(rewards, old["logp"], entropy_mask, G, args)
    metrics = {
        "egpo/entropy_proxy_correct": d["H"][rewards > 0].mean(),
        "egpo/entropy_proxy_incorrect": d["H"][rewards <= 0].mean(),
        "egpo/nsr_group_frac": d["nsr"].view(-1, G)[:, 0].float().mean(),
    }
    return adv, metrics | {f"egpo/{k}": v for k, v in weight_stats(d, rewards, G, args).items()}


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
    entropies [N, C], and the reference model's log-probs when --beta > 0."""
    out = {k: torch.zeros_like(batch["completion_mask"]) for k in ("logp", "entropy", "ref_logp")}
    with torch.no_grad():
        for mb in trainer.micro_batches(batch, range(len(batch["input_ids"]))):
            at, n, C = mb["rows"][: mb.n], mb.n, mb["completion_mask"].shape[1]  # the real rows, on the device
            logp, ent = mb.logprobs(trainer.model, args.temperature, with_entropy=True)
            out["logp"][at, :C], out["entropy"][at, :C] = logp[:n], ent[:n]
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

            # 5. Advantages; a group holding an answer the verifier had no time to check gets none.
            # EGPO's: GRPO's (-1 in entirely-incorrect groups) x the entropy weights of H over entropy_mask's tokens.
            entropy_mask = batch["completion_mask"]  # the paper's H: over the whole response
            if args.entropy_span == "answer":  # the authors' code: H over the tokens after </think>
                think_end = s.rollout.tokenizer.encode("</think>", add_special_tokens=False)
                entropy_mask = span_after(batch["input_ids"], batch["completion_mask"], think_end)
            advantages, info = egpo_advantages(scores.reward, old, batch, G, args, entropy_mask)
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
