"""Stop strings inside vLLM against the old path (sample on to EOS or the limit, cut afterwards): the tokens sampled
and the rollout time of a few-shot `--template plain` step on SmolLM2-135M-Instruct, interleaved on one engine with
the same seeds (the completions after the cut checked equal). Stored; docs/SCALING.md's table is written from it.

    python benchmarks/stop_strings.py                 # ~6 min alone on 2 cores; stored and written
    python benchmarks/stop_strings.py --render_only   # SCALING.md's block again from the stored run
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
STORED = ROOT / "docs" / "bench" / "stop_strings.json"
from benchmarks import stored_run  # noqa: E402

BEGIN, END, FIND = stored_run.markers("stop_strings", "benchmarks/stop_strings.py", "docs/bench/stop_strings.json")


def measure(max_len: int, repeats: int, prompts_per_step: int, group: int) -> dict:
    """One engine, `repeats` steps after a warm-up, the old and the new path in turn (alternating which goes first)."""
    from common.models import load_tokenizer
    from common.prompts import (
        cut_groups,
        few_shot_examples,
        few_shot_pool,
        format_few_shot_prompt,
        prompt_seeds,
        stop_strings,
    )
    from common.rollout import make_engine
    from scripts.real_model_demo import write_data
    from tools.smollm2 import ensure_smollm2

    path = str(ensure_smollm2())
    tok = load_tokenizer(path)
    with tempfile.TemporaryDirectory() as tmp:
        train, _ = write_data(Path(tmp))
        rows = [json.loads(line) for line in train.read_text().splitlines()]
    pool = few_shot_pool(rows, 2, seed=0)
    stop, _ = stop_strings(None, "plain", 2)
    prompts = [
        tok(format_few_shot_prompt(r["problem"], "plain", few_shot_examples(r["problem"], pool, 2), tok),
            add_special_tokens=False).input_ids
        for r in rows[10 : 10 + prompts_per_step]
    ]  # fmt: skip
    engine = make_engine("vllm", path, tok, max_model_len=1024, stop=stop, max_num_seqs=prompts_per_step * group)
    paths = {
        "after the cut (before)": lambda s: engine._sample(prompts, s, group, max_len, 1.0, 1.0, stop=()),
        "inside vLLM (now)": lambda s: engine.sample(prompts, group, max_len, 1.0, seed=s),
    }
    seconds, sampled, kept = {k: [] for k in paths}, {k: [] for k in paths}, []
    for rep in range(repeats + 1):  # rep 0 warms up
        seeds = prompt_seeds(0, rep, prompts_per_step, 0, prompts_per_step)
        got = {}
        for name in list(paths)[:: 1 if rep % 2 else -1]:
            t0 = time.perf_counter()
            out = paths[name](seeds)
            t1 = time.perf_counter()
            got[name] = cut_groups(out, engine.stop, engine.decode)
            if rep:
                seconds[name].append(t1 - t0)
                sampled[name].append(sum(len(c.token_ids) for g in out for c in g))
        ids = [[[c.token_ids for c in g] for g in got[name]] for name in paths]
        assert ids[0] == ids[1], "the two paths gave other completions after the cut"
        kept.append(sum(len(c.token_ids) for g in got[name] for c in g))
    engine.close()
    return {"max_completion_len": max_len, "stop": stop, "seconds": seconds, "sampled": sampled, "kept": kept[1:]}


def render(result: dict) -> str:
    L = [
        f"Stored in `docs/bench/stop_strings.json`: {stored_run.conditions(result, units=True)}. "
        f"{result['prompts']} prompts x "
        f"{result['group']} completions of SmolLM2 under `--template plain --few_shot 2` (stop strings "
        f"{', '.join(repr(s) for s in result['runs'][0]['stop'])}), {result['repeats']} steps after a warm-up, both "
        "paths on one engine with the same seeds, the same completions after the cut:",
        "",
        "| --max_completion_len | stop applied | tokens sampled a step (mean) | kept after the cut | rollout s (median) |",
        "|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        kept = statistics.mean(run["kept"])
        for name, secs in run["seconds"].items():
            L.append(
                f"| {run['max_completion_len']} | {name} | {statistics.mean(run['sampled'][name]):,.0f} | {kept:,.0f} "
                f"| {statistics.median(secs):.1f} |"
            )
    return "\n".join(L)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="32,128", help="comma-separated --max_completion_len values")
    p.add_argument("--repeats", type=int, default=4, help="timed steps per length, after one warm-up")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--group", type=int, default=8)
    doc = str(ROOT / "docs" / "SCALING.md")
    p.add_argument("--doc", default=doc, help="the page whose block is written ('' for none)")
    p.add_argument("--render_only", action="store_true")
    a = p.parse_args()
    if not a.render_only:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        result = stored_run.start("python benchmarks/stop_strings.py " + " ".join(sys.argv[1:]))
        result |= {"prompts": a.prompts, "group": a.group, "repeats": a.repeats}
        result["runs"] = [measure(int(n), a.repeats, a.prompts, a.group) for n in a.lengths.split(",")]
        stored_run.finish(result, STORED)
    block = render(json.loads(STORED.read_text()))
    print(block)
    if a.doc:
        stored_run.write_between(Path(a.doc), BEGIN, END, block, "benchmarks/stop_strings.py", FIND)


if __name__ == "__main__":
    main()
