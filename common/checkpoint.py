"""Checkpoints that a killed run can resume from, written atomically.

    output_dir/checkpoint-<step>/
        model/               HF model + tokenizer: loadable by vLLM, `--model`, evaluation
        accelerate/          accelerator.save_state: weights, optimiser, scheduler, RNG states
                             (sharded the way DeepSpeed / FSDP keep them)
        trainer_state.json   step and the prompt sampler's position
        COMPLETE             written last: a checkpoint without it is never used

Everything is written under `checkpoint-<step>.tmp` and renamed at the end,
so a crash while saving leaves the previous checkpoint as the latest one.
"""

import json
import re
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator

_NAME = re.compile(r"^checkpoint-(\d+)$")


def save_checkpoint(
    accelerator: Accelerator, model: torch.nn.Module, tokenizer, output_dir: str | Path, step: int, trainer_state: dict, keep_last: int = 0
) -> Path:
    """Save everything needed to resume after `step`; keep only the newest `keep_last` (0: all)."""
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f"checkpoint-{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "accelerate"))  # every rank takes part (sharded states)
    state_dict = accelerator.get_state_dict(model)  # gathered in full on rank 0 under ZeRO-3 / FSDP
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(tmp / "model", state_dict=state_dict)
        tokenizer.save_pretrained(tmp / "model")
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}))
        (tmp / "COMPLETE").write_text("ok\n")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        if keep_last > 0:
            for old in list_checkpoints(output_dir)[keep_last:]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """checkpoint-<step> directories, newest first (complete or not)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` cannot be resumed from, or None if it looks whole."""
    if not (path / "COMPLETE").exists():
        return "no COMPLETE marker (the save was interrupted)"
    try:
        state = json.loads((path / "trainer_state.json").read_text())
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable trainer_state.json ({e})"
    if not (path / "accelerate").is_dir() or not any((path / "accelerate").iterdir()):
        return "missing accelerate/ state"
    if not (path / "model" / "config.json").exists():
        return "missing model/config.json"
    return None


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint that passes `checkpoint_problem`; broken ones are reported and skipped."""
    for path in list_checkpoints(output_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        print(f"skipping {path}: {problem}")
    return None


def load_checkpoint(accelerator: Accelerator, output_dir: str | Path) -> dict:
    """Restore weights, optimiser, scheduler and RNG from the latest good checkpoint; return its trainer state."""
    path = latest_checkpoint(output_dir)
    if path is None:
        raise SystemExit(f"--resume: no complete checkpoint under {output_dir}; run without --resume to start fresh")
    try:
        accelerator.load_state(str(path / "accelerate"))
    except Exception as e:  # a checkpoint from another model or world size
        raise SystemExit(f"--resume: cannot load {path} ({type(e).__name__}: {e}); was it written by this model and setup?") from e
    state = json.loads((path / "trainer_state.json").read_text())
    if accelerator.is_main_process:
        print(f"resumed from {path} (step {state['step']})")
    return state
