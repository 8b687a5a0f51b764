"""Prompt templates, shared by training and evaluation so that a model is evaluated with the prompt it
was trained on. `{problem}` is substituted with str.replace, never str.format: both the templates
(\\boxed{}) and the problems (LaTeX) are full of braces."""

QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

# DAPO-Math-17k's instruction around each problem (arXiv 2503.14476): the answer goes on a last
# line "Answer: ...", which the `dapo` reward reads (common/rewards.py).
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response "
    "should be of the form Answer: $Answer (without quotes) where $Answer is the "
    "answer to the problem."
)
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'

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


TEMPLATES: dict[str, str] = {
    "qwen_math": _chatml(QWEN_MATH_SYSTEM),
    "r1": _chatml(R1_SYSTEM),
    "plain": "Question: {problem}\nAnswer:",  # base models without chat markup
}


# Rendered with the model's own chat template instead of fixed markup: models
# whose chat format is not ChatML (DeepSeek-R1-Distill: <｜User｜>...<｜Assistant｜>,
# which may also open the <think> block itself). System turn -> instruction.
NATIVE_TEMPLATES: dict[str, str] = {"qwen_math_native": QWEN_MATH_SYSTEM, "r1_native": R1_SYSTEM}

# A user message and no system turn, rendered with the model's own chat template (its default
# system prompt, if it has one, applies): how verl feeds DAPO-Math-17k's prompts, and evalscope's
# default zero-shot math prompt (its math_500 / aime24 / gsm8k adapters).
USER_TEMPLATES: dict[str, str] = {
    "dapo_native": f"{DAPO_PREFIX}\n\n{{problem}}\n\n{DAPO_SUFFIX}",
    "evalscope_native": "{problem}\n" + QWEN_MATH_SYSTEM,
}
TEMPLATE_CHOICES = [*TEMPLATES, *NATIVE_TEMPLATES, *USER_TEMPLATES]


def format_prompt(problem: str, template: str = "qwen_math", tokenizer=None) -> str:
    """Render `problem` into the named prompt template (`*_native` ones need the model's tokenizer)."""
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
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose one of {TEMPLATE_CHOICES}")
    return TEMPLATES[template].replace("{problem}", problem)


def prompt_opens_think(template: str, tokenizer=None) -> bool:
    """Does the rendered prompt already open the <think> block? (Then the format
    reward must not expect the completion to write `<think>` itself.)"""
    return format_prompt("1 + 1", template, tokenizer).rstrip().endswith("<think>")
