"""Prompt templates, shared by training and evaluation so that a model is evaluated with the prompt it
was trained on. `{problem}` is substituted with str.replace, never str.format: both the templates
(\\boxed{}) and the problems (LaTeX) are full of braces. Then what a rollout engine returns for a prompt
(`Completion`), where a completion ends (a stop token, or before the first stop string: `cut_at_stop`, as if
sampled on to EOS and cut afterwards), and each prompt's sampling seed (`prompt_seeds`)."""

import os
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from common.cli import clear_errors, not_utf8, require

QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

# DAPO-Math-17k's instruction around each problem (arXiv 2503.14476): the `dapo` reward reads the "Answer:" line.
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form Answer: "
    "$Answer (without quotes) where $Answer is the answer to the problem."
)
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'

# Open-RS's R1-Zero instruction, CW-GRPO's (arXiv 2605.11538, App. B). The prompt stops at the assistant turn: the
# model writes <think> itself, so the format reward checks tags the policy produced.
R1_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer, and put your "
    "final answer within \\boxed{} . The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
    "</answer>. Note that respond by English, NOT use other languages."
)


def _chatml(system: str) -> str:
    """Qwen2.5 chat markup with a fixed system turn and a `{problem}` slot."""
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{{problem}}<|im_end|>\n<|im_start|>assistant\n"


TEMPLATES: dict[str, str] = {
    "qwen_math": _chatml(QWEN_MATH_SYSTEM),
    "r1": _chatml(R1_SYSTEM),
    "plain": "Question: {problem}\nAnswer:",  # base models without chat markup
}


# System turn -> instruction, rendered with the model's own chat template: for models whose chat format is not
# ChatML (DeepSeek-R1-Distill's, which may also open the <think> block itself).
NATIVE_TEMPLATES: dict[str, str] = {"qwen_math_native": QWEN_MATH_SYSTEM, "r1_native": R1_SYSTEM}

# A user message only (the chat template's default system prompt applies): how verl feeds DAPO-Math-17k's prompts,
# and evalscope's default zero-shot math prompt (its math_500 / aime24 / gsm8k adapters).
USER_TEMPLATES: dict[str, str] = {
    "dapo_native": f"{DAPO_PREFIX}\n\n{{problem}}\n\n{DAPO_SUFFIX}",
    "evalscope_native": "{problem}\n" + QWEN_MATH_SYSTEM,
}


class TemplateChoices(list):
    """The template names as `--template`'s choices, which also admit a template of one's own (`own_template`)."""

    also = "or a template of your own: a string or a file holding {problem}"

    def __contains__(self, value) -> bool:
        if list.__contains__(self, value) or os.path.isfile(os.path.expanduser(str(value))):
            return True  # a file: read (and any problem with it said) where the template is used
        try:
            own_template(value)
        except (ValueError, TypeError):
            return False
        return True


TEMPLATE_CHOICES = TemplateChoices([*TEMPLATES, *NATIVE_TEMPLATES, *USER_TEMPLATES])
PLACEHOLDER = "{problem}"


def own_template(template: str) -> str:
    """The text of a template of one's own: a file's contents, or the string itself; either must hold `{problem}`."""
    text = template
    if os.path.isfile(os.path.expanduser(template)):
        try:
            with open(os.path.expanduser(template), encoding="utf-8-sig") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise ValueError(not_utf8(os.path.expanduser(template))) from None
        except OSError as e:
            raise ValueError(f"cannot read the template file {template} ({e.strerror})") from None
        if PLACEHOLDER not in text:
            raise ValueError(
                f"the template file {template} has no {PLACEHOLDER} placeholder: put it where the problem goes"
            )
    elif PLACEHOLDER not in text:
        raise ValueError(
            f"{template!r} is neither a template name ({', '.join(TEMPLATE_CHOICES)}) nor a file, nor a template "
            f"string holding {PLACEHOLDER}"
        )
    return text.replace("\\n", "\n") if "\n" not in text else text  # a shell's literal \\n in a one-line string


def check_template(template: str) -> None:
    """ValueError, before anything loads, for a `--template` that is neither a name nor a template of one's own."""
    if template not in TEMPLATE_CHOICES:
        own_template(template)


