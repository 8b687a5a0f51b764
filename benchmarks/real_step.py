"""One GRPO step on a real model (SmolLM2-135M-Instruct, `--model smollm2`), phase by phase, in fp32 and in the
GPU's precision mode (`--precision bf16-mixed`), beside bare compute and TRL's GRPOTrainer on the same model, batch
and lengths. The run is stored (machine, load, command, figures) and docs/SCALING.md's tables are written from it.

    python benchmarks/real_step.py                    # every part (~15 min alone on 2 cores), stored and written
    python benchmarks/real_step.py --render_only      # SCALING.md's block again from the stored run
    python benchmarks/real_step.py --memory           # what one process's peak RSS is made of (stored too)

The parts: ours (`grpo_base.py` per `--runs` entry: mean phase seconds over steps 2.., peak RSS, the log-prob gap),
bare (HF generate + one forward/backward of the model's own loss), TRL (`pip install trl`, else skipped), the
evaluation here and at each `--eval_at` commit, a matmul's GFLOP/s and each phase's floor (real_step_render.py
`floor_flops`). Time it alone: vLLM's CPU threads spin beside another busy process.
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
STORED = ROOT / "docs" / "bench" / "real_step.json"
STORED_MEMORY = ROOT / "docs" / "bench" / "real_step_memory.json"
DOC = ROOT / "docs" / "SCALING.md"
from benchmarks import stored_run  # noqa: E402
from benchmarks.real_step_render import PHASES, memory_block, render, step_memory  # noqa: E402

BEGIN, END, FIND = stored_run.markers("real_step", "benchmarks/real_step.py", "docs/bench/real_step.json")
MEMORY_BEGIN, MEMORY_END, MEMORY_FIND = stored_run.markers(
    "real_step memory", "benchmarks/real_step.py --memory", "docs/bench/real_step_memory.json"
)


def write_data(path: Path) -> None:
    from common.math_data import synthetic_arithmetic

    with open(path, "w") as f:
        for r in synthetic_arithmetic(400, seed=2, max_operand=99):
            f.write(json.dumps(r) + "\n")


def step_flags(a, data: Path, config: str, out: Path) -> list[str]:
    """grpo_base.py's flags for the step measured: `a`'s batch and lengths, `config` engine[:padded]@precision."""
    engine, _, precision = config.partition("@")
    rollout, _, layout = engine.partition(":")
    return [
        "--model", "smollm2", "--dataset", str(data), "--few_shot", "2", "--steps", str(a.steps),
        "--prompts_per_step", str(a.prompts), "--group_size", str(a.group), "--max_completion_len",
        str(a.max_completion_len), "--lr", "1e-5", "--rollout", rollout, "--micro_batch_size", str(a.micro_batch_size),
        "--output_dir", str(out), "--save_minutes", "0", "--share_prompts", str(layout != "padded").lower(),
        "--precision", precision or "fp32", "--rollout_correction", "none",  # measure the gap; correct nothing
    ]  # fmt: skip


def ours(a, data: Path, config: str, out: Path) -> dict:
    """grpo_base.py on smollm2 for --steps steps: mean phase seconds over steps 2.., peak RSS, the share of rows the
    update trained, and the log-prob gap at step 1 and at the last step. `config`: engine[:padded]@precision."""
    cmd = [sys.executable, str(ROOT / "grpo_base.py"), *step_flags(a, data, config, out)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"grpo_base.py ({config}) failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["step"] >= 2]
    t = {k: sum(r.get(f"time/{k}", 0.0) for r in timed) / len(timed) for k in PHASES}
    t["peak_mem_gb"] = max(r["time/peak_mem_gb"] for r in rows)
    t["tokens"] = sum(r["train/response_len"] for r in timed) / len(timed) * a.prompts * a.group
    t["trained"] = 1 - sum(r["train/skipped_rows"] for r in timed) / len(timed) / (a.prompts * a.group)
    gap = lambda r: {"mean": r["train/rollout_logp_gap"], "p99": r["train/rollout_logp_gap_p99"]}  # noqa: E731
    t["gap"] = {"step 1": gap(rows[0]), f"step {rows[-1]['step']}": gap(rows[-1])}
    return t


EVAL = "--model smollm2 --few_shot 2 --limit 100 --n 8 --temperature 1 --max_tokens 32".split()


def evaluation(root: Path, out: Path) -> dict:
    """`tools.evaluate` at `root` (EVAL's flags): its own time (`eval_s`: sampling and scoring, not the engine's
    start), the tokens of its prompts (each, and the prefix they all share) and of its samples, and its pass@1."""
    cmd = [sys.executable, "-m", "tools.evaluate", *EVAL, "--output_dir", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(root)})
    if proc.returncode:
        raise SystemExit(f"tools.evaluate at {root} failed:\n{proc.stderr[-3000:]}")
    results = json.loads((out / "eval_results.json").read_text())
    records = [json.loads(line) for line in (out / "eval_records.jsonl").read_text().splitlines()]
    return {
        "eval_s": results["config"]["eval_s"],
        "prompts": len(records),
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "shared_prefix": eval_prefix([r["problem"] for r in records]),
        "completions": sum(len(r["num_tokens"]) for r in records),
        "tokens": sum(sum(r["num_tokens"]) for r in records),
        "pass@1": results["summary"]["eval/overall/pass@1"],
    }


def eval_prefix(problems: list[str]) -> int:
    """The tokens every evaluation prompt begins with (the template and the worked examples), as this tree builds them."""
    from common.evaluation import prompt_ids
    from common.models import load_tokenizer
    from tools.evaluate import Args, few_shot_pool_for
    from tools.smollm2 import ensure_smollm2

    tok, pool = load_tokenizer(str(ensure_smollm2())), few_shot_pool_for(Args(few_shot=2), None)
    return len(os.path.commonprefix([prompt_ids(p, Args.template, tok, 2, pool) for p in problems]))


def evaluations(commits: list[str], tmp: Path) -> dict:
    """The evaluation here and at each commit (checked out in a worktree under `tmp`), in that order."""
    roots = {"this tree": ROOT}
    for commit in commits:
        roots[commit] = tmp / f"tree-{commit}"
        subprocess.run(["git", "worktree", "add", "--detach", str(roots[commit]), commit], cwd=ROOT, check=True)
    try:
        return {name: evaluation(root, tmp / f"eval-{i}") for i, (name, root) in enumerate(roots.items())}
    finally:
        for commit in commits:
            subprocess.run(["git", "worktree", "remove", "--force", str(roots[commit])], cwd=ROOT, check=True)


def model_params() -> dict:
    """What a token's forward multiplies by: the body's matrices (not the embedding, a lookup, nor the norms' scales)
    and the LM head (SmolLM2's is the embedding)."""
    from transformers import AutoModelForCausalLM

    from tools.smollm2 import ensure_smollm2

    model = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()))
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not embedding and p is not head)
    return {"body": matrices, "head": head.numel()}


