"""Checkpoints that a killed run can resume from, written atomically.

    output_dir/checkpoint-<step>/
        model/               HF model + tokenizer: loadable by vLLM, `--model`, evaluation
        accelerate/          accelerator.save_state: weights, optimiser, scheduler, RNG states
                             (one RNG file per rank; weights and optimiser sharded the
                             way DeepSpeed / FSDP keep them). On one GPU or DDP its weights
                             file is a hard link to model/'s: the weights are stored once.
        trainer_state.json   step, number of processes, the prompt sampler's position
        MANIFEST.json        size and SHA-256 of every file above
        COMPLETE             written last: a checkpoint without it is never used

Everything is written under `checkpoint-<step>.tmp`, flushed to disk, and renamed
at the end, so a crash while saving leaves the previous checkpoint as the latest.
On `--resume` the newest checkpoint that is whole, matches its manifest (a missing,
truncated or altered file: RNG state, optimiser, weights) and loads is used; a
broken one is reported with its reason and skipped. Evaluation checks the manifest
too. Weights that are not finite are never saved: the save is skipped, so
`--keep_last` can never delete the last good checkpoint in favour of a diverged one.
Multi-node: `output_dir` must be on a filesystem every
node sees (every rank writes its own RNG / optimiser shard files).
"""

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

_NAME = re.compile(r"^checkpoint-(\d+)$")
MANIFEST = "MANIFEST.json"


def save_checkpoint(
    accelerator: Accelerator,
    model: torch.nn.Module,
    tokenizer,
    output_dir: str | Path,
    step: int,
    trainer_state: dict,
    keep_last: int = 0,
    export: bool = False,
) -> Path | None:
    """Save everything needed to resume after `step` (None: not saved, the weights are not finite);
    keep only the newest `keep_last` complete ones (0: all). `export`: also make the HF model of
    this checkpoint the run's model, `output_dir/model` (the last run's end: `export_model`).

    Every rank must call it (the states are sharded, the HF weights gathered).
    """
    output_dir = Path(output_dir)
    if not weights_are_finite(accelerator, model):
        if accelerator.is_main_process:
            print(f"warning: step {step}: the weights hold NaN or inf; checkpoint-{step} is not saved")
        return None
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f"checkpoint-{step}.tmp"
    if accelerator.is_main_process:
        for stale in output_dir.glob("checkpoint-*.tmp"):  # left by a save that was killed
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "accelerate"))
    accelerator.wait_for_everyone()  # save_state does not wait: every rank's files are in before the rename
    state_dict = accelerator.get_state_dict(model)  # gathered in full on rank 0 under ZeRO-3 / FSDP
    if accelerator.is_main_process:
        # One file, so that accelerate's copy of the same weights can become a link to it.
        accelerator.unwrap_model(model).save_pretrained(tmp / "model", state_dict=state_dict, max_shard_size="1000GB")
        tokenizer.save_pretrained(tmp / "model")
        _store_weights_once(tmp / "accelerate" / "model.safetensors", tmp / "model" / "model.safetensors")
        state = {"step": step, "num_processes": accelerator.num_processes, **trainer_state}
        (tmp / "trainer_state.json").write_text(json.dumps(state))
        write_manifest(tmp)
        _fsync([*tmp.rglob("*"), tmp])  # the data is on disk before COMPLETE says so
        (tmp / "COMPLETE").write_text("ok\n")
        _fsync([tmp / "COMPLETE", tmp])
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        _fsync([output_dir])  # the rename itself
        if keep_last > 0:
            complete = [p for p in list_checkpoints(output_dir) if checkpoint_problem(p) is None]
            for old in complete[keep_last:]:
                shutil.rmtree(old, ignore_errors=True)
        if export:
            export_model(final / "model", output_dir / "model")
    accelerator.wait_for_everyone()
    return final


