"""The shipped accelerate configs under their real engines, 2 gloo processes on CPU.

Each test launches tests/engines/probe.py with `accelerate launch --config_file
configs/accelerate/<config>` through the CPU shim of tests/engines/cpu_entry.py (FSDP2 as
accelerate prepares it, DeepSpeed ZeRO-2 / ZeRO-3, DDP over MULTI_CPU) and checks what
the engine really did on BOTH ranks. About 15-25 s per launch on 2 cores.
"""

import importlib.util
import math

import pytest
import torch
from engines.launch import CONFIGS, PROBE, TIMEOUT_RC, launch, read_facts, variant_config

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="pip install deepspeed")
pytestmark = [
    pytest.mark.xdist_group("engines"),  # shared runs: one worker
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness: on GPUs accelerate applies the configs itself"),
]

STEPS = 2
N_PARAMS_TIED = 558208  # the probe's tiny Qwen2 (vocab 512, hidden 128, 2 layers), lm_head tied
EMBED = 512 * 128

_RUNS: dict[str, list[dict]] = {}


def run_probe(tmp_path_factory, key: str, config, *args: str, timeout: float = 180) -> list[dict]:
    """Launch the probe on 2 ranks (once per key and session); its two fact rows, rank 0 first."""
    if key not in _RUNS:
        out = tmp_path_factory.mktemp(key)
        rc, output = launch(config, PROBE, "--out", str(out / "run"), "--steps", str(STEPS), *args, timeout=timeout)
        assert rc == 0, f"{key}: rc={rc}\n{output[-5000:]}"
        rows = read_facts(out / "run")
        assert len(rows) == 2, f"{key}: expected a fact line per rank\n{output[-3000:]}"
        _RUNS[key] = rows
    return _RUNS[key]


def check_two_real_ranks(rows: list[dict], distributed_type: str, saved: bool = True) -> None:
    r0, r1 = rows
    assert [r["process_index"] for r in rows] == [0, 1]
    assert [r["is_main_process"] for r in rows] == [True, False]
    for r in rows:
        assert r["distributed_type"] == distributed_type
        assert r["num_processes"] == 2 and r["dist_world_size"] == 2 and r["dist_backend"] == "gloo"
        assert r["device"].startswith("cpu")
        assert len(r["losses"]) == STEPS and all(math.isfinite(x) for x in r["losses"] + r["global_losses"])
        assert r["all_finite_local"] and r["all_finite_full"]
    # Each rank trains on its own data, the update is shared: same weights before and after, on both ranks.
    assert r0["losses"][0] != r1["losses"][0], "the ranks should see different data"
    assert r0["global_losses"] == r1["global_losses"]
    assert r0["initial_checksum"] == r1["initial_checksum"]
    assert r0["final_checksum"] == pytest.approx(r1["final_checksum"], rel=1e-12)
    assert r0["final_checksum"] != pytest.approx(r0["initial_checksum"], rel=1e-6), "the weights did not move"
    if saved:
        assert {"random_states_0.pkl", "random_states_1.pkl"} <= set(r0["saved_files"])
        for r in rows:  # load_state brought back the saved weights (the probe perturbed them first)
            assert r["checksum_after_load_state"] == pytest.approx(r["final_checksum"], rel=1e-9)


# --- FSDP2 ----------------------------------------------------------------------------------