def prompt_lengths(rows: list[dict]) -> dict:
    """The training prompts' mean length and the prefix they all share (template and worked examples), tokens."""
    ids = [r["prompt_ids"] for r in rows]
    return {"mean": sum(map(len, ids)) / len(ids), "shared": len(os.path.commonprefix(ids))}


def training_rows(data: Path):
    """The model's path, its tokenizer and the training prompts, as grpo_base.py loads them (2 worked examples)."""
    from common.math_data import load_prompts
    from common.models import load_tokenizer
    from tools.smollm2 import ensure_smollm2

    path = str(ensure_smollm2())
    tok = load_tokenizer(path)
    rows, _ = load_prompts(str(data), tok, "qwen_math", 512, few_shot=2, say=lambda _: None)
    return path, tok, rows


def prompts_and_model(a, data: Path):
    import torch
    from transformers import AutoModelForCausalLM

    path, tok, rows = training_rows(data)
    torch.manual_seed(0)
    return path, tok, rows[: a.prompts], AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


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


def trl(a, data: Path) -> dict:
    """TRL's GRPOTrainer on the same model, prompts, G and lengths: mean seconds per step over steps 2.."""
    if importlib.util.find_spec("trl") is None:
        return {"skipped": "TRL is not installed (`pip install trl` for this comparison)"}
    import datasets
    import trl as trl_module
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
    steps = clock.seconds
    return {"step_s": sum(steps[1:]) / max(1, len(steps) - 1), "steps": steps, "version": trl_module.__version__}


