"""Every recipe's memory on an 80 GB GPU: its vLLM KV cache against what a step asks of it per rank, and what each
GPU holds at the rollout and at the update. Arithmetic, not measured.

    python benchmarks/kv_room.py            # print the tables
    python benchmarks/kv_room.py --write    # and put them in docs/SCALING.md, between their markers

The KV room: tests/recipe_memory.py `kv_table` (tests/test_kv_room.py checks it). The budget: the training state,
the reference model, the update's activations (`benchmarks/memory.py` `update_phases`), vLLM's share and the KV a step
wants, summed at the rollout and at the update with the preflight's margin (vLLM asleep under --vllm_sleep).
"""

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from recipe_memory import (  # noqa: E402
    H100_GIB,
    KV_TABLE_BEGIN,
    KV_TABLE_END,
    MODELS,
    RECIPES,
    kv_room,
    kv_table,
    launch_plan,
    recipe_flags,
    update_activations_gib,
)

from benchmarks.stored_run import write_between  # noqa: E402
from common.models import GIB, MARGIN_GIB, bytes_per_parameter, kv_bytes_per_token, model_shape  # noqa: E402

BUDGET_BEGIN = "<!-- per-GPU budget: written by benchmarks/kv_room.py from recipes/ and common/models.py -->"
BUDGET_END = "<!-- end of per-GPU budget -->"


def budget(recipe: str, total_gib: float = H100_GIB) -> dict:
    """One GPU's memory under the recipe, in GiB: each term of the budget (module docstring) and the two sums."""
    plan, room = launch_plan(recipe), kv_room(recipe, total_gib=total_gib)
    sizes, parameters = MODELS[plan["model"]]
    training = parameters * bytes_per_parameter(plan["mode"], plan["world"], plan["precision"]) / GIB
    reference = parameters * 2 / GIB if plan["reference_model"] else 0.0
    activations = update_activations_gib(recipe)
    share = plan["vllm_utilization"] * total_gib
    shape = model_shape(SimpleNamespace(**sizes))
    wanted = room["asked"] * kv_bytes_per_token(shape, 4 if plan["precision"] == "fp32" else 2) / GIB
    asleep = recipe_flags(recipe)[1].vllm_sleep
    return {
        "GPUs": plan["world"], "mode": plan["mode"], "training": training, "reference": reference,
        "activations": activations, "share": share, "KV wanted": wanted, "KV held": room["KV GiB"], "asleep": asleep,
        "rollout": training + reference + share + MARGIN_GIB,
        "update": training + reference + activations + (0.0 if asleep else share) + MARGIN_GIB,
    }  # fmt: skip


def budget_table(total_gib: float = H100_GIB) -> str:
    """docs/SCALING.md's table of every recipe's per-GPU budget (`budget`), in markdown."""
    rows = [
        f"| recipe | GPUs, engine | training state | reference model | update's activations | vLLM share | KV a step "
        f"wants / vLLM holds | at the rollout | at the update (of {total_gib:g}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for recipe in RECIPES:
        b = budget(recipe, total_gib)
        update = f"{b['update']:.1f}" + (" (vLLM asleep)" if b["asleep"] else "")
        rows.append(
            f"| {recipe.removesuffix('.yaml')} | {b['GPUs']}, {b['mode']} | {b['training']:.1f} | {b['reference']:.1f} "
            f"| {b['activations']:.1f} | {b['share']:.1f} | {b['KV wanted']:.1f} / {b['KV held']:.1f} "
            f"| {b['rollout']:.1f} | {update} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the tables into docs/SCALING.md")
    args = parser.parse_args()
    tables = {"KV room": (KV_TABLE_BEGIN, KV_TABLE_END, kv_table()), "per-GPU budget": (BUDGET_BEGIN, BUDGET_END, budget_table())}  # fmt: skip
    for what, (begin, end, table) in tables.items():
        print(table + "\n")
        if args.write:
            write_between(ROOT / "docs" / "SCALING.md", begin, end, table, what)


if __name__ == "__main__":
    main()
