"""--rollout_correction (common/logprobs.py): each mode's weights against its formula, hand-computed;
the weights in the loss; auto's choice; the flags' checks in every script."""

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from common.batching import rows_with_loss
from common.cli import parse_args
from common.logprobs import MODES, RolloutCorrection, percentile, rollout_correction
from common.models import precision_for
from common.run_flags import RunFlags

# Two completions of 3 tokens. Row 0: pi_old / pi_rollout = 0.5, 1.5, 3 per token. Row 1: 2, then a token the engine
# did not sample (EDGE-GRPO's insertion: NaN rollout log-prob), then padding.
OLD = torch.zeros(2, 3)
ROLLOUT = -torch.log(torch.tensor([[0.5, 1.5, 3.0], [2.0, math.nan, 1.0]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
BATCH = {"rollout_logp": ROLLOUT, "completion_mask": MASK}
ROW0_SEQ = 0.5 * 1.5 * 3.0  # 2.25: the product of row 0's token ratios
ROW0_GEO = ROW0_SEQ ** (1 / 3)  # 1.31...


def weights(mode: str, low=None, high=None):
    _, _, default_low, default_high = MODES[mode]
    corr = RolloutCorrection(mode, default_low if low is None else low, default_high if high is None else high)
    return corr.weights(OLD, BATCH)


def sampled_weights(w) -> list:
    """Row 0's three tokens and row 1's first (the sampled ones); row 1's insertion must be 1."""
    assert w[1, 1].item() == 1.0  # a token the engine did not sample keeps weight 1
    return [*w[0].tolist(), w[1, 0].item()]


@pytest.mark.parametrize(
    "mode, low, high, want",
    [
        ("token_truncate", None, None, [0.5, 1.5, 2.0, 2.0]),  # min(rho_t, 2)
        ("token_mask", None, None, [0.5, 1.5, 3.0, 2.0]),  # all within IcePop's [0.5, 5]
        ("token_mask", 0.6, 2.5, [0.0, 1.5, 0.0, 2.0]),  # outside the bounds: 0
        ("sequence_truncate", None, None, [2.0, 2.0, 2.0, 2.0]),  # min(2.25, 2) on row 0; row 1's ratio is 2
        ("sequence_mask", None, None, [ROW0_SEQ] * 3 + [2.0]),  # within TRL's 3
        ("sequence_mask", None, 2.1, [0.0, 0.0, 0.0, 2.0]),
        ("geometric_mask", None, None, [0.0, 0.0, 0.0, 0.0]),  # 1.31 and 2: outside [0.999, 1.001]
        ("geometric_mask", 1.0, 1.4, [1.0, 1.0, 1.0, 0.0]),  # a rejection: kept rows weigh 1, not their ratio
    ],
)
def test_each_modes_weights_against_its_formula(mode, low, high, want):
    w, _ = weights(mode, low, high)
    assert sampled_weights(w) == pytest.approx(want)
    assert not w.requires_grad


def test_the_figures_measure_before_correcting_and_count_what_changed():
    """|d| per sampled token, the raw ratio at the mode's level, the weight applied, the share changed."""
    from types import SimpleNamespace

    one = SimpleNamespace(num_processes=1, device="cpu")
    corr = RolloutCorrection("token_truncate", 0.0, 2.0)
    w, stats = corr.weights(OLD, BATCH)
    figures = {k: float(v) for k, v in corr.figures(one, stats).items()}
    logs = [math.log(0.5), math.log(1.5), math.log(3.0), math.log(2.0)]
    assert figures["train/rollout_logp_gap"] == pytest.approx(sum(map(abs, logs)) / 4)
    assert figures["train/rollout_is_ratio_mean"] == pytest.approx((0.5 + 1.5 + 3 + 2) / 4)
    assert figures["train/rollout_is_ratio_max"] == pytest.approx(3.0)
    assert figures["train/rollout_is_weight_mean"] == pytest.approx((0.5 + 1.5 + 2 + 2) / 4)
    assert figures["train/rollout_is_corrected_frac"] == pytest.approx(1 / 4)  # only the 3 was capped
    assert figures["train/rollout_logp_gap_p99"] == pytest.approx(torch.tensor([abs(x) for x in logs]).quantile(0.99))
    none, stats = RolloutCorrection("none", 0.0, math.inf).weights(OLD, BATCH)
    figures = {k: float(v) for k, v in corr.figures(one, stats).items()}
    assert none is None and figures["train/rollout_is_corrected_frac"] == 0.0  # measured, not applied
    assert figures["train/rollout_is_weight_mean"] == 1.0
    _, stats = RolloutCorrection("geometric_mask", 0.999, 1.001).weights(OLD, BATCH)
    assert float(corr.figures(one, stats)["train/rollout_is_corrected_frac"]) == 1.0  # every sampled token rejected


def test_the_p99_holds_above_the_2_to_the_24_cells_torch_quantile_refuses():
    """A rank's [N, C] rollout past 2^24 cells (DAPO's 8,192 x 3,072 on one GPU): torch.quantile raises there."""
    values = torch.rand(2049, 8192)
    valid = torch.rand(2049, 8192) > 0.5
    with pytest.raises(RuntimeError, match="too large"):
        values.flatten().quantile(0.99)
    want = np.quantile(values.numpy()[valid.numpy()], 0.99)  # numpy: the same interpolation, no size limit
    assert percentile(values, valid, 0.99).item() == pytest.approx(want, rel=1e-6)
    assert percentile(values, torch.zeros_like(valid), 0.99).isnan()


def test_no_torch_quantile_on_the_training_path():
    """The class of the p99's crash: torch.quantile / nanquantile anywhere a step runs."""
    root = Path(__file__).resolve().parents[1]
    sources = [*root.glob("*.py"), *root.glob("baselines/*.py"), *root.glob("common/*.py")]
    calls = [
        f"{path.name}:{node.lineno}"
        for path in sources
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("quantile", "nanquantile")
    ]
    assert calls == []


def test_rows_the_correction_rejects_whole_are_not_trained():
    """sequence_mask under 2.1 weighs row 0 (ratio 2.25) 0 at every token: its loss and gradient are 0."""
    w, _ = weights("sequence_mask", None, 2.1)
    advantages = torch.tensor([1.0, -1.0])
    assert rows_with_loss(advantages, MASK, False, w) == [False, True]
    assert rows_with_loss(advantages, MASK, False, None) == [True, True]
    assert rows_with_loss(advantages, MASK, True, w) == [True, True]  # a KL term acts on it still


def test_auto_corrects_where_a_run_computes_in_bf16_and_not_in_fp32():
    fp32, mixed = precision_for("fp32", gpu=False), precision_for("bf16-mixed", gpu=False)
    assert rollout_correction("auto", None, None, fp32, 1.0).mode == "none"
    assert rollout_correction("auto", None, None, precision_for("auto", gpu=False), 1.0).mode == "none"
    assert rollout_correction("auto", None, None, mixed, 1.0) == RolloutCorrection("token_truncate", 0.0, 2.0)
    assert rollout_correction("auto", None, None, precision_for("auto", gpu=True), 1.0).mode == "token_truncate"
    assert rollout_correction("auto", None, None, mixed, 0.95).mode == "none"  # top-p: the ratios are biased
    assert rollout_correction("sequence_mask", 0.5, None, fp32, 1.0) == RolloutCorrection("sequence_mask", 0.5, 3.0)


def test_the_weights_multiply_each_tokens_surrogate_in_the_loss():
    """At ratio 1 and A = 1 each token's surrogate is -1: the loss is minus the mean weight (token-mean)."""
    from grpo_base import Args, policy_loss

    w, _ = weights("token_truncate")
    args = Args(loss_agg="token-mean")
    loss, _ = policy_loss(torch.zeros(2, 3), OLD, torch.tensor([1.0, 1.0]), MASK, args, 2, 5, is_weight=w)
    assert loss.item() == pytest.approx(-(0.5 + 1.5 + 2.0 + 2.0 + 1.0) / 5)
    off, _ = policy_loss(torch.zeros(2, 3), OLD, torch.tensor([1.0, 1.0]), MASK, args, 2, 5)
    assert off.item() == pytest.approx(-1.0)


SCRIPTS = ["grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo"] + [
    f"baselines.{b}" for b in ("dapo", "dr_grpo", "gspo", "kl_cov")
]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_checks_the_correction_flags_together(script):
    """Under --top_p < 1 the engine's log-probs are renormalised over the nucleus (pi_old / pi_rollout sits below
    1 by the dropped mass): an explicit correction is refused, auto and none pass; bounds need a mode and order."""
    module = __import__(script, fromlist=["Args"])

    def check(*argv):
        module.validate(*parse_args(module.Args, RunFlags, argv=list(argv)))

    with pytest.raises(SystemExit, match="--rollout_correction token_mask with --top_p 0.9: .* use --top_p 1"):
        check("--rollout_correction", "token_mask", "--top_p", "0.9")
    with pytest.raises(SystemExit, match="with --rollout_correction none: nothing to bound"):
        check("--rollout_correction", "none", "--rollout_correction_max", "2")
    with pytest.raises(SystemExit, match="--rollout_correction_min 3 is not below --rollout_correction_max 2"):
        check("--rollout_correction", "token_mask", "--rollout_correction_min", "3", "--rollout_correction_max", "2")
    for argv in (["--top_p", "0.9"], ["--rollout_correction", "none", "--top_p", "0.9"], ["--rollout_correction", "sequence_mask"]):  # fmt: skip
        check(*argv)
