"""One GRPO step on a real model (SmolLM2-135M-Instruct, `--model smollm2`), phase by phase, beside bare
compute and beside TRL's GRPOTrainer on the same model, batch and lengths.

    python benchmarks/real_step.py [--prompts 4 --group 8 --max_completion_len 32 --steps 3]
    python benchmarks/real_step.py --memory [--micro_batch_size 8]    # what the peak RSS is made of

- ours: `grpo_base.py --model smollm2` with each rollout engine (--rollout hf,vllm), the mean of
  time/*_s over steps 2..--steps (step 1 warms up), and its peak RSS; `vllm:padded` is the vLLM
  run with `--share_prompts false` (every completion's row recomputes its prompt, as bare and TRL do).
- bare: what any GRPO step must compute, with nothing around it: HF `generate` of the same
  prompts x G completions (sampling, same lengths), then one forward/backward of the model's own
  cross-entropy over the generated batch, in the scripts' micro-batches.
- TRL: `GRPOTrainer` (HF generation, its defaults otherwise: one pass, no reference model) on the
  same prompts, G, lengths and learning rate; mean step time over steps 2..--steps.
  TRL is not a dependency of this project: `pip install trl` for this benchmark; without it the
  TRL line is skipped with a note.

The prompts are the real-model demo's: two-digit sums with two worked examples (`--few_shot 2`),
about 125 prompt tokens each. Runs on CPU in about 9 minutes (--steps 3); run it alone: it measures time,
and vLLM's CPU threads slow many-fold beside another busy process.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PHASES = ["rollout_s", "scoring_s", "old_logp_s", "update_s", "sync_s", "step_s"]


def write_data(path: Path) -> None:
    from common.synthetic import synthetic_arithmetic

    with open(path, "w") as f:
        for r in synthetic_arithmetic(400, seed=2, max_operand=99):
            f.write(json.dumps(r) + "\n")


def ours(a, data: Path, config: str, out: Path) -> dict:
    """grpo_base.py on smollm2 for --steps steps: mean phase seconds over steps 2.., and peak RSS.
    `config`: the rollout engine, with ":padded" for the padded layout (`--share_prompts false`)."""
    rollout, _, layout = config.partition(":")
    cmd = [
        sys.executable, str(ROOT / "grpo_base.py"), "--model", "smollm2", "--dataset", str(data), "--few_shot", "2",
        "--steps", str(a.steps), "--prompts_per_step", str(a.prompts), "--group_size", str(a.group),
        "--max_completion_len", str(a.max_completion_len), "--lr", "1e-5", "--rollout", rollout,
        "--micro_batch_size", str(a.micro_batch_size), "--output_dir", str(out), "--save_minutes", "0",
        "--share_prompts", str(layout != "padded").lower(),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"grpo_base.py ({config}) failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["step"] >= 2]
    t = {k: sum(r.get(f"time/{k}", 0.0) for r in timed) / len(timed) for k in PHASES}
    t["peak_mem_gb"] = max(r["time/peak_mem_gb"] for r in rows)
    t["tokens"] = sum(r["train/response_len"] for r in timed) / len(timed) * a.prompts * a.group
    return t


def prompts_and_model(a, data: Path):
    import torch
    from transformers import AutoModelForCausalLM

    from common.math_data import load_prompts
    from common.models import load_tokenizer
    from common.smollm2 import ensure_smollm2

    path = str(ensure_smollm2())
    tok = load_tokenizer(path)
    rows, _ = load_prompts(str(data), tok, "qwen_math", 512, few_shot=2, say=lambda _: None)
    torch.manual_seed(0)
    return path, tok, [r for r in rows[: a.prompts]], AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def bare(a, data: Path) -> dict:
    """HF generate of the same batch, then one forward/backward (the model's own loss) in the same micro-batches."""
    import torch

    _, tok, rows, model = prompts_and_model(a, data)
    P = max(len(r["prompt_ids"]) for r in rows)
    ids = torch.tensor([[tok.pad_token_id] * (P - len(r["prompt_ids"])) + r["prompt_ids"] for r in rows])
    attn = (torch.arange(P)[None] >= torch.tensor([P - len(r["prompt_ids"]) for r in rows])[:, None]).long()
    times = {}
    for _ in range(2):  # the first warms up
        model.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                max_new_tokens=a.max_completion_len, num_return_sequences=a.group, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
        t1 = time.perf_counter()
        model.train()
        mask = torch.cat([attn.repeat_interleave(a.group, 0), (out[:, P:] != tok.pad_token_id).long()], 1)
        for first in range(0, len(out), a.micro_batch_size):
            mb, m = out[first : first + a.micro_batch_size], mask[first : first + a.micro_batch_size]
            labels = mb.masked_fill(m == 0, -100)
            labels[:, :P] = -100  # the loss on completion tokens, as GRPO's
            model(input_ids=mb, attention_mask=m, labels=labels).loss.backward()
        model.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        times = {"generate_s": t1 - t0, "forward_backward_s": t2 - t1, "step_s": t2 - t0}
        times["tokens"] = int((out[:, P:] != tok.pad_token_id).sum())
    return times


def trl(a, data: Path) -> dict | None:
    """TRL's GRPOTrainer on the same model, prompts, G and lengths: mean seconds per step over steps 2.."""
    if importlib.util.find_spec("trl") is None:
        print("TRL: skipped (not installed: `pip install trl` for this comparison)", file=sys.stderr)
        return None
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from common.answers import extract_answer

    path, tok, rows, model = prompts_and_model(a, data)
    dataset = datasets.Dataset.from_list(
        [{"prompt": tok.decode(r["prompt_ids"]), "answer": r["answer"]} for r in rows] * a.steps
    )

    def accuracy(completions, answer, **_):
        return [float(extract_answer(c) == g) for c, g in zip(completions, answer)]

    class Clock(TrainerCallback):
        starts, seconds = [], []

        def on_step_begin(self, *args, **kwargs):
            self.starts.append(time.perf_counter())

        def on_step_end(self, *args, **kwargs):
            self.seconds.append(time.perf_counter() - self.starts[-1])

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
            max_completion_length=a.max_completion_len, max_steps=a.steps, learning_rate=1e-5, temperature=1.0,
            logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=0,
            gradient_accumulation_steps=1, dataloader_num_workers=0,
        )  # fmt: skip
        clock = Clock()
        trainer = GRPOTrainer(
            model=model, reward_funcs=accuracy, args=config, train_dataset=dataset, processing_class=tok,
            callbacks=[clock],
        )  # fmt: skip
        trainer.train()
    return {"step_s": sum(clock.seconds[1:]) / max(1, len(clock.seconds) - 1), "steps": clock.seconds}


