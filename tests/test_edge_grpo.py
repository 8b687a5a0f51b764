"""edge_grpo.py: EDA against hand-computed numbers, GEC through the real rollout engines and reward,
the start-up data check, a run of the authors' variant (--eda_entropy_grad)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from train_utils import TWO_STEPS, grpo_advantage, run_cli, run_script, uneven_mask

from common.cli import parse_args
from common.logprobs import sequence_logprobs
from common.prompts import Completion, prompt_seeds
from common.rewards import compute_rewards
from common.rollout import HFEngine
from common.run_flags import RunFlags, vllm_available
from common.verifier import MathVerifier
from common.vllm_engine import VLLMEngine
from edge_grpo import (
    INJECTION,
    REFLECTION,
    Args,
    check_gec_data,
    edge_advantages,
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


def test_eda_scales_an_injected_solution_as_eq_7_says_and_the_metrics_show_it():
    """A reference solution GEC put in (its tokens never sampled: NaN rollout log-probs) is text the policy
    finds predictable: P_i near 0. Eqs. 6-7, like the authors' code, give it A * mean_group(P) / P_i, unbounded;
    edge/entropy_P_injected and edge/adv_abs_max show it (docs/algorithms/edge_grpo.md)."""
    entropy = torch.tensor([[0.05] * 3, [1.0] * 3, [1.0] * 3, [1.0] * 3])  # P = [0.05, 1, 1, 1], group mean 0.7625
    batch = {"completion_mask": torch.ones(4, 3), "rollout_logp": torch.zeros(4, 3)}
    batch["rollout_logp"][0] = math.nan  # completion 0: the reference solution
    batch["rollout_logp"][1, 1] = math.nan  # completion 1: a reflection, continued by the policy (not counted)
    args = SimpleNamespace(eda=True, eda_ratio_bound=0.0)
    adv, info = edge_advantages(torch.tensor([1.0, 0, 0, 1]), {"entropy": entropy}, batch, 4, args)
    torch.testing.assert_close(adv, torch.tensor([15.25 * A, -0.7625 * A, -0.7625 * A, 0.7625 * A]))
    assert info["edge/adv_abs_max"].item() == pytest.approx(15.25 * A)  # 13.2, where |A| <= (G - 1) / sqrt(G)
    assert info["edge/adv_share_injected"].item() == pytest.approx(15.25 / (15.25 + 3 * 0.7625))  # 0.87 of sum |A|
    assert info["edge/entropy_P_injected"].item() == pytest.approx(0.05) and info["edge/entropy_P"] == pytest.approx(
        0.7625
    )


def test_eda_ratio_bound_caps_the_injected_solutions_advantage_at_bound_times_A():
    """--eda_ratio_bound 10 (a departure: the authors' commented-out clamp): the same batch as above, 1 / P_hat of
    the reference solution 15.25 is cut to 10; the policy's own completions (0.7625, inside [0.1, 10]) keep theirs."""
    entropy = torch.tensor([[0.05] * 3, [1.0] * 3, [1.0] * 3, [1.0] * 3])
    batch = {"completion_mask": torch.ones(4, 3), "rollout_logp": torch.zeros(4, 3)}
    batch["rollout_logp"][0] = math.nan
    args = SimpleNamespace(eda=True, eda_ratio_bound=10.0)
    adv, info = edge_advantages(torch.tensor([1.0, 0, 0, 1]), {"entropy": entropy}, batch, 4, args)
    torch.testing.assert_close(adv, torch.tensor([10 * A, -0.7625 * A, -0.7625 * A, 0.7625 * A]))
    assert info["edge/adv_abs_max"].item() == pytest.approx(10 * A)
    # The low side too: P_i 20 times its group's mean gets A / 10, not A / 20.
    out = entropy_driven_advantages(
        torch.tensor([1.0, -1.0]), torch.tensor([2.0, 0.0]), torch.tensor([0.1, 0.1]), bound=10
    )
    torch.testing.assert_close(out, torch.tensor([0.1, -10.0]))


def test_random_uneven_batches_match_eqs_3_6_7_completion_by_completion():
    """Eqs. 3, 6, 7 in plain Python on pi_old's token entropies: P_i the mean entropy over o_i's valid tokens,
    P_hat_i = P_i / mean_group(P), A_hat_i = A_i / P_hat_i with GRPO's A_i (unbiased std, eps 1e-6)."""
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        G, n, C = 6, 30, 12
        rewards = (torch.rand(n, generator=g) > 0.5).double()
        rewards[::G], rewards[:G] = 1 - rewards[1::G], 1.0  # every group mixed but the first, all correct
        entropy = torch.rand(n, C, generator=g, dtype=torch.float64) * 3 + 1e-3
        lengths = torch.randint(1, C + 1, (n,), generator=g).tolist()
        mask = uneven_mask(lengths, C)
        batch = {"completion_mask": mask, "rollout_logp": torch.zeros(n, C, dtype=torch.float64)}
        args = SimpleNamespace(eda=True, eda_ratio_bound=0.0)
        adv, _ = edge_advantages(rewards, {"entropy": entropy}, batch, G, args)
        r, want = rewards.tolist(), []
        for grp in range(0, n, G):
            P = [sum(entropy[i, t].item() for t in range(lengths[i])) / lengths[i] for i in range(grp, grp + G)]
            for a, p in zip(grpo_advantage(r[grp : grp + G]), P):
                want.append(a / (p / (sum(P) / G)))
        torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--eda_ratio_bound", "0.5"], r"--eda_ratio_bound takes 0 \(off\) or B > 1 such as 10 \(got 0.5\)"),
        (["--eda_ratio_bound", "10", "--eda", "false"], "it needs --eda, not --eda_entropy_grad"),
        (["--eda_ratio_bound", "10", "--eda_entropy_grad"], "it needs --eda, not --eda_entropy_grad"),
    ],
)
def test_eda_ratio_bound_is_checked_before_anything_loads(argv, says):
    with pytest.raises(SystemExit, match=says):
        validate(*parse_args(Args, RunFlags, argv=argv))


