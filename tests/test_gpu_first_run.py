"""gpu_check/first_run.py, the first GPU session's one call, kept from rotting: its dry run on CPU (every
part at toy sizes, each in its own process) must run every part and pass its checks, the default shared-prompt
layout included, and report the rollout correction's figures; the sync detector's attribution of a host sync to
where it came from (intended, library, ours, backward)."""

import json
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pytest
from train_utils import ROOT, user_env

from gpu_check import first_run, sync_guard


def frame(path: str, name: str, line: int = 1) -> traceback.FrameSummary:
    return traceback.FrameSummary(path, line, name)


SITE = "/usr/lib/python3/site-packages"


@pytest.mark.parametrize(
    "stack, kind, where",
    [
        (  # the optimiser step's one read: intended, wherever below it the read is made
            [frame(f"{ROOT}/grpo_base.py", "update"), frame(f"{ROOT}/common/trainer.py", "optimizer_step", 85),
             frame(f"{ROOT}/common/metrics.py", "global_sum"), frame(f"{SITE}/torch/_tensor.py", "tolist")],
            "intended", "common/trainer.py:optimizer_step:85",
        ),
        (  # transformers' SDPA mask check
            [frame(f"{ROOT}/common/logprobs.py", "sequence_logprobs"),
             frame(f"{SITE}/transformers/masking_utils.py", "_ignore_causal_mask_sdpa", 273)],
            "library", "transformers/masking_utils.py:_ignore_causal_mask_sdpa:273",
        ),
        (  # a read in our code, through torch's own frames
            [frame(f"{ROOT}/grpo_base.py", "old_logprobs", 140), frame(f"{SITE}/torch/_tensor.py", "__bool__")],
            "ours", "grpo_base.py:old_logprobs:140",
        ),
        (  # autograd's engine replays a backward kernel's warning at the call that ran backward
            [frame(f"{ROOT}/grpo_base.py", "update", 177), frame(f"{SITE}/accelerate/accelerator.py", "backward"),
             frame(f"{SITE}/torch/_tensor.py", "backward"), frame(f"{SITE}/torch/autograd/graph.py", "_engine_run_backward")],
            "backward", "accelerate/accelerator.py:backward:1",
        ),
    ],
)  # fmt: skip
def test_a_sync_is_attributed_to_where_it_came_from(stack, kind, where):
    assert sync_guard.classify(stack) == (kind, where)


def ours_reads():
    warnings.warn(sync_guard.SYNC_MESSAGE + " (Triggered internally at CUDAFunctions.cpp)", UserWarning, stacklevel=1)


def test_the_detectors_warnings_are_recorded_not_shown(capsys):
    """torch's detector speaks through Python warnings: inside `watch` each is recorded where it was made (here a
    function in this repository: ours), other warnings pass through, and nothing is recorded outside."""
    log = sync_guard.SyncLog(cuda=False)
    log.patched = True  # no CPU stand-in: its patches of torch would outlive the test (a model loaded later is noise)
    with pytest.warns(UserWarning, match="another"):
        with log.watch("update"):
            ours_reads()
            ours_reads()
            warnings.warn("another warning", UserWarning, stacklevel=1)
    ours_reads_outside = pytest.warns(UserWarning, match="synchronizing")
    with ours_reads_outside:
        ours_reads()
    record = log.record()
    assert record["by_kind"] == {"ours": 2}
    assert [(r["phase"], r["where"].rsplit(":", 1)[0]) for r in record["syncs"]] == [
        ("update", "tests/test_gpu_first_run.py:ours_reads")
    ]


# What common/logprobs.py `figures` logs each step beside the mean gap: whether the correction acts.
CORRECTION = ["rollout_logp_gap_p99", "rollout_is_ratio_max", "rollout_is_weight_mean", "rollout_is_corrected_frac"]


