"""--beta > 0 logs the KL to the reference model it penalises (issue 33, "also seen"): train/kl_ref, the k3
estimate of KL(pi_theta || pi_ref) per token trained on, in all five scripts; null without a reference."""

import importlib
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

SCRIPTS = ["grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_beta_logs_the_kl_to_the_reference(script):
    module = importlib.import_module(script)
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=g) - 0.1
    ref = logp + 0.3 * torch.randn(4, 5, generator=g)
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    _, sums = module.policy_loss(logp, logp, adv, mask, module.Args(beta=0.1), 4, mask.sum(), ref)
    d = ref - logp
    assert float(sums["kl_ref"]) == pytest.approx(float(((torch.exp(d) - d - 1) * mask).sum()))
    _, without = module.policy_loss(logp, logp, adv, mask, module.Args(beta=0.0), 4, mask.sum(), ref)
    assert "kl_ref" not in without

    s = SimpleNamespace(accelerator=SimpleNamespace(device="cpu", num_processes=1))
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    scores = SimpleNamespace(reward=rewards, accuracy=rewards)
    batch = {"completion_mask": mask, "rollout_logp": logp, "finished": torch.ones(4, dtype=torch.bool)}
    old = {"logp": logp, "entropy": torch.rand(4, 5, generator=g)}
    timer = SimpleNamespace(seconds={"rollout": 1.0})
    common = dict(clip_low=0, clip_high=0, approx_kl=0, tokens=float(mask.sum()), batch_tokens=float(mask.sum()))
    common |= dict(loss=1.0, optimizer_steps=1, grad_norm=1.0, skipped=0, skipped_rows=0)
    logged = module.step_metrics(
        s, scores, batch, old, rewards, Counter(common, kl_ref=float(sums["kl_ref"])), 2, timer
    )
    assert float(logged["train/kl_ref"]) == pytest.approx(float(sums["kl_ref"]) / float(mask.sum()))
    assert math.isnan(module.step_metrics(s, scores, batch, old, rewards, Counter(common), 2, timer)["train/kl_ref"])
