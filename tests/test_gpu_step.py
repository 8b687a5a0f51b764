"""gpu_check/step.py's parts that need no GPU: the peak dense bf16 FLOP/s looked up by the device's name (issue
51, item 8)."""

import pytest

from gpu_check import step as gpu_step


@pytest.mark.parametrize(
    "name, flops",
    [  # NVIDIA's datasheets, half the "with sparsity" figures
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA A100-SXM4-80GB", None),
        (None, None),
    ],
)
def test_peak_flops_by_device_name(name, flops):
    """The first entry whose name the device's contains wins: an NVL or PCIe part before its SXM name."""
    assert gpu_step.peak_bf16_flops(name) == flops


def test_each_phase_is_measured_and_checked_against_its_own_terms():
    """The toy step on CPU: every phase of the chunked head's step measured (the live bytes the tracker follows,
    the model's included) beside its predicted terms; the fused AdamW's step holds nothing above the training state
    (16 bytes a parameter). On a GPU each phase is checked against its own terms with no margin: a phase 1% over
    them fails, where the step's peak against the plan plus the 2 GiB margin passed."""
    r = gpu_step.measure("tiny", 32, 96, 4, 1)
    measured, predicted = r["paths"]["chunked head (the scripts')"]["phases_gib"], r["predicted_phases_gib"]
    phases = ["forward", "output layer's backward", "layers' backward", "embedding's backward", "optimiser step"]
    assert list(measured) == list(predicted) == phases
    state = predicted["optimiser step"]["training state"]
    assert state == pytest.approx(16 * r["parameters"] / 2**30)
    assert measured["optimiser step"] == pytest.approx(state, rel=0.01)
    on_gpu = dict(r, device="NVIDIA H200")
    on_gpu["paths"]["chunked head (the scripts')"]["phases_gib"] = {
        phase: sum(terms.values()) * (1.01 if phase == "forward" else 0.99) for phase, terms in predicted.items()
    }
    checks = gpu_step.findings(on_gpu).checks
    failed = [name for name, c in checks.items() if not c["ok"]]
    assert len(checks) == 1 + len(phases) and len(failed) == 1 and "forward" in failed[0]
    assert all(c["ok"] for c in gpu_step.findings(r).checks.values())  # on CPU: reported, not checked
