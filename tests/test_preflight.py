"""The memory preflight (common/preflight.py): the recipes' plans fit an 80 GB GPU, the issue's plan
(FSDP2 + 7B + a reference model + vLLM at 0.7) is refused with its figures and the fix, the
session runs it, and the shared-filesystem check, before any weight loads, and under each real
engine (DDP, FSDP2, ZeRO-2, ZeRO-3 on 2 gloo processes) it counts what it counts without one."""

import importlib
import json

import pytest
import torch
import yaml
from engines.launch import CONFIGS, launch
from train_utils import ROOT

from common.cli import parse_args
from common.preflight import check_plan, count_parameters
from common.run_flags import RunFlags

H100_GIB = 79.2  # torch.cuda.get_device_properties(0).total_memory of an 80 GB H100, in GiB
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 28, "head_dim": 128}
QWEN2_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "tie_word_embeddings": False}  # fmt: skip
# The recipes' models (their config.json sizes) and their parameter counts.
MODELS = {
    "Qwen/Qwen2.5-7B": (QWEN2 | QWEN2_7B, 7_615_616_512),
    "Qwen/Qwen2.5-Math-7B": (QWEN2 | QWEN2_7B, 7_615_616_512),  # Qwen2.5-7B's sizes, a 4k context
    "Qwen/Qwen2.5-Math-1.5B": (
        QWEN2 | {"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2,
                 "vocab_size": 151936, "tie_word_embeddings": True},
        1_543_714_304,
    ),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": (
        QWEN2 | {"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2,
                 "vocab_size": 151936, "tie_word_embeddings": False},
        1_777_088_000,
    ),
    "Qwen/Qwen3-30B-A3B-Base": (  # a mixture of experts: 128 experts of which 8 a token, 30.5B parameters in all
        {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
         "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
         "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
         "vocab_size": 151936, "tie_word_embeddings": False},
        30_532_122_624,
    ),
}  # fmt: skip
RECIPES = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml"))
SCRIPTS = ("grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo")
FIVE = [r for r in RECIPES if r.startswith(tuple(f"{s}_" for s in SCRIPTS))]  # the five scripts' recipes


@pytest.fixture(scope="module")
def parameters(tmp_path_factory):
    """Each recipe model's parameter count, from a config.json with its sizes (built on the meta device)."""
    counts = {}
    for name, (sizes, _) in MODELS.items():
        path = tmp_path_factory.mktemp("config")
        (path / "config.json").write_text(json.dumps(sizes))
        counts[name] = count_parameters(str(path))
    return counts


def test_parameter_count_comes_from_the_config(parameters):
    assert parameters == {name: count for name, (_, count) in MODELS.items()}


def launch_command(recipe: str) -> tuple[str, int | None, str]:
    """(accelerate config, --num_processes or None, script) of the launch line in the recipe's header."""
    line = next(x for x in (ROOT / "recipes" / recipe).read_text().splitlines() if "accelerate launch" in x)
    tokens = line.split()
    world = int(tokens[tokens.index("--num_processes") + 1]) if "--num_processes" in tokens else None
    return tokens[tokens.index("--config_file") + 1], world, next(t for t in tokens if t.endswith(".py"))


def recipe_flags(recipe: str):
    """The recipe's (Args, RunFlags), parsed by its script (a top-level script or baselines/<name>.py)."""
    module = importlib.import_module(launch_command(recipe)[2].removesuffix(".py").replace("/", "."))
    return parse_args(module.Args, RunFlags, argv=["--config", str(ROOT / "recipes" / recipe)])


def launch_plan(recipe: str) -> dict:
    """The recipe's flags and the layout of the accelerate command in its header."""
    config, world, _ = launch_command(recipe)
    launch = yaml.safe_load((ROOT / config).read_text())
    kind = launch["distributed_type"]
    mode = {"NO": "single", "MULTI_GPU": "ddp", "FSDP": "fsdp2"}.get(
        kind
    ) or f"zero{launch['deepspeed_config']['zero_stage']}"
    args, run = recipe_flags(recipe)
    return {"model": args.model, "mode": mode, "world": world or launch["num_processes"], "precision": run.precision,
            "reference_model": args.beta > 0, "vllm_utilization": run.vllm_gpu_memory_utilization}  # fmt: skip


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_fits_an_80gb_gpu(recipe, parameters):
    """The five scripts' recipes and the baselines': a recipe whose launch the preflight refuses is a broken recipe."""
    plan = launch_plan(recipe)
    used = check_plan(parameters[plan.pop("model")], **plan, total_gib=H100_GIB)
    assert sum(used.values()) <= H100_GIB


def test_the_7b_recipe_plan_item_by_item(parameters):
    """ZeRO-3 on 8 GPUs, bf16: 2 / 8 bf16 weights + 16 / 8 fp32 master, gradients and moments per parameter."""
    plan = launch_plan("pro_grpo_qwen2.5-7b.yaml")
    used = check_plan(parameters[plan.pop("model")], **plan, total_gib=H100_GIB)
    assert plan["mode"] == "zero3" and plan["world"] == 8
    assert used["training state"] == pytest.approx(7_615_616_512 * 18 / 8 / 2**30)  # 16.0 GiB
    assert used["vLLM"] == pytest.approx(0.7 * H100_GIB) and used["reference model"] == 0
    assert sum(used.values()) == pytest.approx(73.4, abs=0.05)


