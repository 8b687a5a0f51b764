"""What `--model` names (the demo model, SmolLM2-135M-Instruct, a directory, a run or checkpoint, a hub name), its
checks before it loads, each stopping with one line, the run's dtypes, and the memory preflight (`check_memory`,
below). Process-wide change: HF_HUB_OFFLINE=1 when the hub cannot be reached (`offline_unless_hub_reachable`)."""

import contextlib
import math
import os
import socket
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def hub_reachable(timeout_s: float = 1.0) -> bool:
    """Can this machine reach the hub (HF_ENDPOINT)? One TCP connection, name lookup included, within `timeout_s`."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    address = (url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443))
    result = []

    def connect():  # in a thread: a name lookup ignores socket timeouts
        try:
            socket.create_connection(address, timeout=timeout_s).close()
            result.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout_s + 0.1)
    return bool(result)


def offline_unless_hub_reachable() -> bool:
    """Set HF_HUB_OFFLINE=1 when the hub cannot be reached, so that transformers and datasets read their caches at
    once instead of retrying for a minute. Returns whether it is reachable."""
    if hub_reachable():
        return True
    os.environ["HF_HUB_OFFLINE"] = "1"
    # Libraries imported already (accelerate imports huggingface_hub) read the variable once, at import.
    if (hub := sys.modules.get("huggingface_hub.constants")) is not None:
        hub.HF_HUB_OFFLINE = True
    if (datasets_config := sys.modules.get("datasets.config")) is not None:
        datasets_config.HF_HUB_OFFLINE = datasets_config.HF_DATASETS_OFFLINE = True
    return False


def hub_error(flag: str, name: str, what: str = "model") -> SystemExit:
    """The one line for a hub name that cannot be loaded here."""
    folder = Path(name).parent  # runs/typo: no such local directory, read as org/name
    typo = f" (or, if you meant a local path: there is no {name} in {folder}/)" if folder.is_dir() else ""
    return SystemExit(
        f"error: {flag}: {name} is a hub name, but the Hugging Face hub cannot be reached from this machine and "
        f"the {what} is not in the local cache; download it where there is a network "
        f"(`huggingface-cli download {name} --local-dir DIR`) and pass the local path{typo}"
    )


def model_to_load(model: str) -> tuple[str, Path | None]:
    """What `--model` names, as (a path or hub name to load, the training run it comes from or None): a run's
    exported model/ (refused if damaged), else its newest good checkpoint; a checkpoint-N's model/."""
    if model == "tiny":
        return str(demo_model_dir()), None
    if model == "smollm2":
        return str(smollm2_dir()), None
    path = Path(model).expanduser()
    if not path.exists():
        if model.startswith(("/", "./", "../", "~")) or model.count("/") > 1 or model.endswith("/") or "/" not in model:
            raise SystemExit(
                f"error: --model: {model} does not exist (a local path; hub names look like org/name, 'tiny' is the demo model, 'smollm2' SmolLM2-135M-Instruct)"
            )
        return model, None  # a hub name
    from common.checkpoint import checkpoint_problem, list_checkpoints, manifest_problem  # torch: after the hub's

    run = hashed = None
    if (path / "run_config.json").is_file() or (path / "metrics.jsonl").is_file():  # a training run
        run = path
        if (path / "model" / "config.json").is_file():
            if problem := manifest_problem(path / "model"):  # never an older checkpoint in its place, silently
                good = [c.name for c in list_checkpoints(path) if checkpoint_problem(c) is None]
                instead = f"pass its newest good checkpoint {path / good[0]}, or " if good else ""
                raise SystemExit(
                    f"error: --model: {path / 'model'} is damaged: {problem}; {instead}delete that model/ and "
                    f"resume its training run to export it again (`python SCRIPT.py --resume --output_dir {path}`)"
                )
            path = hashed = path / "model"
        else:
            good = [c for c in list_checkpoints(path) if checkpoint_problem(c) is None]
            if not good:
                raise SystemExit(
                    f"error: --model: run directory {path} has no exported model/ and no complete checkpoint-N/"
                )
            path = good[0]
    if path.name.startswith("checkpoint-") and (path / "model").is_dir():
        if problem := manifest_problem(path):
            raise SystemExit(f"error: --model: checkpoint {path} is damaged: {problem}; use an earlier checkpoint")
        run = run or (path.parent if (path.parent / "metrics.jsonl").is_file() else None)
        path = path / "model"
    elif path != hashed and (path / "MANIFEST.json").is_file() and (problem := manifest_problem(path)):
        raise SystemExit(f"error: --model: {path} is damaged: {problem}; use a checkpoint-N of its run instead")
    if not (path / "config.json").is_file():
        raise SystemExit(f"error: --model: {path} has no config.json: not a model, a checkpoint-N or a run directory")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise SystemExit(
            f"error: --model: {path} has no tokenizer files (tokenizer.json, tokenizer_config.json); copy them from the base model"
        )
    if run is None and path.name == "model":  # a run's model/, or a checkpoint-N/model/ named directly
        owner = path.parent.parent if path.parent.name.startswith("checkpoint-") else path.parent
        run = owner if (owner / "metrics.jsonl").is_file() else None
    return str(path), run


