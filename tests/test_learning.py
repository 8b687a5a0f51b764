"""Every script learns on the synthetic task, through the real vLLM rollout loop; the README's demo figures are
those of a fresh run.

The demo model (common/tiny_model.py) mostly knows the sums but boxes its answer only about half
the time, so the verifier scores it right well under its knowledge: the algorithms must raise the
evaluated accuracy (4 samples of each of the task's 100 problems).
"""

import re

import pytest
from train_utils import ROOT, SCRIPTS, run_script

from common.run_flags import vllm_available

ROLLOUT = "vllm" if vllm_available() else "hf"
STEPS = 6
MARGIN = 0.1
README_TOLERANCE = 0.05  # another 2-core machine may round a kernel differently, and the run's samples follow


@pytest.fixture(scope="session")
def demo_model_dir():
    from common.tiny_model import ensure_tiny_model

    return ensure_tiny_model()  # the same cached model `python grpo_base.py` uses


@pytest.mark.slow
@pytest.mark.parametrize("script", [s for s in SCRIPTS if s != "grpo_base.py"])  # grpo_base: the README test below
def test_accuracy_rises_on_the_synthetic_task(script, demo_model_dir, tmp_path):
    """The policy's own accuracy on its rollout (128 samples at T = 1 a step): the mean of the last two of 6 steps
    against the first step's, sampled before any update. EDGE-GRPO's train/accuracy counts GEC's injected answers."""
    rows = run_script(script, tmp_path, "--model", str(demo_model_dir), "--rollout", ROLLOUT, "--steps", str(STEPS))
    key = "gec/rollout_accuracy" if script == "edge_grpo.py" else "train/accuracy"
    accuracy = [r[key] for r in rows]
    before, after = accuracy[0], sum(accuracy[-2:]) / 2
    assert after > before + MARGIN, f"{script}: training accuracy {before:.3f} -> {after:.3f} over {STEPS} steps"


def readme_demo_table() -> dict[str, list[float | None]]:
    """The README's demo table (scripts/readme_demo_table.py writes it): row label -> values at steps 0, 10, 20, 30."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- demo table:", 1)[1].split("<!-- end of demo table -->", 1)[0]
    rows = {}
    for line in block.splitlines()[3:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = [None if c == "-" else float(c) for c in cells[1:]]
    return rows


@pytest.mark.slow
@pytest.mark.skipif(ROLLOUT != "vllm", reason="the README's figures are vLLM's")
def test_the_readme_demo_is_a_fresh_run_of_its_command(tmp_path):
    """`python grpo_base.py --eval_steps 10`, exactly as the README says: its training and evaluation accuracy at
    steps 0, 10, 20, 30 are the README's table (and it learns)."""
    rows = {r["step"]: r for r in run_script("grpo_base.py", tmp_path, "--eval_steps", "10", timeout=900)}
    train, evaluation = readme_demo_table().values()
    fresh_train = [rows[max(s, 1)]["train/accuracy"] for s in (0, 10, 20, 30)]
    fresh_eval = [rows[s]["eval/synthetic/pass@1"] for s in (0, 10, 20, 30)]
    assert fresh_train == pytest.approx(train, abs=README_TOLERANCE), (fresh_train, train)
    assert fresh_eval == pytest.approx(evaluation, abs=README_TOLERANCE), (fresh_eval, evaluation)
    assert fresh_eval[1] > fresh_eval[0] + MARGIN
    assert re.search(r"## Setup and run", (ROOT / "README.md").read_text())
