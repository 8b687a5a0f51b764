"""Run by tests/test_distributed.py on 2 CPU processes (gloo): FSDP2 weight sync.

accelerate 1.15 turns FSDP on only for GPU-type devices (on CPU its FSDP plugin
is ignored), so the model is sharded here with torch's own `fully_shard`, the
way accelerate's FSDP2 does it (each decoder layer, then the root; activation
checkpointing wrappers first, as `fsdp_activation_checkpointing` adds them).

    torchrun --nproc_per_node 2 tests/fsdp2_sync_worker.py MODEL_DIR   (ACCELERATE_USE_CPU=true)
"""

import sys

import torch
from accelerate import Accelerator
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from common.distributed import state_dict_for_sync

accelerator = Accelerator(cpu=True)
assert accelerator.num_processes == 2, accelerator.num_processes
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
expected = {k: v.clone() for k, v in model.state_dict().items()}  # HF checkpoint names, tied lm_head included

layers = model.model.layers
for i in range(len(layers)):
    layers[i] = checkpoint_wrapper(layers[i])
    fully_shard(layers[i])
fully_shard(model)
assert isinstance(model.model.embed_tokens.weight, DTensor)
local = model.model.embed_tokens.weight.to_local()
assert local.shape[0] < expected["model.embed_tokens.weight"].shape[0], "each rank should hold a shard only"
assert any("_checkpoint_wrapped_module" in n for n, _ in model.named_parameters())

# Before training: the synced tensors are the checkpoint's, under the checkpoint's names.
seen = {}
for name, full in state_dict_for_sync(accelerator, model):
    assert type(full) is torch.Tensor, f"{name}: {type(full).__name__} is not a plain tensor"
    assert torch.equal(full, expected[name]), name
    seen[name] = full.shape
assert set(seen) == set(expected), set(expected) ^ set(seen)

# After an optimiser step (gradients reduce-scattered over both ranks), every rank
# syncs the same full weights, and they are the updated ones.
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(accelerator.process_index))
model(input_ids=ids, labels=ids).loss.backward()
opt.step()
for name, full in state_dict_for_sync(accelerator, model):
    gathered = accelerator.gather(full[None])
    assert torch.equal(gathered[0], gathered[1]), f"{name}: ranks disagree"
    if name.endswith("embed_tokens.weight"):
        assert not torch.equal(full, expected[name]), "the update did not reach the synced weights"
print(f"rank {accelerator.process_index}: FSDP2 sync ok ({len(seen)} tensors)", flush=True)