def context_length(model_path: str) -> int | None:
    """The model's context in tokens (its config's max_position_embeddings), if it says."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)


def check_context_length(model_path: str, needed: int, flags: str) -> None:
    """Stop before the weights load if `needed` tokens (the sum of `flags`) exceed the model's context: vLLM would
    refuse only after loading, and the trainer would score positions the model was never trained on."""
    limit = context_length(model_path)
    if limit is not None and needed > limit:
        raise SystemExit(
            f"error: {flags} = {needed} tokens, more than {model_path}'s context of {limit} tokens: "
            "lower --max_prompt_len or --max_completion_len"
        )


def load_tokenizer(model_path: str):
    """The model's tokenizer, with a pad token (padding is masked out: any id will do)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(model_path: str, dtype, gradient_checkpointing: bool = False):
    """The policy to train, in `dtype` (its master weights)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


@dataclass(frozen=True)
class Precision:
    """The dtypes of a run (`precision_for`)."""

    mixed: str  # accelerate's mixed_precision: "bf16" (autocast) or "no"
    policy: object  # the policy's weights (its master copy), a torch dtype
    reference: object  # the reference model's weights
    engine: str  # the rollout engine's dtype name
    activation_bytes: int  # bytes per activation value, for the micro-batch budget
    residual_bytes: int  # the residual stream's: fp32 under autocast (its adds are not autocast ops)

    @property
    def exact(self) -> bool:
        """fp32 throughout: the trainer and the rollout engine agree to ~1e-6 per token (no correction needed)."""
        import torch

        return self.mixed == "no" and self.policy == torch.float32 and self.engine == "float32"

    def record(self) -> dict:
        """The run's precision in words, for its run_config.json."""
        return {"weights": str(self.policy).removeprefix("torch."), "autocast": self.mixed, "engine": self.engine}


def precision_for(precision: str, gpu: bool) -> Precision:
    """--precision where the run trains. bf16-mixed (auto on a GPU): fp32 master weights, bf16 autocast, engine and
    reference model. auto on CPU is fp32, so that the demo's figures hold on any CPU (docs/SCALING.md#bf16-on-cpu).
    bf16: bf16 weights. fp32: throughout (the reference model still bf16 on a GPU)."""
    import torch

    mode = ("bf16-mixed" if gpu else "fp32") if precision == "auto" else precision
    autocast = mode == "bf16-mixed" or (mode == "bf16" and gpu)
    return Precision(
        mixed="bf16" if autocast else "no",
        policy=torch.bfloat16 if mode == "bf16" else torch.float32,
        reference=torch.bfloat16 if gpu or autocast else torch.float32,
        engine="bfloat16" if autocast else "float32",
        activation_bytes=2 if mode == "bf16" or autocast else 4,
        residual_bytes=2 if mode == "bf16" else 4,
    )


def autocast_options() -> dict:
    """torch.autocast's options for the policy's forward (`common.trainer.make_accelerator`). The weight cache
    is off: it holds a bf16 copy of every weight (2 bytes a parameter) to the forward's end, and saves no cast, as
    each weight is cast once a forward."""
    return {"cache_enabled": False}


def optimizer_options(device_type: str) -> dict:
    """The policy's AdamW options: fused, one pass over each parameter and its state. torch's default on CUDA
    (foreach) holds sqrt(v) of the whole model in one temporary (4 bytes a parameter); on CPU (a loop of a dozen
    tensor ops a parameter) it is several times slower (docs/SCALING.md#a-real-model-on-cpu-smollm2-135m-instruct)."""
    return {"fused": True} if device_type in ("cuda", "cpu") else {}