# The untied and reshard_after_forward=false layouts run too, through the training scripts themselves
# (tests/test_engine_runs.py); this probe records accelerate's grouping for the shipped config.
@pytest.mark.parametrize("tie,reshard", [(1, True)], ids=["tied-reshard"])
def test_fsdp2(tmp_path_factory, tie, reshard):
    config = CONFIGS / "fsdp2.yaml"
    if not reshard:
        dst = tmp_path_factory.mktemp("cfg") / "fsdp2_no_reshard.yaml"
        config = variant_config(config, dst, fsdp_config={"fsdp_reshard_after_forward": False})
    save = tie == 1 and reshard  # checkpointing once is enough
    rows = run_probe(
        tmp_path_factory, f"fsdp2_t{tie}_r{int(reshard)}", config, "--tie", str(tie), *([] if save else ["--no_save"])
    )
    check_two_real_ranks(rows, "FSDP", saved=save)
    for r in rows:
        assert r["is_fsdp2"] and r["fsdp_version"] == 2 and r["is_fsdp_module"]
        assert r["fsdp_reshard_after_forward"] is reshard
        assert r["tied_after_prepare"] is bool(tie)
        p = r["first_param_after_prepare"]
        assert r["first_param_name"] == "model.embed_tokens.weight"
        assert p["is_dtensor"] and p["placements"] == ["S(0)"] and p["local_numel"] == EMBED // 2
        assert r["all_dtensor_after_prepare"]
        assert r["local_numel_sum"] * 2 == r["numel_sum_after_prepare"]
        # accelerate's units: one per decoder layer; embedding alone unless tied; the tail
        # [norm, lm_head] (+ the tied embedding) never reshards after forward.
        units = {tuple(u["modules"]): u["reshard_after_forward"] for u in r["fsdp_units"]}
        assert units[("model.layers.0",)] is reshard and units[("model.layers.1",)] is reshard
        if tie:
            assert units[("model.embed_tokens", "model.norm", "lm_head")] is False
        else:
            assert units[("model.embed_tokens",)] is reshard
            assert units[("model.norm", "lm_head")] is False
        # After a no-grad forward the first parameter is a DTensor only if the embedding has
        # a resharding unit of its own: tied (or reshard_after_forward false) -> plain tensor.
        after = r["first_param_after_nograd_forward"]
        assert after["is_dtensor"] is (reshard and not tie), after
        plain = r["not_dtensor_after_nograd_forward"]
        if not reshard:  # the whole model stays gathered after a no-grad forward
            assert len(plain) == (26 if tie else 27)
        elif tie:
            assert plain == ["model.embed_tokens.weight", "model.norm.weight"]
        else:
            assert plain == ["model.norm.weight", "lm_head.weight"]
        # No reduce-scatter in a micro-batch under no_sync, one per unit in the last one.
        for step in r["collectives"]:
            assert "reduce_scatter_single" not in step[0]["backward"] and not step[0]["last"]
            assert step[-1]["backward"].get("reduce_scatter_single", 0) >= 3
    r0, r1 = rows
    # fsdp_cpu_ram_efficient_loading: only rank 0 reads the checkpoint; prepare broadcasts it.
    assert r0["loaded"]["embed_local_abs_sum"] > 0 and r1["loaded"]["embed_local_abs_sum"] == 0
    if save:
        assert {"pytorch_model_fsdp_0/__0_0.distcp", "pytorch_model_fsdp_0/__1_0.distcp"} <= set(r0["saved_files"])
        assert {"optimizer_0/__0_0.distcp", "optimizer_0/__1_0.distcp"} <= set(r0["saved_files"])
        # get_state_dict: the full state dict on rank 0 only (broadcast_from_rank0 + cpu_offload).
        assert r0["state_dict_keys"] == 27 and r0["state_dict_has_lm_head"] and r0["state_dict_max_diff"] == 0
        assert r1["state_dict_keys"] == 0


# --- DeepSpeed ------------------------------------------------------------------------------


@needs_deepspeed
def test_zero2(tmp_path_factory):
    rows = run_probe(tmp_path_factory, "zero2", CONFIGS / "zero2.yaml")
    check_two_real_ranks(rows, "DEEPSPEED")
    for r in rows:
        assert r["zero_stage"] == 2 and r["ds_config_stage"] == 2 and r["wrapper"] == "DeepSpeedEngine"
        assert not r["is_fsdp2"] and not r["first_param_after_prepare"]["has_ds_id"]
        assert r["local_numel_sum"] == r["numel_sum_after_prepare"] == N_PARAMS_TIED  # weights whole
        # accelerate's no_sync is a no-op for ZeRO >= 2: the gradients are reduced in EVERY backward.
        for step in r["collectives"]:
            assert not step[0]["last"] and step[0]["backward"].get("all_reduce", 0) >= 1, step
        assert r["state_dict_keys"] == 27 and r["state_dict_max_diff"] == 0  # every rank gets it
    saved = set(rows[0]["saved_files"])
    assert {f"pytorch_model/zero_pp_rank_{i}_mp_rank_00_optim_states.pt" for i in (0, 1)} <= saved


