"""benchmarks/real_step_render.py's floors against the matmul FLOPs torch counts in the model's own passes."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.real_step_render import floor_flops


def matmul_flops(fn) -> int:
    """FLOPs of the linear layers and the head (aten mm / addmm) that `fn` runs; attention's bmm left out, as the
    floor leaves it."""
    with FlopCounterMode(display=False) as counter:
        fn()
    counts = counter.get_flop_counts()["Global"]
    return sum(v for op, v in counts.items() if str(op).split(".")[1] in ("mm", "addmm"))


@pytest.fixture(scope="module")
def model_and_weights(tiny_random_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir, attn_implementation="eager")
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    norms = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 1)  # no matmul: RMSNorm scales, biases
    body = sum(p.numel() for p in model.parameters()) - embedding.numel() - (0 if head is embedding else head.numel())
    return model, body - norms, head.numel()


def test_scoring_and_update_count_the_prompt_once_and_the_head_on_completion_tokens(model_and_weights):
    model, body, head = model_and_weights
    P, T = 11, 7
    ids = torch.randint(0, 100, (1, P + T))
    floor = floor_flops(body, head, prompts=1, prompt_tokens=P, shared=0, samples=1, tokens=T)
    assert matmul_flops(lambda: model(ids, logits_to_keep=T)) == floor["old_logp_s"]
    update = matmul_flops(lambda: model(ids, logits_to_keep=T).logits.float().logsumexp(-1).sum().backward())
    assert update == floor["update_s"]


def test_sampling_counts_the_prefill_once_and_a_forward_a_token_after_the_first(model_and_weights):
    model, body, head = model_and_weights
    P, T = 9, 5
    ids = torch.randint(0, 100, (1, P))
    generate = lambda: model.generate(ids, max_new_tokens=T, min_new_tokens=T, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        counted = matmul_flops(generate)
    assert counted == floor_flops(body, head, prompts=1, prompt_tokens=P, shared=0, samples=1, tokens=T)["rollout_s"]


def test_a_prefix_shared_by_every_prompt_is_computed_once():
    one = floor_flops(1, 0, prompts=1, prompt_tokens=10, shared=6, samples=1, tokens=1)["rollout_s"]
    three = floor_flops(1, 0, prompts=3, prompt_tokens=30, shared=6, samples=3, tokens=3)["rollout_s"]
    assert three - one == 2 * 2 * (10 - 6)  # each further prompt adds its own 4 tokens, a body forward each


def test_the_update_counts_only_the_rows_it_trains(model_and_weights):
    model, body, head = model_and_weights
    P, T = 11, 7  # two prompts of one completion each, alike in length; the second's advantage is 0: left out
    ids = torch.randint(0, 100, (1, P + T))
    floor = floor_flops(body, head, prompts=2, prompt_tokens=2 * P, shared=0, samples=2, tokens=2 * T, trained=0.5)
    update = matmul_flops(lambda: model(ids, logits_to_keep=T).logits.float().logsumexp(-1).sum().backward())
    assert update == floor["update_s"]
    assert floor["old_logp_s"] == 2 * matmul_flops(lambda: model(ids, logits_to_keep=T))  # scoring takes every row