def matmul(n: int = 2048, seconds: float = 5.0) -> dict:
    """GFLOP/s of an n x n matmul in fp32 and in bf16 on this CPU: the best of `seconds` of repeats each (a shared
    VM's cores ramp up: the first tenth of a second ran 96 where the next seconds reached 168 in fp32)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    out = {"n": n}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x, y = a.to(dtype), b.to(dtype)
        times, end = [], time.perf_counter() + seconds
        while (t0 := time.perf_counter()) < end:
            x @ y
            times.append(time.perf_counter() - t0)
        out[f"{name}_gflops"] = 2 * n**3 / min(times) / 1e9
    return out


def run(a) -> dict:
    """Every part, in one process tree, one after another; the result as stored."""
    result = stored_run.start("python benchmarks/real_step.py " + " ".join(sys.argv[1:]))
    result |= {
        "args": {k: v for k, v in vars(a).items() if k not in ("render_only", "memory", "out", "doc")},
        "matmul": matmul(),
        "model": model_params(),
        "ours": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sums.jsonl"
        write_data(data)
        result["prompt_len"] = prompt_lengths(training_rows(data)[2])
        for config in filter(None, a.runs.split(",")):
            result["ours"][config] = ours(a, data, config, Path(tmp) / config.replace(":", "-").replace("@", "-"))
            print(f"ours ({config}):", json.dumps(result["ours"][config]), flush=True)
        result["bare"] = bare(a, data) if "bare" not in a.skip else {"skipped": "--skip bare"}
        try:
            result["trl"] = trl(a, data) if "trl" not in a.skip else {"skipped": "--skip trl"}
        except Exception as e:  # noqa: BLE001 - a TRL version this benchmark does not fit: say so, keep the rest
            result["trl"] = {"skipped": f"failed ({type(e).__name__}: {str(e)[:300]})"}
        if "eval" not in a.skip:
            result["evaluation"] = evaluations(list(filter(None, a.eval_at.split(","))), Path(tmp))
    result["matmul_end"] = matmul()  # the floors take the faster of the two
    return result


def parser() -> argparse.ArgumentParser:
    """The flags; benchmarks/profile_step.py takes its step's from their defaults."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--max_completion_len", type=int, default=32)
    p.add_argument("--micro_batch_size", type=int, default=8, help="sequences per forward/backward (ours and bare)")
    p.add_argument("--steps", type=int, default=3, help="steps per run; the first warms up")
    p.add_argument(
        "--runs",
        default="vllm@fp32,vllm@bf16-mixed,vllm:padded@fp32,hf@fp32",
        help="our runs, comma-separated: engine (vllm, hf)[:padded: no shared prompts]@--precision",
    )
    p.add_argument("--skip", default="", help="comma-separated parts to skip: bare, trl, eval")
    p.add_argument("--eval_at", default="", help="comma-separated commits whose evaluation is timed beside this tree's")
    p.add_argument("--memory", action="store_true", help="only the memory breakdown of a step, in one process")
    p.add_argument("--out", default=None, help=f"where the run is stored (default {STORED.relative_to(ROOT)})")
    p.add_argument("--doc", default=str(DOC), help="the page whose block is written ('' for none)")
    p.add_argument("--render_only", action="store_true", help="write the page's block from the stored run")
    return p


def main() -> None:
    a = parser().parse_args()
    stored = Path(a.out) if a.out else STORED_MEMORY if a.memory else STORED
    if not a.render_only:
        if a.memory:
            with tempfile.TemporaryDirectory() as tmp:
                write_data(Path(tmp) / "sums.jsonl")
                result = step_memory(a, Path(tmp) / "sums.jsonl", prompts_and_model)
        else:
            result = run(a)
        stored_run.finish(result, stored)
    result = json.loads(stored.read_text())
    block = memory_block(result) if a.memory else render(result)
    print(block)
    if a.doc:
        begin, end, find = (MEMORY_BEGIN, MEMORY_END, MEMORY_FIND) if a.memory else (BEGIN, END, FIND)
        stored_run.write_between(Path(a.doc), begin, end, block, "benchmarks/real_step.py", find)
        print(f"wrote {a.doc}'s block from {stored}")


if __name__ == "__main__":
    main()
