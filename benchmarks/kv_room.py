"""Every recipe's vLLM KV cache on an 80 GB GPU against what a step asks of it per rank: arithmetic, not measured.

    python benchmarks/kv_room.py            # print the table
    python benchmarks/kv_room.py --write    # and put it in docs/SCALING.md, between its KV-room markers

Per recipe: vLLM's share, what it holds before its KV cache (weights, profile activations, CUDA graphs:
`common.preflight.vllm_floor`), the KV cache's GiB and tokens, the tokens a step asks per rank (every sequence
at its longest), the sequences held at once, the waves, and the largest share the GPU allows beside the rest of
the plan (tests/recipe_memory.py `kv_room`, `largest_share`). tests/test_kv_room.py checks that the page holds
this output and that every recipe holds one wave or the fewest waves its GPU allows.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from recipe_memory import KV_TABLE_BEGIN, KV_TABLE_END, kv_table  # noqa: E402

from common.marked_text import write_between  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the table into docs/SCALING.md")
    args = parser.parse_args()
    table = kv_table()
    print(table)
    if args.write:
        write_between(ROOT / "docs" / "SCALING.md", KV_TABLE_BEGIN, KV_TABLE_END, table, "KV room")


if __name__ == "__main__":
    main()
