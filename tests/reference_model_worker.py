"""Run by tests/test_distributed.py as one process that accelerate's FSDP launch environment calls
local rank 1, with `fsdp_cpu_ram_efficient_loading` on (the two variables `accelerate launch` sets).

transformers then loads all-zero weights, expecting FSDP's prepare to broadcast rank 0's: a plain
`from_pretrained` reference model stays zero. `load_reference_model` must load the real weights.

    python tests/reference_model_worker.py MODEL_DIR
"""

import os
import sys

import torch
from transformers import AutoModelForCausalLM

from common.models import load_reference_model

os.environ.update(ACCELERATE_USE_FSDP="true", FSDP_CPU_RAM_EFFICIENT_LOADING="true", LOCAL_RANK="1")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
torch.distributed.init_process_group("gloo", rank=0, world_size=1)

plain = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ref = load_reference_model(sys.argv[1], torch.float32, "cpu")
weight = "model.layers.0.mlp.up_proj.weight"
print("plain from_pretrained all zero:", bool((plain.state_dict()[weight] == 0).all()))
print("reference model all zero:", bool((ref.state_dict()[weight] == 0).all()))
assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true", "the launch environment must be left as it was"
assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
