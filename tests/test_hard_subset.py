"""data/hard_subset.py: DeepScaleR-Hard-1K (EDGE-GRPO), the problems a model answers least often."""

import json

from common.cli import parse_args
from common.prompts import Completion
from common.verifier import MathVerifier
from data.hard_subset import Args, hardest, main, sample_accuracies


def test_hardest_ranks_by_accuracy_and_breaks_ties_by_seed():
    rows = [{"problem": str(i)} for i in range(5)]
    out = hardest(rows, [0.5, 0.0, 1.0, 0.0, 0.25], n=3, seed=0)
    assert {r["problem"] for r in out[:2]} == {"1", "3"} and out[2]["problem"] == "4"
    assert [r["model_accuracy"] for r in out] == [0.0, 0.0, 0.25]
    ties = [{"problem": str(i)} for i in range(20)]
    picks = {tuple(r["problem"] for r in hardest(ties, [0.0] * 20, 5, seed)) for seed in range(5)}
    assert len(picks) > 1  # the seed decides among ties...
    assert hardest(ties, [0.0] * 20, 5, 3) == hardest(ties, [0.0] * 20, 5, 3)  # ...reproducibly


class ScriptedEngine:
    """Answers problem i correctly in the first correct[i] of its samples (the rollout-engine interface)."""

    def __init__(self, tok, correct):
        self.tok, self.correct, self.seen = tok, correct, 0

    def generate(self, prompts, n, max_tokens, temperature, top_p=1.0, seed=None):
        out = []
        for _ in prompts:
            k, self.seen = self.correct[self.seen], self.seen + 1
            texts = ["so \\boxed{5}" if j < k else "so \\boxed{4}" for j in range(n)]
            out.append([Completion(self.tok(t, add_special_tokens=False).input_ids, [0.0], True) for t in texts])
        return out


def test_sample_accuracies_counts_correct_samples(tiny_random_model):
    _, tok = tiny_random_model
    rows = [{"problem": f"What is 2 + {i}?", "answer": "5"} for i in range(3)]
    with MathVerifier() as verifier:
        acc = sample_accuracies(rows, ScriptedEngine(tok, [4, 0, 1]), tok, verifier, samples=4, batch_size=2)
    assert acc == [1.0, 0.0, 0.25]


def test_hard_subset_cli_on_tiny_model(tiny_random_dir, tmp_path):
    src, out = tmp_path / "pool.jsonl", tmp_path / "hard.jsonl"
    src.write_text(
        "".join(
            json.dumps({"problem": f"What is {i} + 2?", "answer": str(i + 2), "solution": f"\\boxed{{{i + 2}}}"}) + "\n"
            for i in range(6)
        )
    )
    main(
        parse_args(
            Args,
            argv=[
                "--model",
                str(tiny_random_dir),
                "--rollout",
                "hf",
                "--source",
                str(src),
                "--output",
                str(out),
                "--n",
                "4",
                "--samples",
                "2",
                "--max_tokens",
                "8",
            ],
        )
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all({"problem", "answer", "solution", "model_accuracy"} <= set(r) for r in rows)
    accs = [r["model_accuracy"] for r in rows]
    assert accs == sorted(accs) and all(a in (0.0, 0.5, 1.0) for a in accs)
