"""The sampling flags of tools.evaluate and of the evaluation during training against what the engines accept
(issue 40, item 8: `--temperature 0 --n 4` ended in vLLM's traceback). Every combination an engine refuses, or
silently changes, is refused as the flags are read, in one line naming the fix; every one vLLM samples as asked
is accepted. The engines are the judges: vLLM's own SamplingParams, and the HF engine's log-probs held to
log_softmax(logits / T) of the model it samples."""

import itertools
import math

import pytest

from common.cli import parse_args
from common.run_flags import RunFlags

TEMPERATURES = [0.0, 1e-6, 0.005, 0.01, 0.6, 2.0, 2.5, math.inf, math.nan, -0.1]
NS = [1, 4]
TOP_PS = [1.0, 0.95, 0.0, 1.5]
MAX_TOKENS = [1, 0]
CELLS = list(itertools.product(["vllm", "hf"], TEMPERATURES, NS, TOP_PS, MAX_TOKENS))


def evaluate_refuses(rollout, temperature, n, top_p, max_tokens) -> str | None:
    """tools.evaluate's verdict as its command line reads the flags: None (accepted) or its one-line error."""
    import tools.evaluate as tool

    argv = ["--rollout", rollout, "--temperature", str(temperature), "--n", str(n), "--top_p", str(top_p)]
    argv += ["--max_tokens", str(max_tokens)]
    try:
        tool.validate(parse_args(tool.Args, argv=argv))
    except SystemExit as e:
        return str(e)
    return None


def training_refuses(rollout, temperature, n, top_p, max_tokens) -> str | None:
    """A training script's verdict on its evaluation's flags (--top_p and --max_completion_len are the rollout's)."""
    import grpo_base

    argv = ["--eval_steps", "1", "--rollout", rollout, "--eval_temperature", str(temperature), "--eval_n", str(n)]
    argv += ["--top_p", str(top_p), "--max_completion_len", str(max_tokens)]
    try:
        grpo_base.validate(*parse_args(grpo_base.Args, RunFlags, argv=argv))
    except SystemExit as e:
        return str(e)
    return None


PROGRAMS = {
    "tools.evaluate": (evaluate_refuses, ["--temperature", "--n", "--top_p", "--max_tokens"]),
    "training": (training_refuses, ["--eval_temperature", "--eval_n", "--top_p", "--max_completion_len"]),
}


def vllm_accepts(temperature, n, top_p, max_tokens) -> bool:
    """vLLM's SamplingParams, as the engine builds them, takes the values and keeps them (no silent change)."""
    vllm = pytest.importorskip("vllm")
    try:
        params = vllm.SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0)
    except Exception:  # noqa: BLE001 - vLLM's validation error, whatever its class
        return False
    return params.temperature == temperature and (temperature == 0 or params.top_p == top_p)  # greedy: top_p unused


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.models import SHIPPED_DIR
    from common.rollout import HFEngine

    tok = AutoTokenizer.from_pretrained(SHIPPED_DIR)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR)
    return HFEngine(model, [tok.eos_token_id], tok.pad_token_id), model, tok("What is 3 + 4?").input_ids


