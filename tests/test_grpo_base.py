"""grpo_base.py's algorithm pieces against hand-computed numbers; its update's micro-batching against one pass."""

import math

import pytest
import torch
from train_utils import as_completions, scoring_session, script_flags

from common.batching import micro_batches, pack, select
from common.cli import parse_args
from common.logprobs import sequence_logprobs
from common.run_flags import RunFlags
from grpo_base import Args, group_advantages, policy_loss


def test_group_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])  # two groups of 4
    a = group_advantages(r, G=4)
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    torch.testing.assert_close(a[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6))
    std2 = math.sqrt(0.25)  # [1, 1, 0, 1]: mean 0.75, unbiased var 0.25
    torch.testing.assert_close(a[4:], torch.tensor([0.25, 0.25, -0.75, 0.25]) / (std2 + 1e-6))


@pytest.mark.parametrize("value", [0.0, 1.0, 0.37])
def test_all_equal_group_has_zero_advantage_not_nan(value):
    a = group_advantages(torch.full((8,), value), G=8)
    assert torch.isfinite(a).all() and (a == 0).all()


def test_group_of_one_is_refused_by_its_flag_not_nan():
    # torch.std of one element is NaN; G = 1 is meaningless for GRPO.
    with pytest.raises(SystemExit, match="--group_size must be >= 2"):
        parse_args(Args, RunFlags, argv=["--group_size", "1"])


def loss_of(agg, adv, mask, logp=None, old=None, **kw):
    args = Args(loss_agg=agg, max_completion_len=mask.shape[1], **kw)
    logp = torch.zeros(mask.shape) if logp is None else logp
    old = torch.zeros(mask.shape) if old is None else old
    n_tok = mask.sum().item()
    return policy_loss(logp, old, adv, mask, args, num_seqs=mask.shape[0], num_tokens=n_tok)


# Two sequences: 3 valid tokens with A = 1, 1 valid token with A = -2; ratio = 1,
# so the per-token losses are -1, -1, -1 and +2.
MASK = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])
ADV = torch.tensor([1.0, -2.0])


def test_token_mean():
    assert loss_of("token-mean", ADV, MASK)[0].item() == pytest.approx((-3 + 2) / 4)


def test_seq_mean_token_mean():
    assert loss_of("seq-mean-token-mean", ADV, MASK)[0].item() == pytest.approx((-1 + 2) / 2)


def test_seq_mean_token_sum_norm():
    assert loss_of("seq-mean-token-sum-norm", ADV, MASK)[0].item() == pytest.approx((-3 + 2) / (2 * 4))


def test_micro_batches_sum_to_the_full_batch_loss():
    torch.manual_seed(0)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1
    logp, old, adv = -torch.rand(6, 5), -torch.rand(6, 5), torch.randn(6)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        args = Args(loss_agg=agg, max_completion_len=5)
        full = policy_loss(logp, old, adv, mask, args, 6, mask.sum().item())[0]
        parts = sum(
            policy_loss(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], args, 6, mask.sum().item())[0]
            for i in (0, 2, 4)
        )
        torch.testing.assert_close(parts, full)


@pytest.mark.parametrize(
    "ratio, adv, expected_loss, has_grad",
    [
        (1.5, 1.0, -1.2, False),  # A > 0, ratio above 1 + eps: clipped, no gradient
        (0.5, 1.0, -0.5, True),  # A > 0, ratio below 1 - eps: the unclipped term is the min
        (0.5, -1.0, 0.8, False),  # A < 0, ratio below 1 - eps: clipped, no gradient
        (1.5, -1.0, 1.5, True),  # A < 0, ratio above 1 + eps: unclipped, pushed back down
        (1.1, 1.0, -1.1, True),  # inside the trust region
    ],
)
def test_clipping(ratio, adv, expected_loss, has_grad):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = loss_of("token-mean", torch.tensor([adv]), torch.ones(1, 1), logp=logp)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-5)
    loss.backward()
    assert (logp.grad.abs().item() > 0) == has_grad
    assert stats["clip_low"] + stats["clip_high"] == (0.0 if has_grad else 1.0)
    assert stats["clip_low" if adv < 0 else "clip_high"] == (0.0 if has_grad else 1.0)  # the side that bounds the move


