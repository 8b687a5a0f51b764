"""The memory preflight (common/models.py): the recipes' plans fit an 80 GB GPU, the issue's plan
(FSDP2 + 7B + a reference model + vLLM at 0.7) is refused with its figures and the fix, vLLM's floor
(weights, profile activations, one max_model_len sequence of KV, CUDA graphs) part by part at the
recipes' models, GSPO's 30.5B refused at a 0.73 share, the session runs it, and the shared-filesystem
check, before any weight loads, and under each real engine (DDP, FSDP2, ZeRO-2, ZeRO-3 on 2 gloo
processes) it counts what it counts without one."""

import json
from types import SimpleNamespace

import pytest
import torch
from engines.launch import CONFIGS, launch
from recipe_memory import H100_GIB, MODELS, RECIPES, launch_plan, recipe_flags, recipe_floor
from train_utils import ROOT

from common.cli import parse_args
from common.models import check_plan, model_config, model_shape, vllm_floor
from common.run_flags import RunFlags

SCRIPTS = ("grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo")
FIVE = [r for r in RECIPES if r.startswith(tuple(f"{s}_" for s in SCRIPTS))]  # the five scripts' recipes


@pytest.fixture(scope="module")
def parameters(tmp_path_factory):
    """Each recipe model's parameter count, from a config.json with its sizes (built on the meta device)."""
    counts = {}
    for name, (sizes, _) in MODELS.items():
        path = tmp_path_factory.mktemp("config")
        (path / "config.json").write_text(json.dumps(sizes))
        counts[name] = model_config(str(path))[1]
    return counts


def test_parameter_count_comes_from_the_config(parameters):
    assert parameters == {name: count for name, (_, count) in MODELS.items()}


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_fits_an_80gb_gpu(recipe, parameters):
    """The five scripts' recipes and the baselines': a recipe whose launch the preflight refuses is a broken recipe."""
    plan = launch_plan(recipe)
    used = check_plan(parameters[plan.pop("model")], **plan, total_gib=H100_GIB, vllm_floor=recipe_floor(recipe))
    assert sum(used.values()) <= H100_GIB


def test_the_7b_recipe_plan_item_by_item(parameters):
    """ZeRO-3 on 8 GPUs, bf16: 2 / 8 bf16 weights + 16 / 8 fp32 master, gradients and moments per parameter."""
    plan = launch_plan("pro_grpo_qwen2.5-7b.yaml")
    floor = recipe_floor("pro_grpo_qwen2.5-7b.yaml")
    used = check_plan(parameters[plan.pop("model")], **plan, total_gib=H100_GIB, vllm_floor=floor)
    assert plan["mode"] == "zero3" and plan["world"] == 8
    assert used["training state"] == pytest.approx(7_615_616_512 * 18 / 8 / 2**30)  # 16.0 GiB
    assert used["vLLM"] == pytest.approx(0.75 * H100_GIB) and used["reference model"] == 0
    assert sum(used.values()) == pytest.approx(77.4, abs=0.05)


def test_fsdp2_7b_with_a_reference_model_at_utilisation_0_7_is_refused(parameters):
    """14.2 GiB training state (16 / 8 bytes per parameter) + 14.2 reference model + 55.4 vLLM + 2 = 85.8 > 79.2."""
    p = parameters["Qwen/Qwen2.5-7B"]
    plan = {"mode": "fsdp2", "world": 8, "precision": "auto", "vllm_utilization": 0.7, "total_gib": H100_GIB,
            "vllm_floor": recipe_floor("pro_grpo_qwen2.5-7b.yaml")}  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        check_plan(p, reference_model=True, **plan)
    message = str(stop.value)
    assert message.startswith("error: memory: each GPU would hold 85.8 GiB of its 79.2 (14.2 training state + ")
    assert "14.2 reference model + 55.4 vLLM + 2.0 margin; fsdp2 over 8 GPUs, 7.62B parameters" in message
    assert "lower --vllm_gpu_memory_utilization to 0.61, or --beta 0" in message and "\n" not in message
    check_plan(p, reference_model=True, **plan | {"vllm_utilization": 0.61})  # the fix it names fits
    check_plan(p, reference_model=False, **plan)  # and so does the other


