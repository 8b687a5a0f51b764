"""Step time by phase for the five scripts on the same CPU demo run, and the update's overhead.

    python benchmarks/step_time.py [--steps 10] [--rollout vllm] [--scripts grpo_base.py,egpo.py]

Each script's mean seconds per phase over steps 2.. (step 1 warms up), its overhead over grpo_base.py, peak memory
and eval accuracy before and after; then the update alone against a bare forward/backward of the model's own loss
on the same micro-batches (target: within 1.1x; stored in docs/bench/update_overhead.json, docs/SCALING.md's line
written from it). `--flat_groups`: the update's time against the share of flat groups, whose rows are left out.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import stored_run  # noqa: E402

STORED = stored_run.BENCH / "update_overhead.json"
DOC = ROOT / "docs" / "SCALING.md"
BEGIN, END, FIND = stored_run.markers("update overhead", "benchmarks/step_time.py", "docs/bench/update_overhead.json")
SCRIPTS = ["grpo_base.py", "edge_grpo.py", "egpo.py", "cw_grpo.py", "pro_grpo.py"]
PHASES = [f"time/{k}" for k in ("rollout_s", "gec_s", "scoring_s", "old_logp_s", "update_s", "sync_s", "step_s")]


def run(script: str, steps: int, rollout: str, out: Path) -> list[dict]:
    cmd = [sys.executable, str(ROOT / script), "--steps", str(steps), "--rollout", rollout]
    cmd += ["--eval_steps", str(steps), "--output_dir", str(out)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rollout", default="vllm", choices=["vllm", "hf"])
    p.add_argument("--scripts", default=",".join(SCRIPTS))
    p.add_argument("--update_only", action="store_true", help="only the update-overhead measurement")
    p.add_argument("--flat_groups", action="store_true", help="only the update's time against the share of flat groups")
    p.add_argument("--out", default=str(STORED), help="where the update overhead is stored ('' for nowhere)")
    p.add_argument("--doc", default=str(DOC), help="the page whose line is written ('' for none)")
    p.add_argument("--render_only", action="store_true", help="write the page's line from the stored run")
    a = p.parse_args()
    if a.render_only:
        return write_doc(stored_run.load(Path(a.out)), a.doc)
    if a.update_only:
        return update_overhead(a.out, a.doc)
    if a.flat_groups:
        return flat_groups()
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for script in a.scripts.split(","):
            rows = run(script, a.steps, a.rollout, Path(tmp) / script)
            train = [r for r in rows if r["step"] >= 2 and "time/step_s" in r]  # step 1 warms up
            table[script] = {k: sum(r.get(k) or 0.0 for r in train) / len(train) for k in PHASES}
            table[script]["peak_mem_gb"] = max(r.get("time/peak_mem_gb") or 0.0 for r in train)
            table[script]["before"] = rows[0].get("eval/synthetic/pass@1")
            table[script]["after"] = rows[-1].get("eval/synthetic/pass@1")
            print(f"ran {script}", file=sys.stderr)
    base = table.get("grpo_base.py", {}).get("time/step_s")
    print(f"mean seconds per step over steps 2..{a.steps} ({a.rollout} rollout, CPU demo)\n")
    print(f"| script | {' | '.join(k[5:] for k in PHASES)} | vs grpo_base | peak GiB | eval pass@1 before -> after |")
    print("|---" * (len(PHASES) + 4) + "|")
    for script, t in table.items():
        overhead = f"{100 * (t['time/step_s'] / base - 1):+.0f}%" if base else "-"
        phases = " | ".join(f"{t[k]:.2f}" for k in PHASES)
        print(f"| {script} | {phases} | {overhead} | {t['peak_mem_gb']:.1f} | {t['before']:.2f} -> {t['after']:.2f} |")
    update_overhead(a.out, a.doc)


def render(record: dict) -> str:
    """docs/SCALING.md's line on the update's overhead, from the stored run."""
    u = record["update"]
    return (
        f"Stored in `docs/bench/update_overhead.json`: {stored_run.conditions(record)}. The update of "
        f"{u['sequences']} demo-sized sequences ({u['micro_batches']} micro-batches, the mean of {u['repeats']} "
        f"repeats): the scripts' path {u['ours_s']:.3f} s, a bare forward/backward with the model's own loss "
        f"{u['bare_s']:.3f} s: {u['ours_s'] / u['bare_s']:.2f}x (target <= 1.1x)."
    )


def write_doc(record: dict, doc: str) -> None:
    if doc:
        stored_run.write_between(Path(doc), BEGIN, END, render(record), "update-overhead", FIND)
        print(f"wrote {doc}'s update-overhead line")


def demo_batch(n: int):
    """The demo model and `n` random rows of the demo's shapes, packed (seeded: every call the same)."""
    import torch
    from transformers import AutoModelForCausalLM

    from common.batching import pack
    from common.models import demo_model_dir
    from common.prompts import Completion

    torch.manual_seed(0)
    rng = random.Random(0)
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir())
    V = model.config.vocab_size
    prompts = [[rng.randrange(3, V) for _ in range(rng.randint(20, 40))] for _ in range(n)]
    completions = [[rng.randrange(3, V) for _ in range(rng.randint(4, 48))] for _ in range(n)]
    return model, pack(prompts, [Completion(c, [0.0] * len(c), True) for c in completions], 0)