def test_asymmetric_clip_range():
    logp = torch.tensor([[math.log(1.25)]])
    loss, stats = loss_of("token-mean", torch.tensor([1.0]), torch.ones(1, 1), logp=logp, eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and stats["clip_high"] == 0.0  # inside [0.8, 1.28]


def test_k3_kl_term():
    logp = torch.tensor([[-1.0]])
    ref = torch.tensor([[-1.5]])
    args = Args(beta=0.1, loss_agg="token-mean")
    loss, _ = policy_loss(logp, logp.clone(), torch.tensor([0.0]), torch.ones(1, 1), args, 1, 1, ref_logp=ref)
    d = -0.5
    assert loss.item() == pytest.approx(0.1 * (math.exp(d) - d - 1))


def test_context_overflow_is_refused_before_the_model_loads(tiny_random_dir, tmp_path):
    import shutil

    from transformers import AutoConfig

    import grpo_base

    model_dir = tmp_path / "short-context"
    shutil.copytree(tiny_random_dir, model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    config.max_position_embeddings = 64
    config.save_pretrained(model_dir)
    (model_dir / "model.safetensors").write_bytes(b"not loaded: the check comes first")
    flags = script_flags(
        "grpo_base.py",
        model=str(model_dir),
        rollout="hf",
        max_prompt_len=40,
        max_completion_len=48,
        output_dir=str(tmp_path / "run"),
    )
    with pytest.raises(
        SystemExit, match=r"--max_prompt_len \+ --max_completion_len = 88 tokens, more than .* context of 64"
    ):
        grpo_base.main(*flags)


PROMPTS = [3, 9, 5, 4, 7, 2, 8, 6]
COMPLETIONS = [10, 2, 30, 7, 1, 25, 12, 4]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_loss_and_gradients_equal_one_unbucketed_pass(tiny_random_model, agg):
    """Token-budget micro-batches, each cut to its own lengths, give the loss and gradients of the
    whole batch in one padded pass (global denominators)."""
    model, _ = tiny_random_model
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    batch = pack(
        [torch.randint(3, V, (p,), generator=g).tolist() for p in PROMPTS],
        as_completions([torch.randint(3, V, (c,), generator=g).tolist() for c in COMPLETIONS]),
        pad_id=0,
    )
    mask, n = batch["completion_mask"], len(PROMPTS)
    old = -torch.rand(mask.shape, generator=g)
    adv = torch.randn(n, generator=g)
    args = Args(loss_agg=agg, max_completion_len=mask.shape[1])

    def run(plan):
        model.zero_grad()
        total = 0.0
        for idx in plan:
            mb = select(batch, idx)
            C = mb["completion_mask"].shape[1]
            logp, _ = sequence_logprobs(model, mb["input_ids"], mb["attention_mask"], 1.0, logits_to_keep=C)
            loss, _ = policy_loss(logp, old[mb["rows"]], adv[mb["rows"]], mb["completion_mask"], args, n, mask.sum())
            loss.backward()
            total += loss.item()
        return total, {k: p.grad.clone() for k, p in model.named_parameters()}

    whole = run([list(range(n))])
    bucketed = run(micro_batches(PROMPTS, COMPLETIONS, list(range(n)), 99, max_tokens=60))
    assert bucketed[0] == pytest.approx(whole[0], rel=1e-5, abs=1e-7)
    for k in whole[1]:
        torch.testing.assert_close(bucketed[1][k], whole[1][k], rtol=1e-4, atol=1e-6, msg=k)
    model.zero_grad(set_to_none=True)


def update_session(model, micro_batch_size: int = 3, layout: str = "padded"):
    """A one-process trainer holding what update() uses: the real accelerator, micro-batch plan,
    accumulation and optimiser step. SGD at lr 0 leaves the model as it is; a hook keeps each
    optimiser step's gradients."""
    from common.metrics import UpdateGuard
    from common.trainer import Trainer, make_accelerator, parallel_mode

    accelerator = make_accelerator("no", grad_clip=1e9)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    grads = []
    opt.register_step_pre_hook(lambda o, a, k: grads.append({n: p.grad.clone() for n, p in model.named_parameters()}))
    s = Trainer(
        accelerator, parallel_mode(accelerator), model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
        UpdateGuard(0), grad_clip=1e9, micro_batch_size=micro_batch_size, layout=layout,
    )  # fmt: skip
    return s, grads


def flat_groups_batch(model, G=3, groups=4, seed=0):
    """`groups` groups of G random completions of one random prompt each; old / rollout log-probs near the
    model's own."""
    g = torch.Generator().manual_seed(seed)
    V, n = model.config.vocab_size, G * groups
    prompts = [
        torch.randint(3, V, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist() for _ in range(groups)
    ]
    prompts = [p for p in prompts for _ in range(G)]
    comps = [
        torch.randint(3, V, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]
    batch = pack(prompts, as_completions(comps), pad_id=0)
    mask = batch["completion_mask"]
    old = {"logp": -torch.rand(mask.shape, generator=g), "ref_logp": -torch.rand(mask.shape, generator=g)}
    return batch, old


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
def test_rows_with_zero_advantage_are_left_out_and_the_update_is_unchanged(tiny_random_model, agg, beta, layout):
    """Groups 0 and 2 are flat (A = 0): without a KL term their rows are not forwarded, yet the loss and
    the gradient equal one padded pass over the whole batch with the method's denominators (all G * groups
    sequences, all tokens). With --beta > 0 the KL term acts on every row: nothing is left out.
    The same with each micro-batch packed into one row (--padding_free) and with one row per prompt
    (--share_prompts)."""
    import grpo_base

    model, _ = tiny_random_model
    batch, old = flat_groups_batch(model)
    mask, n = batch["completion_mask"], len(batch["input_ids"])
    rewards = torch.tensor([0.0, 0, 0, 1, 0, 1, 1, 1, 1, 0, 0, 1])
    adv = group_advantages(rewards, 3)
    args = Args(loss_agg=agg, max_completion_len=mask.shape[1], beta=beta, group_size=3)

    model.zero_grad(set_to_none=True)
    logp, _ = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], 1.0, logits_to_keep=mask.shape[1])
    full, _ = policy_loss(logp, old["logp"], adv, mask, args, n, mask.sum(), old["ref_logp"])
    full.backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    s, grads = update_session(model, layout=layout)
    forwarded = []  # the real tokens of each forward
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: forwarded.append(int((kw["input_ids"] != 0).sum())), with_kwargs=True
    )
    try:
        sums = grpo_base.update(s, batch, old, adv, None, args, step=0)
    finally:
        hook.remove()
    skipped = 0 if beta > 0 else 6
    live = [r for r in range(n) if beta > 0 or adv[r] != 0]
    tokens = sum(batch["prompt_lens"][r] + batch["completion_lens"][r] for r in live)
    assert sums["skipped_rows"] == skipped
    assert sum(forwarded) < tokens if layout == "shared" else sum(forwarded) == tokens  # some prompts computed once
    assert sums["loss"] == pytest.approx(full.item(), rel=1e-5, abs=1e-7)
    assert sums["tokens"] == mask[adv != 0].sum().item() if beta == 0 else mask.sum().item()  # the rows trained on
    for k, g in grads[0].items():
        torch.testing.assert_close(g, want[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("mu", [1, 2])
def test_clip_shares_count_every_token_of_the_batch_and_kl_the_trained_ones(tiny_random_model, mu):
    """Half the rows flat (advantage 0, left out of the update): clip_frac_low/high are shares of every completion
    token of the batch (TRL's clip_ratio and verl's pg_clipfrac count zero-advantage tokens, which are never
    clipped), approx_kl a mean over the tokens trained on (a flat row's pi_theta is never computed)."""
    from types import SimpleNamespace

    import grpo_base

    model, _ = tiny_random_model
    batch, _ = flat_groups_batch(model)
    mask = batch["completion_mask"]
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], logits_to_keep=mask.shape[1])
    g = torch.Generator().manual_seed(1)
    old = {"logp": logp + torch.randn(mask.shape, generator=g), "ref_logp": logp, "entropy": torch.zeros_like(logp)}
    adv = torch.tensor([1.0, -0.5, -0.5, -1.0, 0.5, 0.5] + [0.0] * 6)  # groups 3 and 4 flat
    args = Args(group_size=3, mu=mu)
    s, _ = update_session(model, micro_batch_size=2)  # lr 0: pi_theta stays the model, in every pass
    sums = grpo_base.update(s, batch, old, adv, None, args, step=0)
    scores = SimpleNamespace(reward=(adv > 0).float(), accuracy=(adv > 0).float())
    timer = SimpleNamespace(seconds={"update": 1.0})
    metrics = grpo_base.step_metrics(s, scores, batch, old, adv, sums, 3, timer)

    ratio, a, trained = torch.exp(logp - old["logp"]), adv[:, None], mask * (adv != 0)[:, None]
    clip_low, clip_high = ((ratio < 0.8) & (a < 0)) * mask, ((ratio > 1.2) & (a > 0)) * mask
    assert 0 < clip_low.sum() and 0 < clip_high.sum()
    assert metrics["train/clip_frac_low"] == pytest.approx(clip_low.sum().item() / mask.sum().item())
    assert metrics["train/clip_frac_high"] == pytest.approx(clip_high.sum().item() / mask.sum().item())
    kl = ((ratio - 1 - ratio.log()) * trained).sum() / trained.sum()
    assert metrics["train/approx_kl"] == pytest.approx(kl.item(), rel=1e-4)


def test_all_flat_update_still_steps_on_zero_gradients(tiny_random_model):
    """Every advantage 0: one empty micro-batch runs, so the optimiser steps on zero gradients (AdamW's
    momentum and weight decay act) exactly as after a full pass, never on missing ones."""
    import grpo_base

    model, _ = tiny_random_model
    batch, old = flat_groups_batch(model)
    s, grads = update_session(model)
    sums = grpo_base.update(s, batch, old, torch.zeros(12), None, Args(group_size=3), step=0)
    assert sums["skipped_rows"] == 12 and sums["loss"] == 0.0 and sums["optimizer_steps"] == 1
    assert all(g is not None and not g.any() for g in grads[0].values())


def count_host_syncs(monkeypatch) -> list:
    """Record each call from this repository's code (scripts, common/; not tests/, not torch.optim's host step
    counters) that would make the host wait for a CUDA device: a value read (.item(), .tolist(), bool(t), ...),
    a Python list used as an index, read or written (a blocking host-to-device copy), or a boolean mask as an
    index (its size is read back). As
    benchmarks/host_syncs.py counts them, which also counts transformers' own."""
    import sys
    from pathlib import Path

    import grpo_base

    root = str(Path(grpo_base.__file__).parent)
    calls = []

    def ours():
        frame = sys._getframe(2)
        while frame and "/torch/" in frame.f_code.co_filename:
            if "/torch/optim/" in frame.f_code.co_filename:
                return False
            frame = frame.f_back
        return frame and frame.f_code.co_filename.startswith(root) and "/tests/" not in frame.f_code.co_filename

    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda t, *a, _o=original, **k: (calls.append(1) if ours() else None, _o(t, *a, **k))[1]
        )
    blocking = lambda i: isinstance(i, list) or (torch.is_tensor(i) and i.dtype == torch.bool)  # noqa: E731
    listed = lambda i: blocking(i) or (isinstance(i, tuple) and any(blocking(j) for j in i))  # noqa: E731
    for name in ("__getitem__", "__setitem__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda t, i, *a, _o=original: (calls.append(1) if listed(i) and ours() else None, _o(t, i, *a))[1],
        )
    return calls