def export_model(source: Path, target: Path) -> None:
    """`target` becomes a copy of the HF model directory `source` (transformers and vLLM load it), made
    of hard links where the filesystem has them: no second copy of the weights on disk, and it
    outlives the checkpoint when `--keep_last` deletes that. Replaced whole, never half written."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in source.iterdir():
        try:
            os.link(f, tmp / f.name)
        except OSError:  # no hard links here (another device, some network filesystems)
            shutil.copy2(f, tmp / f.name)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def weights_are_finite(accelerator: Accelerator, model: torch.nn.Module) -> bool:
    """No NaN or inf in any parameter (each rank checks its shard; every rank gets the answer)."""
    bad = sum(not bool(torch.isfinite(p.detach()).all()) for p in model.parameters() if p.numel())
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(torch.tensor(float(bad), device=accelerator.device), reduction="sum").item()
    return bad == 0


def _sha256(path: Path, seen: dict | None = None) -> str:
    """SHA-256 of a file's bytes; `seen` caches it per inode, so a file hard-linked under two
    names (the weights stored once) is read once."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if seen is not None and key in seen:
        return seen[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**23):
            h.update(chunk)
    if seen is not None:
        seen[key] = h.hexdigest()
    return h.hexdigest()


def _store_weights_once(state_file: Path, hf_file: Path) -> None:
    """accelerate's model file and the HF model file hold the same tensors (single GPU / DDP: both the
    unwrapped model's fp32 state dict, tied weights once): keep one, hard-linked under both names.
    Sharded states (ZeRO, FSDP) are other files, kept as they are; so is anything that differs."""
    from safetensors import safe_open

    if not (state_file.is_file() and hf_file.is_file()):
        return

    def layout(path):
        with safe_open(path, "pt") as f:
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}

    if layout(state_file) != layout(hf_file) or not _same_tensors(state_file, hf_file):
        return
    state_file.unlink()
    os.link(hf_file, state_file)


def _same_tensors(a: Path, b: Path) -> bool:
    from safetensors import safe_open

    with safe_open(a, "pt") as fa, safe_open(b, "pt") as fb:
        return all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in fa.keys())