def test_unsharded_7b_is_refused_with_a_sharded_config_named(parameters):
    with pytest.raises(SystemExit, match=r"113\.5 training state.*shard the model \(configs/accelerate/zero3.yaml"):
        check_plan(
            parameters["Qwen/Qwen2.5-7B"], mode="ddp", world=8, precision="auto", reference_model=False,
            vllm_utilization=0.3, total_gib=H100_GIB, vllm_floor=recipe_floor("pro_grpo_qwen2.5-7b.yaml"),
        )  # fmt: skip


def test_session_checks_memory_and_the_shared_filesystem_before_any_weight_loads(
    tiny_random_dir, tmp_path, monkeypatch
):
    """start_session: the shared-filesystem check, then the preflight (given the model, layout and flags),
    both before the policy loads. The preflight is stopped here to show nothing loads after a refusal."""
    import common.models
    import common.run_dir
    import grpo_base
    from common.session import spec_from

    calls = []
    monkeypatch.setattr(common.run_dir, "check_shared", lambda *a: calls.append("check_shared"))

    def refuse(model_path, **plan):
        calls.append(("preflight", model_path, plan))
        raise SystemExit("error: memory: refused")

    monkeypatch.setattr(common.models, "preflight_memory", refuse)
    monkeypatch.setattr(common.models, "load_policy", lambda *a: calls.append("load_policy"))
    args, run = parse_args(
        grpo_base.Args, RunFlags,
        argv=["--model", str(tiny_random_dir), "--output_dir", str(tmp_path / "run"), "--beta", "0.1", "--rollout", "hf"],
    )  # fmt: skip
    spec = spec_from(args, optimizer=None, optimizer_steps_per_step=1, reference_model=True)
    with pytest.raises(SystemExit, match="memory: refused"):
        grpo_base.start_session("grpo_base", spec, run, (vars(args) | vars(run), set()))
    assert calls == [
        "check_shared",
        ("preflight", str(tiny_random_dir), {"mode": "single", "world": 1, "precision": "auto", "reference_model": True,
                                             "vllm_utilization": 0.0, "total_gib": None,
                                             # vLLM's sizes, as the rollout engine is built (rollout_side.engine_size)
                                             "max_model_len": args.max_prompt_len + args.max_completion_len,
                                             "max_num_seqs": min(1024, args.prompts_per_step * args.group_size),
                                             "max_num_batched_tokens": None}),
    ]  # fmt: skip


# The engines the preflight runs under, each on 2 gloo processes (tests/engines/cpu_entry.py), and their configs.
ENGINES = {"ddp": "ddp_8gpu.yaml", "fsdp2": "fsdp2.yaml", "zero2": "zero2.yaml", "zero3": "zero3.yaml"}


@pytest.mark.slow
@pytest.mark.xdist_group("engines")  # one launch at a time
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU harness: on GPUs accelerate applies the configs itself")
@pytest.mark.parametrize("mode", ENGINES)
def test_the_preflight_under_each_real_engine(mode, tmp_path):
    """tests/engines/preflight.py: the session's accelerator step, then each recipe model's count and plan on an
    80 GB device. Under ZeRO-3 the count used to crash in zero.Init (its hook is set from the accelerator on),
    and would have counted 0 parameters once partitioned. The 7B model is refused at 2 ranks and the 1.5B
    models fit, whatever the engine, as `check_plan` says with the count made without an engine."""
    pytest.importorskip("deepspeed") if mode.startswith("zero") else None
    plans, expected = {}, {}
    for recipe in FIVE:
        plan = launch_plan(recipe)
        sizes, count = MODELS[plan["model"]]
        model_dir = tmp_path / recipe
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(sizes))
        run = recipe_flags(recipe)[1]
        flags = {
            "precision": run.precision,
            "rollout": run.rollout,
            "vllm_gpu_memory_utilization": run.vllm_gpu_memory_utilization,
        }
        plans[recipe] = {"model_dir": str(model_dir), "flags": flags, "reference_model": plan["reference_model"], "device_gib": H100_GIB}  # fmt: skip
        # vLLM's floor as the session asks it: no vLLM settings passed (vLLM's defaults, the model's own context)
        floor = vllm_floor(count, model_shape(SimpleNamespace(**sizes)), precision=run.precision, total_gib=H100_GIB)
        try:
            expected[recipe] = {"count": count, "plan": check_plan(
                count, mode=mode, world=2, precision=run.precision, reference_model=plan["reference_model"],
                vllm_utilization=run.vllm_gpu_memory_utilization if run.rollout == "vllm" else 0.0, total_gib=H100_GIB,
                vllm_floor=floor,
            )}  # fmt: skip
        except SystemExit as stop:
            expected[recipe] = {"count": count, "refused": str(stop)}
    (tmp_path / "plans.json").write_text(json.dumps(plans))
    script = ROOT / "tests" / "engines" / "preflight.py"
    rc, out = launch(CONFIGS / ENGINES[mode], script, tmp_path / "plans.json", tmp_path / "run", timeout=300)
    assert rc == 0, out[-5000:]
    rows = [json.loads(f.read_text()) for f in sorted((tmp_path / "run").glob("preflight-rank*.json"))]
    assert sorted(r["rank"] for r in rows) == [0, 1], out[-3000:]
    for r in rows:
        assert r["mode"] == mode and r["world"] == 2 and r["mixed"] == "bf16"
        if mode == "fsdp2":  # gradients reduced in fp32, as DDP's (common.trainer.make_accelerator)
            assert r["fsdp_dtypes"] == ["torch.bfloat16", "torch.float32"]
        if mode.startswith("zero"):
            ds = r["ds_config"]
            assert ds["data_types"] == {"grad_accum_dtype": "fp32"} and ds["communication_data_type"] == "fp32"
            assert ds["gradient_clipping"] == 1.0 and ds["train_batch_size"] == 2 * RunFlags().micro_batch_size
            gathered = ds["zero_optimization"].get("stage3_gather_16bit_weights_on_model_save", False)
            assert gathered is (mode == "zero3")  # the HF copy in each checkpoint
        assert r["zero3_hook"] is r["zero3_hook_after"] is (mode == "zero3")  # set by the engine, and left set
        assert {recipe: r[recipe] for recipe in FIVE} == expected
    assert "refused" in expected["pro_grpo_qwen2.5-7b.yaml"]
    assert all("plan" in v for k, v in expected.items() if "1.5b" in k)