def test_eda_entropy_grad_flows_through_one_over_P_only():
    # --eda_entropy_grad: P_i from the training pass carries a gradient, the group mean is a constant.
    P = torch.tensor([0.5, 2.0], requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    out = entropy_driven_advantages(adv, P, torch.tensor([1.25, 1.25]))
    out.sum().backward()
    torch.testing.assert_close(P.grad, -adv * 1.25 / P.detach() ** 2)  # d(A m / P) / dP = -A m / P^2


def test_eda_entropy_grad_needs_eda():
    with pytest.raises(SystemExit, match="--eda_entropy_grad needs --eda"):
        validate(*parse_args(Args, RunFlags, argv=["--eda", "false", "--eda_entropy_grad"]))


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


def gec(tok, engine, rows, completions, accuracy, step=0, **flags):
    """guided_error_correction as a step of edge_grpo.main calls it (one rank, the flags given)."""
    s = SimpleNamespace(tokenizer=tok, engine=engine, rank=0)
    return guided_error_correction(s, rows, completions, accuracy, step, Args(**flags))


def test_gec_branch_proportions_over_4000_draws(tiny_random_model):
    _, tok = tiny_random_model
    prompt = tok("What is 1 + 1?", add_special_tokens=False).input_ids
    n = 5000
    accuracy = [1.0 if i % 5 == 0 else (None if i == 1 else 0.0) for i in range(n)]  # 3999 incorrect, 1 unchecked
    completions = [wrong(tok) for _ in range(n)]
    engine = RecordingEngine(tok.eos_token_id)
    rows = [{"prompt_ids": prompt, "answer": "2", "solution": "1 + 1 = 2. \\boxed{2}"}] * n
    args = (tok, engine, rows, completions, accuracy)
    edited, branches = gec(*args, gec_max_new_tokens=7, prompts_per_step=n, group_size=1)
    reflected = [i for i, b in enumerate(branches) if b == "reflection"]
    seeds = prompt_seeds(1, 0, n, 0, n)  # --seed 0 + 1: one per completion, from its place in the global batch
    assert engine.seeds == [seeds[i] for i in reflected]  # each continuation under its own completion's seed
    assert branches[1] is None and edited[1] is completions[1]  # unchecked: not known wrong, left alone
    accuracy[1] = 0.0
    assert all(
        b is None and e is c for b, e, c, acc in zip(branches, edited, completions, accuracy) if acc
    )  # correct: untouched
    edited, branches = gec(*args, gec_max_new_tokens=7, prompts_per_step=n, group_size=1)
    [(prompts, n_samples, max_tokens)] = engine.calls[-1:]
    counts = {b: branches.count(b) for b in ("reflection", "injection", "replacement")}
    assert sum(counts.values()) == 4000
    for name, p in (("reflection", 0.5), ("injection", 0.25), ("replacement", 0.25)):
        assert abs(counts[name] / 4000 - p) < 0.03, counts  # 4 binomial standard deviations
    # All reflections continue in one engine call: prompt + completion without its EOS + reflection.
    refl = tok(REFLECTION, add_special_tokens=False).input_ids
    assert (n_samples, max_tokens, len(prompts)) == (1, 7, counts["reflection"])
    assert all(p == prompt + completions[0].token_ids[:-1] + refl for p in prompts)
    # Seeded: the same seed and step repeat the draws; another seed or step does not.
    assert gec(*args)[1] == branches
    assert gec(*args, seed=1)[1] != branches and gec(*args, step=1)[1] != branches
    # +Force-R: reflection with p = 1.
    _, forced = gec(*args, gec="reflection_only")
    assert forced.count("reflection") == 4000 and forced.count(None) == 1000


def branch_example(
    tok, hf_engine, branch, completion, answer="\\frac{1}{2}", solution="Halve it: \\boxed{\\frac{1}{2}}"
):
    """Draw until `branch` comes up for a single incorrect completion."""
    prompt = tok("What is 1 + 1?", add_special_tokens=False).input_ids
    row = {"prompt_ids": prompt, "answer": answer, "solution": solution}
    for seed in range(100):
        edited, branches = gec(tok, hf_engine, [row], [completion], [0.0], seed=seed, gec_max_new_tokens=4)
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
        r = compute_rewards(texts, golds, ["boxed_format", "accuracy"], verifier)
    assert r.accuracy == [1.0] * 8 and r.total == [2.0] * 8 and all(r.checked), list(zip(texts, r.total))
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
    rows = [{"prompt_ids": p, "answer": "46", "solution": None} for p in prompt_of]
    flags = {
        "gec": "reflection_only",
        "gec_max_new_tokens": 8,
        "temperature": T,
        "prompts_per_step": 2,
        "group_size": 2,
    }
    edited, branches = gec(tok, engine, rows, completions, [0.0] * 4, **flags)
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
def test_gec_reflection_continues_through_vllm(tiny_random_model, tiny_random_dir, closing):
    model, tok = tiny_random_model
    engine = closing(VLLMEngine(str(tiny_random_dir), [tok.eos_token_id], max_model_len=256, seed=0, dtype="float32"))
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
    flags = [
        "--model",
        str(tiny_random_dir),
        "--dataset",
        str(data),
        "--rollout",
        "hf",
        "--output_dir",
        str(tmp_path / "run"),
    ]
    proc = run_cli("edge_grpo.py", *flags, timeout=180)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--gec full needs a reference solution" in proc.stderr and "4 of 4 rows lack a solution" in proc.stderr


# ---------------------------------------------------------------- a run of the authors' variant


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
        *TWO_STEPS[2:],
        "--gec_max_new_tokens",
        "8",
        "--steps",
        "1",
    )
    assert rows[0]["gec/injection"] == rows[0]["gec/replacement"] == 0 and rows[0]["gec/reflection"] > 0
    assert math.isfinite(rows[0]["train/loss"]) and math.isfinite(rows[0]["train/grad_norm"])
