"""A reward term of your own, for --reward_fn: a small penalty per character of the completion.

    python grpo_base.py --reward_fn examples/length_penalty.py:length_penalty

A term gets the step's completions (decoded text), their gold answers and the answer verifier
(`common.verifier.MathVerifier`, e.g. `verifier.verify_batch(preds, answers)`), and returns one
number per completion. The script adds it to the --rewards terms (accuracy by default). Name it
as module:function (importable from where you run) or path/to/file.py:function.
"""


def length_penalty(completions: list[str], answers: list[str], verifier) -> list[float]:
    return [-0.001 * len(text) for text in completions]
