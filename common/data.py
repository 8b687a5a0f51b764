"""Prompt templates, math datasets and the per-step prompt sampler.

Every dataset is reduced to rows ``{"problem": str, "answer": str, "solution": str | None}``:
`answer` is the gold final answer the reward checks against, `solution` a
reference worked solution (EDGE-GRPO's guided error correction needs it, the
other algorithms ignore it).

Sources are local files (``.jsonl``, ``.json``, ``.parquet`` or a directory
holding them) or Hugging Face hub names. The hub needs a network, so every
code path is also reachable through a local copy of the same data: a known
dataset's field mapping can be applied to a local file with ``preset=``.

Templates are shared by training and evaluation so that a model is always
evaluated with the prompt it was trained on.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------
# Prompt templates
# ---------------------------------------------------------------------------

QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

# The R1-Zero style instruction of Open-RS, used by CW-GRPO (arXiv 2605.11538, App. B).
# The prompt stops at the assistant turn: the model writes <think> itself, so
# the format reward checks tags the policy produced.
R1_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the "
    "Assistant solves it. The assistant first thinks about the reasoning process in "
    "the mind and then provides the user with the answer, and put your final answer "
    "within \\boxed{} . The reasoning process and answer are enclosed within <think> "
    "</think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think> <answer> answer here </answer>. Note that respond by "
    "English, NOT use other languages."
)


def _chatml(system: str) -> str:
    """Qwen2.5 chat markup with a fixed system turn and a `{problem}` slot."""
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{{problem}}<|im_end|>\n<|im_start|>assistant\n"


# `{problem}` is substituted with str.replace, never str.format: both the
# templates (\boxed{}) and the problems (LaTeX) are full of braces.
TEMPLATES: dict[str, str] = {
    "qwen_math": _chatml(QWEN_MATH_SYSTEM),
    "r1": _chatml(R1_SYSTEM),
    "plain": "Question: {problem}\nAnswer:",  # base models without chat markup
}


# Rendered with the model's own chat template instead of fixed markup: models
# whose chat format is not ChatML (DeepSeek-R1-Distill: <｜User｜>...<｜Assistant｜>,
# which may also open the <think> block itself). System turn -> instruction.
NATIVE_TEMPLATES: dict[str, str] = {"qwen_math_native": QWEN_MATH_SYSTEM, "r1_native": R1_SYSTEM}
TEMPLATE_CHOICES = [*TEMPLATES, *NATIVE_TEMPLATES]


def format_prompt(problem: str, template: str = "qwen_math", tokenizer=None) -> str:
    """Render `problem` into the named prompt template (`*_native` ones need the model's tokenizer)."""
    if template in NATIVE_TEMPLATES:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"template {template!r} renders with the model's chat template, and this tokenizer has none; "
                f"use {template.removesuffix('_native')!r} (Qwen ChatML markup) instead"
            )
        messages = [{"role": "system", "content": NATIVE_TEMPLATES[template]}, {"role": "user", "content": problem}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose one of {TEMPLATE_CHOICES}")
    return TEMPLATES[template].replace("{problem}", problem)


def prompt_opens_think(template: str, tokenizer=None) -> bool:
    """Does the rendered prompt already open the <think> block? (Then the format
    reward must not expect the completion to write `<think>` itself.)"""
    return format_prompt("1 + 1", template, tokenizer).rstrip().endswith("<think>")


# ---------------------------------------------------------------------------
# Synthetic arithmetic: a task that needs no download (CPU demo, learning tests)
# ---------------------------------------------------------------------------

SYNTHETIC_NAME = "synthetic-arith"
# Single-digit sums: 100 problems, few enough that a ~1M-parameter model learns
# them in a minute of SFT. The demo trains and evaluates on the same 100
# problems: it shows RL raising the accuracy of a policy, not generalisation.
SYNTHETIC_MAX_OPERAND = 9
SYNTHETIC_EVAL_SEED = 20250
SYNTHETIC_EVAL_SIZE = (SYNTHETIC_MAX_OPERAND + 1) ** 2
SYNTHETIC_TRAIN_SEED = 0
SYNTHETIC_TRAIN_SIZE = (SYNTHETIC_MAX_OPERAND + 1) ** 2
SYNTHETIC_EVAL_PATH = Path(__file__).resolve().parent.parent / "data" / "synthetic_arith_eval.jsonl"

_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def synthetic_arithmetic(
    n: int,
    seed: int,
    max_operand: int = 99,
    ops: str = "+",
    exclude: Iterable[str] = (),
) -> list[dict]:
    """`n` distinct problems "What is a <op> b?" with operands in [0, max_operand].

    Each op in `ops` (any of "+", "-", "*") is drawn uniformly. For "-" the
    operands are ordered so that answers are never negative (one less thing
    for a tiny model to learn). Problems whose text is in `exclude` are never
    drawn: training sets exclude the evaluation set. Deterministic given the
    arguments.
    """
    if not ops or any(op not in _OPS for op in ops):
        raise ValueError(f"ops must be a non-empty string of {sorted(_OPS)}, got {ops!r}")
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    ops = "".join(dict.fromkeys(ops))  # "++-" -> "+-": duplicates would skew the op mix
    m = max_operand + 1
    space = sum(m * (m + 1) // 2 if op == "-" else m * m for op in ops)
    excluded = set(exclude)
    if n > space - len(excluded):  # conservative: some excluded texts may lie outside the space
        raise ValueError(
            f"asked for {n} distinct problems but only {space} exist "
            f"(ops={ops!r}, max_operand={max_operand}, {len(excluded)} excluded)"
        )

    rng = random.Random(seed)
    rows, seen = [], set(excluded)
    while len(rows) < n:
        op = rng.choice(ops)
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if op == "-" and a < b:
            a, b = b, a
        problem = f"What is {a} {op} {b}?"
        if problem in seen:
            continue
        seen.add(problem)
        c = _OPS[op](a, b)
        rows.append(
            {
                "problem": problem,
                "answer": str(c),
                # Short on purpose: a tiny model is SFT'd on it before RL.
                "solution": f"{a} {op} {b} = {c}. The answer is \\boxed{{{c}}}.",
            }
        )
    return rows


def synthetic_eval_set() -> list[dict]:
    """The fixed evaluation set shipped as data/synthetic_arith_eval.jsonl."""
    return synthetic_arithmetic(SYNTHETIC_EVAL_SIZE, seed=SYNTHETIC_EVAL_SEED, max_operand=SYNTHETIC_MAX_OPERAND)


# ---------------------------------------------------------------------------
# Field mappings of known datasets
# ---------------------------------------------------------------------------

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response "
    "should be of the form Answer: $Answer (without quotes) where $Answer is the "
    "answer to the problem."
)
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'


def strip_dapo_instruction(text: str) -> str:
    """Remove DAPO-Math-17k's "Answer:"-format wrapper, leaving the bare problem.

    The wrapper asks for an "Answer: ..." last line, which contradicts our
    \\boxed{} templates, so it must not reach the policy.
    """
    text = text.strip()
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX) :]
    if text.endswith(DAPO_SUFFIX):
        text = text[: -len(DAPO_SUFFIX)]
    return text.strip()


