"""Checkpoints that a killed run can resume from, written atomically.

    output_dir/checkpoint-<step>/
        model/               HF model + tokenizer (vLLM, `--model`, evaluation load it)
        accelerate/          accelerator.save_state, sharded as DeepSpeed / FSDP keep it; one RNG file per rank
        trainer_state.json   step, number of processes, the prompt sampler's position
        MANIFEST.json        size and SHA-256 of every file above
        COMPLETE             written last: a checkpoint without it is never used
    output_dir/model/        the final model: hard links to the last checkpoint's model/, its own MANIFEST.json

Written under `checkpoint-<step>.tmp`, fsynced and renamed; deleted via a `.deleting` rename; so a kill leaves
the previous checkpoint the newest. `--resume` takes the newest one that is whole, matches its manifest and
loads. Multi-node: `output_dir` must be shared by every node (`common.run_dir.check_shared`).
"""

import hashlib
import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object

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
    """Save what resuming after `step` needs (None: not saved, the weights are not finite); keep the newest
    `keep_last` (0: all); `export`: also make it `output_dir/model`. Every rank calls it."""
    output_dir = Path(output_dir)
    if not weights_are_finite(accelerator, model):
        if accelerator.is_main_process:
            print(f"warning: step {step}: the weights hold NaN or inf; checkpoint-{step} is not saved")
        return None
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f"checkpoint-{step}.tmp"
    with _write_errors(tmp):
        if accelerator.is_main_process:
            remove_leftovers(output_dir)
            tmp.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp / "accelerate"))
        accelerator.wait_for_everyone()  # save_state does not wait: every rank's files are in before the rename
        state_dict = accelerator.get_state_dict(model)  # gathered in full on rank 0 under ZeRO-3 / FSDP
        if accelerator.is_main_process:
            # One file, so that accelerate's copy of the same weights can become a link to it.
            accelerator.unwrap_model(model).save_pretrained(
                tmp / "model", state_dict=state_dict, max_shard_size="1000GB"
            )
            tokenizer.save_pretrained(tmp / "model")
            _store_weights_once(tmp / "accelerate" / "model.safetensors", tmp / "model" / "model.safetensors")
            state = {"step": step, "num_processes": accelerator.num_processes, **trainer_state}
            (tmp / "trainer_state.json").write_text(json.dumps(state))
        accelerator.wait_for_everyone()
        write_manifest(tmp, accelerator)  # every rank hashes its share (its own shard files) at once
        if accelerator.is_main_process:
            _fsync([*tmp.rglob("*"), tmp])  # the data is on disk before COMPLETE says so
            (tmp / "COMPLETE").write_text("ok\n")
            _fsync([tmp / "COMPLETE", tmp])
            if final.exists():
                delete_tree(final)
            tmp.rename(final)
            _fsync([output_dir])  # the rename itself
            if keep_last > 0:
                complete = [p for p in list_checkpoints(output_dir) if checkpoint_problem(p) is None]
                for old in complete[keep_last:]:
                    delete_tree(old)
            if export:
                export_model(final / "model", output_dir / "model")
    accelerator.wait_for_everyone()
    return final


@contextmanager
def _write_errors(tmp: Path):
    """A failed write while saving: `tmp` removed, one line naming the path and the reason (torch's C++ writer
    reports a full disk as "iostream error", so the free space is looked at too)."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        try:
            free = shutil.disk_usage(tmp.parent).free  # before the partial files go
        except OSError:
            free = None
        shutil.rmtree(tmp, ignore_errors=True)
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0][:200]
        if free is not None and free < 2**20:
            reason = f"No space left on device ({free} bytes free)"
        raise SystemExit(
            f"error: saving {tmp.name.removesuffix('.tmp')} in {tmp.parent} failed: {reason}. The partial "
            "checkpoint was removed; earlier checkpoints are untouched. Free space (or point --output_dir elsewhere) "
            "and continue with --resume"
        ) from None


def delete_tree(path: Path) -> None:
    """Delete a directory so that a kill mid-way leaves nothing under its name: renamed `.deleting` first."""
    doomed = path.with_name(path.name + ".deleting")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(output_dir: Path) -> list[str]:
    """Remove what killed saves and deletions left (`*.tmp`, `*.deleting`, broken checkpoints older than the
    newest good one); returns their names."""
    removed = []
    for stale in [*output_dir.glob("checkpoint-*.tmp"), *output_dir.glob("*.deleting"), output_dir / "model.tmp"]:
        if stale.exists():
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale.name)
    checkpoints = list_checkpoints(output_dir)
    newest_good = next((i for i, p in enumerate(checkpoints) if checkpoint_problem(p) is None), None)
    if newest_good is not None:
        for old in checkpoints[newest_good + 1 :]:
            if checkpoint_problem(old) is not None:
                shutil.rmtree(old, ignore_errors=True)
                removed.append(old.name)
    return removed


def export_model(source: Path, target: Path) -> None:
    """`target` becomes a copy of the HF model directory `source`, hard links where possible, with its own
    MANIFEST.json: it outlives the checkpoint `--keep_last` deletes. Replaced whole, never half written."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in source.iterdir():
        try:
            os.link(f, tmp / f.name)
        except OSError:  # no hard links here (another device, some network filesystems)
            shutil.copy2(f, tmp / f.name)
    write_manifest(tmp)
    _fsync([*tmp.iterdir(), tmp])
    if target.exists():
        delete_tree(target)
    tmp.rename(target)
    _fsync([target.parent])