def test_fsdp2_7b_with_a_reference_model_at_utilisation_0_7_is_refused(parameters):
    """14.2 GiB training state (16 / 8 bytes per parameter) + 14.2 reference model + 55.4 vLLM + 2 = 85.8 > 79.2."""
    p = parameters["Qwen/Qwen2.5-7B"]
    plan = {"mode": "fsdp2", "world": 8, "precision": "auto", "vllm_utilization": 0.7, "total_gib": H100_GIB}
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
            vllm_utilization=0.3, total_gib=H100_GIB,
        )  # fmt: skip


def test_session_checks_memory_and_the_shared_filesystem_before_any_weight_loads(
    tiny_random_dir, tmp_path, monkeypatch
):
    """start_session: the shared-filesystem check, then the preflight (given the model, layout and flags),
    both before the policy loads. The preflight is stopped here to show nothing loads after a refusal."""
    import common.models
    import common.preflight
    import common.run_dir
    import grpo_base

    calls = []
    monkeypatch.setattr(common.run_dir, "check_shared", lambda *a: calls.append("check_shared"))

    def refuse(model_path, **plan):
        calls.append(("preflight", model_path, plan))
        raise SystemExit("error: memory: refused")

    monkeypatch.setattr(common.preflight, "preflight_memory", refuse)
    monkeypatch.setattr(common.models, "load_policy", lambda *a: calls.append("load_policy"))
    args, run = parse_args(
        grpo_base.Args, RunFlags,
        argv=["--model", str(tiny_random_dir), "--output_dir", str(tmp_path / "run"), "--beta", "0.1", "--rollout", "hf"],
    )  # fmt: skip
    with pytest.raises(SystemExit, match="memory: refused"):
        grpo_base.start_session(
            "grpo_base", run, (vars(args) | vars(run), set()), model=args.model, dataset=args.dataset,
            template=args.template, rewards=args.rewards, reward_fn=None, seed=0, steps=1, epochs=None,
            prompts_per_step=args.prompts_per_step, group_size=args.group_size, max_prompt_len=args.max_prompt_len,
            max_completion_len=args.max_completion_len, optimizer=None, lr_schedule="constant", warmup_steps=0,
            optimizer_steps_per_step=1, grad_clip=1.0, reference_model=True,
        )  # fmt: skip
    assert calls == [
        "check_shared",
        ("preflight", str(tiny_random_dir), {"mode": "single", "world": 1, "precision": "auto", "reference_model": True,
                                             "vllm_utilization": 0.0, "total_gib": None}),
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
        try:
            expected[recipe] = {"count": count, "plan": check_plan(
                count, mode=mode, world=2, precision=run.precision, reference_model=plan["reference_model"],
                vllm_utilization=run.vllm_gpu_memory_utilization if run.rollout == "vllm" else 0.0, total_gib=H100_GIB,
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
        if mode == "fsdp2":  # gradients reduced in fp32, as DDP's (common.distributed.make_accelerator)
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
    [  # (accelerate's mixed precision, policy weights, reference model, rollout engine, activation bytes)
        ("auto", True, ("bf16", torch.float32, torch.bfloat16, "bfloat16", 2)),
        ("bf16", True, ("bf16", torch.bfloat16, torch.bfloat16, "bfloat16", 2)),
        ("fp32", True, ("no", torch.float32, torch.bfloat16, "float32", 4)),
        ("auto", False, ("no", torch.float32, torch.float32, "float32", 4)),
        ("bf16", False, ("no", torch.bfloat16, torch.float32, "float32", 2)),
        ("fp32", False, ("no", torch.float32, torch.float32, "float32", 4)),
    ],
)
def test_precision_on_a_gpu_and_on_cpu(precision, gpu, expected):
    """The session's dtypes, from --precision and whether a GPU trains (the session asks torch once)."""
    from dataclasses import astuple

    from common.session import precision_for

    assert astuple(precision_for(precision, gpu)) == expected


def test_the_session_plans_memory_on_a_gpu_only(tiny_random_dir):
    """check_memory: the plan on a device of the stated GiB, refused past it; nothing planned on CPU (None)."""
    from common.distributed import ParallelMode
    from common.session import check_memory

    run, mode = RunFlags(), ParallelMode("ddp", 2)
    assert check_memory(run, str(tiny_random_dir), mode, False, None) is None
    plan = check_memory(run, str(tiny_random_dir), mode, False, 10.0)
    assert plan["vLLM"] == pytest.approx(run.vllm_gpu_memory_utilization * 10.0) and plan["margin"] == 2.0
    with pytest.raises(SystemExit, match=r"^error: memory: each GPU would hold .* of its 2\.0 "):
        check_memory(run, str(tiny_random_dir), mode, False, 2.0)


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
        assert count_parameters(str(tmp_path)) == count
        assert is_deepspeed_zero3_enabled() and hook.is_zero3()  # put back for the engine
    finally:
        unset_hf_deepspeed_config()


def test_a_vllm_share_too_small_for_the_weights_is_refused(parameters):
    """Each rank's vLLM holds the whole model (colocated, no tensor parallelism): 30.5B parameters are 56.9 GiB in
    bf16, more than a 0.3 share of an 80 GB GPU, however many GPUs shard the training state."""
    plan = {"mode": "fsdp2", "world": 64, "precision": "auto", "reference_model": False, "total_gib": H100_GIB}
    with pytest.raises(SystemExit) as stop:
        check_plan(parameters["Qwen/Qwen3-30B-A3B-Base"], vllm_utilization=0.3, **plan)
    assert str(stop.value).startswith("error: memory: vLLM's share of each GPU, 23.8 GiB (")
    assert "cannot hold the model's 56.9 GiB of weights: raise it well above 0.72" in str(stop.value)
    check_plan(parameters["Qwen/Qwen3-30B-A3B-Base"], vllm_utilization=0.85, **plan)  # 64 GPUs at 0.85 fit
