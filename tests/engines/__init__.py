"""Run scripts under accelerate's real FSDP2 / DeepSpeed / DDP engines on a CPU-only host (2 gloo processes).

launch.py  - `launch(config_yaml, script, *args)`: `accelerate launch --config_file ...` with the shim below.
cpu_entry.py - what every rank runs first: lets accelerate apply an FSDP / DeepSpeed config on CPU.
probe.py   - a toy training script that prints what the engine really did, one JSON line per rank.
"""