@dataclass(frozen=True)
class FieldMap:
    """Where a dataset keeps problem / answer / solution (dotted paths reach nested fields)."""

    problem: str = "problem"
    answer: str = "answer"
    solution: str | None = "solution"
    problem_transform: Callable[[str], str] | None = None
    config: str | None = None  # hub config (subset) name


DATASET_PRESETS: dict[str, FieldMap] = {
    "agentica-org/DeepScaleR-Preview-Dataset": FieldMap(),
    # prompt = [{"role": "user", "content": <wrapped problem>}],
    # reward_model = {"ground_truth": ..., "style": "rule-lighteval/MATH_v2"}; no solution.
    "BytedTsinghua-SIA/DAPO-Math-17k": FieldMap(
        problem="prompt", answer="reward_model.ground_truth", solution=None, problem_transform=strip_dapo_instruction
    ),
    "knoveleng/open-rs": FieldMap(),
    # Configs "default" (94K) and "extended" (131K); EGPO draws from both.
    "open-r1/OpenR1-Math-220k": FieldMap(config="default"),
}

_FILE_EXTS = (".jsonl", ".json", ".parquet")


def _get_path(row: dict, path: str) -> Any:
    """row["a"]["b"] for path "a.b"; integer parts index lists. KeyError if absent."""
    value: Any = row
    for part in path.split("."):
        if isinstance(value, dict):
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit():
            value = value[int(part)]
        else:
            raise KeyError(part)
    return value