@needs_deepspeed
def test_zero3(tmp_path_factory):
    rows = run_probe(tmp_path_factory, "zero3", CONFIGS / "zero3.yaml")
    check_two_real_ranks(rows, "DEEPSPEED")
    for r in rows:
        assert r["zero_stage"] == 3 and r["zero3_init_flag"]
        # Partitioned already by from_pretrained (zero.Init), not only by prepare.
        assert r["loaded"]["embed"]["has_ds_id"] and r["loaded"]["embed"]["numel"] == 0
        p = r["first_param_after_prepare"]
        assert p["has_ds_id"] and p["numel"] == 0 and p["shape"] == [0]
        assert p["ds_numel"] == EMBED and p["ds_shape"] == [512, 128] and p["ds_tensor_numel"] == EMBED // 2
        assert r["first_param_after_nograd_forward"]["numel"] == 0  # released again after the forward
        assert r["numel_sum_after_prepare"] == 0 and r["local_numel_sum"] == N_PARAMS_TIED // 2
        assert r["tied_after_prepare"]
        # A NaN in a partition: `isfinite(p).all()` is vacuously True on the empty tensor.
        assert r["nan_in_partition_naive_isfinite"] is True
        assert r["nan_in_partition_ds_tensor_isfinite"] is False
    r0, r1 = rows
    assert r0["state_dict_keys"] == 27 and r0["state_dict_max_diff"] == 0  # 16-bit gather, rank 0 only
    assert r1["state_dict_returned"] == "NoneType"
    saved = set(r0["saved_files"])
    assert {f"pytorch_model/zero_pp_rank_{i}_mp_rank_00_model_states.pt" for i in (0, 1)} <= saved


# --- DDP and all engines together -----------------------------------------------------------


def test_ddp(tmp_path_factory):
    rows = run_probe(tmp_path_factory, "ddp", CONFIGS / "ddp_8gpu.yaml")
    check_two_real_ranks(rows, "MULTI_CPU")
    for r in rows:
        assert r["shim"] == "multi_cpu" and r["wrapper"] == "DistributedDataParallel"
        assert r["state_dict_keys"] == 27 and r["state_dict_max_diff"] == 0


@needs_deepspeed
def test_engines_agree(tmp_path_factory):
    """Same checkpoint, same data per rank, AdamW + clipping at 1.0: DDP, FSDP2, ZeRO-2 and ZeRO-3
    give each rank the same losses and the same final weights, up to reduction-order rounding."""
    ddp = run_probe(tmp_path_factory, "ddp", CONFIGS / "ddp_8gpu.yaml")
    others = {
        "fsdp2": run_probe(tmp_path_factory, "fsdp2_t1_r1", CONFIGS / "fsdp2.yaml", "--tie", "1"),
        "zero2": run_probe(tmp_path_factory, "zero2", CONFIGS / "zero2.yaml"),
        "zero3": run_probe(tmp_path_factory, "zero3", CONFIGS / "zero3.yaml"),
    }
    for name, rows in others.items():
        for a, b in zip(ddp, rows):
            assert b["initial_checksum"] == pytest.approx(a["initial_checksum"], rel=1e-9), name
            assert b["losses"] == pytest.approx(a["losses"], rel=1e-5), name
            assert b["grad_norms"] == pytest.approx(a["grad_norms"], rel=1e-4), name
            assert b["final_checksum"] == pytest.approx(a["final_checksum"], rel=1e-5), name


def test_launch_timeout_kills_every_process(tmp_path):
    """torchrun puts each worker in a session of its own: the timeout must still reach them."""
    import os
    import time

    script = tmp_path / "hang.py"
    script.write_text(
        "import os, sys, time\nopen(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\ntime.sleep(600)\n"
    )
    pids = tmp_path / "pids"
    pids.mkdir()

    def both_up() -> bool:  # then the kill: no need to wait the timeout out
        return len(list(pids.iterdir())) == 2

    start = time.monotonic()
    rc, out = launch(CONFIGS / "ddp_8gpu.yaml", script, str(pids), timeout=50, stop_when=both_up)
    assert rc == TIMEOUT_RC and "[launch] TIMEOUT" in out
    assert time.monotonic() - start < 60
    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == 2, out[-2000:]
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
