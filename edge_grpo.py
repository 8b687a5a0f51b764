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

    python edge_grpo.py                       # CPU demo: a tiny model learns to box its sums
    accelerate launch --config_file configs/accelerate/single_gpu.yaml edge_grpo.py \\
        --config recipes/edge_grpo_qwen2.5-math-1.5b.yaml
"""

import math
import random
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from common.batching import pack, rows_with_loss
from common.cli import arg, flag_record, parse_args, require
from common.logprobs import CORRECTIONS, masked_mean
from common.metrics import global_sum
from common.prompts import TEMPLATE_CHOICES, Completion, prompt_seeds
from common.rewards import accuracy_reward, without_unchecked_groups
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
        "boxed_format,accuracy",
        "comma-separated reward terms: accuracy, boxed_format, think_format, think_answer_format, dapo",
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
    weight_decay: float = arg(0.0, "AdamW weight decay", at_least=0)
    adam_beta1: float = arg(0.9, "AdamW beta1", at_least=0, below=1)
    adam_beta2: float = arg(0.999, "AdamW beta2", at_least=0, below=1)
    grad_clip: float = arg(1.0, "max global gradient norm", above=0, resumable=True)
    # The method. Defaults: docs/algorithms/edge_grpo.md (the authors' launch script).
    group_size: int = arg(8, "G: completions per prompt", at_least=2)
    temperature: float = arg(0.6, "sampling temperature T; log-probs are computed from logits / T", above=0)
    top_p: float = arg(1.0, "nucleus sampling", above=0, at_most=1)
    eps_low: float = arg(0.2, "clip range: rho >= 1 - eps_low", at_least=0, below=1)
    eps_high: float = arg(0.2, "clip range: rho <= 1 + eps_high", at_least=0)
    beta: float = arg(0.0, "k3 KL weight to the initial model (0: no reference model is loaded)", at_least=0)
    loss_agg: str = arg(
        "seq-mean-token-mean", "loss aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
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
    gec: str = arg(
        "full",
        "Guided Error Correction of incorrect completions: full (0.5 / 0.25 / 0.25), reflection_only (+Force-R: p = 1), off",
        ["full", "reflection_only", "off"],
    )
    gec_max_new_tokens: int = arg(
        256, "GEC reflection branch: tokens the policy may add after the reflection prompt", at_least=1
    )
    eda: bool = arg(True, "Entropy-Driven Advantage A_i / (P_i / mean_group(P)) (eqs. 6, 7); --eda false turns it off")
    eda_entropy_grad: bool = arg(False, "EDA with P_i from the training pass, gradient through 1 / P_i (authors' code)")
    eda_ratio_bound: float = arg(0.0, "a departure, off by default: EDA's P_hat kept within [1 / B, B] (the authors' "
                                 "commented-out clamp: B = 10); 0: unbounded, as eqs. 6-7", at_least=0)  # fmt: skip


def validate(args: Args, run: RunFlags) -> None:
    """Cross-flag checks (each flag's own range is checked as it is parsed), before anything loads."""
    check_batch_split(args.prompts_per_step, args.group_size, args.num_minibatches, launch_world())
    require(
        args.eda or not args.eda_entropy_grad,
        "--eda_entropy_grad needs --eda (it changes how EDA's entropy is computed)",
    )
    require(not args.eda_ratio_bound or (args.eda_ratio_bound > 1 and args.eda and not args.eda_entropy_grad),
            f"--eda_ratio_bound takes 0 (off) or B > 1 such as 10 (got {args.eda_ratio_bound}), and bounds EDA under "
            "pi_old: it needs --eda, not --eda_entropy_grad")  # fmt: skip
    check_correction(args.rollout_correction, args.rollout_correction_min, args.rollout_correction_max, args.top_p)
    check_rollout_sampling(run.rollout, args.temperature, args.group_size)
    run.validate()


def group_advantages(rewards: torch.Tensor, G: int, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each group of G (GRPO paper, eq. 3 of the four papers).
    A group whose rewards are all equal gets A = 0 ("advantage collapse")."""
    r = rewards.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def entropy_driven_advantages(
    adv: torch.Tensor, P: torch.Tensor, P_group_mean: torch.Tensor, floor: float = 1e-6, bound: float = 0.0
) -> torch.Tensor:
    """EDA (eqs. 6, 7): A_hat_i = A_i / P_hat_i, P_hat_i = P_i / mean_group(P) (all [n]): confident completions get larger |A|.
    Both entropies are floored at `floor`: zero entropy gives a large but finite A_hat, an all-zero group keeps A.
    bound > 1 (a departure): P_hat within [1 / bound, bound], so |A_hat| <= bound |A_i|."""
    if bound:
        return adv * (P_group_mean.clamp(min=floor) / P.clamp(min=floor)).clamp(1 / bound, bound)
    return adv * P_group_mean.clamp(min=floor) / P.clamp(min=floor)


def edge_advantages(rewards: torch.Tensor, old: dict, batch: dict, G: int, args: Args) -> tuple[torch.Tensor, dict]:
    """GRPO's advantage, rescaled by EDA on pi_old's entropies (eqs. 3, 6, 7) unless --eda false; metrics: the
    advantage variance without EDA (paper Fig. 5), the mean P_i (eq. 3), that of GEC's injected answers and
    reference solutions (last token never sampled) and their share of sum |A|, the largest |A_hat|."""
    base = group_advantages(rewards, G)
    P = masked_mean(old["entropy"], batch["completion_mask"], dim=-1)  # eq. 3: each completion's mean token entropy
    mean_P = P.view(-1, G).mean(1).repeat_interleave(G)
    adv = entropy_driven_advantages(base, P, mean_P, bound=args.eda_ratio_bound) if args.eda else base
    last = batch["completion_mask"].sum(-1, keepdim=True).long().clamp(min=1) - 1
    injected = batch["rollout_logp"].gather(1, last).squeeze(1).isnan()
    info = {"edge/adv_var_within_group_before_eda": base.view(-1, G).var(1).mean(), "edge/entropy_P": P.mean()}
    info["edge/adv_share_injected"] = adv[injected].abs().sum() / adv.abs().sum().clamp(min=1e-30)
    return adv, info | {"edge/entropy_P_injected": P[injected].mean(), "edge/adv_abs_max": adv.abs().max()}


REFLECTION = " Wait! Something is wrong here."
INJECTION = (
    "\nWait! Something is wrong here. After verification, the correct answer is \\boxed{{{}}}."  # .format(answer)
)


def check_gec_data(rows: list[dict], gec: str) -> None:
    """Full GEC injects the gold answer and swaps in the reference solution: every problem needs both."""
    no_solution, no_answer = (sum(not (row[k] or "").strip() for row in rows) for k in ("solution", "answer"))
    require(
        gec != "full" or no_solution == no_answer == 0,  # reflection only needs no solution
        f"--gec full needs a reference solution and an answer for every problem, but {no_solution} of {len(rows)} rows lack a solution "
        f"and {no_answer} an answer. Name the columns with --solution_field / --answer_field, build the data with "
        "`python -m data.prepare edge` (it keeps problems with a boxed solution), or use --gec reflection_only / --gec off",
    )


def guided_error_correction(rollout, rows: list[dict], completions: list, accuracy: list, step: int, args: Args):
    """GEC: edit every completion with accuracy 0; returns (edited completions, branch name or None each).

    --gec full: reflection (p = 0.5), answer injection (0.25), reference solution (0.25); reflection_only
    (+Force-R): reflection, p = 1. Reflections continue in one `rollout.engine.generate` call on prompt + completion
    + REFLECTION, each under its completion's own seed; the others end on the completion's stop token (the
    tokenizer's EOS if it was cut off). Inserted tokens get log-prob NaN: the engine never sampled them. An
    answer the verifier had no time to check (accuracy None) is not known wrong: left alone. `rows`: each
    completion's dataset row (prompt_ids, answer, solution)."""
    tokenizer = rollout.tokenizer
    rng = random.Random(f"gec-{args.seed}-{rollout.rank}-{step}")  # one draw per incorrect completion, in order
    seeds = prompt_seeds(args.seed + 1, step, args.prompts_per_step * args.group_size, rollout.rank, len(completions))
    eos_id = tokenizer.eos_token_id
    reflection_ids = tokenizer(REFLECTION, add_special_tokens=False).input_ids
    edited, branches, regenerate = list(completions), [None] * len(completions), []
    for i, (c, acc, row) in enumerate(zip(completions, accuracy, rows)):
        if acc is None or acc > 0:
            continue
        body, body_logp = (c.token_ids[:-1], c.logprobs[:-1]) if c.finished else (c.token_ids, c.logprobs)
        eos = c.token_ids[-1] if c.finished else eos_id
        u = rng.random() if args.gec == "full" else 0.0  # one draw per incorrect completion, in order
        if u < 0.5:
            branches[i], new = "reflection", reflection_ids
            regenerate.append(i)
        elif u < 0.75:
            branches[i], new = (
                "injection",
                tokenizer(INJECTION.format(row["answer"]), add_special_tokens=False).input_ids + [eos],
            )
        else:
            branches[i], new = "replacement", tokenizer(row["solution"], add_special_tokens=False).input_ids + [eos]
            body, body_logp = [], []
        edited[i] = Completion(body + new, body_logp + [math.nan] * len(new), finished=branches[i] != "reflection")
    # Called on every rank, even with nothing to continue: a synced engine (ZeRO-3, FSDP2) steps with its peers.
    conts = rollout.engine.generate(
        [rows[i]["prompt_ids"] + edited[i].token_ids for i in regenerate], 1, args.gec_max_new_tokens, args.temperature,
        args.top_p, seed=[seeds[i] for i in regenerate],
    )  # fmt: skip
    for i, [cont] in zip(regenerate, conts):
        edited[i] = Completion(edited[i].token_ids + cont.token_ids, edited[i].logprobs + cont.logprobs, cont.finished)
    return edited, branches


def gec_rollout(s, rows: list[dict], completions: list, texts: list[str], step: int, args: Args):
    """Step 2b: (completions, texts, branch or None each, accuracy before GEC); --gec off: unchanged, None."""
    if args.gec == "off":
        return completions, texts, [None] * len(completions), None
    accuracy = accuracy_reward(texts, [row["answer"] for row in rows], s.rewards.verifier)
    completions, branches = guided_error_correction(s.rollout, rows, completions, accuracy, step, args)
    return completions, s.rollout.texts(completions), branches, accuracy


def gec_metrics(branches, rollout_accuracy, accuracy) -> dict:
    """Per-step counts (per rank): completions edited by each branch; edits correct afterwards (all, and reflections:
    the policy's own corrections); the policy's own accuracy before GEC."""
    fixed = [b for b, acc in zip(branches, accuracy) if b is not None and acc > 0]
    counts = {f"gec/{name}": branches.count(name) for name in ("reflection", "injection", "replacement")}
    own = [a or 0.0 for a in rollout_accuracy or accuracy]  # before GEC (no GEC: the same)
    return counts | {
        "gec/fixed": len(fixed),
        "gec/reflection_fixed": fixed.count("reflection"),
        "gec/rollout_accuracy": sum(own) / len(own),
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
                logp, ent = mb.logprobs(trainer.model, args.temperature, with_entropy=args.eda_entropy_grad)
                adv = advantages[at]
                if (
                    args.eda_entropy_grad
                ):  # the authors' code: P_i from this very pass, with its gradient through 1 / P_i
                    adv = (
                        adv
                        * masked_mean(old["entropy"][at], batch["completion_mask"][at], dim=-1).clamp(min=1e-6)
                        / masked_mean(ent, mb["completion_mask"], dim=-1).clamp(min=1e-6)
                    )
                loss, stats = policy_loss(
                    logp, old["logp"][at], adv, mb["completion_mask"], args, len(minibatch), num_tokens,
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
            check_data=partial(check_gec_data, gec=args.gec), extra_context_flags=" + GEC's reflection and --gec_max_new_tokens",
            # GEC continues prompt + completion + REFLECTION (at most one token per character) by --gec_max_new_tokens.
            extra_context=0 if args.gec == "off" else len(REFLECTION) + args.gec_max_new_tokens,
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

            # 2b. GEC: edit the incorrect completions; everything below scores and trains on the edited ones.
            with timer("gec"):
                completions, texts, branches, rollout_acc = gec_rollout(s, rollout_rows, completions, texts, step, args)

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

            # 5. Advantages; EDA rescales them by the group-normalised policy entropy under pi_old (eqs. 3, 6, 7);
            # a group holding an answer the verifier had no time to check gets none.
            advantages, info = edge_advantages(scores.reward, old, batch, G, args)
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
            metrics |= gec_metrics(branches, rollout_acc, scores.accuracy.tolist())
            s.end_step(step + 1, metrics, timer, samples=(rollout_rows, texts, scores.reward, advantages))


if __name__ == "__main__":
    args, run = parse_args(Args, RunFlags, description=__doc__)
    validate(args, run)  # a bad flag: one line, before anything loads
    main(args, run)