@pytest.mark.parametrize(
    "precision,gpu,expected",
    [  # (accelerate's mixed precision, policy weights, reference model, rollout engine, activation bytes,
        #  residual-stream bytes: the weights' own, fp32 under autocast over fp32 weights)
        ("auto", True, ("bf16", torch.float32, torch.bfloat16, "bfloat16", 2, 4)),
        ("bf16-mixed", True, ("bf16", torch.float32, torch.bfloat16, "bfloat16", 2, 4)),  # = auto on a GPU
        ("bf16-mixed", False, ("bf16", torch.float32, torch.bfloat16, "bfloat16", 2, 4)),  # the GPU's mode on CPU
        ("bf16", True, ("bf16", torch.bfloat16, torch.bfloat16, "bfloat16", 2, 2)),
        ("fp32", True, ("no", torch.float32, torch.bfloat16, "float32", 4, 4)),
        ("auto", False, ("no", torch.float32, torch.float32, "float32", 4, 4)),
        ("bf16", False, ("no", torch.bfloat16, torch.float32, "float32", 2, 2)),
        ("fp32", False, ("no", torch.float32, torch.float32, "float32", 4, 4)),
    ],
)
def test_precision_on_a_gpu_and_on_cpu(precision, gpu, expected):
    """The session's dtypes, from --precision and whether a GPU trains (the session asks torch once)."""
    from dataclasses import astuple

    from common.models import precision_for

    assert astuple(precision_for(precision, gpu)) == expected


def test_the_session_plans_memory_on_a_gpu_only(tiny_random_dir):
    """check_memory: the plan on a device of the stated GiB, refused past it; nothing planned on CPU (None)."""
    import dataclasses

    from common.models import check_memory
    from common.trainer import ParallelMode

    run, mode = RunFlags(), ParallelMode("ddp", 2)
    assert check_memory(run, str(tiny_random_dir), mode, False, None) is None
    plan = check_memory(run, str(tiny_random_dir), mode, False, 10.0)
    assert plan["vLLM"] == pytest.approx(run.vllm_gpu_memory_utilization * 10.0) and plan["margin"] == 2.0
    with pytest.raises(SystemExit, match=r"^error: memory: vLLM's share of each GPU, 0\.6 GiB .* 1\.0 CUDA graphs"):
        check_memory(run, str(tiny_random_dir), mode, False, 2.0)  # vLLM's floor, before the sum
    with pytest.raises(SystemExit, match=r"^error: memory: each GPU would hold .* of its 2\.0 "):
        check_memory(dataclasses.replace(run, rollout="hf"), str(tiny_random_dir), mode, False, 2.0)


