"""edge_grpo.py: EDA against hand-computed numbers, GEC through the real rollout engines and reward,
the start-up data check, 2-step CLI runs; data/hard_subset.py (DeepScaleR-Hard-1K)."""

import json
import math
import random
import subprocess
import sys

import pytest
import torch
from train_utils import ROOT, TWO_STEPS, run_script

from common.logprobs import sequence_logprobs
from common.rewards import MathVerifier, compute_rewards
from common.rollout import Completion, HFEngine, VLLMEngine, vllm_available
from data.hard_subset import hardest, sample_accuracies
from data.hard_subset import main as hard_subset_main
from edge_grpo import (
    INJECTION,
    REFLECTION,
    Args,
    check_gec_data,
    entropy_driven_advantages,
    group_advantages,
    guided_error_correction,
    validate,
)

needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vllm not installed")]
T = 0.6
A = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # GRPO advantage of a correct answer in rewards [1, 0, 0, 1]


def eda(rewards, P, G=4):
    """A_hat exactly as edge_grpo.main computes it."""
    P = torch.tensor(P)
    return entropy_driven_advantages(
        group_advantages(torch.tensor(rewards), G), P, P.view(-1, G).mean(1).repeat_interleave(G)
    )


# ---------------------------------------------------------------- EDA (eqs. 6, 7)


def test_eda_mixed_groups_hand_computed():
    # Group 1: P = [0.5, 1, 1.5, 1], mean 1 -> P_hat = P. Group 2: P doubled, same P_hat (scale-free).
    out = eda([1.0, 0, 0, 1, 1, 0, 0, 1], [0.5, 1.0, 1.5, 1.0, 1.0, 2.0, 3.0, 2.0])
    expected = torch.tensor([2 * A, -A, -A / 1.5, A] * 2)  # confident right: x2; unsure wrong: x(2/3)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[:2], torch.tensor([1.7320491, -0.8660246]))


@pytest.mark.parametrize(
    "rewards", [[2.0] * 4, [1.0] * 4, [0.0] * 4], ids=["all-correct", "all-correct-acc-only", "all-incorrect"]
)
def test_eda_keeps_collapsed_groups_at_zero(rewards):
    out = eda(rewards, [0.3, 0.0, 2.0, 1e-9])
    assert torch.isfinite(out).all() and (out == 0).all()


def test_eda_ties_leave_advantages_unchanged():
    torch.testing.assert_close(eda([1.0, 0, 0, 1], [0.7] * 4), torch.tensor([A, -A, -A, A]))


def test_eda_zero_entropy_is_finite_and_floored():
    out = eda([1.0, 0, 0, 1], [0.0, 1.0, 1.0, 2.0])  # group mean 1; P_0 floored at 1e-6
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor([A / 1e-6, -A, -A, A / 2]))
    # A group whose entropies are all zero (mean 0 as well) keeps its advantages.
    torch.testing.assert_close(eda([1.0, 0, 0, 1], [0.0] * 4), torch.tensor([A, -A, -A, A]))


