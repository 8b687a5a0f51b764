"""The recipes' memory on an 80 GB GPU, from their flags and their models' published config.json: the
preflight's plan (tests/test_preflight.py) and vLLM's KV room per recipe (tests/test_kv_room.py, and the table
`python benchmarks/kv_room.py --write` puts in docs/SCALING.md). Arithmetic, not measurements."""

import importlib
import math
from types import SimpleNamespace

import yaml
from train_utils import ROOT

from benchmarks.memory import update_phases
from common.cli import parse_args
from common.logprobs import head_chunk_rows
from common.models import (
    GIB,
    KV_BLOCK,
    MARGIN_GIB,
    ModelShape,
    autocast_options,
    bytes_per_parameter,
    kv_bytes_per_token,
    model_shape,
    optimizer_options,
    vllm_floor,
)
from common.run_flags import RunFlags

H100_GIB = 79.2  # torch.cuda.get_device_properties(0).total_memory of an 80 GB H100, in GiB
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 28, "head_dim": 128}
QWEN2_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "tie_word_embeddings": False}  # fmt: skip
QWEN2_1_5B = {"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2,
              "vocab_size": 151936}  # fmt: skip
# The recipes' models: the sizes of their config.json on the Hugging Face hub (max_position_embeddings included:
# vLLM's max_model_len when it is not told one), and their parameter counts.
MODELS = {
    "Qwen/Qwen2.5-7B": (QWEN2 | QWEN2_7B | {"max_position_embeddings": 131072}, 7_615_616_512),
    "Qwen/Qwen2.5-Math-7B": (QWEN2 | QWEN2_7B | {"max_position_embeddings": 4096}, 7_615_616_512),
    "Qwen/Qwen2.5-Math-1.5B": (
        QWEN2 | QWEN2_1_5B | {"tie_word_embeddings": True, "max_position_embeddings": 4096}, 1_543_714_304
    ),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": (
        QWEN2 | QWEN2_1_5B | {"tie_word_embeddings": False, "max_position_embeddings": 131072}, 1_777_088_000
    ),
    "Qwen/Qwen3-30B-A3B-Base": (  # a mixture of experts: 128 experts of which 8 a token, 30.5B parameters in all
        {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
         "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
         "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
         "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768},
        30_532_122_624,
    ),
}  # fmt: skip
RECIPES = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml"))


