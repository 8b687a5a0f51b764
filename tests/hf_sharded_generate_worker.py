"""Run by tests/test_distributed.py on 2 CPU processes (gloo): HFEngine on an FSDP2-sharded model
when the ranks have different amounts to generate (EDGE-GRPO's GEC regenerates only wrong answers).

Every forward of a sharded model is a collective, so a rank with nothing to generate must
still step with the others; before, it made no `generate` call and the other rank hung.

    torchrun --nproc_per_node 2 tests/hf_sharded_generate_worker.py MODEL_DIR   (ACCELERATE_USE_CPU=true)
"""

import sys

import torch
from accelerate import Accelerator
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.rollout import HFEngine

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
tok = AutoTokenizer.from_pretrained(sys.argv[1])
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)

engine = HFEngine(
    model, [tok.eos_token_id], tok.pad_token_id, batch_size=2, synced=True
)  # sharded: ranks step together
assert engine.synced
# Rank 0 has three prompts (two generate calls of 2 rows), rank 1 none: both must make two calls.
prompts = [tok("What is 1 + 1?").input_ids, tok("What is 2 + 5?").input_ids, tok("Say hi.").input_ids][: 3 - 3 * rank]
groups = engine.generate(prompts, 1, 6, 1.0, seed=list(range(len(prompts))))
assert len(groups) == len(prompts) and all(len(c.token_ids) == len(c.logprobs) > 0 for g in groups for c in g)
torch.distributed.barrier()
print(f"rank {rank}: {len(prompts)} prompts generated in step with the other rank", flush=True)