def test_eda_entropy_grad_flows_through_one_over_P_only():
    # --eda_entropy_grad: P_i from the training pass carries a gradient, the group mean is a constant.
    P = torch.tensor([0.5, 2.0], requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    out = entropy_driven_advantages(adv, P, torch.tensor([1.25, 1.25]))
    out.sum().backward()
    torch.testing.assert_close(P.grad, -adv * 1.25 / P.detach() ** 2)  # d(A m / P) / dP = -A m / P^2


def test_eda_entropy_grad_needs_eda():
    with pytest.raises(SystemExit, match="--eda_entropy_grad needs --eda"):
        validate(Args(eda=False, eda_entropy_grad=True))


# ---------------------------------------------------------------- GEC


@pytest.fixture(scope="module")
def hf_engine(tiny_random_model):
    model, tok = tiny_random_model
    return HFEngine(model, [tok.eos_token_id], tok.pad_token_id)


def wrong(tok, text="1 + 1 = 3. The answer is \\boxed{3}.", finished=True):
    ids = tok(text, add_special_tokens=False).input_ids + ([tok.eos_token_id] if finished else [])
    return Completion(ids, [-1.0] * len(ids), finished)


class RecordingEngine:
    """Rollout-engine interface that answers every prompt with one EOS token and records its calls.

    Many draws through the real engine cost minutes of CPU; the continuation itself is tested with
    the real engines below."""

    def __init__(self, eos_id):
        self.eos_id, self.calls = eos_id, []

    def generate(self, prompts, n, max_tokens, temperature, top_p=1.0, seed=None):
        self.calls.append((prompts, n, max_tokens))
        self.seeds = seed
        return [[Completion([self.eos_id], [-0.5], True) for _ in range(n)] for _ in prompts]


def test_gec_branch_proportions_over_4000_draws(tiny_random_model):
    _, tok = tiny_random_model
    prompt = tok("What is 1 + 1?", add_special_tokens=False).input_ids
    n = 5000
    accuracy = [1.0 if i % 5 == 0 else 0.0 for i in range(n)]  # 4000 incorrect, 1000 correct
    completions = [wrong(tok) for _ in range(n)]
    engine = RecordingEngine(tok.eos_token_id)
    args = ([prompt] * n, completions, accuracy, ["2"] * n, ["1 + 1 = 2. \\boxed{2}"] * n, tok, engine)
    edited, branches = guided_error_correction(*args, random.Random(0), max_new_tokens=7, seeds=list(range(n)))
    reflected = [i for i, b in enumerate(branches) if b == "reflection"]
    assert engine.seeds == reflected  # each continuation under its own completion's seed: none shared
    assert all(
        b is None and e is c for b, e, c, acc in zip(branches, edited, completions, accuracy) if acc
    )  # correct: untouched
    counts = {b: branches.count(b) for b in ("reflection", "injection", "replacement")}
    assert sum(counts.values()) == 4000
    for name, p in (("reflection", 0.5), ("injection", 0.25), ("replacement", 0.25)):
        assert abs(counts[name] / 4000 - p) < 0.03, counts  # 4 binomial standard deviations
    # All reflections continue in one engine call: prompt + completion without its EOS + reflection.
    [(prompts, n_samples, max_tokens)] = engine.calls
    refl = tok(REFLECTION, add_special_tokens=False).input_ids
    assert (n_samples, max_tokens, len(prompts)) == (1, 7, counts["reflection"])
    assert all(p == prompt + completions[0].token_ids[:-1] + refl for p in prompts)
    # Seeded: the same seed repeats the draws, another seed does not.
    assert guided_error_correction(*args, random.Random(0))[1] == branches
    assert guided_error_correction(*args, random.Random(1))[1] != branches
    # +Force-R: reflection with p = 1.
    _, forced = guided_error_correction(*args, random.Random(0), mode="reflection_only")
    assert forced.count("reflection") == 4000 and forced.count(None) == 1000


def branch_example(
    tok, hf_engine, branch, completion, answer="\\frac{1}{2}", solution="Halve it: \\boxed{\\frac{1}{2}}"
):
    """Draw until `branch` comes up for a single incorrect completion."""
    prompt = tok("What is 1 + 1?", add_special_tokens=False).input_ids
    for seed in range(100):
        edited, branches = guided_error_correction(
            [prompt], [completion], [0.0], [answer], [solution], tok, hf_engine, random.Random(seed), max_new_tokens=4
        )
        if branches == [branch]:
            return edited[0]
    raise AssertionError(branch)


@pytest.mark.parametrize("finished", [True, False], ids=["ended-on-eos", "cut-off"])
def test_gec_edits_token_ids_and_marks_inserted_tokens(tiny_random_model, hf_engine, finished):
    _, tok = tiny_random_model
    c = wrong(tok, finished=finished)
    body = c.token_ids[:-1] if finished else c.token_ids
    for branch, new_text in (
        ("injection", INJECTION.format("\\frac{1}{2}")),
        ("replacement", "Halve it: \\boxed{\\frac{1}{2}}"),
    ):
        e = branch_example(tok, hf_engine, branch, c)
        new = tok(new_text, add_special_tokens=False).input_ids + [tok.eos_token_id]  # ends on an EOS either way
        start = body if branch == "injection" else []
        assert e.token_ids == start + new and e.finished
        assert e.logprobs[: len(start)] == [-1.0] * len(start) and all(math.isnan(x) for x in e.logprobs[len(start) :])
    e = branch_example(tok, hf_engine, "reflection", c)
    refl = tok(REFLECTION, add_special_tokens=False).input_ids
    assert e.token_ids[: len(body) + len(refl)] == body + refl  # EOS dropped, reflection appended
    cont = e.logprobs[len(body) + len(refl) :]
    assert 1 <= len(cont) <= 4 and all(math.isfinite(x) for x in cont)  # sampled by the engine


def test_injected_answers_and_solutions_score_as_correct(tiny_random_model, hf_engine):
    _, tok = tiny_random_model
    answers = ["\\frac{1}{2}", "12", "x^2+1", "(1, 2)"]
    solutions = [
        "Halve it: \\boxed{\\frac{1}{2}}",
        "3 * 4 = 12, so \\boxed{12}.",
        "Expand: \\boxed{x^2 + 1}",
        "So \\boxed{(1,2)}.",
    ]
    edited = [
        branch_example(tok, hf_engine, branch, wrong(tok), a, s)
        for branch in ("injection", "replacement")
        for a, s in zip(answers, solutions)
    ]
    texts, golds = tok.batch_decode([e.token_ids for e in edited], skip_special_tokens=True), answers * 2
    with MathVerifier() as verifier:
        rewards, accuracy = compute_rewards(texts, golds, ["boxed_format", "accuracy"], verifier)
    assert accuracy == [1.0] * 8 and rewards == [2.0] * 8, list(zip(texts, rewards))
    assert texts[0].startswith(
        "1 + 1 = 3. The answer is \\boxed{3}.\nWait! Something is wrong here."
    )  # the wrong box stays, the last one counts


def check_continuation(model, tok, engine, max_logp_err):
    """Real completions -> all marked wrong -> reflection continued by `engine`; the trainer agrees on its log-probs."""
    prompts = [
        tok("What is 12 + 34? Please reason.", add_special_tokens=False).input_ids,
        tok("What is 7 + 8?", add_special_tokens=False).input_ids,
    ]
    groups = engine.generate(prompts, 2, 12, T, seed=0)
    completions = [c for g in groups for c in g]
    prompt_of = [p for p in prompts for _ in range(2)]
    edited, branches = guided_error_correction(
        prompt_of,
        completions,
        [0.0] * 4,
        ["46"] * 4,
        [None] * 4,
        tok,
        engine,
        random.Random(0),
        mode="reflection_only",
        max_new_tokens=8,
        temperature=T,
        seeds=[1, 2, 3, 4],
    )
    refl = tok(REFLECTION, add_special_tokens=False).input_ids
    assert branches == ["reflection"] * 4
    for p, c, e in zip(prompt_of, completions, edited):
        assert c.finished == (c.token_ids[-1] == tok.eos_token_id)  # the stop token is in the engine's ids
        body = c.token_ids[:-1] if c.finished else c.token_ids
        n_cont = len(e.token_ids) - len(body) - len(refl)
        assert e.token_ids[: len(body) + len(refl)] == body + refl and 1 <= n_cont <= 8
        assert e.finished == (e.token_ids[-1] == tok.eos_token_id)
        ids = torch.tensor([p + e.token_ids])
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, ids, torch.ones_like(ids), T, logits_to_keep=n_cont)
        assert (logp[0] - torch.tensor(e.logprobs[-n_cont:])).abs().max().item() < max_logp_err