def kv_cache_tokens(floor: dict[str, float], shape: ModelShape, precision: str, share_gib: float) -> int:
    """Tokens vLLM's KV cache holds in `share_gib` GiB beside the rest of its `floor` (`vllm_floor`), in whole
    blocks."""
    rest = sum(v for k, v in floor.items() if k != "one sequence's KV")
    page = KV_BLOCK * kv_bytes_per_token(shape, 4 if precision == "fp32" else 2)
    return max(0, int((share_gib - rest) * GIB // page)) * KV_BLOCK


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
    """The recipe's flags and the layout of the accelerate command in its header: `check_plan`'s arguments."""
    config, world, _ = launch_command(recipe)
    launch = yaml.safe_load((ROOT / config).read_text())
    kind = launch["distributed_type"]
    mode = {"NO": "single", "MULTI_GPU": "ddp", "FSDP": "fsdp2"}.get(
        kind
    ) or f"zero{launch['deepspeed_config']['zero_stage']}"
    args, run = recipe_flags(recipe)
    return {"model": args.model, "mode": mode, "world": world or launch["num_processes"], "precision": run.precision,
            "reference_model": args.beta > 0, "vllm_utilization": run.vllm_gpu_memory_utilization}  # fmt: skip


def rollout_shape(recipe: str) -> dict:
    """What the session gives each rank's vLLM (common/rollout.py `engine_size`): max_model_len (prompt +
    completion + EDGE-GRPO's reflection context), max_num_seqs (the rank's rollout, at most 1,024; the recipes'
    evaluations sample fewer), max_num_batched_tokens (None: vLLM's), and the sequences a step samples."""
    args, run = recipe_flags(recipe)
    world = launch_plan(recipe)["world"]
    extra = 0
    if getattr(args, "gec", "off") != "off":  # edge_grpo.py: the reflection and its new tokens
        extra = len(importlib.import_module("edge_grpo").REFLECTION) + args.gec_max_new_tokens
    sequences = args.prompts_per_step // world * args.group_size
    return {
        "max_model_len": args.max_prompt_len + args.max_completion_len + extra,
        "max_num_seqs": run.vllm_max_num_seqs or min(1024, sequences),
        "max_num_batched_tokens": run.vllm_max_num_batched_tokens or None,
        "sequences": sequences,
    }


def recipe_floor(recipe: str, total_gib: float = H100_GIB) -> dict[str, float]:
    """`vllm_floor` of the recipe's model and vLLM settings on a device of `total_gib` GiB."""
    plan, vllm = launch_plan(recipe), rollout_shape(recipe)
    sizes, parameters = MODELS[plan["model"]]
    return vllm_floor(
        parameters, model_shape(SimpleNamespace(**sizes)), precision=plan["precision"], total_gib=total_gib,
        max_model_len=vllm["max_model_len"], max_num_seqs=vllm["max_num_seqs"],
        max_num_batched_tokens=vllm["max_num_batched_tokens"],
    )  # fmt: skip


def update_phases_gib(recipe: str, total_gib: float = H100_GIB) -> dict[str, dict[str, float]]:
    """`benchmarks/memory.py` `update_phases` of a micro-batch of the recipe's --max_tokens_per_micro_batch tokens on a
    GPU of `total_gib` GiB, with what the trainer does on CUDA (`common.models.autocast_options`,
    `optimizer_options`)."""
    args, run = recipe_flags(recipe)
    plan = launch_plan(recipe)
    sizes, parameters = MODELS[args.model]
    return update_phases(
        parameters, SimpleNamespace(**sizes), run.max_tokens_per_micro_batch, mode=plan["mode"], world=plan["world"],
        precision=plan["precision"], chunk_rows=head_chunk_rows(sizes["vocab_size"], "cuda", int(total_gib * GIB)),
        checkpointing=run.gradient_checkpointing, autocast_cache=autocast_options()["cache_enabled"],
        fused_adamw=optimizer_options("cuda").get("fused", False),
    )  # fmt: skip


def update_activations_gib(recipe: str) -> float:
    """The update's peak beside the training state: its largest phase (`update_phases_gib`) less the state."""
    phases = update_phases_gib(recipe)
    return max(sum(terms.values()) - terms["training state"] for terms in phases.values())


def largest_share(recipe: str, total_gib: float = H100_GIB) -> float:
    """The largest vLLM share, to 0.01 below, that the GPU holds beside the training state, the reference model,
    the margin and, unless --vllm_sleep frees vLLM's memory for it, the update's activations."""
    plan = launch_plan(recipe)
    parameters = MODELS[plan["model"]][1]
    rest = parameters * bytes_per_parameter(plan["mode"], plan["world"], plan["precision"]) / GIB + MARGIN_GIB
    rest += parameters * 2 / GIB if plan["reference_model"] else 0.0
    rest += 0.0 if recipe_flags(recipe)[1].vllm_sleep else update_activations_gib(recipe)
    return math.floor(100 * (total_gib - rest) / total_gib) / 100


def kv_room(recipe: str, share: float | None = None, total_gib: float = H100_GIB) -> dict:
    """The KV cache of each rank's vLLM at the recipe's share (or `share`) beside the rest of its floor, in tokens,
    against the tokens a step asks per rank: every sequence at its longest (`rollout_shape`), each with its own
    prompt (what prefix caching shares is not taken off): the bound, not the typical step. `waves`: how many
    times over the cache must fill to hold them; `at once`: the sequences it holds together at their longest."""
    plan, vllm = launch_plan(recipe), rollout_shape(recipe)
    share = plan["vllm_utilization"] if share is None else share
    sizes, _ = MODELS[plan["model"]]
    shape = model_shape(SimpleNamespace(**sizes))
    floor = recipe_floor(recipe, total_gib)
    held = kv_cache_tokens(floor, shape, plan["precision"], share * total_gib)
    asked = vllm["sequences"] * vllm["max_model_len"]
    return {
        "share": share,
        "before KV": sum(v for k, v in floor.items() if k != "one sequence's KV"),
        "KV GiB": held * kv_bytes_per_token(shape, 4 if plan["precision"] == "fp32" else 2) / GIB,
        "held": held,
        "asked": asked,
        "sequences": vllm["sequences"],
        "max_model_len": vllm["max_model_len"],
        "waves": math.ceil(asked / held) if held else math.inf,
        "at once": min(vllm["sequences"], held // vllm["max_model_len"]),
        "largest share": largest_share(recipe, total_gib),
    }


def kv_table(total_gib: float = H100_GIB) -> str:
    """docs/SCALING.md's table of every recipe's KV room (`kv_room`), in markdown."""
    rows = [
        "| recipe | GPUs | vLLM share | vLLM before its KV cache (GiB) | KV cache (GiB) | KV tokens held | a step asks "
        "per rank (sequences x tokens) | sequences at once | waves | largest share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for recipe in RECIPES:
        r, world = kv_room(recipe, total_gib=total_gib), launch_plan(recipe)["world"]
        rows.append(
            f"| {recipe.removesuffix('.yaml')} | {world} | {r['share']:.2f} | {r['before KV']:.1f} | {r['KV GiB']:.1f} "
            f"| {r['held']:,} | {r['sequences']:,} x {r['max_model_len']:,} = {r['asked']:,} | {r['at once']} | {r['waves']} "
            f"| {r['largest share']:.2f} |"
        )
    return "\n".join(rows)


# docs/SCALING.md's markers around `kv_table` (benchmarks/kv_room.py --write)
KV_TABLE_BEGIN = "<!-- KV room: written by benchmarks/kv_room.py from recipes/ and common/models.py -->"
KV_TABLE_END = "<!-- end of KV room -->"
