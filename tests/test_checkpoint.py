"""Checkpoints: atomic saves, resume = uninterrupted run, broken checkpoints refused."""

import hashlib
import json
import os
import random
import shutil

import pytest
import torch
from accelerate import Accelerator
from scaling_utils import ROOT, baseline_run, checkpoint_weights, launch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.checkpoint import checkpoint_problem, list_checkpoints, load_checkpoint, save_checkpoint


@pytest.mark.xdist_group("coin")  # scaling_utils.baseline_run: built once per worker
def test_resume_after_a_kill_reaches_the_same_weights(tmp_path_factory, tiny_random_dir, tmp_path):
    """A run killed while saving step 2 (its checkpoint-2 has no COMPLETE marker, a
    checkpoint-3.tmp is half written, metrics.jsonl has a row for step 2 and half a line)
    resumes from checkpoint-1 and reaches step 3 exactly as the uninterrupted run did:
    same data order, optimiser, scheduler and RNG state. The resume gives no flag but --output_dir: it reads
    the run's flags from its run_config.json (before, it had to repeat every one)."""
    base = baseline_run(tmp_path_factory, tiny_random_dir)
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(base / "run_config.json", run / "run_config.json")
    shutil.copytree(base / "checkpoint-1", run / "checkpoint-1")
    shutil.copytree(base / "checkpoint-2", run / "checkpoint-2")
    (run / "checkpoint-2" / "COMPLETE").unlink()
    (run / "checkpoint-3.tmp" / "accelerate").mkdir(parents=True)
    logged = (base / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(logged[0] + "\n" + logged[1] + "\n" + logged[2][:20])

    rows, out = launch(ROOT / "grpo_base.py", run, "--resume")
    assert f"--resume: the run's flags from {run / 'run_config.json'}\n" in out
    assert f"skipping {run / 'checkpoint-2'}: no COMPLETE marker" in out
    assert f"resumed from {run / 'checkpoint-1'} (step 1)" in out
    assert [r["step"] for r in rows] == [1, 2, 3]  # the killed run's step-2 row and half line are gone
    expected = [json.loads(line) for line in logged]
    for got, want in zip(rows[1:], expected[1:]):
        for k in ("train/reward", "train/response_len", "train/loss", "train/grad_norm", "train/lr"):
            assert got[k] == want[k], (got["step"], k, got[k], want[k])
    w_resumed, w_straight = checkpoint_weights(run / "checkpoint-3"), checkpoint_weights(base / "checkpoint-3")
    assert w_resumed.keys() == w_straight.keys()
    for k in w_straight:
        assert torch.equal(w_resumed[k], w_straight[k]), k
    assert not list(run.glob("*.tmp")) and checkpoint_problem(run / "checkpoint-2") is None  # re-saved whole


# --- In-process: save, refuse, fall back ----------------------------------------------------


@pytest.fixture
def trainer(tiny_random_dir):
    """A prepared model + optimiser + scheduler, and a function doing one optimiser step."""
    accelerator = Accelerator()
    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    ids = torch.randint(3, 200, (2, 10), generator=torch.Generator().manual_seed(0))

    def train_step():
        accelerator.backward(model(input_ids=ids, labels=ids).loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

    return accelerator, model, tokenizer, optimizer, scheduler, train_step


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_save_is_atomic_and_keeps_the_newest(trainer, tmp_path):
    accelerator, model, tokenizer, _, _, train_step = trainer
    (tmp_path / "checkpoint-9.tmp").mkdir()  # a save that was killed
    for step in (1, 2, 3):
        train_step()
        save_checkpoint(accelerator, model, tokenizer, tmp_path, step, {"sampler": {"pos": step}}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-3", "checkpoint-2"]
    assert not list(tmp_path.glob("*.tmp"))
    for p in list_checkpoints(tmp_path):
        assert checkpoint_problem(p) is None
        state = json.loads((p / "trainer_state.json").read_text())
        assert state["num_processes"] == 1 and state["sampler"]["pos"] == state["step"]
        assert (p / "model" / "tokenizer_config.json").exists()


def _flip_bytes(path, n=1000):
    data = bytearray(path.read_bytes())
    for i in random.Random(0).sample(range(len(data)), min(n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path, keep=1000):
    """A file cut short as a copy that stopped: a new file, so a hard link to it keeps the whole one."""
    data = path.read_bytes()[:keep]
    path.unlink()
    path.write_bytes(data)


def _unloadable_but_listed(ckpt):
    """A file the manifest vouches for that still cannot be loaded (a bug at save time)."""
    (ckpt / "accelerate" / "optimizer.bin").write_bytes(b"\x80\x02trunc")
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    manifest["accelerate/optimizer.bin"] = {"bytes": 7, "sha256": hashlib.sha256(b"\x80\x02trunc").hexdigest()}
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))


CORRUPTIONS = {
    "no COMPLETE marker": lambda ckpt: (ckpt / "COMPLETE").unlink(),
    "unreadable trainer_state.json": lambda ckpt: (ckpt / "trainer_state.json").write_text('{"step": 2, "samp'),
    "cannot load it": _unloadable_but_listed,
    # What the manifest catches: each resumed silently (different weights, or trained on garbage) before it.
    "accelerate/random_states_0.pkl is missing": lambda ckpt: (ckpt / "accelerate" / "random_states_0.pkl").unlink(),
    "accelerate/random_states_0.pkl does not match its SHA-256": lambda ckpt: _flip_bytes(
        ckpt / "accelerate" / "random_states_0.pkl", 8
    ),
    "accelerate/model.safetensors does not match its SHA-256": lambda ckpt: _flip_bytes(
        ckpt / "accelerate" / "model.safetensors"
    ),
    "model/model.safetensors has": lambda ckpt: _truncate(ckpt / "model" / "model.safetensors"),
    "no readable MANIFEST.json": lambda ckpt: (ckpt / "MANIFEST.json").unlink(),
}


@pytest.mark.parametrize("reason", CORRUPTIONS)
def test_a_broken_checkpoint_is_refused_and_the_previous_one_used(trainer, tmp_path, capsys, reason):
    accelerator, model, tokenizer, optimizer, scheduler, train_step = trainer
    train_step()
    save_checkpoint(accelerator, model, tokenizer, tmp_path, 1, {"sampler": {"pos": 1}})
    at_1, lr_1 = _params(model), scheduler.get_last_lr()
    train_step()
    save_checkpoint(accelerator, model, tokenizer, tmp_path, 2, {"sampler": {"pos": 2}})
    CORRUPTIONS[reason](tmp_path / "checkpoint-2")
    train_step()  # the live state moves on: loading must bring back step 1's

    state = load_checkpoint(accelerator, tmp_path)
    out = capsys.readouterr().out
    assert f"skipping {tmp_path / 'checkpoint-2'}: {reason}" in out
    assert f"resumed from {tmp_path / 'checkpoint-1'} (step 1)" in out
    assert state["step"] == 1 and state["sampler"] == {"pos": 1}
    for k, v in _params(model).items():
        assert torch.equal(v, at_1[k]), k
    assert scheduler.get_last_lr() == lr_1
    assert optimizer.state_dict()["state"][0]["step"].item() == 1


def test_no_usable_checkpoint_starts_from_step_0_and_says_so(trainer, tmp_path, capsys):
    accelerator, model, tokenizer, _, _, train_step = trainer
    assert load_checkpoint(accelerator, tmp_path) is None
    assert "no usable checkpoint" in capsys.readouterr().out
    save_checkpoint(accelerator, model, tokenizer, tmp_path, 1, {})
    (tmp_path / "checkpoint-1" / "COMPLETE").unlink()
    assert load_checkpoint(accelerator, tmp_path) is None
    assert (
        "checkpoint-1: no COMPLETE marker (the save was interrupted)): starting from step 0" in capsys.readouterr().out
    )


def test_non_finite_weights_are_never_saved(trainer, tmp_path, capsys):
    accelerator, model, tokenizer, *_ = trainer
    assert save_checkpoint(accelerator, model, tokenizer, tmp_path, 1, {}) is not None
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    assert save_checkpoint(accelerator, model, tokenizer, tmp_path, 2, {}, keep_last=1) is None
    assert "not saved" in capsys.readouterr().out
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-1"]  # keep_last never drops the good one


def test_model_flag_refuses_a_damaged_checkpoint(trainer, tmp_path):
    from common.models import model_to_load

    accelerator, model, tokenizer, *_ = trainer
    save_checkpoint(accelerator, model, tokenizer, tmp_path, 1, {})
    assert model_to_load(str(tmp_path / "checkpoint-1"))[0] == str(tmp_path / "checkpoint-1" / "model")
    _flip_bytes(tmp_path / "checkpoint-1" / "model" / "model.safetensors")
    with pytest.raises(SystemExit, match="model.safetensors does not match its SHA-256"):  # one file, two names
        model_to_load(str(tmp_path / "checkpoint-1"))


def test_weights_are_stored_once(trainer, tmp_path):
    """accelerate's weights file is a hard link to the HF model's: one copy on disk, both loadable."""
    accelerator, model, tokenizer, *_ = trainer
    ckpt = save_checkpoint(accelerator, model, tokenizer, tmp_path, 1, {})
    state, hf = ckpt / "accelerate" / "model.safetensors", ckpt / "model" / "model.safetensors"
    assert state.stat().st_ino == hf.stat().st_ino and state.stat().st_nlink == 2
    assert load_checkpoint(accelerator, tmp_path)["step"] == 1


def test_hash_shares_give_each_rank_its_own_files_and_balance_the_rest(tmp_path):
    """Rank r hashes the files it wrote for itself (RNG state, ZeRO and DCP shards, named by r); the rest go
    largest first to the least loaded rank, a file's hard links together (read once)."""
    from common.checkpoint import hash_shares

    sizes = {
        "accelerate/random_states_0.pkl": 1, "accelerate/random_states_1.pkl": 1,
        "accelerate/pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt": 40,
        "accelerate/pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt": 40,
        "accelerate/optimizer_0/__1_0.distcp": 5, "model/model.safetensors": 30, "model/tokenizer.json": 3,
        "trainer_state.json": 1,
    }  # fmt: skip
    for name, size in sizes.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * size)
    os.link(tmp_path / "model/model.safetensors", tmp_path / "accelerate/model.safetensors")
    names = sorted([*sizes, "accelerate/model.safetensors"])
    zero, one = hash_shares(tmp_path, names, world=2)
    assert sorted(zero + one) == names
    assert {n for n in one if "rank_" in n or "states_" in n or "distcp" in n} == {
        "accelerate/random_states_1.pkl", "accelerate/pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "accelerate/optimizer_0/__1_0.distcp",
    }  # fmt: skip
    # rank 0 holds 41 of its own, rank 1 46: the 30-byte weights (both names) go to rank 0, then the rest to rank 1
    assert {"model/model.safetensors", "accelerate/model.safetensors"} <= set(zero)
    assert {"model/tokenizer.json", "trainer_state.json"} <= set(one)
    assert [sorted(share) for share in hash_shares(tmp_path, names, world=1)] == [names]


HASH_SCRIPT = """
import json, sys
from pathlib import Path
from accelerate import Accelerator
import common.checkpoint as ck
from common.trainer import end_run

root, out = Path(sys.argv[1]), Path(sys.argv[2])
acc = Accelerator()
hashed, real = [], ck._sha256
ck._sha256 = lambda path, seen=None: hashed.append(str(path.relative_to(root))) or real(path, seen)
ck.write_manifest(root, acc)
report = {"wrote": list(hashed)}
hashed.clear()
report["whole"] = ck.manifest_problem(root, accelerator=acc)
report["checked"] = list(hashed)
acc.wait_for_everyone()
if acc.is_main_process:  # a flipped byte in the file rank 1 hashes: every rank hears of it
    shard = root / "pytorch_model" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.write_bytes(b"y" + shard.read_bytes()[1:])
acc.wait_for_everyone()
report["flipped"] = ck.manifest_problem(root, accelerator=acc)
(out / f"rank{acc.process_index}.json").write_text(json.dumps(report))
end_run(acc)
"""


@pytest.mark.slow
def test_two_ranks_hash_their_own_shares_and_agree(tmp_path):
    """On 2 gloo processes: each rank hashes its own files and half the rest, once; the manifest is the one
    a single process writes; a file corrupted in rank 1's share is reported by rank 0's verdict on both."""
    from engines.launch import CONFIGS, launch

    from common.checkpoint import MANIFEST, write_manifest

    root, single = tmp_path / "ckpt", tmp_path / "single"
    names = ["random_states_0.pkl", "random_states_1.pkl", "scheduler.bin", "model.safetensors",
             "pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt",
             "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt"]  # fmt: skip
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(random.Random(i).randbytes(1000 * (i + 1)))
    shutil.copytree(root, single)
    write_manifest(single)
    script = tmp_path / "hash.py"
    script.write_text(HASH_SCRIPT)
    rc, out = launch(CONFIGS / "ddp_8gpu.yaml", script, str(root), str(tmp_path), timeout=120)
    assert rc == 0, out[-3000:]
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert sorted(zero["wrote"] + one["wrote"]) == sorted(names)  # every file once
    assert "random_states_1.pkl" in one["wrote"] and "random_states_0.pkl" in zero["wrote"]
    assert "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt" in one["wrote"]
    assert sorted(zero["checked"]) == sorted(zero["wrote"]) and sorted(one["checked"]) == sorted(one["wrote"])
    assert json.loads((root / MANIFEST).read_text()) == json.loads((single / MANIFEST).read_text())
    assert zero["whole"] is None and one["whole"] is None
    expected = "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt does not match its SHA-256 in the manifest"
    assert zero["flipped"].startswith(expected) and one["flipped"] == zero["flipped"]
