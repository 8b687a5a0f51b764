"""What machine a run ran on, recorded in its run_config.json: a CPU run's figures round by the CPU's kernels
and its thread count, and its timings by what else the machine was doing."""

import os
import platform

# CPU flags (/proc/cpuinfo) of the units that compute bfloat16: AVX-512 BF16 dot products, AMX tiles.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_info(cpuinfo: str) -> tuple[str, list[str]]:
    """(the CPU's model name, its bf16 units among BF16_FLAGS) from the text of /proc/cpuinfo."""
    model, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags |= set(value.split())
    return model, [f for f in BF16_FLAGS if f in flags]


def describe_machine(threads: int, gpu: str | None = None) -> dict:
    """This machine: CPU model and bf16 units, cores, the process's compute threads, the load average when the
    run started (1 minute; 'the cores were shared' reads off it), and the GPU's name if one trains."""
    try:
        with open("/proc/cpuinfo") as f:
            model, bf16 = cpu_info(f.read())
    except OSError:
        model, bf16 = platform.processor() or platform.machine(), []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": model, "bf16_units": bf16, "cores": os.cpu_count(), "threads": threads, "load_1min": load} | (
        {"gpu": gpu} if gpu else {}
    )