def load_reference_model(model_path: str, dtype, device):
    """The frozen reference model of the KL term (`--beta > 0`), whole on every rank. Loaded with FSDP's
    `cpu_ram_efficient_loading` off: it loads zeros on all but local rank 0, counting on `prepare` to broadcast,
    and the reference model is never prepared."""
    from transformers import AutoModelForCausalLM

    saved = os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    finally:
        if saved is not None:
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = saved
    return model.to(device).eval().requires_grad_(False)


# Built once by `python -m tools.tiny_model`; shipped, as a build's weights depend on the CPU and thread count.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-arith"


def demo_model_dir(path: Path = SHIPPED_DIR) -> Path:
    """The demo model `--model tiny` names, checked against its MANIFEST.json (a few milliseconds)."""
    from common.checkpoint import manifest_problem

    if problem := manifest_problem(path):
        raise SystemExit(
            f"error: --model tiny: the demo model in {path} is damaged: {problem}; restore it with "
            "`git checkout -- models/tiny-arith` (or pass --model DIR with a model built by `python -m tools.tiny_model`, whose weights "
            "and so figures differ by machine)"
        )
    return path


# `--model smollm2`: SmolLM2-135M-Instruct as `python -m tools.smollm2` converts it (scripts/setup_cpu.sh runs it).
SMOLLM2_VERSION = 1  # bump when the conversion changes so cached folders are rebuilt
SMOLLM2_DIR = (
    Path(os.environ.get("GRPO_ZOO_CACHE", Path.home() / ".cache" / "grpo-zoo"))
    / f"smollm2-135m-instruct-v{SMOLLM2_VERSION}"
)
SMOLLM2_MARKER = "smollm2.json"


def smollm2_dir(path: str | Path = SMOLLM2_DIR) -> Path:
    """The converted model `--model smollm2` names, checked against its MANIFEST.json."""
    from common.checkpoint import manifest_problem

    path = Path(path)
    if not (path / SMOLLM2_MARKER).exists():
        raise SystemExit(f"error: --model smollm2: not converted yet: run `python -m tools.smollm2` (into {path})")
    if problem := manifest_problem(path):
        raise SystemExit(
            f"error: --model smollm2: the converted model {path} is damaged: {problem}; delete that folder "
            "and run `python -m tools.smollm2` to convert it anew"
        )
    return path


# Memory preflight: refuse, before any weight loads, a plan whose resident memory cannot fit a GPU; else it would
# train one step and die at vLLM's next wake-up, beside AdamW's state. Resident on each GPU (docs/SCALING.md "Per-GPU
# budget"): the training state, the bf16 reference model, vLLM's share (the whole model: colocated, no tensor
# parallelism; it must hold `vllm_floor` and one `max_model_len` sequence) and `MARGIN_GIB`, a floor, not a promise.
# The update's own peak is estimated phase by phase in benchmarks/memory.py (`update_phases`).

GIB = 2**30
MARGIN_GIB = 2.0
KV_BLOCK = 16  # tokens per KV page: vLLM 0.32's default (vllm/config/cache.py DEFAULT_BLOCK_SIZE)
# vLLM subtracts the CUDA graphs it captures from the KV cache, measured by capturing, which no config predicts:
# an allowance, with the buffers outside torch (cuBLAS, attention workspaces); not measured here.
CUDA_GRAPHS_GIB = 1.0


def bytes_per_parameter(mode: str, world: int, precision: str) -> float:
    """Training-state bytes per policy parameter on one GPU (`mode`: `common.trainer.parallel_mode`'s).
    torch AdamW: weights, gradients, both moments in the weights' dtype, whole or over `world` (FSDP2). DeepSpeed
    in bf16: bf16 weights (whole under ZeRO-2) beside sharded fp32 master weights, gradients and moments."""
    if mode in ("single", "ddp"):
        return 8.0 if precision == "bf16" else 16.0
    if mode == "fsdp2":
        return (8.0 if precision == "bf16" else 16.0) / world
    if mode not in ("zero2", "zero3"):
        raise ValueError(f"unknown parallel mode {mode!r}")
    weights, sharded = (4.0, 12.0) if precision == "fp32" else (2.0, 16.0)
    return (weights if mode == "zero2" else weights / world) + sharded / world


