"""benchmarks/gpu_step.py's parts that need no GPU: the peak dense bf16 FLOP/s looked up by the device's name (issue
51, item 8)."""

import sys

import pytest
from train_utils import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_step  # noqa: E402


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