def test_a_scripts_steps_report_the_rollout_corrections_figures(tmp_path):
    """A script part's figures of each logged step hold the correction's figures (p99 gap, largest ratio, mean
    weight, corrected share), and a step that logged one as NaN fails its check."""
    from gpu_check.report import Findings

    run = tmp_path / "run"
    run.mkdir()
    logged = {"train/reward": 0.5, "train/accuracy": 0.5, "train/rollout_logp_gap": 1e-3, "train/grad_norm": 0.4}
    logged |= {f"train/{k}": v for k, v in zip(CORRECTION, [4e-3, 1.2, 0.99, 0.01])}
    rows = [logged, logged | {"train/rollout_is_ratio_max": float("nan")}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = Findings()
    first_run.run_figures(f, run, cuda=False)
    for step in ("step 1", "step 2"):
        assert set(CORRECTION) <= set(f.figures[step]), f.figures[step]
    assert f.figures["step 1"]["rollout_is_weight_mean"] == 0.99
    assert [ok for ok in (c["ok"] for c in f.checks.values())].count(False) == 1  # step 2's NaN


def test_the_gap_parts_shared_pass_runs_the_shared_layout_at_its_gpu_size(monkeypatch):
    """logp_gap at its GPU size (here on CPU, fp32): each engine's samples are scored padded, then in the
    shared-prompt layout, not in `select`'s fallback to padded (at the demo's 16 prompts x 8 completions the
    "shared" pass was the padded one again), and the two agree."""
    import common.logprobs as lp
    from gpu_check import parts

    layouts, score = [], lp.sequence_logprobs

    def recorded(*a, layout="padded", **k):
        layouts.append(type(layout).__name__)
        return score(*a, layout=layout, **k)

    monkeypatch.setattr(lp, "sequence_logprobs", recorded)
    findings = parts.logp_gap(dry=False).record()
    assert layouts == ["str", "SharedPrefix"] * 2
    assert findings["checks"] and all(c["ok"] for c in findings["checks"].values()), findings["checks"]


def run_dry(tmp_path: Path, parts: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    out = tmp_path / "report.md"
    cmd = [sys.executable, str(ROOT / "gpu_check" / "first_run.py"), "--dry_run", "--out", str(out)]
    cmd += ["--parts", parts, "--work_dir", str(tmp_path / "work")]
    proc = subprocess.run(cmd, cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=3600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.with_suffix(".json").read_text()), out.read_text()


def assert_every_part_ran(proc, report: dict, text: str, names: list[str]) -> None:
    parts = {p["name"]: p for p in report["parts"]}
    assert list(parts) == names
    failed = {n: (p["error"], {k: c for k, c in p["checks"].items() if not c["ok"]}) for n, p in parts.items() if p["status"] != "ran"}  # fmt: skip
    assert not failed, failed
    assert proc.returncode == 0, proc.stdout[-3000:]
    for name in names:
        assert f"## {name}: ran" in text
    assert report["environment"]["dry_run"] and "## Not executed, and why" in text


@pytest.mark.slow
def test_the_whole_dry_run(tmp_path):
    """Every part, the five scripts through the sync guard included: each ran, passed its checks, and its sync
    report found no host sync of ours in scoring or update (CPU stand-in: benchmarks/host_syncs.py's patches)."""
    names = [p.name for p in first_run.PARTS]
    proc, report, text = run_dry(tmp_path, ",".join(names))
    assert_every_part_ran(proc, report, text, names)
    for p in report["parts"]:
        if p["name"] in first_run.SCRIPTS:
            assert p["checks"]["no host sync of ours in scoring or update"]["ok"]
            assert "intended" in p["figures"]["host syncs by kind (old_logprobs + update, 2 steps)"]
            layouts = p["figures"]["micro-batches by layout"]  # what ran: `select` may fall back to padded
            assert set(layouts) == {"old_logprobs", "update"} and all(x.get("shared") for x in layouts.values())
            assert all(set(CORRECTION) <= set(p["figures"][f"step {i}"]) for i in (1, 2))
    step = next(p for p in report["parts"] if p["name"] == "gpu_step")
    assert step["figures"]["predicted GiB: training state (preflight)"] > 0