def hf_accepts(hf, temperature, n, top_p, max_tokens) -> bool:
    """The HF engine samples under logits / T as it says: its completions' log-probs are log_softmax(logits / T) of
    the tokens it drew (top_p 1; a smaller nucleus renormalises them, and vLLM judges top_p); at T = 0 one
    completion, each token the most likely."""
    import torch

    engine, model, prompt = hf
    if max_tokens < 1 or n < 1 or (temperature == 0 and n > 1):  # greedy: n copies of one completion, not n samples
        return False
    try:
        group = engine.generate([prompt], n, max_tokens, temperature, 1.0, seed=[0])[0]
    except Exception:  # noqa: BLE001
        return False
    with torch.no_grad():
        for c in group:
            logits = model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1].float()
            z = logits / temperature if temperature else logits  # greedy: the most likely token, under the logits
            want = torch.log_softmax(z, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            if temperature == 0 and c.token_ids != z.argmax(-1).tolist():
                return False
            if not torch.isfinite(want).all() or not torch.allclose(torch.tensor(c.logprobs), want, atol=1e-3):
                return False
    return True


@pytest.mark.vllm
@pytest.mark.parametrize("program", PROGRAMS)
def test_vllm_sampling_flags_are_refused_exactly_where_vllm_refuses_them(program):
    refuses, names = PROGRAMS[program]
    wrong = []
    for rollout, t, n, top_p, max_tokens in CELLS:
        if rollout != "vllm":
            continue
        message = refuses(rollout, t, n, top_p, max_tokens)
        if (message is None) != vllm_accepts(t, n, top_p, max_tokens):
            wrong.append((t, n, top_p, max_tokens, message))
        elif message is not None:
            assert message.startswith("error: --") and "\n" not in message, message
            assert any(f"{flag} " in message for flag in names), message
    assert not wrong, f"{program} and vLLM disagree on (temperature, n, top_p, max_tokens, message): {wrong}"


@pytest.mark.parametrize("program", PROGRAMS)
def test_what_the_hf_engine_cannot_sample_is_refused(program, hf):
    """Every cell where the HF engine would not sample as asked is refused; the program refuses no more than the
    flags' documented ranges (top_p in (0, 1], max_tokens >= 1, a finite temperature >= 0) besides."""
    refuses, _ = PROGRAMS[program]
    seen = {}
    for rollout, t, n, top_p, max_tokens in CELLS:
        if rollout != "hf":
            continue
        message = refuses(rollout, t, n, top_p, max_tokens)
        key = (t, n, max_tokens)
        if key not in seen:
            seen[key] = hf_accepts(hf, t, n, top_p, max_tokens) if not math.isnan(t) else False
        in_range = 0 < top_p <= 1 and max_tokens >= 1 and 0 <= t < math.inf
        if not seen[key] or not in_range:
            assert message is not None, (t, n, top_p, max_tokens)
        else:
            assert message is None, (t, n, top_p, max_tokens, message)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperature", "0", "--n", "4"], "error: --temperature 0 is greedy decoding, one completion a prompt: "
         "use --n 1 (not 4)"),
        (["--temperature", "0"], "use --n 1 (not 8)"),  # --n's default: greedy does not pick n for you
        (["--temperature", "0", "--n", "2", "--rollout", "hf"], "use --n 1 (not 2), or a temperature above 0"),
        (["--seed", "-1"], "--seed must be >= 0 (got -1)"),  # vLLM reads a seed of -1 as none: unseeded, silently
    ],
)  # fmt: skip
def test_the_users_greedy_command_and_its_kin_get_one_line(argv, message):
    import tools.evaluate as tool

    with pytest.raises(SystemExit) as e:
        tool.validate(parse_args(tool.Args, argv=["--rollout", "vllm", *argv]))
    assert str(e.value).startswith(message) if message.startswith("error") else message in str(e.value)
    assert tool.validate(parse_args(tool.Args, argv=["--rollout", "vllm", "--temperature", "0", "--n", "1"])) is None


def test_k_above_n_is_a_note_and_summarised_without_it(capsys):
    """k > n is no engine's concern: the tool says so and pass@k leaves those k out."""
    import tools.evaluate as tool
    from common.evaluation import summarize

    ks = tool.validate(
        parse_args(tool.Args, argv=["--n", "1", "--k", "1,8", "--temperature", "0", "--rollout", "vllm"])
    )
    assert ks == [1, 8] and "k > --n 1 is skipped" in capsys.readouterr().out
    record = {"benchmark": "a", "correct": [True], "num_tokens": [3], "finished": [True]}
    assert set(summarize([record], ks)) >= {"eval/a/pass@1"} and "eval/a/pass@8" not in summarize([record], ks)
