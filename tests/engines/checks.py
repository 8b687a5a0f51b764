"""Checks of common/ code under a real engine, one JSON line of verdicts per rank (run by tests/test_engine_runs.py).

    accelerate launch --config_file configs/accelerate/zero3.yaml tests/engines/cpu_entry.py tests/engines/checks.py MODEL DIR

- finite: `common.checkpoint.weights_are_finite` before and after a NaN is planted in one parameter
  (under ZeRO-3 every partitioned parameter has numel() == 0: a check of `p` itself sees nothing).
- sharded_grads: after a non-last micro-batch's backward inside `common.trainer.micro_batch`, does
  every gradient exist as a shard (FSDP2 reduce-scatters each micro-batch; no_sync would keep them whole)?
- sync: `common.rollout.state_dict_for_sync` (each parameter gathered alone) against accelerate's
  gathered state dict: every tensor, full and equal, under its HF name.
- sync_bf16: the same gather for a bf16 rollout engine: every tensor bf16, the weights rounded once; under
  FSDP2 the all-gathers themselves carry bf16 (half the bytes of the fp32 shards).
- linear: under ZeRO-3, zero.Init has replaced torch.nn.functional.linear process-wide; after
  `common.trainer.confine_zero3_linear` F.linear is torch's again (what vLLM's layers call) and
  only the policy's own Linear layers run DeepSpeed's version.
- shared: `common.run_dir.check_shared` when rank 1 looks at another directory (a node that does not
  mount the run directory), as the one line it stops with.
"""

import sys

import torch
from launch import write_facts  # tests/engines/ is on the path of the launched script
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from common.checkpoint import weights_are_finite
from common.rollout import state_dict_for_sync
from common.run_dir import check_shared
from common.trainer import confine_zero3_linear, end_run, make_accelerator, micro_batch, parallel_mode

model_dir, out_dir = sys.argv[1], sys.argv[2]


def _walk(node, seen=None):
    """Every autograd node behind `node`."""
    seen = set() if seen is None else seen
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        yield n
        stack.extend(next_fn for next_fn, _ in n.next_functions)


accelerator = make_accelerator("no", grad_clip=1.0, micro_batch_size=2)  # as the scripts build it
mode = parallel_mode(accelerator)
model = AutoModelForCausalLM.from_pretrained(model_dir)
model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
torch_linear = torch.nn.functional.linear
linear_before = torch_linear.__name__
facts_linear = {"patched_before": linear_before != "linear", "confined": confine_zero3_linear(model)}
facts_linear["torch_linear_after"] = torch.nn.functional.linear.__name__ == "linear"
facts = {
    "rank": accelerator.process_index,
    "mode": mode.kind,
    "finite_before": weights_are_finite(accelerator, model),
}

facts["linear"] = facts_linear
ids = torch.randint(3, 400, (2, 12), generator=torch.Generator().manual_seed(accelerator.process_index))
with micro_batch(accelerator, model, mode, last=False):
    loss = model(input_ids=ids, labels=ids).loss
    accelerator.backward(loss)
facts["linear"]["policy_grad_fns"] = sorted(  # the autograd nodes of the policy's linear layers
    {n.name() for n in _walk(loss.grad_fn) if "Linear" in n.name() or "Addmm" in n.name() or n.name() == "MmBackward0"}
)
grads = [p.grad for p in model.parameters()]
facts["grads_present"] = all(g is not None for g in grads)
facts["sharded_grads"] = all(g is not None and type(g).__name__ == "DTensor" for g in grads)
optimizer.zero_grad()

synced = {name: t.clone() for name, t in state_dict_for_sync(accelerator, model)}  # every rank takes part
full = accelerator.get_state_dict(model)  # gathered on rank 0
if accelerator.is_main_process:
    facts["sync_matches"] = set(full) <= set(synced) and all(torch.equal(synced[k], v) for k, v in full.items())

# The gather for a bf16 engine: which dtypes the collectives themselves carried.
gathered = set()


class _Gathers(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "all_gather" in str(func):
            gathered.add(str(args[0].dtype))
        return func(*args, **(kwargs or {}))


with _Gathers():
    synced16 = {name: t.clone() for name, t in state_dict_for_sync(accelerator, model, torch.bfloat16)}
if accelerator.is_main_process:
    facts["sync_bf16"] = all(synced16[k].dtype == torch.bfloat16 for k in synced16) and all(
        torch.equal(synced16[k], v.to(torch.bfloat16)) for k, v in full.items()
    )
facts["gathered_dtypes"] = sorted(gathered)

with torch.no_grad():  # a NaN in rank 0's share of one parameter
    p = next(model.parameters())
    held = p.ds_tensor if hasattr(p, "ds_tensor") else p.to_local() if hasattr(p, "to_local") else p
    if accelerator.process_index == 0:
        held.view(-1)[0] = float("nan")
facts["finite_after_nan"] = weights_are_finite(accelerator, model)

try:
    check_shared(
        out_dir if accelerator.process_index == 0 else out_dir + f"-node{accelerator.process_index}", accelerator
    )
    facts["shared"] = "ok"
except SystemExit as stop:
    facts["shared"] = str(stop)
write_facts(out_dir, accelerator.process_index, facts)
end_run(accelerator)