def test_the_count_is_the_same_while_transformers_zero3_hook_is_set(tmp_path):
    """What accelerate's DeepSpeed plugin (stage 3) leaves behind: a live stage-3 HfDeepSpeedConfig, so that
    from_config would build inside zero.Init (on the meta device: "Cannot copy out of meta tensor"; here, with no
    process group, zero.Init looks for MPI and fails). The count turns the hook off for its build and puts it back."""
    pytest.importorskip("deepspeed")
    from transformers.integrations import HfDeepSpeedConfig, is_deepspeed_zero3_enabled
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    sizes, count = MODELS["Qwen/Qwen2.5-Math-1.5B"]
    (tmp_path / "config.json").write_text(json.dumps(sizes))
    hook = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled()
        assert model_config(str(tmp_path))[1] == count
        assert is_deepspeed_zero3_enabled() and hook.is_zero3()  # put back for the engine
    finally:
        unset_hf_deepspeed_config()


# vLLM's floor at each recipe model, with its recipe's vLLM settings, GiB: weights (P x 2 bytes), the profile run's
# activations (the larger of the forward of 16,384 tokens, 2 x 16,384 x (3 D + the MLP's 3 I or the experts'
# 8 x (max(2 x 768, D) + 768)), and the sampler's N x V x 18 bytes + 16,384 x D x 2), one max_model_len sequence
# of KV in 16-token blocks (2 x layers x KV heads x 128 x 2 bytes a token), the CUDA graphs' allowance.
FLOORS = {
    # 1.5B: forward 16,384 x (4,608 + 26,880) x 2 = 0.961 > sampler 256 x 151,936 x 18 + 16,384 x 1,536 x 2 = 0.699;
    # 4,032 tokens x 28,672 bytes = 0.108
    "grpo_base_qwen2.5-math-1.5b.yaml": (2.875, 0.961, 0.108, 1.0),
    # 1,024 sequences: the sampler, 1,024 x 151,936 x 18 + 50.3M bytes = 2.655, passes the forward; 4,096 x 28,672
    "dapo_qwen2.5-math-1.5b.yaml": (2.875, 2.655, 0.109, 1.0),
    "cw_grpo_r1-distill-qwen-1.5b.yaml": (3.310, 0.961, 0.123, 1.0),  # untied head: 1,777,088,000 parameters
    # 7B: forward 16,384 x (10,752 + 56,832) x 2 = 2.063; 4,032 x 57,344 = 0.215
    "dr_grpo_qwen2.5-math-7b.yaml": (14.185, 2.063, 0.215, 1.0),
    "kl_cov_qwen2.5-7b.yaml": (14.185, 2.063, 0.547, 1.0),  # 10,240 x 57,344 bytes
    # 30B MoE: forward 16,384 x (6,144 + 8 x (2,048 + 768)) x 2 = 0.875; 10,240 x 98,304 bytes = 0.9375
    "gspo_qwen3-30b-a3b-base.yaml": (56.871, 0.875, 0.9375, 1.0),
}


@pytest.mark.parametrize("recipe", FLOORS)
def test_vllms_floor_at_the_recipes_models(recipe):
    """What vLLM's share must hold before its KV cache, part by part, against the arithmetic above."""
    floor = recipe_floor(recipe)
    assert list(floor) == ["weights", "activations", "one sequence's KV", "CUDA graphs"]
    assert list(floor.values()) == pytest.approx(FLOORS[recipe], abs=0.001)


def test_gspo_at_a_0_73_share_is_refused_and_at_its_recipes_share_fits(parameters):
    """The issue's plan: 0.73 x 79.2 = 57.8 GiB held the 56.9 GiB of weights, the old floor, but not vLLM's own
    56.9 + 0.9 activations + 0.9 of one 10,240-token sequence's KV + 1.0 CUDA graphs = 59.7 GiB: vLLM would have
    stopped after the policy had loaded. The fix it names (0.76) passes, and so does the recipe's 0.85."""
    gspo = "gspo_qwen3-30b-a3b-base.yaml"
    plan = launch_plan(gspo)
    count, floor = parameters[plan.pop("model")], recipe_floor(gspo)
    plan.pop("vllm_utilization")
    with pytest.raises(SystemExit) as stop:
        check_plan(count, **plan, vllm_utilization=0.73, total_gib=H100_GIB, vllm_floor=floor)
    assert str(stop.value) == (
        "error: memory: vLLM's share of each GPU, 57.8 GiB (--vllm_gpu_memory_utilization 0.73 x 79.2), cannot hold "
        "what it needs before its KV cache, 59.7 GiB (56.9 weights + 0.9 activations + 0.9 one sequence's KV + 1.0 "
        "CUDA graphs; vLLM would stop after the policy loads): raise it to at least 0.76 (the rest is its KV cache), "
        "shorten --max_prompt_len + --max_completion_len, or use GPUs with more memory"
    )
    for share in (0.76, 0.85):
        check_plan(count, **plan, vllm_utilization=share, total_gib=H100_GIB, vllm_floor=floor)


