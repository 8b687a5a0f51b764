"""TRL's GRPOTrainer as a row of the comparison: the implementation most users run, configured as the grid
configures grpo_base.py, and stored as the grid's runs are, so the page reads it beside GRPO.

    python scripts/comparison/trl_grpo.py --model smollm2 --seed 0 --dataset sums_train.jsonl \\
        --eval_benchmarks sums=sums_eval.jsonl --output_dir runs/trl-seed0 [the grid's flags]

It takes the grid's command line (scripts/comparison/grid.py: settings), so that runs.py runs it as a script.
What matches grpo_base.py: the model, the prompts (the same text and tokens: checked), G, the lengths, T and
top-p, the learning rate (constant, no warm-up), AdamW's betas and no weight decay, the gradient clip, the clip
range 0.2, no KL (beta 0), the loss averaged over each sequence's tokens then over sequences (TRL's loss_type
"grpo"), advantages normalised by the group's std, and --num_minibatches optimiser steps per rollout (TRL's
steps_per_generation), on a shuffled batch. What does not: TRL's own prompt order, sampler and seeds (HF
generate), its std's epsilon (1e-4, not 1e-6), fp32 on CPU. The reward is the grid's accuracy term (the same
verifier). The model is then evaluated by tools.evaluate on the held-out sums, as the grid's runs are
(scripts/comparison/evaluate_settings.py), and its log written as the grid's scripts write theirs."""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TEMPLATE, MAX_PROMPT_LEN = "qwen_math", 512  # grpo_base.py's defaults, which the grid keeps


def parse() -> argparse.Namespace:
    """The grid's flags (grid.FLAGS and settings()): those that set what TRL trains, and the bookkeeping ones."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, kind, default in [
        ("model", str, "smollm2"), ("steps", int, 8), ("seed", int, 0), ("few_shot", int, 2),
        ("prompts_per_step", int, 6), ("group_size", int, 8), ("max_completion_len", int, 32), ("lr", float, 1e-5),
        ("num_minibatches", int, 1), ("eval_n", int, 4), ("eval_temperature", float, 1.0),
        ("micro_batch_size", int, 8), ("save_minutes", float, 0), ("eval_steps", int, 0), ("eval_before", str, "false"),
        ("dataset", str, None), ("eval_benchmarks", str, None), ("output_dir", str, None),
    ]:  # fmt: skip
        p.add_argument(f"--{name}", type=kind, default=default, required=default is None and name != "eval_steps")
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args()
    if (
        a.eval_before != "false"
        or a.eval_temperature != 1.0
        or a.few_shot != 2
        or (a.prompts_per_step * a.group_size) % a.num_minibatches
    ):
        raise SystemExit(
            "error: the TRL row evaluates after training only, at T = 1 with 2 worked examples, on a batch "
            "--num_minibatches divides"
        )
    return a


def prompts(a, tokenizer) -> list[dict]:
    """The grid's training rows as TRL's dataset: the prompt text grpo_base.py renders, which TRL must tokenise back
    to the same ids."""
    from common.math_data import load_prompts

    rows, _ = load_prompts(a.dataset, tokenizer, TEMPLATE, MAX_PROMPT_LEN, few_shot=a.few_shot, seed=a.seed)
    out = [{"prompt": tokenizer.decode(r["prompt_ids"]), "answer": r["answer"]} for r in rows]
    again = tokenizer(text=[r["prompt"] for r in out])["input_ids"]  # as GRPOTrainer._tokenize_prompts does
    if again != [r["prompt_ids"] for r in rows]:
        raise SystemExit("error: TRL would tokenise the prompts to other ids than grpo_base.py trains on")
    return out


class Rollouts:
    """The accuracy reward, and each rollout's figures as grpo_base.py logs them (docs/algorithms/grpo_base.md)."""

    def __init__(self, group_size: int):
        from common.verifier import MathVerifier

        self.G, self.verifier, self.rows = group_size, MathVerifier(), []
        self.__name__ = "accuracy"

    def __call__(self, completions, answer, **_) -> list[float]:
        import torch

        from common.rewards import compute_rewards

        reward = compute_rewards(list(completions), list(answer), ["accuracy"], self.verifier).total
        r = torch.tensor(reward).view(-1, self.G)  # TRL's sampler puts a prompt's G completions together
        adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)  # TRL's scale_rewards="group"
        self.rows.append(
            {
                "train/reward": float(r.mean()),
                "train/accuracy": float(r.mean()),
                "train/zero_adv_group_frac": float((r.max(1).values == r.min(1).values).float().mean()),
                "train/adv_var_within_group": float(adv.var(1).mean()),
            }
        )
        return reward