def _available_fields(row: dict, path: str) -> list[str]:
    """The keys present at the level where `path` stops resolving (for error messages)."""
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            break
        value = value[part]
    return sorted(value) if isinstance(value, dict) else []


def _as_text(value: Any) -> str:
    """Field value -> text; a chat-message list gives its (last) user message."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        user = [m for m in value if m.get("role") == "user"] or list(value)
        return str(user[-1].get("content", ""))
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], (str, int, float)):
        value = value[0]
    return str(value).strip()


def _is_answer(value: Any) -> bool:
    """A gold answer is a string or a number; a one-item list of one is that item (some datasets
    wrap answers in lists). Booleans, dicts and longer lists would be stringified into nonsense."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and bool(str(value).strip())


def _looks_like_path(source: str) -> bool:
    return os.path.exists(source) or source.endswith(_FILE_EXTS) or source.startswith(("/", "./", "../", "~"))


def _data_files(directory: Path, split: str) -> list[Path]:
    """Data files in a directory (e.g. a hub snapshot): top level first, else recursive."""
    for pattern in ("*", "**/*"):
        files = sorted(p for p in directory.glob(pattern) if p.is_file() and p.name.endswith(_FILE_EXTS))
        if files:
            break
    else:
        raise FileNotFoundError(f"no {'/'.join(_FILE_EXTS)} file in directory {directory}")
    # Hub snapshots name shards after their split (train-00000-of-00002.parquet).
    matching = [p for p in files if split in p.name]
    files = matching or files
    exts = {p.suffix for p in files}
    if len(exts) > 1:
        raise ValueError(f"directory {directory} mixes file types {sorted(exts)}; pass one file as --source")
    return files


def _read_file(path: Path, split: str) -> Iterator[dict]:
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from e
    elif path.suffix == ".json":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if isinstance(data, dict):  # {"train": [...], "test": [...]} or {"data": [...]}
            lists = {k: v for k, v in data.items() if isinstance(v, list)}
            data = lists.get(split) or lists.get("data") or (next(iter(lists.values())) if len(lists) == 1 else None)
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of rows (or a dict holding one)")
        yield from data
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            yield from batch.to_pylist()
    else:
        raise ValueError(f"unsupported file type {path.suffix!r}; use one of {_FILE_EXTS}")


def _raw_rows(source: str, split: str, config: str | None) -> Iterator[dict]:
    if _looks_like_path(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"dataset file not found: {source}")
        for f in _data_files(path, split) if path.is_dir() else [path]:
            yield from _read_file(f, split)
        return
    try:
        import datasets

        ds = datasets.load_dataset(source, config, split=split)
    except Exception as e:  # offline, unknown name, bad split: all surface here
        raise RuntimeError(
            f"could not load {source!r} (config={config}, split={split}) from the Hugging Face hub: "
            f"{type(e).__name__}: {e}\nThe hub may be unreachable (no network here) or the name is "
            f"wrong. Download the dataset elsewhere and pass a local .jsonl/.json/.parquet file (or "
            f"a directory holding one) as the source instead."
        ) from e
    yield from ds