def ensure_export(output_dir: str | Path, final_step: int) -> None:
    """Export `model/` again from the last checkpoint if a kill during the final export left it missing or damaged."""
    output_dir = Path(output_dir)
    last = output_dir / f"checkpoint-{final_step}"
    model = output_dir / "model"
    if checkpoint_problem(last) is None and not (model.is_dir() and manifest_problem(model, checksums=False) is None):
        export_model(last / "model", model)


def weights_are_finite(accelerator: Accelerator, model: torch.nn.Module) -> bool:
    """No NaN or inf in any parameter, on every rank; each checks what it holds (ZeRO-3: `ds_tensor`, FSDP2:
    its shard)."""
    bad = 0
    for p in model.parameters():
        held = p.ds_tensor if hasattr(p, "ds_tensor") else p.to_local() if hasattr(p, "to_local") else p
        bad += not bool(torch.isfinite(held.detach()).all())
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(torch.tensor(float(bad), device=accelerator.device), reduction="sum").item()
    return bad == 0


def _sha256(path: Path, seen: dict | None = None) -> str:
    """SHA-256 of a file; `seen` caches it per inode, so a hard-linked file is read once."""
    st, seen = path.stat(), {} if seen is None else seen
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in seen:
        with open(path, "rb") as f:
            seen[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return seen[key]


def _store_weights_once(state_file: Path, hf_file: Path) -> None:
    """On one GPU or DDP accelerate's model file holds the HF file's tensors: store them once, hard-linked under
    both names. Sharded states, files that differ, filesystems without hard links: both kept."""
    from safetensors import safe_open

    if not (state_file.is_file() and hf_file.is_file()):
        return

    def layout(path):
        with safe_open(path, "pt") as f:
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}

    if layout(state_file) != layout(hf_file):
        return
    with safe_open(state_file, "pt") as fa, safe_open(hf_file, "pt") as fb:
        if not all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in fa.keys()):
            return
    link = state_file.with_name(state_file.name + ".link")
    try:
        os.link(hf_file, link)
    except OSError:  # FUSE, object-store mounts: keep both copies
        return
    os.replace(link, state_file)


# A file one rank writes for itself: accelerate's RNG state, DeepSpeed's and torch.distributed.checkpoint's shards.
_OWNER = re.compile(r"(?:^random_states_|^zero_pp_rank_|^__)(\d+)[_.]")


def hash_shares(root: Path, names: list[str], world: int) -> list[list[str]]:
    """`names` split over `world` ranks to hash at once: a rank's own files (`_OWNER`) to it, where they may still
    be in the page cache; the rest largest first to the least loaded. Hard links stay together."""
    shares, load, groups = [[] for _ in range(world)], [0] * world, {}
    for name in names:
        st = (root / name).stat()
        groups.setdefault((st.st_dev, st.st_ino), (st.st_size, []))[1].append(name)
    rest = []
    for size, members in groups.values():
        owners = {int(m.group(1)) for n in members if (m := _OWNER.match(Path(n).name))}
        if len(owners) == 1 and (rank := owners.pop()) < world:
            shares[rank] += members
            load[rank] += size
        else:
            rest.append((size, members))
    for size, members in sorted(rest, key=lambda g: (-g[0], g[1])):
        rank = load.index(min(load))
        shares[rank] += members
        load[rank] += size
    return shares


