"""Shared fixtures: tiny models and tokenizers built on the spot (no hub access here), the stand-in data formats."""

import os

import pytest

# Tests run side by side (pyproject.toml): one OpenMP thread per process, tests and the scripts they start,
# instead of each spinning a thread per core against the others. Same results, about a quarter less CPU time.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_random_dir(tmp_path_factory):
    """A random (untrained) tiny Qwen2 checkpoint directory with its tokenizer."""
    from tools.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-random", sft_steps=0, manifest=False)


@pytest.fixture(scope="session")
def tiny_random_model(tiny_random_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir).eval()
    return model, AutoTokenizer.from_pretrained(tiny_random_dir)


@pytest.fixture
def closing():
    """`engine = closing(VLLMEngine(...))`: closed when the test ends, pass or fail. An engine left open keeps vLLM's
    parallel groups in the pytest worker, and the next engine there inherits them (a MoE engine then finds no
    expert-parallel group: tests/test_moe_sync.py)."""
    opened = []
    yield lambda engine: opened.append(engine) or engine
    for engine in opened:
        engine.close()


@pytest.fixture(params=["jsonl", "parquet"])
def fmt(request):
    """A stand-in dataset file's format (tests/dataset_standins.py `save`): each test runs on both."""
    return request.param


@pytest.fixture(scope="session")
def tiny_tokenizer_path(tmp_path_factory):
    """A word-level tokenizer of a few words, saved: data.prepare's token-length filters."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["Problem solve it long please reason step"], trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    )
    path = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    return str(path)


def pytest_collection_modifyitems(config, items):
    """The slow tests first, each group in its collected order: pytest-xdist hands out tests in this order, so the
    minute-long runs start while the short tests remain to fill the workers' ends (a slow test collected last left
    one worker running it alone at the end)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