def test_gec_reflection_continues_through_hf_engine(tiny_random_model, hf_engine):
    model, tok = tiny_random_model
    check_continuation(model, tok, hf_engine, 1e-4)


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vllm not installed")
def test_gec_reflection_continues_through_vllm(tiny_random_model, tiny_random_dir):
    model, tok = tiny_random_model
    engine = VLLMEngine(str(tiny_random_dir), [tok.eos_token_id], max_model_len=256, seed=0, dtype="float32")
    check_continuation(model, tok, engine, 1e-3)


# ---------------------------------------------------------------- data checks


def test_full_gec_refuses_rows_without_solution():
    rows = [
        {"problem": "p", "answer": "1", "solution": "\\boxed{1}"},
        {"problem": "q", "answer": "2", "solution": None},
    ]
    with pytest.raises(SystemExit, match="--gec full needs a reference solution.*1 of 2 rows lack a solution"):
        check_gec_data(rows, "full")
    check_gec_data(rows, "reflection_only")  # reflection needs no solution
    check_gec_data(rows, "off")
    with pytest.raises(SystemExit, match="0 of 1 rows lack a solution and 1 an answer"):
        check_gec_data([{"problem": "p", "answer": " ", "solution": "s"}], "full")


def test_cli_refuses_dataset_without_solutions(tiny_random_dir, tmp_path):
    data = tmp_path / "no_solutions.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(4))
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "edge_grpo.py"),
            "--model",
            str(tiny_random_dir),
            "--dataset",
            str(data),
            "--rollout",
            "hf",
            "--output_dir",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--gec full needs a reference solution" in proc.stderr and "4 of 4 rows lack a solution" in proc.stderr


