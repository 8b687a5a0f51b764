"""Reward terms for verifiable math, and a step's rewards (`compute_rewards`). A term maps the step's
completions and gold answers to one float per completion, `term(completions, answers, verifier)`: the
built-in REWARD_FUNCS, and `--reward_fn module:function` of your own (README, "Your own reward"). An answer
the verifier had no time to check is neither right nor wrong: `checked` says so.
A session scores a step with `Scorer.score` -> `Scores` (tensors on the training device); it keeps no count: the
run's health reads what it returns (`metrics.ScoreWatch`)."""

import importlib
import importlib.util
import inspect
import math
import numbers
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from common.answers import extract_answer, extract_boxed
from common.run_flags import RunFlags
from common.verifier import MathVerifier, default_workers

RewardFn = Callable[[list[str], list[str], MathVerifier], list[float]]


def accuracy_reward(completions: list[str], answers: list[str], verifier: MathVerifier) -> list[float | None]:
    """1.0 if the final answer (`extract_answer`) equals the gold one, else 0.0; None if left unchecked."""
    preds = [extract_answer(c) for c in completions]
    return [None if ok is None else float(ok) for ok in verifier.verify_batch(preds, answers)]


def boxed_format_reward(completions: list[str], answers=None, verifier=None) -> list[float]:
    """1.0 if the last box is complete and non-empty, else 0.0."""
    return [float(bool((extract_boxed(c) or "").strip())) for c in completions]


def _opened(c: str, prompt_ends_with_think: bool) -> str:
    """The completion as if it began with the "<think>" a chat template put at the end of the prompt."""
    return "<think>" + c if prompt_ends_with_think and not c.startswith("<think>") else c


def think_format_reward(
    completions: list[str], answers=None, verifier=None, *, prompt_ends_with_think: bool = False
) -> list[float]:
    """CW-GRPO's format term (arXiv 2605.11538, App. C): 1.0 for exactly one `<think>` and one `</think>`
    after it, else 0.0. `prompt_ends_with_think`: the template put the "<think>" (`_opened`)."""
    opened = [_opened(c, prompt_ends_with_think) for c in completions]
    return [
        float(c.count("<think>") == c.count("</think>") == 1 and c.index("<think>") < c.index("</think>"))
        for c in opened
    ]


_THINK_ANSWER_RE = re.compile(r"^<think>\n?.*?\n?</think>\s*<answer>\n?.*?\n?</answer>$", re.DOTALL)
_THINK_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def think_answer_format_reward(
    completions: list[str], answers=None, verifier=None, *, prompt_ends_with_think: bool = False
) -> list[float]:
    """The stricter R1 format: 1.0 for `<think>...</think> <answer>...</answer>` and nothing else, else 0.0."""
    opened = [_opened(c, prompt_ends_with_think) for c in completions]
    # Count first: it rules out nested/repeated tags the lazy regex would accept.
    return [float(all(c.count(t) == 1 for t in _THINK_TAGS) and _THINK_ANSWER_RE.match(c) is not None) for c in opened]


# DAPO's reward (arXiv 2503.14476) as verl computes it (verl/utils/reward_score/math_dapo.py): text, not
# symbolic, so "Answer: 0.5" against "\frac{1}{2}" is wrong.
_DAPO_TAIL_CHARS = 300
_DAPO_ANSWER = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
_DAPO_REWRITES = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]  # fmt: skip
_DAPO_DROPPED = [
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}",
    "\\;", ",\\!", "{,}", '"', "\\dots",
]  # fmt: skip


def dapo_normalize(answer: str) -> str:
    """Minerva's answer normalisation, as DAPO's reward applies it to both sides."""
    s = answer.split("=")[-1]  # "x = 5" -> " 5"
    for old, new in _DAPO_REWRITES:
        s = s.replace(old, new)
    for word in _DAPO_DROPPED:
        s = s.replace(word, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s)  # the first $...$ span only
    for macro in ("text", "textbf", "overline"):
        s = re.sub(rf"(\\{macro}\{{)(.*?)(\}})", r"\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", s)
    s = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)  # \frac12 -> \frac{1}{2}
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s)  # \sqrt2 -> \sqrt{2}
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():  # 1,000 -> 1000
        s = s.replace(",", "")
    return s.strip()


