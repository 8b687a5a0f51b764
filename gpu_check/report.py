"""What the first GPU run found (gpu_check/first_run.py): each part's figures, checks, notes and small tables
(`Findings`, as JSON), and the report: the machine and versions, one section per part, what stayed unexecuted.
Markdown for docs/, the same as JSON beside it."""

import importlib.metadata
import json
import os
import platform
import subprocess
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["torch", "transformers", "accelerate", "math-verify", "latex2sympy2_extended", "vllm", "flash-attn", "deepspeed"]  # fmt: skip
# What even the lent machine (one GPU, no vLLM, no network) does not execute, and why.
NOT_EXECUTED = [
    "NCCL collectives, and DDP, FSDP2 and ZeRO-2/3 on GPUs: one GPU (the CPU suite runs them on gloo, "
    'docs/SCALING.md "Verified where")',
    "multi-node anything (`GLOO_SOCKET_IFNAME`, the shared-run-directory sentinel across nodes): one machine",
    "vLLM on a GPU (sleep mode, `gpu_memory_utilization` beside training, CUDA graphs, per-request seeds) and the "
    "preflight's vLLM share and KV-cache sizes: vLLM is not installed there (no wheel of it fits the 64 MiB that "
    "may travel)",
    "the real 1.5B-7B models' steps with their weights: no network (gpu_step runs the 1.5B shape, random weights)",
    "flex_attention's compiled kernels for `--padding_free`: not in this run's time budget",
    "flash-attn's varlen kernel (fed by `flash_varlen_kwargs`) and DeepSpeed's ZeRO engines: neither is installed "
    "there (the report's versions say what is)",
]


class Findings:
    """One part's findings. A failed check, or a step that raises inside `attempt`, fails the part without
    stopping its other steps."""

    def __init__(self):
        self.figures, self.checks, self.notes, self.tables = {}, {}, [], []

    def figure(self, name: str, value) -> None:
        self.figures[name] = value

    def check(self, name: str, ok: bool, detail="") -> None:
        self.checks[name] = {"ok": bool(ok), "detail": str(detail)}

    def note(self, text: str) -> None:
        self.notes.append(text)

    def table(self, title: str, header: list[str], rows: list[list]) -> None:
        self.tables.append({"title": title, "header": header, "rows": rows})

    def attempt(self, name: str, step, *args) -> None:
        """`step(self, *args)`; an exception becomes the failed check `name`, with its traceback's last lines."""
        try:
            step(self, *args)
        except Exception as e:  # noqa: BLE001 - one step's failure must not stop the part's others
            self.check(name, False, "\n".join("".join(traceback.format_exception(e)).strip().splitlines()[-8:]))

    def record(self) -> dict:
        return {"figures": self.figures, "checks": self.checks, "notes": self.notes, "tables": self.tables}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(dry: bool) -> dict:
    """The machine, the device and the versions this run ran with."""
    import torch

    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        commit = git.stdout.strip()
    except OSError:  # no git on the machine
        commit = ""
    device = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = {
            "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }  # fmt: skip
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit or "unknown (no git here)",
        "dry_run": dry, "python": platform.python_version(), "packages": {n: _version(n) for n in PACKAGES},
        "cpu_cores": len(os.sched_getaffinity(0)), "device": device,
    }  # fmt: skip


def cell(v) -> str:
    """A value in a markdown table's cell, on one line, its pipes escaped."""
    if isinstance(v, bool):
        v = "yes" if v else "no"
    elif isinstance(v, float):
        v = f"{v:.3e}" if v and (abs(v) < 1e-3 or abs(v) >= 1e6) else f"{v:.4g}"
    elif isinstance(v, int):
        v = f"{v:,}"
    elif isinstance(v, dict | list):
        v = "`" + json.dumps(v, separators=(", ", ": ")) + "`"
    elif v is None:
        v = "-"
    return str(v).replace("|", "\\|").replace("\n", " ")


def table(header: list, rows: list[list]) -> list[str]:
    return ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(map(cell, row)) + " |" for row in rows
    ]


def part_section(p: dict) -> list[str]:
    """A part's section: its result, figures, checks, tables, notes, its output's tail when it failed."""
    out = [f"## {p['name']}: {p['status']}", "", p["what"], ""]
    if p["figures"]:
        out += table(["figure", "value"], [[k, v] for k, v in p["figures"].items()]) + [""]
    for name, c in p["checks"].items():
        multiline = "\n" in c["detail"]
        out.append(
            f"- [{'x' if c['ok'] else ' '}] {name}" + (f" ({c['detail']})" if c["detail"] and not multiline else "")
        )
        out += ["", "```", c["detail"], "```", ""] if multiline else []
    out += [""] if p["checks"] else []
    for t in p["tables"]:
        out += [f"{t['title']}:", ""] + table(t["header"], t["rows"]) + [""]
    out += [f"- {n}" for n in p["notes"]] + ([""] if p["notes"] else [])
    if p["error"]:
        out += ["Output's last lines:", "", "```", p["error"], "```", ""]
    return out


def markdown(report: dict, command: str) -> str:
    env, parts = report["environment"], report["parts"]
    d = env["device"]
    where = f"{d['name']} ({d['memory_gib']} GiB, compute capability {d['capability']}; CUDA {d['cuda']}, cuDNN {d['cudnn']})" if d else "no GPU (CPU)"  # fmt: skip
    failed = [p["name"] for p in parts if p["status"] != "ran"]
    out = [
        "# The first GPU run: the lines that need CUDA",
        "",
        f'Written by `{command}` (gpu_check/first_run.py; docs/SCALING.md "Verified where" lists what needs CUDA).',
        "",
        f"- when: {env['date']}, commit {env['commit']}{', dry run (toy sizes)' if env['dry_run'] else ''}",
        f"- device: {where}, {env['cpu_cores']} CPU cores",
        f"- Python {env['python']}; " + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v),
        f"- result: {len(parts) - len(failed)} of {len(parts)} parts ran" + (f"; not: {', '.join(failed)}" if failed else ""),
        "",
    ]  # fmt: skip
    rows = [[p["name"], p["budget_s"], p["took_s"] and round(p["took_s"]), p["status"], p["what"]] for p in parts]
    out += table(["part", "budget s", "took s", "result", "what it executes"], rows) + [""]
    for p in parts:
        out += part_section(p)
    out += ["## Not executed, and why", ""] + [f"- {line}" for line in report["not_executed"]]
    return "\n".join(out) + "\n"


def write(report: dict, out: Path, command: str) -> None:
    """`out` (markdown) and the same report as JSON beside it (`out` with the suffix .json)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(report, command))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
