#!/usr/bin/env bash
# The comparison recipe on the CPU demo: all five algorithms on the same data
# and seed, evaluated every 10 steps, then one figure and one results table;
# and the README's demo table: grpo_base over seeds 0-3 at 1 and 2 threads.
# Regenerates docs/compare_demo.png, docs/results_demo.md, docs/demo_runs.json and the README's
# demo table (13 runs, 1-3 min each on 2 cores).
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
# The README's demo table: the README's command (seed 0) and three more seeds, each at 1 and 2 torch threads
# (the thread count changes a CPU kernel's rounding, as another machine would).
seeds=()
for threads in 1 2; do
    for seed in 0 1 2 3; do
        OMP_NUM_THREADS=$threads python grpo_base.py --seed "$seed" --steps 30 --eval_steps 10 \
            --output_dir "$out/grpo_base_seed${seed}_t$threads" --overwrite
        seeds+=("$out/grpo_base_seed${seed}_t$threads")
    done
done
python scripts/readme_demo_table.py "${seeds[@]}"
