"""Every script learns on the synthetic task, through the real vLLM rollout loop.

The demo model (common/tiny_model.py) mostly knows the sums but boxes its
answer only about half the time, so the verifier scores it right well under
its knowledge; ten steps of each algorithm must raise the evaluated accuracy
(4 samples of each of the task's 100 problems; the demo goes ~0.7 -> ~0.95).
"""

import pytest
from train_utils import run_script

from common.rollout import vllm_available

SCRIPTS = ["grpo_base.py", "edge_grpo.py", "egpo.py", "cw_grpo.py", "pro_grpo.py"]
ROLLOUT = "vllm" if vllm_available() else "hf"
STEPS = 10
MARGIN = 0.1


@pytest.fixture(scope="session")
def demo_model_dir():
    from common.tiny_model import ensure_tiny_model

    return ensure_tiny_model()  # the same cached model `python grpo_base.py` uses


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_accuracy_rises_on_the_synthetic_task(script, demo_model_dir, tmp_path):
    rows = run_script(
        script,
        tmp_path,
        "--model",
        str(demo_model_dir),
        "--rollout",
        ROLLOUT,
        "--steps",
        str(STEPS),
        "--eval_steps",
        str(STEPS),
        "--eval_n",
        "4",
        timeout=600,
    )
    before = rows[0]["eval/synthetic/pass@1"]
    after = rows[-1]["eval/synthetic/pass@1"]
    assert rows[0]["step"] == 0 and rows[-1]["step"] == STEPS
    assert after > before + MARGIN, f"{script}: eval pass@1 {before:.3f} -> {after:.3f}"