def iter_math_dataset(
    source: str,
    split: str = "train",
    problem_field: str | None = None,
    answer_field: str | None = None,
    solution_field: str | None = None,
    limit: int | None = None,
    preset: str | None = None,
    config: str | None = None,
    strict: bool = False,
) -> Iterator[dict]:
    """Stream `{"problem", "answer", "solution"}` rows; see `load_math_dataset`. `strict`: an answer
    that is not a string or a number (missing, empty, a bool, a dict, a list of several) becomes
    None instead of its text, for the caller to count and refuse or drop."""
    if source == SYNTHETIC_NAME:
        if split == "train":
            rows = synthetic_arithmetic(
                SYNTHETIC_TRAIN_SIZE, seed=SYNTHETIC_TRAIN_SEED, max_operand=SYNTHETIC_MAX_OPERAND
            )
        elif split in ("test", "eval", "validation"):
            rows = synthetic_eval_set()
        else:
            raise ValueError(f"{SYNTHETIC_NAME} has splits 'train' and 'test', not {split!r}")
        yield from rows[:limit]
        return

    preset = preset or source
    fmap = DATASET_PRESETS.get(preset)
    if fmap is None and preset != source:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(DATASET_PRESETS)}")
    fmap = fmap or FieldMap()
    fields = {
        "problem": problem_field or fmap.problem,
        "answer": answer_field or fmap.answer,
        "solution": solution_field or fmap.solution,
    }
    # Only an explicitly requested solution field must exist; by default it is optional.
    required = {"problem", "answer"} | ({"solution"} if solution_field else set())

    count = 0
    for i, raw in enumerate(_raw_rows(source, split, config or fmap.config)):
        if limit is not None and count >= limit:
            return
        row = {}
        for key, path in fields.items():
            if path is None:
                row[key] = None
                continue
            try:
                value = _get_path(raw, path)
            except (KeyError, IndexError, TypeError):
                if i == 0 and key in required:
                    have = _available_fields(raw, path)
                    raise ValueError(
                        f"{key} field {path!r} not found in {source} (its fields: {', '.join(have) or 'none'}). "
                        f"Pass --{key}_field with the field that holds the {key} "
                        f"(dotted paths such as reward_model.ground_truth reach nested fields)."
                    ) from None
                if i == 0 and key == "solution":
                    fields["solution"] = None  # the dataset has no solutions: stop looking
                value = None
            row[key] = value
        problem = _as_text(row["problem"])
        if fmap.problem_transform is not None and not problem_field:
            problem = fmap.problem_transform(problem)
        solution = _as_text(row["solution"]) or None
        answer = _as_text(row["answer"]) if not strict or _is_answer(row["answer"]) else None
        yield {"problem": problem, "answer": answer or (None if strict else ""), "solution": solution}
        count += 1


def load_math_dataset(
    source: str,
    split: str = "train",
    problem_field: str | None = None,
    answer_field: str | None = None,
    solution_field: str | None = None,
    limit: int | None = None,
    preset: str | None = None,
    config: str | None = None,
) -> list[dict]:
    """Load rows `{"problem": str, "answer": str, "solution": str | None}`.

    source: a local ``.jsonl`` / ``.json`` / ``.parquet`` file, a directory
        holding such files (all shards are read; names containing `split` are
        preferred), a hub dataset name, or "synthetic-arith" (generated; split
        "train" or "test": the same 100 sums in two orders, "test" = the shipped eval file).
    *_field: where the field lives, dotted for nested fields
        (``reward_model.ground_truth``); they override the built-in mapping of
        known datasets (`DATASET_PRESETS`). A problem field holding a chat
        message list yields its last user message.
    preset: apply a known dataset's mapping to a local copy of it, e.g.
        ``preset="BytedTsinghua-SIA/DAPO-Math-17k"`` for a downloaded parquet.
    config: hub config (subset); defaults to the preset's.

    Rows with empty answers are kept (answer ""); the `data.prepare` commands
    drop them. A missing solution is None.
    """
    return list(iter_math_dataset(source, split, problem_field, answer_field, solution_field, limit, preset, config))