def memory(a, data: Path) -> None:
    """Resident memory of one process as a step's parts arrive, in the order they grow: the policy, its gradients
    and AdamW state, vLLM's engine (its own weights and KV cache), the rollout, pi_old scoring, the update."""
    import resource

    import psutil
    import torch

    from common.batching import micro_batches, pack, select
    from common.logprobs import sequence_logprobs
    from common.rollout import make_engine

    rss = lambda: psutil.Process().memory_info().rss / 2**30  # noqa: E731
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # noqa: E731
    lines, last = [], [rss()]

    def mark(what):
        now = rss()
        lines.append(f"| {what} | {now - last[0]:+.2f} | {now:.2f} | {peak():.2f} |")
        last[0] = now

    mark("python, torch, transformers imported")
    path, tok, rows, model = prompts_and_model(a, data)
    mark("policy weights (fp32)")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    mark("gradients + AdamW moments")
    max_len = max(len(r["prompt_ids"]) for r in rows) + a.max_completion_len
    engine = make_engine("vllm", path, tok, max_model_len=max_len, max_num_seqs=a.prompts * a.group)
    mark(f"vLLM engine: its weights + KV cache (VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE')} GiB)")
    groups = engine.generate([r["prompt_ids"] for r in rows], a.group, a.max_completion_len, 1.0, seed=0)
    mark("rollout")
    prompts = [r["prompt_ids"] for r in rows for _ in range(a.group)]
    batch = pack(prompts, [c for g in groups for c in g], tok.pad_token_id)
    lens = batch["prompt_mask"].sum(1).long().tolist(), batch["completion_mask"].sum(1).long().tolist()
    plan = micro_batches(*lens, list(range(len(prompts))), a.micro_batch_size)
    with torch.no_grad():
        for idx in plan:
            mb = select(batch, idx)
            sequence_logprobs(model, mb["input_ids"], mb["attention_mask"], 1.0, mb["completion_mask"].shape[1], True)
    mark(f"pi_old scoring (micro-batch {a.micro_batch_size})")
    model.train()
    for idx in plan:
        mb = select(batch, idx)
        logp, _ = sequence_logprobs(model, mb["input_ids"], mb["attention_mask"], 1.0, mb["completion_mask"].shape[1])
        (logp * mb["completion_mask"]).sum().backward()
    mark(f"update forward/backward (micro-batch {a.micro_batch_size})")
    engine.close()
    shape = f"{len(prompts)} sequences x {batch['input_ids'].shape[1]} padded tokens, {int(batch['completion_mask'].sum())} completion tokens"
    print(f"\nresident memory (GiB, one process) of a step on SmolLM2-135M-Instruct: {shape}\n")
    print("| part | RSS added | RSS | peak RSS so far |\n|---|---|---|---|")
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--max_completion_len", type=int, default=32)
    p.add_argument("--micro_batch_size", type=int, default=8, help="sequences per forward/backward (ours and bare)")
    p.add_argument("--steps", type=int, default=3, help="steps per run; the first warms up")
    p.add_argument(
        "--rollout",
        default="hf,vllm,vllm:padded",
        help="our engines to time, comma-separated (:padded: no shared prompts)",
    )
    p.add_argument("--skip", default="", help="comma-separated parts to skip: bare, trl")
    p.add_argument("--memory", action="store_true", help="only the memory breakdown of a step, in one process")
    a = p.parse_args()
    if a.memory:
        with tempfile.TemporaryDirectory() as tmp:
            write_data(Path(tmp) / "sums.jsonl")
            return memory(a, Path(tmp) / "sums.jsonl")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sums.jsonl"
        write_data(data)
        results = {}
        for r in filter(None, a.rollout.split(",")):
            results[f"ours ({r})"] = ours(a, data, r, Path(tmp) / r.replace(":", "-"))
            print(f"ours ({r}):", json.dumps({k: round(v, 2) for k, v in results[f"ours ({r})"].items()}), flush=True)
        b = bare(a, data) if "bare" not in a.skip else None
        print("bare:", json.dumps({k: round(v, 2) for k, v in (b or {}).items()}), flush=True)
        t = None
        if "trl" not in a.skip:
            try:
                t = trl(a, data)
            except Exception as e:  # noqa: BLE001 - a TRL version this benchmark does not fit: say so, keep the rest
                print(f"TRL: failed ({type(e).__name__}: {str(e)[:300]})", file=sys.stderr)
    n = a.prompts * a.group
    print(f"\none GRPO step on SmolLM2-135M-Instruct (fp32, CPU, {os.cpu_count()} cores): {a.prompts} prompts x "
          f"{a.group} completions of <= {a.max_completion_len} tokens, micro-batch {a.micro_batch_size}\n")  # fmt: skip
    print(f"| run | {' | '.join(k[:-2] for k in PHASES)} | peak RSS GB |")
    print("|---" * (len(PHASES) + 2) + "|")
    for name, r in results.items():
        print(f"| {name} | " + " | ".join(f"{r[k]:.1f}" for k in PHASES) + f" | {r['peak_mem_gb']:.1f} |")
    if b:
        print(f"| bare: HF generate + 1 fwd/bwd | {b['generate_s']:.1f} | - | - | {b['forward_backward_s']:.1f} | - | "
              f"{b['step_s']:.1f} | - |")  # fmt: skip
    if t:
        print(f"| TRL GRPOTrainer (HF generation) | - | - | - | - | - | {t['step_s']:.1f} | - |")
    print()
    for name, r in results.items():
        line = f"{name}: {n} completions, {r['tokens']:.0f} completion tokens a step"
        if b:
            line += f"; {r['step_s'] / b['step_s']:.2f}x bare (rollout {r['rollout_s'] / b['generate_s']:.2f}x generate"
            line += f", old_logp + update {(r['old_logp_s'] + r['update_s']) / b['forward_backward_s']:.2f}x fwd/bwd)"
        if t:
            line += f"; {r['step_s'] / t['step_s']:.2f}x TRL"
        print(line)
    if b and t:
        print(f"TRL: {t['step_s'] / b['step_s']:.2f}x bare (steps {', '.join(f'{s:.1f}' for s in t['steps'])} s)")


if __name__ == "__main__":
    main()