def test_update_reads_nothing_from_the_device_per_micro_batch(tiny_random_model, monkeypatch):
    """The host waits for the device a fixed number of times per optimiser step, however many micro-batches
    it takes: the micro-batches' sums stay on the device."""
    import grpo_base

    syncs = count_host_syncs(monkeypatch)
    model, _ = tiny_random_model
    batch, old = flat_groups_batch(model)
    adv = torch.randn(12)
    counts = []
    for micro_batch_size in (6, 2):  # 2 and 6 micro-batches
        s, _ = update_session(model, micro_batch_size=micro_batch_size)
        syncs.clear()
        grpo_base.update(s, batch, old, adv, None, Args(group_size=3), step=0)
        counts.append(len(syncs))
    assert counts[0] == counts[1] <= 2, counts  # the rows to train, and the optimiser step's sums


@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
@pytest.mark.parametrize("script", ["grpo_base", "pro_grpo"])
def test_old_logprobs_waits_for_the_device_never(tiny_random_model, monkeypatch, script, layout):
    """The scoring pass writes each micro-batch's log-probs at its rows' device index (`select`'s "rows"),
    not at a Python list of them (a blocking copy per micro-batch); an empty micro-batch (a rank with fewer
    rows than its peers) writes nothing. Each layout's indices are made on the host (the packed one's too:
    it took the real tokens with a boolean mask)."""
    import importlib

    from common.batching import micro_batches

    module = importlib.import_module(script)
    model, _ = tiny_random_model
    batch, _ = flat_groups_batch(model)
    plans = {"whole": [list(range(12))], "6": micro_batches(batch["prompt_lens"], batch["completion_lens"],
             list(range(12)), 2) + [[]]}  # fmt: skip
    outs = {}
    for name, plan in plans.items():
        s = scoring_session(model, ref_model=model, layout=layout)
        s.micro_batch_plan = lambda batch, rows, plan=plan: plan
        syncs = count_host_syncs(monkeypatch)
        outs[name] = module.old_logprobs(s, batch, module.Args(group_size=3))
        assert syncs == [], f"{len(syncs)} host syncs in {script}.old_logprobs over {len(plan)} micro-batches"
        monkeypatch.undo()
    for k, v in outs["whole"].items():  # at real tokens (a padded position's score depends on the cut)
        prompt = batch["prompt_mask"]
        real = prompt[:, 1:] * prompt[:, :-1] if k == "prompt_logp" else batch["completion_mask"]
        torch.testing.assert_close(outs["6"][k] * real, v * real, rtol=1e-5, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
