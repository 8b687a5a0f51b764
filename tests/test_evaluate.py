"""common/evaluation.py and tools/evaluate.py: pass@k, averages, benchmark loading,
end-to-end runs, re-scoring."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

import tools.evaluate as tool
from common import evaluation
from common.checkpoint import write_manifest
from common.cli import parse_args
from common.math_data import SYNTHETIC_EVAL_PATH, SYNTHETIC_EVAL_SIZE, load_math_dataset
from common.models import model_to_load
from common.prompts import Completion
from common.rollout import HFEngine
from common.run_dir import write_jsonl
from common.verifier import MathVerifier


def run_tool(**flags):
    """`python -m tools.evaluate --flag value ...` in process."""
    args = tool.Args(**flags)
    tool.main(args, tool.validate(args))


@pytest.fixture(scope="module")
def tiny_model(tiny_random_dir):
    return tiny_random_dir


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(timeout_s=5.0) as v:
        yield v


# pass@k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 1, 0.3),  # pass@1 = c / n
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (8, 2, 4, 1 - 15 / 70),  # 1 - C(6,4)/C(8,4)
        (4, 1, 4, 1.0),  # n = k: solved if any sample is
        (4, 0, 4, 0.0),  # n = k, none correct
        (16, 0, 8, 0.0),  # c = 0
        (16, 16, 1, 1.0),  # c = n
        (16, 16, 16, 1.0),
        (16, 10, 8, 1.0),  # n - c < k: every k-subset holds a correct one
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert evaluation.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_form_and_is_stable():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert evaluation.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # Large n: the product form needs no huge binomials.
    assert evaluation.pass_at_k(5000, 1, 1) == pytest.approx(1 / 5000)
    assert evaluation.pass_at_k(5000, 2500, 1000) == pytest.approx(1.0)
    assert 0 < evaluation.pass_at_k(1024, 3, 32) < 1


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 5), (4, 2, 0), (0, 0, 1)])
def test_pass_at_k_rejects_invalid(n, c, k):
    with pytest.raises(ValueError):
        evaluation.pass_at_k(n, c, k)


def test_default_ks():
    assert evaluation.default_ks(1) == [1]
    assert evaluation.default_ks(8) == [1, 2, 4, 8]
    assert evaluation.default_ks(12) == [1, 2, 4, 8]


# Averages


def _record(bench, correct, tokens=10, finished=True):
    return {
        "benchmark": bench,
        "answer": "1",
        "completions": [""] * len(correct),
        "correct": list(correct),
        "num_tokens": [tokens] * len(correct),
        "finished": [finished] * len(correct),
    }


def test_summary_weighted_overall_and_unweighted_mean():
    records = [_record("small", [True, True])] + [
        _record("big", [False, True] if i == 0 else [False, False], tokens=20) for i in range(3)
    ]
    s = evaluation.summarize(records)
    assert s["eval/small/pass@1"] == 1.0
    assert s["eval/big/pass@1"] == pytest.approx(0.5 / 3)
    assert s["eval/big/pass@2"] == pytest.approx(1 / 3)
    # overall = total correct / total problems (EDGE-GRPO): (1 + 0.5) / 4 problems.
    assert s["eval/overall/pass@1"] == pytest.approx(1.5 / 4)
    assert s["eval/overall/pass@2"] == pytest.approx(2 / 4)
    assert s["eval/mean/pass@1"] == pytest.approx((1.0 + 0.5 / 3) / 2)
    assert s["eval/overall/num_problems"] == 4 and s["eval/big/num_problems"] == 3
    assert s["eval/overall/response_len"] == pytest.approx((2 * 10 + 6 * 20) / 8)
    assert all(isinstance(v, (int, float)) for v in s.values())  # flat, loggable


def test_summary_skips_k_above_n():
    s = evaluation.summarize([_record("a", [True, False])], ks=[1, 2, 4])
    assert "eval/a/pass@2" in s and "eval/a/pass@4" not in s


def test_format_table_lists_benchmarks_and_averages():
    s = evaluation.summarize([_record("math500", [True, False]), _record("aime24", [False, False], finished=False)])
    table = tool.format_table(s)
    lines = table.splitlines()
    assert lines[0].startswith("| benchmark | problems | pass@1 (%) | pass@2 (%)")
    assert any(line.startswith("| math500 | 1 | 50.0 | 100.0") for line in lines)
    assert any(line.startswith("| aime24 | 1 | 0.0 | 0.0 | 10 | 100.0") for line in lines)
    assert lines[-2].startswith("| overall") and lines[-1].startswith("| mean")


# Benchmark loading


def test_registry_covers_the_papers_benchmarks():
    for name in ("math500", "aime24", "aime25", "amc23", "amc", "minerva", "olympiadbench", "gsm8k", "synthetic"):
        assert name in evaluation.BENCHMARKS
    assert evaluation.BENCHMARKS["gsm8k"][:3] == ("openai/gsm8k", "main", "test")


def test_synthetic_benchmark_is_the_shipped_file():
    rows = evaluation.load_benchmark("synthetic")
    assert len(rows) == SYNTHETIC_EVAL_SIZE
    assert rows == [
        {"problem": r["problem"], "answer": r["answer"]} for r in load_math_dataset(str(SYNTHETIC_EVAL_PATH))
    ]


def test_local_raw_dumps_use_the_hub_fields(tmp_path):
    write_jsonl([{"question": "Q1", "answer": "She pays 3 * 4 = 12.\n#### 1,200"}], tmp_path / "gsm8k.jsonl")
    write_jsonl(
        [{"problem": "P", "solution": r"So $v = \boxed{7.5 \times 10^{-4}}$ m/s.", "type": "x", "idx": 0}],
        tmp_path / "minerva.jsonl",
    )
    write_jsonl([{"id": 1, "problem": "A", "answer": 27.0, "url": "u"}], tmp_path / "amc.jsonl")
    write_jsonl(
        [{"id": 1, "question": "O", "answer": r"$\frac{1}{2}$", "final_answer": ["x"]}],
        tmp_path / "olympiadbench.jsonl",
    )
    got = evaluation.load_benchmarks("gsm8k,minerva,amc,olympiadbench", data_dir=str(tmp_path))
    assert got["gsm8k"] == [{"problem": "Q1", "answer": "1200"}]
    assert got["minerva"] == [{"problem": "P", "answer": r"7.5 \times 10^{-4}"}]
    assert got["amc"] == [{"problem": "A", "answer": "27"}]
    assert got["olympiadbench"] == [{"problem": "O", "answer": r"$\frac{1}{2}$"}]


def test_local_file_in_our_format_and_explicit_source(tmp_path):
    path = tmp_path / "mine.jsonl"
    write_jsonl([{"problem": "What is 1 + 1?", "answer": "2"}, {"problem": "Q", "answer": "#### 5"}], path)
    got = evaluation.load_benchmarks(f"gsm8k={path},custom={path}", limit=1)
    assert got == {
        "gsm8k": [{"problem": "What is 1 + 1?", "answer": "2"}],
        "custom": [{"problem": "What is 1 + 1?", "answer": "2"}],
    }


def test_unknown_benchmark_and_bad_names(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark 'nope'.*Give it a file: nope=path/to/nope.jsonl"):
        evaluation.load_benchmark("nope")
    with pytest.raises(ValueError, match="invalid benchmark name"):
        evaluation.load_benchmark("overall", source=str(SYNTHETIC_EVAL_PATH))
    bad = tmp_path / "bad.jsonl"
    write_jsonl([{"text": "no problem field"}], bad)
    with pytest.raises(
        ValueError,
        match=r"benchmark 'olympiadbench': .*bad.jsonl needs the fields problem, answer "
        r"or question, answer \(.*fields: text\)\); map them: olympiadbench=PATH:problem=FIELD:answer=FIELD",
    ):
        evaluation.load_benchmark("olympiadbench", source=str(bad))


def test_hub_unreachable_says_to_pass_a_local_file(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'HuggingFaceH4/MATH-500' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        RuntimeError, match=r"(?s)HuggingFaceH4/MATH-500.*local copy: math500=path/to/math500.jsonl"
    ) as e:
        evaluation.load_benchmark("math500")
    assert "--data_dir" not in str(e.value)  # a training run has no such flag
    with pytest.raises(RuntimeError, match=r"math500=DIR holding math500.jsonl, or --data_dir DIR holding it"):
        evaluation.load_benchmark("math500", data_dir_flag="--data_dir")  # tools.evaluate has


# evaluate() with a scripted engine: known answers, known scores


class ScriptedEngine:
    """Returns fixed completion texts per prompt (cycled to n), as a rollout engine would; the j-th completion's
    every token has log-prob -(j + 1) / 10."""

    def __init__(self, tokenizer, texts_by_problem):
        self.tokenizer, self.texts = tokenizer, texts_by_problem
        self.calls = []

    def generate(self, prompts, n, max_tokens, temperature, top_p=1.0, seed=None):
        self.calls.append((len(prompts), n, max_tokens, temperature, top_p, seed))
        out = []
        for p in prompts:
            problem = next(k for k in self.texts if k in self.tokenizer.decode(p))
            texts = (self.texts[problem] * n)[:n]
            ids = [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
            out.append([Completion(i, [-(j + 1) / 10] * len(i), finished=True) for j, i in enumerate(ids)])
        return out


def test_evaluate_scores_and_records(tokenizer, verifier):
    benchmarks = {
        "a": [{"problem": "What is 1 + 1?", "answer": "2"}, {"problem": "What is 2 + 2?", "answer": "4"}],
        "b": [{"problem": "What is 3 + 3?", "answer": "6"}],
    }
    engine = ScriptedEngine(
        tokenizer,
        {
            "1 + 1": [r"\boxed{2}", r"\boxed{3}", "no answer", r"\boxed{2}"],  # 2 of 4
            "2 + 2": [r"\boxed{5}"],  # 0 of 4
            "3 + 3": [r"\boxed{6}"],  # 4 of 4
        },
    )
    summary, records = evaluation.evaluate(
        engine,
        tokenizer,
        benchmarks,
        "qwen_math",
        n=4,
        temperature=0.6,
        max_tokens=32,
        top_p=0.95,
        seed=7,
        verifier=verifier,
    )
    seeds = [7 + i * 1_000_003 for i in range(3)]  # one per problem, unique across benchmarks
    assert engine.calls == [(2, 4, 32, 0.6, 0.95, seeds[:2]), (1, 4, 32, 0.6, 0.95, seeds[2:])]
    assert summary["eval/a/pass@1"] == pytest.approx((0.5 + 0) / 2)
    assert summary["eval/a/pass@2"] == pytest.approx((1 - 1 / 6) / 2)
    assert summary["eval/b/pass@4"] == 1.0
    assert summary["eval/overall/pass@1"] == pytest.approx(1.5 / 3)
    assert summary["eval/mean/pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert [r["benchmark"] for r in records] == ["a", "a", "b"]
    first = records[0]
    assert first["completions"] == [r"\boxed{2}", r"\boxed{3}", "no answer", r"\boxed{2}"]
    assert first["predictions"] == ["2", "3", None, "2"]
    assert first["correct"] == [True, False, False, True]
    assert first["prompt_tokens"] > 0 and len(first["num_tokens"]) == 4
    assert first["mean_logprob"] == pytest.approx([-0.1, -0.2, -0.3, -0.4])  # per completion, over its tokens


def test_evaluate_counts_overlong_prompts_as_wrong(tokenizer, verifier):
    rows = [{"problem": "What is 1 + 1?", "answer": "2"}, {"problem": "What is 1 + 1? " * 50, "answer": "2"}]
    engine = ScriptedEngine(tokenizer, {"1 + 1": [r"\boxed{2}"]})
    summary, records = evaluation.evaluate(
        engine,
        tokenizer,
        {"a": rows},
        "qwen_math",
        n=2,
        temperature=1.0,
        max_tokens=8,
        verifier=verifier,
        max_prompt_len=100,
    )
    assert engine.calls[0][0] == 1  # only the short prompt was generated
    assert summary["eval/a/pass@1"] == 0.5 and summary["eval/a/num_problems"] == 2
    assert "max_prompt_len" in records[1]["skipped"] and records[1]["correct"] == [False, False]
    assert records[1]["mean_logprob"] == [None, None]  # nothing generated: no confidence
    assert summary["eval/a/truncated_frac"] == 0.0  # lengths describe generated completions only


# End to end with the tiny model (HF engine), then re-scoring


def test_cli_end_to_end_hf_then_rescore(tiny_model, tmp_path, capsys):
    bench = tmp_path / "tiny_bench.jsonl"
    write_jsonl([{"question": f"What is {a} + {a}?", "answer": f"work\n#### {2 * a}"} for a in range(3)], bench)
    out = tmp_path / "out"
    run_tool(
        model=str(tiny_model),
        benchmarks=f"gsm8k={bench},synthetic",
        limit=2,
        n=4,
        k="1,2,4,8",
        temperature=1.0,
        max_tokens=12,
        rollout="hf",
        output_dir=str(out),
        seed=3,
    )
    printed = capsys.readouterr().out
    assert "| gsm8k | 2 |" in printed and "| synthetic | 2 |" in printed
    assert f"evaluating {tiny_model}" in printed  # which model, for the record

    results = json.loads((out / evaluation.RESULTS_FILE).read_text())
    summary = results["summary"]
    assert summary["eval/overall/num_problems"] == 4
    assert {"eval/gsm8k/pass@4", "eval/synthetic/pass@1", "eval/mean/pass@2"} <= set(summary)
    assert "eval/gsm8k/pass@8" not in summary  # k > n
    assert results["config"]["n"] == 4 and results["config"]["rollout"] == "hf"
    records = [json.loads(line) for line in (out / evaluation.RECORDS_FILE).read_text().splitlines()]
    assert len(records) == 4 and all(len(r["completions"]) == 4 for r in records)
    assert records[0]["answer"] == "0" and all(0 < t <= 12 for r in records for t in r["num_tokens"])

    # Re-score without generating: make two completions of the first problem right.
    records[0]["completions"][:2] = [r"\boxed{0}", r"so \boxed{0}."]
    write_jsonl(records, out / evaluation.RECORDS_FILE)
    summary2, rescored = tool.rescore(out / evaluation.RECORDS_FILE)
    assert rescored[0]["correct"][:2] == [True, True]
    assert rescored[0]["correct"][2:] == records[0]["correct"][2:]
    first = sum(rescored[0]["correct"]) / 4
    assert summary2["eval/gsm8k/pass@1"] == pytest.approx((first + sum(rescored[1]["correct"]) / 4) / 2)
    assert summary2["eval/gsm8k/pass@1"] >= summary["eval/gsm8k/pass@1"] + 0.25 - 1e-9
    # The CLI's --rescore writes next to the records and keeps the generation config.
    run_tool(rescore=str(out / evaluation.RECORDS_FILE))
    rewritten = json.loads((out / evaluation.RESULTS_FILE).read_text())
    assert rewritten["summary"] == summary2
    assert rewritten["config"]["n"] == 4 and rewritten["config"]["rescored_from"].endswith(evaluation.RECORDS_FILE)


def test_rescore_rejects_a_non_record_file(tmp_path):
    path = tmp_path / "x.jsonl"
    write_jsonl([{"problem": "p", "answer": "1"}], path)
    with pytest.raises(
        ValueError, match=r"x.jsonl: record 1: not an evaluation record \(missing benchmark, completions"
    ):
        tool.rescore(path)
    with pytest.raises(SystemExit, match="not an evaluation record"):
        run_tool(rescore=str(path))


def test_hf_engine_decodes_greedily_at_temperature_0(tiny_random_model, tokenizer):
    """T = 0 on the HF engine is transformers' own greedy decoding, whatever the seed, each token's log-prob taken
    under the logits themselves (as vLLM's greedy reports it); the evaluation then gives one completion a problem."""
    model = tiny_random_model[0]
    engine = HFEngine(model, stop_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    prompt = tokenizer("What is 3 + 4?").input_ids
    first, second = (engine.generate([prompt], 1, 8, 0.0, seed=[s])[0][0] for s in (0, 5))
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, pad_token_id=0)
        ids = want[0, len(prompt) :].tolist()
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    assert first.token_ids == second.token_ids == ids[: len(first.token_ids)] and len(first.token_ids) > 0
    logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[: len(first.token_ids), 0]
    torch.testing.assert_close(torch.tensor(first.logprobs), logp, atol=1e-4, rtol=0)
    summary, records = evaluation.evaluate(
        engine, tokenizer, {"a": [{"problem": "p", "answer": "1"}]}, "qwen_math", n=1, temperature=0.0, max_tokens=4
    )
    assert len(records) == 1 and len(records[0]["completions"]) == 1


def resolved(model):
    """(model path, results directory) as tools/evaluate.py resolves --model."""
    path, run = model_to_load(model)
    return path, tool.output_dir(tool.Args(model=model), path, run)


def test_model_flag_finds_the_export_or_the_checkpoint_and_the_run_dir(tmp_path):
    run = tmp_path / "runs" / "grpo_base"
    for step, complete in ((2, True), (4, True), (6, False)):  # checkpoint-6 is half-written
        (run / f"checkpoint-{step}" / "model").mkdir(parents=True)
        (run / f"checkpoint-{step}" / "model" / "config.json").write_text("{}")
        (run / f"checkpoint-{step}" / "model" / "tokenizer_config.json").write_text("{}")
        (run / f"checkpoint-{step}" / "accelerate").mkdir()
        (run / f"checkpoint-{step}" / "accelerate" / "state.bin").write_text("x")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"step": step}))
        if complete:
            write_manifest(run / f"checkpoint-{step}")
            (run / f"checkpoint-{step}" / "COMPLETE").write_text("ok\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "run_config.json").write_text('{"flags": {}}')  # the run's flags, not a model config
    model4 = str(run / "checkpoint-4" / "model")
    # A checkpoint's results go in the run's eval-checkpoint-N/, never over the final model's eval_results.json.
    assert resolved(str(run)) == (model4, run / "eval-checkpoint-4")
    assert resolved(str(run / "checkpoint-4")) == (model4, run / "eval-checkpoint-4")
    assert resolved(model4) == (model4, run / "eval-checkpoint-4")
    assert tool.checkpoint_of(model4, run) == "checkpoint-4"
    # A finished run: its exported model/ (with its own manifest) comes first.
    (run / "model").mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        (run / "model" / name).write_text("{}")
    write_manifest(run / "model")
    assert resolved(str(run)) == (str(run / "model"), run)
    plain = tmp_path / "my-model"
    plain.mkdir()
    with pytest.raises(SystemExit, match="has no config.json"):
        resolved(str(plain))
    (plain / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="has no tokenizer files"):
        resolved(str(plain))
    (plain / "tokenizer.json").write_text("{}")
    assert resolved(str(plain)) == (str(plain), Path("runs/eval/my-model"))
    assert resolved("Qwen/Qwen2.5-Math-7B") == ("Qwen/Qwen2.5-Math-7B", Path("runs/eval/Qwen__Qwen2.5-Math-7B"))
    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    (empty_run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(SystemExit, match="no exported model/ and no complete checkpoint"):
        resolved(str(empty_run))
    with pytest.raises(SystemExit, match="does not exist .* hub names look like org/name"):
        resolved(str(tmp_path / "typo" / "model"))


def test_each_problem_samples_under_its_own_seed(tiny_random_model):
    """Two identical problems must not get identical samples: one seed shared by every prompt makes
    vLLM's GPU sampler (and the HF engine's per-row generators) draw the same stream for each."""
    from common.evaluation import evaluate

    model, tok = tiny_random_model
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id)
    rows = [{"problem": "What is 3 + 4?", "answer": "7"}] * 2
    _, records = evaluate(engine, tok, {"twins": rows}, "qwen_math", n=4, temperature=1.0, max_tokens=12, seed=0)
    assert records[0]["completions"] != records[1]["completions"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n", "0"], "--n must be >= 1 (got 0)"),
        (["--k", "abc"], "--k must be comma-separated whole numbers"),
        (["--top_p", "1.5"], "--top_p must be > 0, <= 1"),
    ],
)
def test_bad_evaluation_flags_are_one_line_errors(argv, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        tool.validate(parse_args(tool.Args, argv=argv))


def test_problem_and_answer_fields_name_a_benchmarks_columns_as_in_training(tmp_path):
    """Your own benchmark in your own columns: --problem_field / --answer_field, as the training scripts take."""
    write_jsonl([{"q": {"text": "1 + 1?"}, "gold": "2"}, {"q": {"text": "2 + 3?"}, "gold": 5}], tmp_path / "mine.jsonl")
    args = parse_args(
        tool.Args,
        argv=["--benchmarks", f"mine={tmp_path / 'mine.jsonl'}", "--problem_field", "q.text", "--answer_field", "gold"],
    )
    got = evaluation.load_benchmarks(args.benchmarks, problem_field=args.problem_field, answer_field=args.answer_field)
    assert got == {"mine": [{"problem": "1 + 1?", "answer": "2"}, {"problem": "2 + 3?", "answer": "5"}]}
    with pytest.raises(SystemExit, match="--benchmarks: .*gold"):
        run_tool(benchmarks=f"mine={tmp_path / 'mine.jsonl'}", answer_field="nope", export_data=str(tmp_path / "x"))


@pytest.mark.slow
def test_training_evaluates_local_copies_offline(tmp_path):
    """Issue 40, item 8: a training run's --eval_benchmarks reaches local files as tools.evaluate's --benchmarks
    does (name=FILE, name=DIR holding name.jsonl, a file's own fields mapped), and offline, a benchmark it cannot
    load says so in one line that names only what the training scripts take."""
    from train_utils import run_cli, user_env

    copies = tmp_path / "benchmarks"
    write_jsonl([{"problem": f"What is {a} + 2?", "answer": str(a + 2)} for a in range(3)], copies / "math500.jsonl")
    write_jsonl([{"question": f"What is {a} + 3?", "gold": a + 3} for a in range(2)], tmp_path / "mine.jsonl")
    env = user_env() | {"HF_HUB_OFFLINE": "1"}
    flags = ["--rollout", "hf", "--prompts_per_step", "2", "--group_size", "2", "--max_completion_len", "4"]
    flags += ["--steps", "1", "--eval_steps", "1", "--eval_n", "1", "--eval_before", "false"]
    refused = run_cli(
        "grpo_base.py", "--output_dir", str(tmp_path / "a"), *flags, "--eval_benchmarks", "math500", env=env
    )
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 1 and len(lines) == 1, refused.stderr[-2000:]
    assert lines[0].startswith("error: --eval_benchmarks: benchmark 'math500': could not load HuggingFaceH4/MATH-500")
    assert "math500=path/to/math500.jsonl, or math500=DIR holding math500.jsonl" in lines[0]
    unquoted = re.sub(r"`[^`]*`", "", lines[0])  # a quoted `python -m tools.evaluate ...` has that tool's flags
    assert "--data_dir" not in unquoted and "--benchmarks" not in unquoted
    local = f"math500={copies},mine={tmp_path / 'mine.jsonl'}:problem=question:answer=gold"
    ran = run_cli("grpo_base.py", "--output_dir", str(tmp_path / "b"), *flags, "--eval_benchmarks", local, env=env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    last = json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["eval/math500/num_problems"] == 3 and last["eval/mine/num_problems"] == 2