def train(a, model_path: str, tokenizer, run_dir: Path) -> list[dict]:
    """GRPOTrainer's run; returns a row per rollout, as metrics.jsonl's."""
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rollouts, history, seconds = Rollouts(a.group_size), [], []

    class Log(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            seconds.append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kwargs):
            history.append(logs or {})

    batch = a.prompts_per_step * a.group_size
    config = GRPOConfig(
        output_dir=str(run_dir / "trl"), per_device_train_batch_size=batch // a.num_minibatches,
        steps_per_generation=a.num_minibatches, num_generations=a.group_size, max_completion_length=a.max_completion_len,
        max_steps=a.steps * a.num_minibatches, learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, epsilon=0.2, beta=0.0,
        loss_type="grpo", scale_rewards="group", temperature=1.0, top_p=1.0, seed=a.seed, use_cpu=True, bf16=False,
        logging_steps=1, report_to="none", save_strategy="no", gradient_accumulation_steps=1,
        dataloader_num_workers=0, model_init_kwargs={"dtype": "float32"},
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model_path, reward_funcs=rollouts, args=config, processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_list(prompts(a, tokenizer)), callbacks=[Log()],
    )  # fmt: skip
    trainer.train()
    trainer.save_model(str(run_dir / "model"))
    tokenizer.save_pretrained(str(run_dir / "model"))
    rollouts.verifier.close()
    steps = [entry for entry in history if "grad_norm" in entry]  # one an optimiser step
    rows, n = [], a.num_minibatches
    for i, row in enumerate(rollouts.rows[: a.steps]):
        mine = steps[i * n : (i + 1) * n]  # the rollout's optimiser steps; the last one's gradient norm, as ours
        entropy = sum(s["entropy"] for s in mine) / n
        rows.append({"step": i + 1, **row, "train/entropy": entropy, "train/grad_norm": mine[-1]["grad_norm"]})
        rows[-1]["time/step_s"] = sum(seconds[i * n : (i + 1) * n])
    return rows


def eval_command(model: Path, out: Path, dataset: str, benchmark: str, seed: int, n: int, max_tokens: int) -> list:
    """tools.evaluate's command line that evaluates `model` as the grid's runs evaluate themselves: the run's
    template, its worked examples from `dataset` under `seed`, each problem's sampling seed from `seed`."""
    cmd = [sys.executable, "-m", "scripts.comparison.evaluate_settings", "--", "--model", str(model)]
    cmd += ["--benchmarks", benchmark, "--seed", str(seed), "--n", str(n), "--temperature", "1.0", "--top_p", "1.0"]
    cmd += ["--max_tokens", str(max_tokens), "--template", TEMPLATE, "--few_shot", "2", "--few_shot_dataset"]
    return cmd + [str(dataset), "--output_dir", str(out)]


def main() -> None:
    """Train, save the model, evaluate it; then the files runs.py stores: metrics.jsonl, run_config.json."""
    a = parse()
    import torch
    import trl

    from common.metrics import describe_machine
    from common.models import load_tokenizer, model_to_load

    run_dir = Path(a.output_dir)
    if run_dir.exists() and a.overwrite:
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    model_path, _ = model_to_load(a.model)
    tokenizer = load_tokenizer(model_path)
    rows = train(a, model_path, tokenizer, run_dir)
    cmd = eval_command(run_dir / "model", run_dir, a.dataset, a.eval_benchmarks, a.seed, a.eval_n, a.max_completion_len)
    if subprocess.run(cmd, cwd=ROOT).returncode:
        raise SystemExit("error: evaluating the TRL run failed (its output is above)")
    key = f"eval/{a.eval_benchmarks.split('=', 1)[0]}/pass@1"
    rows[-1][key] = json.loads((run_dir / "eval_results.json").read_text())["summary"][key]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = {k: v for k, v in vars(a).items() if k != "overwrite"}
    flags |= {"temperature": 1.0, "top_p": 1.0, "mu": 1, "template": TEMPLATE, "trl": trl.__version__}
    machine = describe_machine(torch.get_num_threads()) | {"precision": "fp32"}
    (run_dir / "run_config.json").write_text(json.dumps({"flags": flags, "history": [{"machine": machine}]}) + "\n")


if __name__ == "__main__":
    main()