def _hash_files(root: Path, names: list[str] | None, accelerator: Accelerator | None = None) -> dict[str, str | None]:
    """SHA-256 of each of `names` under `root` (None: unreadable), every rank hashing its share (`hash_shares`) at
    once: a 7B ZeRO-3 checkpoint is ~106 GB, minutes for rank 0 alone. Every rank gets every hash."""
    world = 1 if accelerator is None else accelerator.num_processes
    shares, rank = [names], 0
    if world > 1:
        shares = broadcast_object_list([hash_shares(root, names, world) if accelerator.is_main_process else None])[0]
        rank = accelerator.process_index
    seen, mine = {}, {}
    for name in shares[rank]:
        try:
            mine[name] = _sha256(root / name, seen)
        except OSError:
            mine[name] = None
    return mine if world == 1 else {k: v for part in gather_object([mine]) for k, v in part.items()}


def write_manifest(root: Path, accelerator: Accelerator | None = None) -> None:
    """MANIFEST.json: {relative path: {"bytes", "sha256"}} of every file under root, written by rank 0; with
    `accelerator`, every rank calls it."""
    main = accelerator is None or accelerator.is_main_process
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in (MANIFEST, "COMPLETE")) if main else []
    names = [str(p.relative_to(root)) for p in files]
    hashes = _hash_files(root, names if main else None, accelerator)
    if main:
        manifest = {n: {"bytes": (root / n).stat().st_size, "sha256": hashes[n]} for n in names}
        (root / MANIFEST).write_text(json.dumps(manifest, indent=1))


def manifest_problem(path: Path, checksums: bool = True, accelerator: Accelerator | None = None) -> str | None:
    """How `path`'s files differ from its MANIFEST.json, or None: sizes only with checksums=False, SHA-256 too
    otherwise. With `accelerator`, every rank calls it and gets rank 0's verdict."""
    several = accelerator is not None and accelerator.num_processes > 1
    main = accelerator is None or accelerator.is_main_process
    expected, problem = {}, None
    if main:
        expected, problem = _sizes_problem(path)
    if several:
        problem = broadcast_object_list([problem])[0]
    if problem is None and checksums:
        hashes = _hash_files(path, list(expected) if main else None, accelerator)
        if main:
            bad = (n for n, e in expected.items() if hashes[n] != e["sha256"])
            problem = next((f"{n} does not match its SHA-256 in the manifest (corrupted)" for n in bad), None)
        if several:
            problem = broadcast_object_list([problem])[0]
    return problem


def _sizes_problem(path: Path) -> tuple[dict, str | None]:
    """`path`'s manifest, and the first file missing or of another size than it says (None: all there)."""
    try:
        expected = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return {}, f"no readable {MANIFEST} ({type(e).__name__})"
    for name, entry in expected.items():
        f = path / name
        if not f.is_file():
            return expected, f"{name} is missing"
        if (size := f.stat().st_size) != entry["bytes"]:
            return expected, f"{name} has {size} bytes, the manifest says {entry['bytes']} (truncated or replaced)"
    return expected, None


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


def load_checkpoint(accelerator: Accelerator, output_dir: str | Path) -> dict | None:
    """Restore the newest checkpoint that checks and loads on every rank; return its trainer state, or None (said):
    the run starts from step 0. The logs' rows after its step are dropped, so the resumed run's follow on."""
    main = accelerator.is_main_process
    if main and (removed := remove_leftovers(Path(output_dir))):
        print(f"--resume: removed what killed saves and deletions left in {output_dir}: {', '.join(removed)}")
    accelerator.wait_for_everyone()
    errors, state = [], None
    for path in list_checkpoints(output_dir):
        problem = checkpoint_problem(path)
        if accelerator.num_processes > 1:  # rank 0's verdict holds for everyone
            problem = broadcast_object_list([problem], from_process=0)[0]
        if problem is None:  # every byte, before any of it is trusted; each rank hashes its share
            problem = manifest_problem(path, accelerator=accelerator)
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
    if state is None:
        if main:
            detail = "; ".join(errors) if errors else "none saved"
            print(f"--resume: no usable checkpoint in {output_dir} ({detail}): starting from step 0")
        return None
    saved_world = state.get("num_processes", accelerator.num_processes)
    if saved_world != accelerator.num_processes and main:
        print(
            f"--resume: {path} was written by {saved_world} processes, this run has {accelerator.num_processes}: "
            "ranks without a saved RNG state start from a fresh one"
        )
    if main:
        for log in ("metrics.jsonl", "samples.jsonl"):
            drop_rows_after(Path(output_dir) / log, state["step"])
        print(f"resumed from {path} (step {state['step']})")
    accelerator.wait_for_everyone()
    return state


def drop_rows_after(path: Path, step: int) -> None:
    """Keep the rows of a run's .jsonl log up to `step` (and drop a last line cut short by a kill)."""
    if not path.exists():
        return

    def row_step(line: str) -> int | None:
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            return None  # a half-written last line from the kill

    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if (s := row_step(line)) is not None and s <= step]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
