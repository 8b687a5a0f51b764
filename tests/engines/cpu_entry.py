"""Per-rank entry point: run a training script under accelerate's FSDP / DeepSpeed engines on CPU.

    accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2 \
        tests/engines/cpu_entry.py SCRIPT [SCRIPT ARGS...]

Why it is needed (accelerate 1.15, accelerate/state.py):
- `PartialState._prepare_backend` picks a backend only for an accelerator device when
  `cpu` is False (state.py:769-796); on a CPU-only host it returns no backend, and
  "No backend == no distributed training" sets DistributedType.NO, num_processes 1,
  process_index 0 on every rank (state.py:287-292). Under DeepSpeed the process group
  is still initialised through deepspeed.comm (state.py:202-216) and the type set to
  DEEPSPEED (state.py:311): world size 2, yet accelerate reports 1 process on each rank.
- With `cpu=True` (ACCELERATE_USE_CPU) the backend is gloo and the type MULTI_CPU
  (state.py:798-808), but AcceleratorState then skips DeepSpeed (`... and not cpu`,
  state.py:974) and only turns FSDP on for the accelerator types MULTI_GPU/NPU/...
  (state.py:986-1013): both configs silently become plain DDP.

What this shim changes: only the backend detection. When accelerate launch has asked
for FSDP or DeepSpeed (ACCELERATE_USE_FSDP / ACCELERATE_USE_DEEPSPEED, set from the
YAML by accelerate/utils/launch.py), a CPU-only rank gets backend "gloo" with the
multi-device type, exactly what a GPU rank gets with "nccl"; the device is pinned to
CPU with accelerate's own ACCELERATE_TORCH_DEVICE (read at state.py:182; set_device
then returns early, state.py:823). From there on everything is accelerate's, DeepSpeed's
and torch's own code: plugin construction from the launcher's environment, AcceleratorState's FSDP /
DeepSpeed selection, fsdp2_prepare_model, deepspeed.initialize. Without FSDP or
DeepSpeed requested (a DDP config) the shim sets ACCELERATE_USE_CPU=true instead:
accelerate's own MULTI_CPU path (DDP over gloo), no patch.

DeepSpeed on CPU: DS_ACCELERATOR=cpu names the CPU accelerator (without it DeepSpeed
logs "Setting accelerator to CPU" after failing to detect a GPU; comm backend gloo,
deepspeed/accelerator/cpu_accelerator.py:30-34). Its TorchBackend loads the
shared-memory op `deepspeed_shm_comm` at init (deepspeed/comm/torch.py:47-53, 207),
JIT-compiling it on first use: about 2 minutes on 2 cores, then cached in
TORCH_EXTENSIONS_DIR; that op serves only
`inference_all_reduce` (comm/torch.py:292-306), never ZeRO training, and a GPU run never
builds it, so the shim marks it unavailable (ENGINES_DS_SHM=1 keeps it).
"""

import os
import runpy
import sys


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() == "true"


def install() -> str:
    """Prepare this process; returns what was done (for the probe's facts)."""
    import torch

    if torch.cuda.is_available():
        return "none (GPU host)"
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed: CPU accelerator by name (no detection warning)
    if not (_flag("ACCELERATE_USE_FSDP") or _flag("ACCELERATE_USE_DEEPSPEED")):
        os.environ["ACCELERATE_USE_CPU"] = "true"
        return "multi_cpu"
    os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")

    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    original = PartialState._prepare_backend

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, distributed_type = original(self, cpu, sagemaker_dp, backend)
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
        if chosen is None and distributed_type == DistributedType.NO and launched and not cpu:
            return backend or "gloo", DistributedType.MULTI_GPU
        return chosen, distributed_type

    PartialState._prepare_backend = _prepare_backend
    if _flag("ACCELERATE_USE_DEEPSPEED") and os.environ.get("ENGINES_DS_SHM") != "1":
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # a cached dict, meant to be edited
    return "gloo_backend_patch"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: cpu_entry.py SCRIPT [ARGS...]")
    os.environ["ENGINES_CPU_SHIM"] = install()
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
