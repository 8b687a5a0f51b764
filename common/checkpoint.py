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
    output_dir/model/        the final model: hard links to the last checkpoint's model/, and its own MANIFEST.json

Everything is written under `checkpoint-<step>.tmp`, flushed to disk, and renamed at the end,
so a crash while saving leaves the previous checkpoint as the newest; a full disk (or any
write error) stops the run with one line naming the path, the partial `.tmp` removed. Old
checkpoints are renamed `.deleting` before they are deleted, so a kill mid-delete never leaves
a half-deleted checkpoint under its name; leftovers are removed at the next save or resume.
On `--resume` the newest checkpoint that is whole, matches its manifest (a missing, truncated
or altered file) and loads is used; a broken one is reported and skipped. Weights that are not
finite are never saved. Multi-node: `output_dir` must be on a filesystem every node sees
(every rank writes its own RNG / optimiser shard files); `common.run_dir.check_shared` checks it.
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
    mode=None,
) -> Path | None:
    """Save everything needed to resume after `step` (None: not saved, the weights are not finite);
    keep only the newest `keep_last` complete ones (0: all). `export`: also make this checkpoint's
    HF model the run's model, `output_dir/model`. `mode`: the run's `common.distributed.ParallelMode`.
    Every rank must call it (the states are sharded, the HF weights gathered)."""
    output_dir = Path(output_dir)
    if not weights_are_finite(accelerator, model, mode):
        if accelerator.is_main_process:
            print(f"warning: step {step}: the weights hold NaN or inf; checkpoint-{step} is not saved")
        return None
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f"checkpoint-{step}.tmp"
    with _write_errors(tmp, accelerator):
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


class _write_errors:
    """A failed write (a full disk, a quota, a permission) while saving: the partial `tmp` removed,
    earlier checkpoints untouched, and one line naming the path and the reason. torch's C++
    writer reports a full disk as "iostream error", so the free space is looked at too."""

    def __init__(self, tmp: Path, accelerator: Accelerator):
        self.tmp, self.accelerator = tmp, accelerator

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or not isinstance(error, (OSError, RuntimeError)):
            return False
        free = _free_bytes(self.tmp.parent)  # before the partial files go
        shutil.rmtree(self.tmp, ignore_errors=True)
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0][:200]
        if free is not None and free < 2**20:
            reason = f"No space left on device ({free} bytes free)"
        raise SystemExit(
            f"error: saving {self.tmp.name.removesuffix('.tmp')} in {self.tmp.parent} failed: {reason}. The partial "
            "checkpoint was removed; earlier checkpoints are untouched. Free space (or point --output_dir elsewhere) "
            "and continue with --resume"
        ) from None


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def delete_tree(path: Path) -> None:
    """Delete a checkpoint or model directory so that a kill mid-way leaves nothing under its name:
    renamed `<name>.deleting` first (atomic), then removed."""
    doomed = path.with_name(path.name + ".deleting")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(output_dir: Path) -> list[str]:
    """Remove what killed saves and deletions left (`*.tmp`, `*.deleting`) and checkpoints that are
    older than the newest good one and broken (a deletion killed before renames were used);
    returns their names."""
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
    """`target` becomes a copy of the HF model directory `source` (transformers and vLLM load it), made
    of hard links where the filesystem has them, with its own MANIFEST.json: no second copy of the
    weights on disk, it outlives the checkpoint when `--keep_last` deletes that, and `--model`
    checks it. Replaced whole, never half written."""
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
    """If the run's last step is saved but `model/` is missing or damaged (a kill during the final
    export), export it again from that checkpoint."""
    output_dir = Path(output_dir)
    last = output_dir / f"checkpoint-{final_step}"
    model = output_dir / "model"
    if checkpoint_problem(last) is None and not (model.is_dir() and manifest_problem(model, checksums=False) is None):
        export_model(last / "model", model)