def test_the_session_check_refuses_gspo_at_0_73_from_the_config(tmp_path):
    """`preflight_memory`, the session's entry, from a config.json with Qwen3-30B-A3B-Base's sizes: refused at 0.73
    with the recipe's vLLM settings, passed at 0.85; without them, vLLM's defaults and the model's own 32,768-token
    context (3.0 GiB of KV for one sequence; 1,024 sequences' sampler, 2.7 GiB) make the floor 63.5 GiB, still
    under 0.85's 67.3."""
    from common.models import preflight_memory

    (tmp_path / "config.json").write_text(json.dumps(MODELS["Qwen/Qwen3-30B-A3B-Base"][0]))
    plan = {"mode": "fsdp2", "world": 64, "precision": "auto", "reference_model": False, "total_gib": H100_GIB}
    vllm = {"max_model_len": 10240, "max_num_seqs": 16}
    with pytest.raises(SystemExit, match=r"59\.7 GiB .* raise it to at least 0\.76 "):
        preflight_memory(str(tmp_path), **plan, vllm_utilization=0.73, **vllm)
    assert preflight_memory(str(tmp_path), **plan, vllm_utilization=0.85, **vllm)["vLLM"] == pytest.approx(67.32)
    sizes, count = MODELS["Qwen/Qwen3-30B-A3B-Base"]
    untold = vllm_floor(count, model_shape(SimpleNamespace(**sizes)), precision="auto", total_gib=H100_GIB)
    assert untold["one sequence's KV"] == pytest.approx(3.0) and sum(untold.values()) == pytest.approx(63.5, abs=0.05)
    preflight_memory(str(tmp_path), **plan, vllm_utilization=0.85)


def test_kv_bytes_match_vllms_own_page_sizes():
    """One sequence's KV is vLLM's FullAttentionSpec.max_memory_usage_bytes (what `_check_enough_kv_cache_memory`
    asks) over the model's layers, at each recipe model."""
    pytest.importorskip("vllm")
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    for recipe in FLOORS:
        sizes, count = MODELS[launch_plan(recipe)["model"]]
        shape = model_shape(SimpleNamespace(**sizes))
        spec = FullAttentionSpec(
            block_size=16, num_kv_heads=shape.kv_heads, head_size=shape.head_dim, dtype=torch.bfloat16
        )
        config = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=4099),
            parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        )
        floor = vllm_floor(count, shape, precision="auto", total_gib=H100_GIB, max_model_len=4099)
        assert floor["one sequence's KV"] * 2**30 == shape.layers * spec.max_memory_usage_bytes(config)


@pytest.mark.parametrize(
    ("gib", "name", "expected"), [(80, "nvidia h100 80gb hbm3", (1024, 16384)), (40, "nvidia a100", (256, 8192))]
)
def test_vllms_batch_defaults_are_vllms(monkeypatch, gib, name, expected):
    """`vllm_batch`'s defaults are vLLM's own offline ones (EngineArgs.get_batch_defaults) on such a GPU."""
    pytest.importorskip("vllm")
    import vllm.engine.arg_utils as arg_utils
    from vllm.usage.usage_lib import UsageContext

    from common.models import vllm_batch

    gpu = SimpleNamespace(
        get_device_total_memory=lambda: gib * 2**30, get_device_name=lambda: name, is_tpu=lambda: False,
        is_cpu=lambda: False,
    )  # fmt: skip
    monkeypatch.setattr(arg_utils, "current_platform", gpu)
    tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(1)
    assert (seqs[UsageContext.LLM_CLASS], tokens[UsageContext.LLM_CLASS]) == expected
    assert vllm_batch(gib * 0.99, 100_000, None, None) == expected
    assert vllm_batch(gib * 0.99, 4, 2, None) == (2, 8)  # at most max_num_seqs x max_model_len