def dapo_reward(completions: list[str], answers: list[str], verifier=None) -> list[float]:
    """+1.0 if the last "Answer:" line of the final 300 characters equals the gold answer once both are
    normalised (`dapo_normalize`), else -1.0."""
    found = [_DAPO_ANSWER.findall(c[-_DAPO_TAIL_CHARS:]) for c in completions]
    return [1.0 if f and dapo_normalize(f[-1]) == dapo_normalize(gold) else -1.0 for f, gold in zip(found, answers)]


REWARD_FUNCS: dict[str, Callable[..., list]] = {
    "accuracy": accuracy_reward,
    "boxed_format": boxed_format_reward,
    "think_format": think_format_reward,
    "think_answer_format": think_answer_format_reward,
    "dapo": dapo_reward,
}


def load_reward_fn(spec: str) -> RewardFn:
    """The function "package.module:function" or "path/to/file.py:function" names; ValueError if it cannot be
    found. Whether training can call it is what `probe_reward_fn` finds out."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ValueError(f"{spec!r} is not module:function (e.g. my_rewards:brevity or path/to/rewards.py:brevity)")
    try:
        if where.endswith(".py") or "/" in where:
            path = Path(where).expanduser().resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # a module beside the user, as `python -c` would see it
            module = importlib.import_module(where)
    except Exception as e:  # noqa: BLE001 - the user's module: any failure is theirs to read
        raise ValueError(f"cannot import {where!r} ({type(e).__name__}: {e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{where!r} has no function {name!r}")
    return fn


class RewardFnError(ValueError):
    """A --reward_fn function raised, or returned something that is not one finite number per completion."""


PROBE_ROWS = 4  # dataset rows the probe takes at the least, spread over the data (`probe_indices`)


def stand_ins(answer: str) -> list[str]:
    """The probe's completions for gold `answer`: right, right but unboxed, wrong, empty."""
    return [
        f"The answer is \\boxed{{{answer}}}.",
        f"The answer is {answer}.",
        f"The answer is \\boxed{{{answer}1}}.",
        "",
    ]


def probe_reward_fn(fn: RewardFn, rows: list[dict], decode) -> RewardFn:
    """Call `fn` before any model loads as `common.rewards.Scorer.score` will (`stand_ins` for a few `rows`, a
    real verifier, `reward_columns`), so that an error stops the run now (`RewardFnError`), not after the first
    rollout."""
    indices = probe_indices(rows)
    picked = [rows[i] for i in indices]
    group = [r for r in picked for _ in stand_ins("")]  # each completion's row, as the sampler gives them
    completions = [c for r in picked for c in stand_ins(r["answer"])]
    columns = reward_columns(group, decode)
    try:
        with MathVerifier(workers=1) as verifier:
            custom_scores(fn, completions, [r["answer"] for r in group], verifier, columns)
    except RewardFnError as e:
        where = (
            f"called at start-up as training calls it, on stand-in completions for rows {', '.join(map(str, indices))}"
        )
        where += f" of the {len(rows)} loaded from --dataset; the keyword arguments it may take: {', '.join(columns)}"
        raise RewardFnError(f"{e} ({where})") from None
    return fn


def probe_indices(rows: list[dict]) -> list[int]:
    """PROBE_ROWS rows spread over the data, and the first row lacking each column some rows lack."""
    spread = {round(k * (len(rows) - 1) / (PROBE_ROWS - 1)) for k in range(PROBE_ROWS)}
    names = dict.fromkeys(k for r in rows for k in r.get("columns", {}))
    lacking = (next((i for i, r in enumerate(rows) if r.get("columns", {}).get(k) is None), None) for k in names)
    return sorted(spread | {i for i in lacking if i is not None})