@dataclass(frozen=True)
class ModelShape:
    """What vLLM's memory depends on besides the parameter count. `mlp`: values per token its MLP holds at once
    (dense: 3 I; MoE: fused_moe's caches, top-k x (max(2 I_e, D) + I_e)); `context`: max_position_embeddings."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    mlp: int
    context: int


def model_shape(config) -> ModelShape:
    """`ModelShape` of a transformers config (or anything with its attributes)."""
    heads, hidden = config.num_attention_heads, config.hidden_size
    experts = getattr(config, "num_experts_per_tok", 0) or 0
    if experts:
        inner = config.moe_intermediate_size
        mlp = experts * (max(2 * inner, hidden) + inner)
    else:
        mlp = 3 * config.intermediate_size
    return ModelShape(
        layers=config.num_hidden_layers, hidden=hidden, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or hidden // heads, vocab=config.vocab_size, mlp=mlp,
        context=config.max_position_embeddings,
    )  # fmt: skip


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """K and V of every layer for one token (vLLM's FullAttentionSpec page over its block size)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes


def vllm_batch(
    total_gib: float, max_model_len: int, max_num_seqs: int | None, max_num_batched_tokens: int | None
) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM 0.32 runs with: the given ones, else its offline defaults
    (vllm/engine/arg_utils.py `get_batch_defaults`; on an 80 GB A100, told by its name, the estimate is high)."""
    seqs, tokens = (1024, 16384) if total_gib >= 70 else (256, 8192)
    seqs = max_num_seqs or seqs
    return seqs, max_num_batched_tokens or min(tokens, seqs * max_model_len)


def vllm_activation_bytes(shape: ModelShape, dtype_bytes: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """An estimate from the config of the peak of vLLM's profile run above its weights (gpu_model_runner.py
    `profile_run`), the larger of: the forward of T = `max_num_batched_tokens` tokens (3 D per token beside the
    wider of attention and the MLP), and the sampler's [N, V] logits, their fp32 copy, processed log-probs,
    probabilities and noise for N = min(max_num_seqs, T) (`_dummy_sampler_run`)."""
    attention = (2 * shape.heads + 2 * shape.kv_heads) * shape.head_dim
    forward = max_num_batched_tokens * (3 * shape.hidden + max(attention, shape.mlp)) * dtype_bytes
    rows = min(max_num_seqs, max_num_batched_tokens)
    per_logit = dtype_bytes + (0 if dtype_bytes == 4 else 4) + 3 * 4
    sampler = rows * shape.vocab * per_logit + max_num_batched_tokens * shape.hidden * dtype_bytes
    return max(forward, sampler)


def vllm_floor(
    parameters: int, shape: ModelShape, *, precision: str, total_gib: float, max_model_len: int | None = None,
    max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
) -> dict[str, float]:  # fmt: skip
    """GiB per part of what vLLM's share must hold before it starts: weights, profile-run activations, the KV of one
    `max_model_len` sequence (None: the model's context, what vLLM takes untold), CUDA graphs."""
    dtype_bytes = 4 if precision == "fp32" else 2
    max_model_len = max_model_len or shape.context
    seqs, tokens = vllm_batch(total_gib, max_model_len, max_num_seqs, max_num_batched_tokens)
    blocks = math.ceil(max_model_len / KV_BLOCK)
    return {
        "weights": parameters * dtype_bytes / GIB,
        "activations": vllm_activation_bytes(shape, dtype_bytes, seqs, tokens) / GIB,
        "one sequence's KV": blocks * KV_BLOCK * kv_bytes_per_token(shape, dtype_bytes) / GIB,
        "CUDA graphs": CUDA_GRAPHS_GIB,
    }


def check_plan(
    parameters: int, *, mode: str, world: int, precision: str, reference_model: bool, vllm_utilization: float,
    total_gib: float, vllm_floor: dict[str, float], margin_gib: float = MARGIN_GIB,
) -> dict[str, float]:  # fmt: skip
    """GiB per item resident on one GPU at the rollout after the first optimiser step (`vllm_utilization`: 0
    without vLLM). Stop with the figures and the fix if vLLM's share cannot hold its floor or the items exceed
    `total_gib`."""
    plan = {
        "training state": parameters * bytes_per_parameter(mode, world, precision) / GIB,
        "reference model": parameters * 2 / GIB if reference_model else 0.0,
        "vLLM": vllm_utilization * total_gib,
        "margin": margin_gib,
    }
    floor = sum(vllm_floor.values())
    if vllm_utilization and plan["vLLM"] < floor:
        parts = " + ".join(f"{v:.1f} {k}" for k, v in vllm_floor.items())
        raise SystemExit(
            f"error: memory: vLLM's share of each GPU, {plan['vLLM']:.1f} GiB (--vllm_gpu_memory_utilization "
            f"{vllm_utilization} x {total_gib:.1f}), cannot hold what it needs before its KV cache, {floor:.1f} GiB "
            f"({parts}; vLLM would stop after the policy loads): raise it to at least "
            f"{math.ceil(100 * floor / total_gib) / 100:.2f} (the rest is its KV cache), shorten --max_prompt_len + "
            "--max_completion_len, or use GPUs with more memory"
        )
    need = sum(plan.values())
    if need <= total_gib:
        return plan
    items = " + ".join(f"{v:.1f} {k}" for k, v in plan.items() if v)
    where = f"{mode} over {world} GPUs" if world > 1 else mode
    fixes = []
    room = total_gib - (need - plan["vLLM"])  # what vLLM could take with everything else in place
    if plan["vLLM"] and room >= floor and room / total_gib >= 0.1:
        fixes.append(f"lower --vllm_gpu_memory_utilization to {math.floor(100 * room / total_gib) / 100:.2f}")
    if reference_model:
        fixes.append("--beta 0 (no reference model)")
    if mode in ("single", "ddp", "zero2"):
        fixes.append("shard the model (configs/accelerate/zero3.yaml or fsdp2.yaml)")
    else:
        fixes.append("more GPUs to shard over")
    raise SystemExit(
        f"error: memory: each GPU would hold {need:.1f} GiB of its {total_gib:.1f} ({items}; {where}, "
        f"{parameters / 1e9:.2f}B parameters, --precision {precision}): {', or '.join(fixes)}"
    )


def model_config(model_path: str) -> tuple:
    """(config, parameter count) from config.json alone, built on the meta device; tied embeddings count once."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with _without_zero3_init(), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return config, sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _without_zero3_init():
    """transformers' ZeRO-3 hook off for the block. While accelerate's stage-3 HfDeepSpeedConfig lives,
    `from_config` builds inside deepspeed.zero.Init: on the meta device it stops on "Cannot copy out of meta
    tensor", and partitioned parameters would report numel() == 0."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref  # a weakref to the live config, or None
    live = ref() if ref is not None else None
    if live is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(live)


def preflight_memory(
    model_path: str, *, mode: str, world: int, precision: str, reference_model: bool, vllm_utilization: float,
    total_gib: float | None, max_model_len: int | None = None, max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict[str, float] | None:  # fmt: skip
    """The session's check before the policy loads (`check_plan` with the model's size and vLLM's floor) on a GPU
    of `total_gib` GiB; None: CPU, not planned. The last three: vLLM's (None: its own). Returns the plan or None."""
    if total_gib is None:
        return None
    config, parameters = model_config(model_path)
    floor = vllm_floor(
        parameters, model_shape(config), precision=precision, total_gib=total_gib, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
    )  # fmt: skip
    return check_plan(
        parameters, mode=mode, world=world, precision=precision, reference_model=reference_model,
        vllm_utilization=vllm_utilization, total_gib=total_gib, vllm_floor=floor,
    )  # fmt: skip


def check_memory(
    run, model_path: str, mode, reference_model: bool, device_gib: float | None, engine_size=None
):  # fmt: skip
    """`preflight_memory` of this run's flags (`common.run_flags.RunFlags`) under `mode`
    (`common.trainer.ParallelMode`; `engine_size` None: vLLM's defaults, which err high), after the one layout
    no memory makes work. Returns the plan (GiB per item) or None."""
    if reference_model and mode.kind == "zero3":
        raise SystemExit(
            "error: --beta > 0 under DeepSpeed ZeRO-3: the reference model would be partitioned and never wrapped; "
            "use configs/accelerate/fsdp2.yaml (the reference model is then loaded whole on each GPU) or --beta 0"
        )
    return preflight_memory(
        model_path, mode=mode.kind, world=mode.world, precision=run.precision, reference_model=reference_model,
        vllm_utilization=run.vllm_gpu_memory_utilization if run.rollout == "vllm" else 0.0, total_gib=device_gib,
        **(asdict(engine_size) if engine_size is not None else {}),
    )  # fmt: skip
