"""What `--model` names (the demo model, SmolLM2-135M-Instruct, a directory, a run or checkpoint, a hub name), its
checks before it loads, each stopping with one line, and the run's dtypes. Process-wide change: HF_HUB_OFFLINE=1
when the hub cannot be reached (`offline_unless_hub_reachable`)."""

import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse


def _lazy(name: str):
    """common.checkpoint's `name`, imported when called: it imports torch, which the hub check must not wait for."""

    def call(*args, **kwargs):
        import common.checkpoint

        return getattr(common.checkpoint, name)(*args, **kwargs)

    return call


checkpoint_problem, list_checkpoints, manifest_problem = map(
    _lazy, ("checkpoint_problem", "list_checkpoints", "manifest_problem")
)


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
    """torch.autocast's options for the policy's forward (`common.distributed.make_accelerator`). The weight cache
    is off: it holds a bf16 copy of every weight (2 bytes a parameter) to the forward's end, and saves no cast, as
    each weight is cast once a forward."""
    return {"cache_enabled": False}


def optimizer_options(device_type: str) -> dict:
    """The policy's AdamW options: fused on CUDA, where torch's default (foreach) holds sqrt(v) of the whole model
    in one temporary (4 bytes a parameter); elsewhere torch's default."""
    return {"fused": True} if device_type == "cuda" else {}


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
    path = Path(path)
    if not (path / SMOLLM2_MARKER).exists():
        raise SystemExit(f"error: --model smollm2: not converted yet: run `python -m tools.smollm2` (into {path})")
    if problem := manifest_problem(path):
        raise SystemExit(
            f"error: --model smollm2: the converted model {path} is damaged: {problem}; delete that folder "
            "and run `python -m tools.smollm2` to convert it anew"
        )
    return path