def update_overhead(out: str = "", doc: str = "", repeats: int = 5) -> None:
    """Seconds per update of the scripts' path vs a bare forward/backward over the same micro-batches; stored in
    `out` and written into `doc` where given."""
    import torch

    from common.batching import micro_batches, select
    from common.logprobs import sequence_logprobs
    from grpo_base import Args, policy_loss

    record = stored_run.start(" ".join(["python benchmarks/step_time.py", *sys.argv[1:]]), torch.get_num_threads())
    model, batch = demo_batch(128)
    lens = batch["prompt_mask"].sum(1).long().tolist(), batch["completion_mask"].sum(1).long().tolist()
    plan = micro_batches(*lens, list(range(128)), 32, max_tokens=2048)
    args, adv, n_tok = Args(), torch.randn(128), batch["completion_mask"].sum().item()

    def ours():
        for idx in plan:
            mb = select(batch, idx)
            logp, _ = sequence_logprobs(
                model, mb["input_ids"], mb["attention_mask"], 1.0, mb["completion_mask"].shape[1]
            )
            loss, _ = policy_loss(logp, logp.detach(), adv[mb["rows"]], mb["completion_mask"], args, 128, n_tok)
            loss.backward()

    def bare():
        for idx in plan:
            mb = select(batch, idx)
            labels = mb["input_ids"].masked_fill(mb["attention_mask"] == 0, -100)
            model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], labels=labels).loss.backward()

    times = {}
    for name, fn in [("bare", bare), ("ours", ours)] * 2:  # interleaved, the second round counted
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
            model.zero_grad(set_to_none=True)
        times[name] = (time.perf_counter() - t0) / repeats
    print(
        f"\nupdate of 128 demo-sized sequences ({len(plan)} micro-batches): scripts' path {times['ours']:.3f} s, "
        f"bare forward/backward {times['bare']:.3f} s, ratio {times['ours'] / times['bare']:.2f}x (target <= 1.1x)"
    )
    record["update"] = {
        "sequences": 128, "micro_batches": len(plan), "repeats": repeats, "ours_s": times["ours"], "bare_s": times["bare"],
    }  # fmt: skip
    if out:
        write_doc(stored_run.finish(record, Path(out)), doc)


def update_session(model, micro_batch_size: int, max_tokens: int = 0):
    """A one-process trainer holding what the scripts' update() uses (accelerator, micro-batch plan,
    accumulation, optimiser step), over `model`; AdamW at lr 0, so that every repeat sees the same model."""
    import torch

    from common.metrics import UpdateGuard
    from common.trainer import Trainer, make_accelerator, parallel_mode

    accelerator = make_accelerator("no", grad_clip=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    return Trainer(
        accelerator, parallel_mode(accelerator), model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
        UpdateGuard(0), grad_clip=1.0, micro_batch_size=micro_batch_size, max_tokens_per_micro_batch=max_tokens,
    )  # fmt: skip


def flat_groups(repeats: int = 5, G: int = 8, groups: int = 16) -> None:
    """Seconds per grpo_base.update() on G * groups demo-sized sequences, by share of flat groups."""
    import torch

    import grpo_base

    n = G * groups
    model, batch = demo_batch(n)
    old = {"logp": -torch.rand(batch["completion_mask"].shape)}
    old["ref_logp"] = torch.zeros_like(old["logp"])
    s = update_session(model, micro_batch_size=32)
    args = grpo_base.Args(group_size=G)
    shares = [0.0, 0.25, 0.5, 0.75, 1.0]
    times = {}
    for _ in range(2):  # the second round counted
        for share in shares:
            rewards = torch.randint(0, 2, (groups, G)).float()
            rewards[:, 0], rewards[:, 1] = 0.0, 1.0  # every group mixed ...
            rewards[: round(share * groups)] = 1.0  # ... but the first share of them: all correct, advantage 0
            adv = grpo_base.group_advantages(rewards.view(-1), G)
            t0 = time.perf_counter()
            for _ in range(repeats):
                sums = grpo_base.update(s, batch, old, adv, None, args, step=0)
            times[share] = (time.perf_counter() - t0) / repeats, sums["skipped_rows"]
    print(f"\ngrpo_base.update() on {n} demo-sized sequences (G = {G}, micro-batches of 32, one process, CPU)\n")
    print("| flat groups | rows left out | update s | vs 0% flat |\n|---|---|---|---|")
    for share in shares:
        t, skipped = times[share]
        print(f"| {share:.0%} | {skipped:.0f} | {t:.3f} | {t / times[0.0][0]:.2f}x |")


if __name__ == "__main__":
    main()