def keyword_columns(fn, columns: dict[str, list]) -> dict[str, list]:
    """The `columns` `fn` takes as keyword arguments: all for a **kwargs, else those it names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(columns)
    return {k: v for k, v in columns.items() if k in params and params[k].kind is not inspect.Parameter.POSITIONAL_ONLY}


def reward_columns(rows: list[dict], decode) -> dict[str, list]:
    """The keyword arguments a reward function of yours may take, one value per completion, as TRL passes
    them: `prompts` (as the policy saw them), `problems`, and each dataset column (`load_prompts`)."""
    prompts = {}
    for r in rows:  # the G completions of a group share their row: decode its prompt once
        if id(r) not in prompts:
            prompts[id(r)] = decode(r["prompt_ids"]) if "prompt_ids" in r else r.get("problem", "")
    out = {"prompts": [prompts[id(r)] for r in rows], "problems": [r.get("problem") for r in rows]}
    names = dict.fromkeys(k for r in rows for k in r.get("columns", {}))
    reserved = {"completions", "answers", "verifier", *out}
    return out | {k: [r.get("columns", {}).get(k) for r in rows] for k in names if k not in reserved}


def custom_scores(
    fn: RewardFn, completions: list[str], answers: list[str], verifier, columns: dict[str, list] | None = None
) -> list[float]:
    """`fn`'s scores as floats (numpy / torch accepted); RewardFnError naming what it returned, or the first
    completion it raises on. `columns`: see `reward_columns`."""
    kwargs = keyword_columns(fn, columns or {})
    try:
        scores = fn(completions, answers, verifier, **kwargs)
    except Exception as error:  # noqa: BLE001 - the user's code: report it, with the completion at fault
        raise RewardFnError(_raised(fn, completions, answers, verifier, error, kwargs)) from None
    if getattr(scores, "ndim", None) == 1 and hasattr(scores, "tolist"):  # a numpy array or a torch tensor
        scores = scores.tolist()
    elif isinstance(scores, Iterable) and not isinstance(scores, (str, bytes, dict)) and getattr(scores, "ndim", 1):
        scores = list(scores)  # a tuple, a generator, ...
    if not isinstance(scores, list) or len(scores) != len(completions):
        got = f"{len(scores)} values" if isinstance(scores, list) else _shown(scores)
        raise RewardFnError(
            f"{_name(fn)} returned {got} for {len(completions)} completions; it must return one finite number per "
            "completion (a list, or a 1-d array)"
        )
    out = []
    for i, value in enumerate(scores):
        number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number):
            raise RewardFnError(
                f"{_name(fn)} returned {_shown(value)} for completion {i} (of {len(completions)}: "
                f"{completions[i][:60]!r}); it must return one finite number per completion"
            )
        out.append(number)
    return out


def _raised(fn, completions, answers, verifier, error: Exception, kwargs: dict) -> str:
    for i, (c, a) in enumerate(zip(completions, answers)):  # the first completion it fails on alone
        try:
            fn([c], [a], verifier, **{k: v[i : i + 1] for k, v in kwargs.items()})
        except Exception as e:  # noqa: BLE001
            return f"{_name(fn)} raised {_one_line(e)} on completion {i} (of {len(completions)}: {c[:60]!r})"
    return f"{_name(fn)} raised {_one_line(error)} on the batch of {len(completions)} completions"


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def _shown(value) -> str:
    text = f"{type(value).__name__} {value!r}" if not isinstance(value, (int, float)) or value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class Rewards:
    """A step's rewards, one entry per completion."""

    total: list[float]  # the sum of the reward terms (an unchecked accuracy counts 0)
    accuracy: list[float]  # 0/1 correctness, logged even when accuracy is not a reward term (unchecked: 0)
    checked: list[bool]  # False: the verifier ran out of its time budget before checking this answer
    terms: dict[str, list[float]] | None = None  # each term's scores (a function of your own under its name)


