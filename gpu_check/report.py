"""The first GPU run's report (gpu_check/first_run.py): the machine and the versions it ran with, one
section per part (its figures, checks, notes, tables, and the tail of its error), and what stayed unexecuted.
Markdown for docs/, the same as JSON beside it."""

import importlib.metadata
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["torch", "transformers", "accelerate", "math-verify", "latex2sympy2_extended", "vllm", "flash-attn", "deepspeed"]  # fmt: skip
# What even the lent machine (one GPU, no vLLM, no network) does not execute, and why.
NOT_EXECUTED = [
    "NCCL collectives, and DDP, FSDP2 and ZeRO-2/3 on GPUs: one GPU (the CPU suite runs them on gloo, "
    'docs/SCALING.md "Verified where")',
    "multi-node anything (`GLOO_SOCKET_IFNAME`, the shared-run-directory sentinel across nodes): one machine",
    "vLLM on a GPU: its sleep mode (`VLLMEngine.sleep` / `_wake`, CUDA's memory pool), `gpu_memory_utilization` "
    "beside training, CUDA graphs, per-request seeds on its V1/V2 runners: vLLM is not installed there (no "
    "wheel of it and its CUDA kernels fits the 64 MiB that may travel)",
    "the preflight's vLLM share and KV-cache sizes (`vllm_floor`, docs/SCALING.md \"vLLM's KV cache per recipe\"): "
    "arithmetic, checked only by a vLLM start on a GPU",
    "the real 1.5B-7B models' steps with their weights: no network on the lent machine (gpu_step runs the 1.5B "
    "shape with random weights)",
    "flex_attention's compiled kernels for `--padding_free` (`auto` packs under flash or flex attention): not in "
    "this run's time budget",
]


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(dry: bool) -> dict:
    """The machine, the device and the versions this run ran with."""
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        commit = commit.stdout.strip()
    except OSError:  # no git on the machine
        commit = ""
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit or "unknown (no git here)",
        "dry_run": dry,
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "cpu_cores": len(__import__("os").sched_getaffinity(0)),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = {
            "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }  # fmt: skip
    else:
        env["device"] = None
    return env


def value_text(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3e}" if v and (abs(v) < 1e-3 or abs(v) >= 1e6) else f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict | list):
        return "`" + json.dumps(v, separators=(", ", ": ")) + "`"
    return "-" if v is None else cell(v)


def cell(text) -> str:
    """Text in a markdown table's cell: its pipes escaped, on one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def part_section(p: dict) -> list[str]:
    """A part's section: its result, figures, checks, tables, notes, the tail of its output when it failed."""
    out = [f"## {p['name']}: {p['status']}", "", p["what"], ""]
    if p.get("figures"):
        out += ["| figure | value |", "|---|---|"]
        out += [f"| {cell(k)} | {value_text(v)} |" for k, v in p["figures"].items()]
        out.append("")
    for name, c in p.get("checks", {}).items():
        detail = f" ({c['detail']})" if c["detail"] and "\n" not in c["detail"] else ""
        out.append(f"- [{'x' if c['ok'] else ' '}] {name}{detail}")
        if "\n" in c["detail"]:
            out += ["", "```", c["detail"], "```", ""]
    if p.get("checks"):
        out.append("")
    for t in p.get("tables", []):
        out += [f"{t['title']}:", "", "| " + " | ".join(map(cell, t["header"])) + " |", "|" + "---|" * len(t["header"])]
        out += ["| " + " | ".join(value_text(v) for v in row) + " |" for row in t["rows"]]
        out.append("")
    out += [f"- {n}" for n in p.get("notes", [])]
    if p.get("notes"):
        out.append("")
    if p.get("error"):
        out += ["Output's last lines:", "", "```", p["error"], "```", ""]
    return out


def markdown(report: dict, command: str) -> str:
    env, parts = report["environment"], report["parts"]
    device = env["device"]
    where = (
        f"{device['name']} ({device['memory_gib']} GiB, compute capability {device['capability']}; CUDA "
        f"{device['cuda']}, cuDNN {device['cudnn']})" if device else "no GPU (CPU)"
    )  # fmt: skip
    versions = ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
    failed = [p["name"] for p in parts if p["status"] != "ran"]
    out = [
        "# The first GPU run: the lines that need CUDA",
        "",
        f'Written by `{command}` (gpu_check/first_run.py; docs/SCALING.md "Verified where" lists what needs CUDA).',
        "",
        f"- when: {env['date']}, commit {env['commit']}{', dry run (toy sizes)' if env['dry_run'] else ''}",
        f"- device: {where}, {env['cpu_cores']} CPU cores",
        f"- Python {env['python']}; {versions}",
        f"- result: {len(parts) - len(failed)} of {len(parts)} parts ran"
        + (f"; not: {', '.join(failed)}" if failed else ""),
        "",
        "| part | budget s | took s | result | what it executes |",
        "|---|---|---|---|---|",
    ]
    for p in parts:
        took = "-" if p["took_s"] is None else f"{p['took_s']:.0f}"
        out.append(f"| {p['name']} | {p['budget_s']} | {took} | {p['status']} | {p['what']} |")
    out.append("")
    for p in parts:
        out += part_section(p)
    out += ["## Not executed, and why", ""] + [f"- {line}" for line in report["not_executed"]]
    return "\n".join(out) + "\n"


def write(report: dict, out: Path, command: str) -> None:
    """`out` (markdown) and the same report as JSON beside it (`out` with the suffix .json)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(report, command))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")


def command_line() -> str:
    return " ".join(["python", *[Path(sys.argv[0]).as_posix(), *sys.argv[1:]]])