def load_prompts(args, tokenizer, say=print) -> tuple[list[dict], bool]:
    """The rows of `--dataset` (with `--problem_field` / `--answer_field` / `--solution_field`),
    each with its prompt rendered by `--template` and tokenised ("prompt_ids"), the ones longer
    than `--max_prompt_len` dropped and counted; and whether the prompt opens the <think> block.

    A row without a problem or a usable answer (missing, empty, not a string or a number) would
    train at reward 0: `--bad_rows error` refuses the data, naming how many and the first;
    `--bad_rows drop` drops them with a count. Repeated problems are counted, and kept.
    A problem stops the run with one line naming the flag."""
    from common.cli import clear_errors, require

    with clear_errors("--dataset"):
        rows = list(
            iter_math_dataset(
                args.dataset, problem_field=args.problem_field, answer_field=args.answer_field,
                solution_field=args.solution_field, strict=True,
            )
        )  # fmt: skip
    require(rows, f"--dataset: {args.dataset} has no rows")
    bad = [i for i, r in enumerate(rows) if not r["problem"].strip() or r["answer"] is None]
    if bad:
        first = rows[bad[0]]
        what = f"{len(bad)} of {len(rows)} rows have no problem or no usable gold answer (row {bad[0]}: answer {first['answer']!r}, problem {first['problem'][:60]!r})"
        require(
            args.bad_rows == "drop",
            f"--dataset: {what}; fix the data, name the fields (--answer_field), or --bad_rows drop",
        )
        say(f"dropped {what}")
        dropped = set(bad)
        rows = [r for i, r in enumerate(rows) if i not in dropped]
        require(rows, f"--dataset: no usable row left in {args.dataset}")
    repeated = len(rows) - len({r["problem"] for r in rows})
    if repeated:
        say(f"note: {repeated} of {len(rows)} problems in --dataset repeat an earlier one (kept)")
    with clear_errors("--template"):
        for r in rows:
            r["prompt_ids"] = tokenizer(
                format_prompt(r["problem"], args.template, tokenizer), add_special_tokens=False
            ).input_ids
        opens_think = prompt_opens_think(args.template, tokenizer)  # then completions start inside <think>
    kept = [r for r in rows if len(r["prompt_ids"]) <= args.max_prompt_len]
    require(kept, f"--max_prompt_len: all {len(rows)} prompts are longer than {args.max_prompt_len} tokens; raise it")
    if len(kept) < len(rows):
        say(
            f"dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than --max_prompt_len={args.max_prompt_len}"
        )
    return kept, opens_think


def write_jsonl(rows: Iterable[dict], path: str | os.PathLike) -> int:
    """Write rows as JSON lines (parent directories created); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


# ---------------------------------------------------------------------------
# Prompt sampler
# ---------------------------------------------------------------------------


class PromptSampler:
    """Seeded, epoch-by-epoch prompt order, `prompts_per_step` global prompts a step.

    Every rank builds the same global order (epoch e is shuffled with seed + e)
    and keeps its contiguous share of each step's global batch, so a prompt's
    whole group of completions is generated and trained on one rank. Batches
    run on across epoch boundaries: every row is drawn exactly once per epoch
    and no data is dropped. The cursor is global, so a run can resume with a
    different world size.
    """

    def __init__(self, rows: list[dict], prompts_per_step: int, seed: int, rank: int = 0, world_size: int = 1):
        if not rows:
            raise ValueError("PromptSampler got an empty dataset")
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if prompts_per_step % world_size:
            raise ValueError(
                f"prompts_per_step ({prompts_per_step}) must be divisible by the "
                f"number of processes ({world_size}) so that each rank gets whole prompts"
            )
        self.rows, self.prompts_per_step, self.seed = rows, prompts_per_step, seed
        self.rank, self.world_size = rank, world_size
        self._epoch, self._pos, self._step = 0, 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed + epoch).shuffle(order)
        return order

    @property
    def epoch(self) -> int:
        """Epoch (0-based) the next prompt is drawn from."""
        return self._epoch

    @property
    def step(self) -> int:
        """Number of batches drawn so far."""
        return self._step

    def next_batch(self) -> list[dict]:
        """This rank's prompts for the next step (prompts_per_step // world_size rows)."""
        indices = []
        while len(indices) < self.prompts_per_step:
            take = min(self.prompts_per_step - len(indices), len(self._order) - self._pos)
            indices += self._order[self._pos : self._pos + take]
            self._pos += take
            if self._pos == len(self._order):  # epoch done: reshuffle with seed + epoch
                self._epoch, self._pos = self._epoch + 1, 0
                self._order = self._permutation(self._epoch)
        self._step += 1
        share = self.prompts_per_step // self.world_size
        mine = indices[self.rank * share : (self.rank + 1) * share]
        return [dict(self.rows[i]) for i in mine]  # copies: callers may annotate rows

    def state_dict(self) -> dict:
        return {
            "epoch": self._epoch,
            "pos": self._pos,
            "step": self._step,
            "seed": self.seed,
            "num_rows": len(self.rows),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != len(self.rows) or state["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for {state['num_rows']} rows / seed {state['seed']}, but this run has "
                f"{len(self.rows)} rows / seed {self.seed}: resume with the same dataset and seed"
            )
        self._epoch, self._pos, self._step = state["epoch"], state["pos"], state["step"]
        self._order = self._permutation(self._epoch)