def format_prompt(problem: str, template: str = "qwen_math", tokenizer=None) -> str:
    """`problem` in the named template (`*_native` ones need the model's tokenizer) or in one's own."""
    if template in NATIVE_TEMPLATES or template in USER_TEMPLATES:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            instead = template.removesuffix("_native")
            instead = f"{instead!r} (Qwen ChatML markup)" if instead in TEMPLATES else "a template without '_native'"
            raise ValueError(
                f"template {template!r} renders with the model's chat template, and this tokenizer has none; "
                f"use {instead} instead"
            )
        if template in USER_TEMPLATES:
            messages = [{"role": "user", "content": USER_TEMPLATES[template].replace("{problem}", problem)}]
        else:
            messages = [{"role": "system", "content": NATIVE_TEMPLATES[template]}, {"role": "user", "content": problem}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = TEMPLATES[template] if template in TEMPLATES else own_template(template)
    return text.replace(PLACEHOLDER, problem)


def prompt_opens_think(template: str, tokenizer=None) -> bool:
    """Does the prompt open the <think> block? (Then the format reward must not expect the completion to.)"""
    return format_prompt("1 + 1", template, tokenizer).rstrip().endswith("<think>")


# Few-shot prompts (`--few_shot K`, lm-evaluation-harness' num_fewshot): K worked examples from the
# dataset's own solutions, before the question.


def few_shot_pool(
    rows: list[dict], k: int, seed: int = 0, fix: str = "name the solution field (--solution_field)"
) -> list[dict]:
    """The K + 1 rows with a solution that every prompt draws its worked examples from (the extra one stands in for
    a row's own problem). `fix`: the caller's way to give more solutions."""
    candidates = [r for r in rows if r.get("solution")]
    if len(candidates) < k + 1:
        raise ValueError(
            f"{k} worked examples need {k + 1} rows with a solution (the extra one replaces a prompt's own problem); "
            f"the dataset has {len(candidates)}: lower --few_shot, or {fix}"
        )
    return random.Random(seed).sample(candidates, k + 1)


def few_shot_examples(problem: str, pool: list[dict], k: int) -> list[tuple[str, str]]:
    """The K (problem, solution) pairs that go before `problem`: the pool's first K, never `problem` itself."""
    return [(r["problem"], r["solution"]) for r in pool if r["problem"] != problem][:k]


def pool_of(rows: list[dict], k: int) -> list[dict]:
    """The pool behind the rows' "shots" (`common.math_data.load_prompts`), for prompts outside the dataset: the
    examples most rows got, then the one that replaced a row's own problem."""
    common = Counter(tuple(r["shots"]) for r in rows).most_common(1)[0][0]
    extra = next(((q, a) for r in rows for q, a in r["shots"] if (q, a) not in common), None)
    return [{"problem": q, "solution": a} for q, a in [*common, *([extra] if extra else [])]][: k + 1]


CHATML_USER = "<|im_start|>user\n"


def _text_turns(template: str) -> tuple[str, str, str] | None:
    """A template without chat markup (`plain`, or one's own) as (header, question cue, answer cue) around
    `{problem}`; None for templates whose examples go in as chat turns."""
    if template in NATIVE_TEMPLATES or template in USER_TEMPLATES or (template in TEMPLATES and template != "plain"):
        return None
    text = TEMPLATES[template] if template in TEMPLATES else own_template(template)
    if CHATML_USER in text:
        return None
    before, after = text.split(PLACEHOLDER, 1)
    header, _, cue = before.rpartition("\n")
    return (header + "\n" if _ else ""), cue, after


def answer_cue(template: str) -> str:
    """The text after the problem in a template without chat markup ("Answer:" of `plain`; else ""): text the
    completion continues, not text it writes."""
    turns = _text_turns(template)
    return turns[2].strip() if turns else ""


def few_shot_stop(template: str, few_shot: int) -> str | None:
    """The stop a few-shot prompt without chat markup implies ("\nQuestion:" under `plain`): the next question."""
    turns = _text_turns(template) if few_shot else None
    return "\n" + turns[1].strip() if turns and turns[1].strip() else None


def parse_stop(text: str | None) -> list[str]:
    """`--stop` as a list: comma-separated, `\\n` / `\\t` a new line / tab (as a shell passes them), `\\,` a comma."""
    if not text:
        return []
    out = [""]
    for token in re.findall(r"\\[nt,\\]|.", text, re.S):  # an escape, else one character
        if token == ",":
            out.append("")
        else:
            out[-1] += {"\\n": "\n", "\\t": "\t"}.get(token, token[-1])
    if any(not s for s in out):
        raise ValueError(f"--stop {text!r} has an empty stop string (write a literal comma as \\,)")
    return out


def stop_strings(stop: str | None, template: str, few_shot: int) -> tuple[list[str], str | None]:
    """`--stop`'s strings and the few-shot format's own (`few_shot_stop`), with the line that says it (or None)."""
    stops = parse_stop(stop)
    implied = few_shot_stop(template, few_shot)
    if implied is None or implied in stops:
        return stops, None
    label = template if template in TEMPLATE_CHOICES or "\n" not in template and len(template) < 60 else "(yours)"
    line = f"stop strings: {implied!r}, implied by --few_shot {few_shot} under --template {label}"
    return [*stops, implied], line + (f", and --stop's {stops!r}" if stops else "")


def format_few_shot_prompt(problem: str, template: str, examples: list[tuple[str, str]], tokenizer=None) -> str:
    """`problem` in `template` after the worked `examples`: earlier user / assistant turns under a chat template,
    question / answer pairs in the template's own words without chat markup (`_text_turns`)."""
    if not examples:
        return format_prompt(problem, template, tokenizer)
    if (turns := _text_turns(template)) is not None:
        header, cue, after = turns
        shots = "".join(f"{cue}{q}{after} {a}\n\n" for q, a in examples)
        return header + shots + cue + problem + after
    if template in NATIVE_TEMPLATES:
        format_prompt(problem, template, tokenizer)  # the same error without a chat template
        messages = [{"role": "system", "content": NATIVE_TEMPLATES[template]}]
        for q, a in examples:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": problem})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = format_prompt(problem, template)
    turns = "".join(f"{CHATML_USER}{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n" for q, a in examples)
    user = prompt.index(CHATML_USER)  # ChatML templates: the shots go before the user turn
    return prompt[:user] + turns + prompt[user:]


# The answer format each built-in term reads; one the prompt does not ask for scores every completion alike.
READS = {"accuracy": "boxed", "boxed_format": "boxed", "dapo": "answer_line", "think_format": "think"}
READS["think_answer_format"] = "think"
FORMATS = {
    "boxed": ("\\boxed{}", "--template qwen_math (or r1)"),
    "answer_line": ("an 'Answer: ...' last line", "--template dapo_native"),
    "think": ("<think> ... </think>", "--template r1 (or r1_native)"),
}


def prompt_asks(prompt: str, cue: str = "") -> set[str]:
    """The answer formats (FORMATS) a rendered prompt asks for, in its instruction or worked examples. The
    template's answer `cue` ("Answer:" of `plain`) is not an "Answer:" line: the completion follows it."""
    text = prompt.replace(cue, "") if cue else prompt
    asks = set()
    if "\\boxed" in text or "<answer>" in text:
        asks.add("boxed")  # extract_answer reads the last box, else an <answer> block
    if "Answer:" in text:
        asks.add("answer_line")
    if "<think>" in text:
        asks.add("think")
    return asks


def format_mismatch(terms: list[str], prompt: str, template: str, who: str = "") -> tuple[str, str] | None:
    """("error" or "warning", one line) when a term reads a format the prompt does not ask for: an error if it
    asks for another (`--rewards dapo` under a \\boxed{} template), a warning if for none; else None.
    `who`: the reader, when it is not a reward (an evaluation reads as `accuracy` does)."""
    asks = prompt_asks(prompt, answer_cue(template))
    for term in terms:
        reads = READS.get(term)
        if reads is None or reads in asks:
            continue
        what, fix = FORMATS[reads]
        label = template if "{problem}" not in template and len(template) < 60 else "(yours)"
        reader, other = (who, "docs/EVALUATION.md") if who else (f"--rewards {term}", "a reward that reads it")
        instead = sorted(asks & {"boxed", "answer_line"})
        if instead and reads != "think":
            asked = " and ".join(FORMATS[f][0] for f in instead)
            return "error", (
                f"{reader} reads {what}, but the prompt of --template {label} asks for {asked}: every "
                f"completion would score alike; use {fix} with it, or {other}"
            )
        return "warning", (
            f"warning: {reader} reads {what}, and the prompt of --template {label} does not ask for it "
            f"(nor do its worked examples): a model that does not write it scores alike on every completion; "
            f"{fix} asks for it"
        )
    return None


def check_prompt_format(terms: list[str], prompt_ids: list[int], tokenizer, template: str, few_shot: int,
                        stop: str | None, say, evaluates: bool = False) -> list[str]:  # fmt: skip
    """A reward term that reads a format the prompt asks against is refused, one it does not ask for warned
    (`format_mismatch`); `evaluates`: the evaluation's \\boxed{} too. Returns the stop strings."""
    prompt = tokenizer.decode(prompt_ids)
    found = format_mismatch(terms, prompt, template)
    if found and found[0] == "error":
        require(False, found[1])
    if found:
        say(found[1])
    if evaluates and (found := format_mismatch(["accuracy"], prompt, template, who="--eval_steps' evaluation")):
        say(found[1] if found[0] == "warning" else f"warning: {found[1]}")
    with clear_errors("--stop"):
        stops, line = stop_strings(stop, template, few_shot)
    if line:
        say(line)
    return stops


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # engine's log pi_old(token | prefix) under logits / T
    finished: bool  # ended on a stop token or a stop string (False: cut at max_tokens)


class RolloutEngine:
    """A rollout engine, what the scripts, the session, evaluation and data selection use of one; both engines
    (common/vllm_engine.py, common/rollout.py's HFEngine) share here `stop` strings, `decode` (token ids -> text,
    the one every stop decision uses), and `generate`: the engine's `sample`, each completion then cut at the stop
    strings."""

    stop_token_ids: list[int]  # tokens that end a completion (kept in it)
    weight_dtype: object  # the torch dtype `load_weights` is best given (None: any)

    def __init__(self, stop: Iterable[str], decode: Callable[[list[int]], str] | None):
        self.stop, self.decode = tuple(stop), decode
        if self.stop and decode is None:
            raise ValueError("stop strings need `decode`: the engine cuts each completion by its text")

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | list[int] | None = None,
    ) -> list[list[Completion]]:
        """n completions for each prompt (a list of token ids); `seed`: one for the call or one per prompt."""
        return cut_groups(self.sample(prompts, n, max_tokens, temperature, top_p, seed), self.stop, self.decode)

    def load_weights(self, named_tensors) -> None:
        """Take the policy's new weights (HF names, tensors), consumed lazily."""
        raise NotImplementedError

    def sleep(self) -> None:
        """Release what can be released during the update (it wakes by itself when used)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def stop_token_ids(tokenizer, model_path: str) -> list[int]:
    """Token ids that end a completion: every EOS the tokenizer and configs name, and `<|im_end|>` when the
    vocabulary has it (a base model such as Qwen2.5-Math-1.5B ends a chat answer with it, unlisted)."""
    from transformers import AutoConfig, GenerationConfig

    ids = {tokenizer.eos_token_id}
    for load in (AutoConfig.from_pretrained, GenerationConfig.from_pretrained):
        try:
            eos = getattr(load(model_path), "eos_token_id", None)
        except (OSError, ValueError):  # no generation_config.json
            continue
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer and model config define no EOS token: generation would never stop")
    return sorted(ids)


def stop_at(text: str, stop: tuple[str, ...] | list[str]) -> int | None:
    """Where the first of the `stop` strings starts in `text` (None: none is in it)."""
    return min((i for s in stop if (i := text.find(s)) >= 0), default=None)


def cut_at_stop(c: Completion, stop: tuple[str, ...] | list[str], decode: Callable[[list[int]], str]) -> Completion:
    """`c` cut to the longest prefix whose text (`decode`'s) ends before the first `stop` string, as vLLM cuts
    the text (a token straddling it goes too), and finished."""
    if not stop or not c.token_ids:
        return c
    at = stop_at(decode(c.token_ids), stop)
    if at is None:
        return c
    keep, hi = 0, len(c.token_ids)  # the most tokens whose text is no longer than `at` (binary search)
    while keep < hi:
        mid = (keep + hi + 1) // 2
        keep, hi = (mid, hi) if len(decode(c.token_ids[:mid])) <= at else (keep, mid - 1)
    return Completion(c.token_ids[:keep], c.logprobs[:keep], finished=True)


def cut_groups(groups: list[list[Completion]], stop: tuple[str, ...], decode) -> list[list[Completion]]:
    """`groups` with every completion cut at the `stop` strings (`cut_at_stop`)."""
    if not stop:
        return groups
    return [[cut_at_stop(c, stop, decode) for c in group] for group in groups]


SEED_STRIDE = 1_000_003  # prime: runs with nearby --seed values share no seeds


def prompt_seeds(seed: int, step: int, prompts_per_step: int, rank: int, num_local: int) -> list[int]:
    """One seed per prompt of this rank's share, from (seed, step, its place in the global batch) only: 1 or 8
    processes sample the same completions (HFEngine exactly; vLLM on GPU up to rounding)."""
    first = step * prompts_per_step + rank * num_local  # the prompt's index among all prompts of the run
    return [seed + (first + i) * SEED_STRIDE for i in range(num_local)]


def completion_seed(prompt_seed: int, index: int) -> int:
    """The seed of the `index`-th completion of a prompt seeded `prompt_seed` (the HF engine's rows)."""
    return (prompt_seed * SEED_STRIDE + index) % 2**63
