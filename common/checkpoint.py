"""Checkpoints: a HF model directory (loadable by vLLM and `--model`), written atomically."""

import shutil
from pathlib import Path

import torch
from accelerate import Accelerator


def save_checkpoint(accelerator: Accelerator, model: torch.nn.Module, tokenizer, path: str | Path) -> None:
    """Write model + tokenizer to `path`; a crash mid-write leaves no partial `path` behind."""
    path = Path(path)
    state = accelerator.get_state_dict(model)  # full parameters, gathered under ZeRO-3 / FSDP
    if accelerator.is_main_process:
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    accelerator.wait_for_everyone()
