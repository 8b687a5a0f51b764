#!/usr/bin/env bash
# The comparison recipe on the CPU demo: all five algorithms on the same data
# and seed, evaluated every 10 steps, then one figure and one results table.
# Regenerates docs/compare_demo.png, docs/results_demo.md and the README's demo table (8 runs, 1-2.5 min each on 2 shared cores).
#   bash scripts/compare_demo.sh [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/compare_demo}
runs=()
for script in grpo_base edge_grpo egpo cw_grpo pro_grpo; do
    python "$script.py" --seed 0 --steps 30 --eval_steps 10 --output_dir "$out/$script" --overwrite
    runs+=("$out/$script")
done
python -m tools.plot "${runs[@]}" --output docs/compare_demo.png --table docs/results_demo.md
# The README's demo table: grpo_base's run (the README's command) and three more seeds, as ranges.
seeds=("$out/grpo_base")
for seed in 1 2 3; do
    python grpo_base.py --seed "$seed" --steps 30 --eval_steps 10 --output_dir "$out/grpo_base_seed$seed" --overwrite
    seeds+=("$out/grpo_base_seed$seed")
done
python scripts/readme_demo_table.py "${seeds[@]}"