# ---------------------------------------------------------------- CLI

EXTRA_METRICS = {
    "train/adv_var_within_group",
    "edge/adv_var_within_group_before_eda",
    "edge/entropy_P",
    "gec/rollout_accuracy",
    "gec/reflection",
    "gec/injection",
    "gec/replacement",
    "gec/fixed",
    "gec/reflection_fixed",
    "time/gec_s",
    "train/rollout_logp_gap",
}
FLAGS = (*TWO_STEPS, "--gec_max_new_tokens", "8")


@pytest.mark.parametrize("rollout", ["hf", pytest.param("vllm", marks=needs_vllm)])
def test_two_steps_log_the_extra_metrics(rollout, tiny_random_dir, tmp_path):
    rows = run_script("edge_grpo.py", tmp_path, "--model", str(tiny_random_dir), "--rollout", rollout, *FLAGS)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert EXTRA_METRICS <= set(r), EXTRA_METRICS - set(r)
        edited = r["gec/reflection"] + r["gec/injection"] + r["gec/replacement"]
        assert (
            edited == round(16 * (1 - r["gec/rollout_accuracy"])) > 0
        )  # every wrong completion, and a random model is wrong
        assert r["gec/fixed"] >= r["gec/injection"] + r["gec/replacement"]  # the synthetic solutions are right
        assert r["train/rollout_logp_gap"] < 1e-3  # finite: injected tokens are left out
    assert (tmp_path / "checkpoint-2" / "COMPLETE").exists()
    assert json.loads((tmp_path / "run_config.json").read_text())["flags"]["gec"] == "full"


def test_force_r_with_entropy_grad_runs(tiny_random_dir, tmp_path):
    rows = run_script(
        "edge_grpo.py",
        tmp_path,
        "--model",
        str(tiny_random_dir),
        "--rollout",
        "hf",
        "--gec",
        "reflection_only",
        "--eda_entropy_grad",
        *FLAGS[2:],
        "--steps",
        "1",
    )
    assert rows[0]["gec/injection"] == rows[0]["gec/replacement"] == 0 and rows[0]["gec/reflection"] > 0
    assert math.isfinite(rows[0]["train/loss"]) and math.isfinite(rows[0]["train/grad_norm"])


# ---------------------------------------------------------------- Hard-1K


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
    hard_subset_main(
        [
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
        ]
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all({"problem", "answer", "solution", "model_accuracy"} <= set(r) for r in rows)
    accs = [r["model_accuracy"] for r in rows]
    assert accs == sorted(accs) and all(a in (0.0, 0.5, 1.0) for a in accs)


def test_loss_aggregation_is_per_response():
    """Eq. 1 averages each response's tokens, then the responses (the authors' run in effect too)."""
    from edge_grpo import Args

    assert Args().loss_agg == "seq-mean-token-mean"