def write_manifest(root: Path) -> None:
    """MANIFEST.json: {relative path: {"bytes", "sha256"}} of every file under root (marker aside)."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in (MANIFEST, "COMPLETE"))
    seen: dict = {}
    manifest = {str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": _sha256(p, seen)} for p in files}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))


def manifest_problem(path: Path, checksums: bool = True) -> str | None:
    """How `path`'s files differ from its MANIFEST.json (missing, extra-short, altered), or None.
    Sizes only with checksums=False (fast); SHA-256 of every file otherwise."""
    try:
        expected = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return f"no readable {MANIFEST} ({type(e).__name__})"
    seen: dict = {}
    for name, entry in expected.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != entry["bytes"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {entry['bytes']} (truncated or replaced)"
        if checksums and _sha256(f, seen) != entry["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (corrupted)"
    return None


def _fsync(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)  # directories too: that persists the entries in them
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable trainer_state.json ({type(e).__name__}: {e})"
    if step != int(_NAME.match(path.name).group(1)):
        return f"trainer_state.json says step {step}, the directory name another"
    if not (path / "accelerate").is_dir() or not any((path / "accelerate").iterdir()):
        return "missing accelerate/ state"
    if not (path / "model" / "config.json").exists():
        return "missing model/config.json"
    return manifest_problem(path, checksums=False)


def load_checkpoint(accelerator: Accelerator, output_dir: str | Path) -> dict:
    """Restore weights, optimiser, scheduler and RNG from the newest good checkpoint; return its trainer state.

    A checkpoint that looks whole but fails to load (a truncated or corrupted file)
    is skipped too, on every rank alike, and the one before it is tried. The
    metrics.jsonl rows of steps after the restored one (logged by the killed run
    after its last save) are dropped, so the resumed run's rows follow on.
    """
    main = accelerator.is_main_process
    errors = []
    for path in list_checkpoints(output_dir):
        problem = checkpoint_problem(path)
        if problem is None and main:
            problem = manifest_problem(path)  # every byte, before any of it is trusted
        if accelerator.num_processes > 1:  # rank 0 read the manifest: its verdict holds for everyone
            problem = broadcast_object_list([problem], from_process=0)[0]
        if problem is None:
            try:
                accelerator.load_state(str(path / "accelerate"))
            except Exception as e:  # one rank's failure is everyone's: they must pick the same checkpoint
                problem = f"cannot load it ({type(e).__name__}: {str(e)[:300]})"
        if accelerator.num_processes > 1:
            failed = torch.tensor(float(problem is not None), device=accelerator.device)
            if accelerator.reduce(failed, reduction="sum").item() > 0 and problem is None:
                problem = "another rank could not load it"
        if problem is None:
            state = json.loads((path / "trainer_state.json").read_text())
            break
        errors.append(f"{path.name}: {problem}")
        if main:
            print(f"--resume: skipping {path}: {problem}")
    else:
        detail = "; ".join(errors) if errors else "none found"
        raise SystemExit(
            f"--resume: no usable checkpoint under {output_dir} ({detail}); run without --resume to start fresh"
        )

    saved_world = state.get("num_processes", accelerator.num_processes)
    if saved_world != accelerator.num_processes and main:
        print(
            f"--resume: {path} was written by {saved_world} processes, this run has {accelerator.num_processes}: "
            "ranks without a saved RNG state start from a fresh one"
        )
    if main:
        _drop_metrics_after(Path(output_dir) / "metrics.jsonl", state["step"])
        print(f"resumed from {path} (step {state['step']})")
    accelerator.wait_for_everyone()
    return state


def _drop_metrics_after(path: Path, step: int) -> None:
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _row_step(line) is not None and _row_step(line) <= step]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)


def _row_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a half-written last line from the kill


def model_to_load(model: str) -> tuple[str, Path | None]:
    """What `--model` names, as (a path or hub name to load, the training run it comes from or None).

    "tiny" is the CPU demo model; a training run directory (metrics.jsonl + checkpoint-N/) means
    its newest complete checkpoint; a checkpoint-N directory its model/ folder, once its manifest
    checks out. A local-looking path that does not exist, or a directory that is not a model (no
    config.json, no tokenizer files), stops with one line: a hub lookup would only retry, then
    blame the network.
    """
    if model == "tiny":
        from common.tiny_model import ensure_tiny_model

        return str(ensure_tiny_model()), None
    path = Path(model).expanduser()
    if not path.exists():
        if model.startswith(("/", "./", "../", "~")) or model.count("/") > 1 or model.endswith("/"):
            raise SystemExit(f"error: --model: {model} does not exist (a local path; hub names look like org/name)")
        return model, None  # a hub name
    if (path / "metrics.jsonl").is_file():  # a training run
        done = [c for c in list_checkpoints(path) if (c / "COMPLETE").exists()]
        if not done:
            raise SystemExit(f"error: --model: run directory {path} has no complete checkpoint-N/")
        path = done[0]
    if path.name.startswith("checkpoint-") and (path / "model").is_dir():
        if problem := manifest_problem(path):
            raise SystemExit(f"error: --model: checkpoint {path} is damaged: {problem}; use an earlier checkpoint")
        path = path / "model"
    if not (path / "config.json").is_file():
        raise SystemExit(f"error: --model: {path} has no config.json: not a model, a checkpoint-N or a run directory")
    if not any(
        (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    ):
        raise SystemExit(
            f"error: --model: {path} has no tokenizer files (tokenizer.json, tokenizer_config.json); copy them from the base model"
        )
    run = path.parent.parent if path.name == "model" and path.parent.name.startswith("checkpoint-") else None
    return str(path), run if run is not None and (run / "metrics.jsonl").is_file() else None
