#!/usr/bin/env bash
# The CPU demo's stored runs, and what is written from them:
# - compare: all five algorithms on the same data and seed, evaluated every 10 steps; each run's metrics.jsonl,
#   eval_results.json and run_config.json (its flags, machine and load) are stored in docs/demo_compare/<script>/,
#   and docs/compare_demo.png and docs/results_demo.md are written from them (5 runs, 1-3 min each on 2 cores);
# - seeds: grpo_base over seeds 0-3 at 1 and 2 torch threads; their figures are stored in docs/demo_runs.json and
#   the README's demo table is written from them (8 runs).
# Not timings: a run's figures do not depend on the load, so the runs may share the machine.
# tests/test_docs.py renders the page and the table again from what is stored.
#   bash scripts/compare_demo.sh [RUNS_DIR] [all|compare|seeds]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/compare_demo}
part=${2:-all}
case $part in all | compare | seeds) ;; *) echo "usage: $0 [RUNS_DIR] [all|compare|seeds]" >&2; exit 2 ;; esac
if [[ $part != seeds ]]; then
    stored=()
    for script in grpo_base edge_grpo egpo cw_grpo pro_grpo; do
        python "$script.py" --seed 0 --steps 30 --eval_steps 10 --output_dir "$out/$script" --overwrite
        mkdir -p "docs/demo_compare/$script"
        cp "$out/$script"/{metrics.jsonl,eval_results.json,run_config.json} "docs/demo_compare/$script/"
        stored+=("docs/demo_compare/$script")
    done
    python -m tools.plot "${stored[@]}" --output docs/compare_demo.png
    python scripts/readme_demo_table.py --results_demo
fi
if [[ $part != compare ]]; then
    # The README's command (seed 0) and three more seeds, each at 1 and 2 torch threads (the thread count changes a
    # CPU kernel's rounding, as another machine would).
    seeds=()
    for threads in 1 2; do
        for seed in 0 1 2 3; do
            OMP_NUM_THREADS=$threads python grpo_base.py --seed "$seed" --steps 30 --eval_steps 10 \
                --output_dir "$out/grpo_base_seed${seed}_t$threads" --overwrite
            seeds+=("$out/grpo_base_seed${seed}_t$threads")
        done
    done
    python scripts/readme_demo_table.py "${seeds[@]}"
fi