def weights_are_finite(accelerator: Accelerator, model: torch.nn.Module, mode=None) -> bool:
    """No NaN or inf in any parameter. Each rank checks what it holds: under ZeRO-3 a parameter is an
    empty placeholder and the rank's partition is `ds_tensor`; under FSDP2 the local shard. Every
    rank gets the answer."""
    bad = 0
    for p in model.parameters():
        held = p.ds_tensor if hasattr(p, "ds_tensor") else p.to_local() if hasattr(p, "to_local") else p
        bad += not bool(torch.isfinite(held.detach()).all())
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
    Sharded states (ZeRO, FSDP) are other files, kept as they are; so is anything that differs, and
    both files stay where the filesystem has no hard links."""
    from safetensors import safe_open

    if not (state_file.is_file() and hf_file.is_file()):
        return

    def layout(path):
        with safe_open(path, "pt") as f:
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}

    if layout(state_file) != layout(hf_file) or not _same_tensors(state_file, hf_file):
        return
    link = state_file.with_name(state_file.name + ".link")
    try:
        os.link(hf_file, link)
    except OSError:  # FUSE, object-store mounts: keep both copies
        return
    os.replace(link, state_file)


def _same_tensors(a: Path, b: Path) -> bool:
    from safetensors import safe_open

    with safe_open(a, "pt") as fa, safe_open(b, "pt") as fb:
        return all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in fa.keys())


# A file one rank writes for itself: accelerate's RNG state, DeepSpeed's and torch.distributed.checkpoint's shards.
_OWNER = re.compile(r"(?:^random_states_|^zero_pp_rank_|^__)(\d+)[_.]")


def hash_shares(root: Path, names: list[str], world: int) -> list[list[str]]:
    """`names` (files under `root`) split over `world` ranks to hash at once: a file a rank wrote for
    itself (its name says which rank: `_OWNER`) to that rank, where it may still be in the page cache;
    the rest largest first to the least loaded rank. A file's hard links stay together (read once)."""
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
    """SHA-256 of each of `names` (read on rank 0) under `root`; None for a file that cannot be read.
    Several processes: rank 0 splits the files (`hash_shares`), every rank hashes its share at the same
    time (a 7B ZeRO-3 checkpoint is ~106 GB: rank 0 alone took minutes with the other GPUs idle), and
    every rank gets every hash."""
    world = 1 if accelerator is None else accelerator.num_processes
    if world == 1:
        shares = [names]
    else:
        from accelerate.utils import gather_object

        shares = broadcast_object_list([hash_shares(root, names, world) if accelerator.is_main_process else None])[0]
    seen: dict = {}
    mine = {}
    for name in shares[0 if world == 1 else accelerator.process_index]:
        try:
            mine[name] = _sha256(root / name, seen)
        except OSError:
            mine[name] = None
    if world == 1:
        return mine
    return {k: v for part in gather_object([mine]) for k, v in part.items()}


def write_manifest(root: Path, accelerator: Accelerator | None = None) -> None:
    """MANIFEST.json: {relative path: {"bytes", "sha256"}} of every file under root (marker aside), written
    by rank 0; with `accelerator`, every rank must call it and hashes its share (`_hash_files`)."""
    main = accelerator is None or accelerator.is_main_process
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in (MANIFEST, "COMPLETE")) if main else []
    names = [str(p.relative_to(root)) for p in files]
    hashes = _hash_files(root, names if main else None, accelerator)
    if main:
        manifest = {n: {"bytes": (root / n).stat().st_size, "sha256": hashes[n]} for n in names}
        (root / MANIFEST).write_text(json.dumps(manifest, indent=1))


def manifest_problem(path: Path, checksums: bool = True, accelerator: Accelerator | None = None) -> str | None:
    """How `path`'s files differ from its MANIFEST.json (missing, extra-short, altered), or None.
    Sizes only with checksums=False (fast); SHA-256 of every file otherwise. With `accelerator`, every
    rank must call it: rank 0 reads the manifest, the ranks hash their shares at once, and every rank
    gets rank 0's verdict."""
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
            problem = next(
                (f"{n} does not match its SHA-256 in the manifest (corrupted)" for n, e in expected.items() if hashes[n] != e["sha256"]),
                None,
            )  # fmt: skip
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
        if f.stat().st_size != entry["bytes"]:
            return (
                expected,
                f"{name} has {f.stat().st_size} bytes, the manifest says {entry['bytes']} (truncated or replaced)",
            )
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
    """Restore weights, optimiser, scheduler and RNG from the newest good checkpoint; return its trainer
    state, or None (with a line saying so) when there is none: the run then starts from step 0.

    A checkpoint that looks whole but fails to load (a truncated or corrupted file) is skipped too,
    on every rank alike, and the one before it is tried. Leftovers of killed saves and deletions
    are removed. The metrics.jsonl rows of steps after the restored one (logged by the killed run
    after its last save) are dropped, so the resumed run's rows follow on.
    """
    main = accelerator.is_main_process
    if main and (removed := remove_leftovers(Path(output_dir))):
        print(f"--resume: removed what killed saves and deletions left in {output_dir}: {', '.join(removed)}")
    accelerator.wait_for_everyone()
    errors = []
    state = None
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
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if (s := _row_step(line)) is not None and s <= step]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)


def _row_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a half-written last line from the kill