def compute_rewards(
    completions: list[str],
    answers: list[str],
    terms: list[str],
    verifier: MathVerifier,
    *,
    prompt_ends_with_think: bool = False,
    custom: list[RewardFn] = (),
    columns: dict[str, list] | None = None,
) -> Rewards:
    """Every named term (REWARD_FUNCS) and `custom` one (`custom_scores`), summed per completion. Accuracy
    is always computed, as the metric; with "dapo" among the terms it is DAPO's verdict, not math-verify's."""
    unknown = [name for name in terms if name not in REWARD_FUNCS]
    if unknown:
        raise ValueError(f"unknown reward name(s) {unknown}; valid choices: {sorted(REWARD_FUNCS)}")
    dapo = dapo_reward(completions, answers) if "dapo" in terms else None
    verdicts = [float(s > 0) for s in dapo] if dapo is not None else accuracy_reward(completions, answers, verifier)
    accuracy = [v or 0.0 for v in verdicts]
    total = [0.0] * len(completions)
    by_term = {}
    for name in terms:
        if name == "accuracy":
            scores = accuracy
        elif name == "dapo":
            scores = dapo
        elif name in ("think_format", "think_answer_format"):
            scores = REWARD_FUNCS[name](completions, prompt_ends_with_think=prompt_ends_with_think)
        else:
            scores = REWARD_FUNCS[name](completions, answers, verifier)
        total = [t + s for t, s in zip(total, scores)]
        by_term[name] = list(scores)
    for fn in custom:
        by_term[_name(fn)] = scores = custom_scores(fn, completions, answers, verifier, columns)
        total = [t + s for t, s in zip(total, scores)]
    return Rewards(total, accuracy, [v is not None for v in verdicts], by_term)


@dataclass
class Scores:
    """A step's rewards as tensors on the training device, one entry per completion."""

    reward: object  # [N] float: the sum of the reward terms
    accuracy: object  # [N] float: 0/1 correctness
    checked: object  # [N] bool: False where the verifier ran out of time before checking the answer
    record: Rewards | None = None  # the same as lists, each term's scores too, as `compute_rewards` gave them


@dataclass
class Scorer:
    verifier: object  # common.verifier.MathVerifier
    terms: list[str]  # --rewards
    custom: list  # --reward_fn's functions, probed at start
    opens_think: bool  # the template's prompt ends inside <think>
    decode: Callable[[list[int]], str]  # token ids -> text: the prompt as the policy saw it (--reward_fn columns)
    device: object  # where the tensors go

    def score(self, texts: list[str], rows: list[dict]) -> Scores:
        """Rewards of the step's completions `texts` (`rows`: each completion's dataset row). A --reward_fn of
        yours that raises, or returns other than one finite number per completion, stops the run in one line."""
        columns = reward_columns(rows, self.decode) if self.custom else None
        try:
            record = compute_rewards(
                texts, [row["answer"] for row in rows], self.terms, self.verifier,
                prompt_ends_with_think=self.opens_think, custom=self.custom, columns=columns,
            )  # fmt: skip
        except RewardFnError as e:
            raise SystemExit(f"error: --reward_fn: {e}") from None
        import torch  # here, not at the top: data/ tools and --help score without torch

        as_tensor = lambda x, dtype: torch.tensor(x, device=self.device, dtype=dtype)
        return Scores(
            as_tensor(record.total, torch.float32), as_tensor(record.accuracy, torch.float32),
            as_tensor(record.checked, torch.bool), record,
        )  # fmt: skip

    def close(self) -> None:
        self.verifier.close()


def open_scorer(run: RunFlags, terms: list[str], custom: list, opens_think: bool, tokenizer, device) -> Scorer:
    """The scorer, its verifier under --verifier_workers, --verifier_memory_mb and --reward_time_budget_s."""
    verifier = MathVerifier(
        workers=run.verifier_workers or default_workers(),
        memory_mb=run.verifier_memory_mb,
        budget_s=run.reward_time_budget_s or None,
    )
    return Scorer(verifier, terms, custom, opens_think, tokenizer.decode, device)


def without_unchecked_groups(advantages, checked, G: int):
    """`advantages` ([N] or [N, C]) with every group of G holding an unchecked answer (`checked` False) set to 0
    (every script does this): its rewards would score that answer wrong, a guess; no advantage beats a wrong one."""
    keep = checked.view(-1, G).all(1).repeat_interleave(G).float()
    return advantages * keep.view(-1, *[1] * (advantages.dim() - 1))
