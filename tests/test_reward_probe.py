"""The start-up probe of a --reward_fn against training's own call (issue 40, item 8): a function that works in
training passes the probe, one that fails in training fails at start-up, whatever arguments it reads (the three
positional ones, prompts, problems, a dataset column, **kwargs)."""

import json
import re

import pytest

from common.math_data import load_prompts
from common.models import SHIPPED_DIR
from common.rewards import RewardFnError, probe_reward_fn
from common.verifier import MathVerifier

G = 4  # completions per prompt in the training calls below


def plain(completions, answers, verifier):
    return [float(bool(c)) for c in completions]


def reads_prompts(completions, answers, verifier, prompts):
    assert all("What is" in p and "boxed" in p for p in prompts)  # the prompt as rendered: the template's words too
    return [float(len(p) > 0) for p in prompts]


def reads_problems(completions, answers, verifier, *, problems):
    return [float(q.startswith("What is")) for q in problems]


def reads_column(completions, answers, verifier, difficulty=None):
    return [0.1 * (d == "hard") for d in difficulty]  # None: TypeError, as the user's did


def reads_kwargs(completions, answers, verifier, **kwargs):
    return [0.1 * (d == "hard") for d in kwargs["difficulty"]]


def reads_column_text(completions, answers, verifier, difficulty):
    return [0.1 * d.startswith("h") for d in difficulty]  # a row lacking the column: None.startswith fails


def requires_absent(completions, answers, verifier, level):
    return [0.0] * len(completions)


def reads_absent_kwarg(completions, answers, verifier, **kwargs):
    return [0.0 if kwargs["level"] else 1.0 for _ in completions]


def none_on_empty(completions, answers, verifier):
    return [None if not c else 1.0 for c in completions]


def uses_verifier(completions, answers, verifier):
    return [float(bool(ok)) for ok in verifier.verify_batch([c[-3:] for c in completions], answers)]


# function -> the datasets it works on in training (the others: it fails there)
FUNCTIONS = {
    plain: {"full", "some_lack_difficulty"},
    reads_prompts: {"full", "some_lack_difficulty"},
    reads_problems: {"full", "some_lack_difficulty"},
    reads_column: {"full", "some_lack_difficulty"},  # None == "hard" is False: no error
    reads_kwargs: {"full", "some_lack_difficulty"},
    reads_column_text: {"full"},
    requires_absent: set(),
    reads_absent_kwarg: set(),
    none_on_empty: set(),
    uses_verifier: {"full", "some_lack_difficulty"},
}


def write_data(path, lacking: set[int]) -> str:
    rows = []
    for i in range(23):
        row = {"question": f"What is {i % 10} + {i // 10}?", "gold": str(i % 10 + i // 10), "sol": "..."}
        if i not in lacking:
            row["difficulty"] = ["easy", "hard"][i % 2]
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR)
    out = {}
    for name, lacking in (("full", set()), ("some_lack_difficulty", {9})):  # row 9: no spread pick lands on it
        path = write_data(tmp_path_factory.mktemp(name) / "d.jsonl", lacking)
        rows, _ = load_prompts(
            path, tokenizer, "qwen_math", 256, problem_field="question", answer_field="gold", say=print
        )
        out[name] = rows
    return tokenizer, out


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(workers=1) as v:
        yield v


def training_outcome(fn, rows, tokenizer, verifier) -> str | None:
    """What training's scoring (`Scorer.score`) says over a whole epoch, G completions a prompt: None, or its error."""
    from common.rewards import Scorer

    scorer = Scorer(verifier, [], [fn], False, tokenizer.decode, "cpu")
    for start in range(0, len(rows), 2):  # 2 prompts a step
        step = [r for r in rows[start : start + 2] for _ in range(G)]
        texts = [f"So {r['answer']}. \\boxed{{{r['answer']}}}" if j % 2 else "" for j, r in enumerate(step)]
        try:
            scorer.score(texts, step)
        except SystemExit as e:
            return str(e)
    return None


@pytest.mark.parametrize("dataset", ["full", "some_lack_difficulty"])
@pytest.mark.parametrize("fn", list(FUNCTIONS), ids=lambda f: f.__name__)
def test_the_probe_passes_exactly_what_training_passes(fn, dataset, datasets, verifier):
    tokenizer, data = datasets
    rows = data[dataset]
    trained = training_outcome(fn, rows, tokenizer, verifier)
    assert (trained is None) == (dataset in FUNCTIONS[fn]), trained
    if trained is None:
        assert probe_reward_fn(fn, rows, tokenizer.decode) is fn
        return
    with pytest.raises(RewardFnError) as probe:
        probe_reward_fn(fn, rows, tokenizer.decode)
    message = str(probe.value)
    assert message.startswith(fn.__name__) and "\n" not in message
    assert "called at start-up as training calls it" in message
    if m := re.search(r"(raised \w+: .*?) on (completion|the batch)", trained):  # the same error as training's
        assert m.group(1) in message, (trained, message)
    assert "question, gold, sol, difficulty" in message  # what it may take, named


@pytest.mark.slow
def test_a_column_reward_trains_and_a_missing_one_stops_at_start(tmp_path):
    """The user's case: --reward_fn reading a `difficulty` column trains; one requiring a column the data lacks
    stops before any model loads, in one line naming the columns it may take."""
    from train_utils import run_cli

    data = write_data(tmp_path / "d.jsonl", set())
    (tmp_path / "my.py").write_text(
        "def diff_bonus(completions, answers, verifier, difficulty=None):\n"
        "    return [0.1 if d == 'hard' else 0.0 for d in difficulty]\n\n"
        "def needs_level(completions, answers, verifier, level):\n    return [0.0] * len(completions)\n"
    )
    flags = ["--dataset", data, "--problem_field", "question", "--answer_field", "gold", "--rollout", "hf"]
    flags += ["--prompts_per_step", "2", "--group_size", "2", "--max_completion_len", "4", "--steps", "1"]
    ok = run_cli(
        "grpo_base.py", "--output_dir", str(tmp_path / "a"), *flags, "--reward_fn", f"{tmp_path}/my.py:diff_bonus"
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = run_cli(
        "grpo_base.py", "--output_dir", str(tmp_path / "b"), *flags, "--reward_fn", f"{tmp_path}/my.py:needs_level"
    )
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 1 and len(lines) == 1, bad.stderr[-2000:]
    assert lines[0].startswith(
        "error: --reward_fn: needs_level raised TypeError: needs_level() missing 1 required positional argument: 'level'"
    )
    assert "may take: prompts, problems, question, gold, sol, difficulty" in lines[0]
    assert "loading" not in bad.stdout  # no model loaded
