"""The documentation check: README.md, data/README.md and docs/**/*.md against the code.

1. Every command they give, fenced or inline (`python ...`, `accelerate launch ...`), and every command in a
   recipe's header, parses with the real parser of its CLI (tests/doc_reading.py reads them).
2. Every relative link and anchor resolves, and so does every docs/...md#anchor the code cites.
3. Every generated block, between `<!-- NAME: written by ... -->` and `<!-- end of NAME -->`, and every generated
   page is what its script renders from its stored run now. Any other HTML comment on a page fails.
4. The figures the code holds: each flag table's defaults, and the figures the prose takes from the code's
   arithmetic or a stored run, computed here and looked for on their page.
"""

import functools
import importlib.util
import json
import math
import re
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
from doc_reading import (
    DOCS,
    RECIPES,
    check_command,
    cli,
    doc_commands,
    is_ours,
    page_cli,
    read,
    recipe_header,
    rel,
    shell_commands,
    slug,
    table_rows,
)
from train_utils import ROOT

from common.cli import _converter


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # commands name recipes/ and configs/ relative to the repository


# -- 1. commands -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_every_command_parses(path):
    problems = [f"{rel(path)}:{n}: {p}" for n, argv in doc_commands(path) if (p := check_command(argv))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", RECIPES, ids=rel)
def test_recipe_header_commands_parse(path):
    commands = [c for c in shell_commands(recipe_header(path), 2) if is_ours(c[1])]
    assert commands, f"{rel(path)}: its header gives no command"
    problems = [f"{rel(path)} (header): {p}" for _, argv in commands if (p := check_command(argv))]
    assert not problems, "\n".join(problems)


# -- 2. links --------------------------------------------------------------------------------------


def link_targets():
    """(where, file, anchor) of every relative link in the docs, and of every docs/...md#anchor the code cites."""
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if not re.match(r"[a-z]+:", target):
                    file, _, anchor = target.partition("#")
                    yield f"{rel(path)}:{n}", (path.parent / file).resolve() if file else path, anchor
    for path in sorted(p for d in ("", "baselines/", "common/", "tools/", "data/") for p in ROOT.glob(f"{d}*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for file, anchor in re.findall(r"\b((?:docs/[\w/]+|README)\.md)#([\w-]+)", line):
                yield f"{rel(path)}:{n}", ROOT / file, anchor


def test_links_and_anchors_resolve():
    problems = []
    for where, file, anchor in link_targets():
        if not file.exists():
            problems.append(f"{where}: no {file}")
        elif anchor and file.suffix == ".md" and anchor not in {slug(h) for h in read(file).headings}:
            problems.append(f"{where}: no heading #{anchor} in {rel(file)}")
    assert not problems, "\n".join(problems)


# -- 3. generated blocks and pages -----------------------------------------------------------------


def module(path: str):
    """A repository file (scripts/ and benchmarks/ are not packages) imported once, under its own name."""
    name = "generated_docs_" + path.removesuffix(".py").replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def stored(path: str):
    return json.loads((ROOT / path).read_text())


@functools.cache
def real_compare():
    """compare_real's module, its page module and the stored runs' figures."""
    compare = module("scripts/compare_real.py")  # puts the repository root on sys.path for scripts.comparison
    from scripts.comparison import page

    return compare, page, compare.stored(ROOT / "docs")


def real_model_table(page: str) -> str:
    from common.run_dir import read_jsonl

    demo = module("scripts/real_model_demo.py")
    return demo.table(read_jsonl(demo.METRICS), json.loads(demo.RUN_INFO.read_text())["wall_s"])


def bench(name: str, stored_as: str, renderer: str | None = None, render: str = "render", markers=("BEGIN", "END")):
    """A benchmark's block, rendered from docs/bench/<stored_as>.json."""
    path = f"benchmarks/{name}.py"
    draw = lambda page: getattr(module(renderer or path), render)(stored(f"docs/bench/{stored_as}.json"))
    return path, markers, draw


# name -> (the module holding its markers, their names there, page -> the text between them)
BLOCKS = {
    "demo table": ("scripts/readme_demo_table.py", ("BEGIN", "END"),
                   lambda page: module("scripts/readme_demo_table.py").table(stored("docs/demo_runs.json"))),
    "held bands": ("tests/test_learning.py", ("HELD_BEGIN", "HELD_END"),
                   lambda page: module("tests/test_learning.py").held_table()),
    "real-model table": ("scripts/real_model_demo.py", ("BEGIN", "END"), real_model_table),
    "real-model comparison": ("scripts/compare_real.py", ("README_BEGIN", "README_END"),
                              lambda page: real_compare()[1].readme_block(*real_compare()[2][:2], "docs", real_compare()[2][2])),
    "real-model reading": ("scripts/compare_real.py", ("READING_BEGIN", "READING_END"),
                           lambda page: real_compare()[1].method_block(Path(page).stem, *real_compare()[2][:2])),
    "KV room": ("benchmarks/kv_room.py", ("KV_TABLE_BEGIN", "KV_TABLE_END"),
                lambda page: module("benchmarks/kv_room.py").kv_table()),
    "per-GPU budget": ("benchmarks/kv_room.py", ("BUDGET_BEGIN", "BUDGET_END"),
                       lambda page: module("benchmarks/kv_room.py").budget_table()),
    "bf16 grads": bench("bf16_grads", "bf16_grads"),
    "memory": bench("memory", "memory"),
    "host syncs": bench("host_syncs", "host_syncs"),
    "update overhead": bench("step_time", "update_overhead"),
    "real_step": bench("real_step", "real_step", "benchmarks/real_step_render.py"),
    "stop_strings": bench("stop_strings", "stop_strings"),
    "profile_step": bench("profile_step", "profile_step"),
    "real_step memory": bench("real_step", "real_step_memory", "benchmarks/real_step_render.py", "memory_block",
                              ("MEMORY_BEGIN", "MEMORY_END")),
}  # fmt: skip
GENERATED_PAGES = {  # page -> its text, rendered from its stored runs
    "docs/results_real.md": lambda: real_compare()[1].page(
        *real_compare()[2][:2], real_compare()[0].task_text(), real_compare()[2][2]
    ),
    "docs/results_demo.md": lambda: module("scripts/readme_demo_table.py").results_page(),
}


@functools.cache
def found() -> dict[str, dict[str, tuple[str, str, str]]]:
    """name -> page -> (begin line, body, end line) of every marked block; any other HTML comment is an error."""
    out, pages = {}, [p for p in DOCS if "real_compare" not in p.parts]  # docs/real_compare/: stored data
    for page in pages:
        where, open_, body = rel(page), None, []
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if end := re.match(r"<!-- end of (.+) -->$", line):
                assert open_ and open_[0] == end[1], f"{where}:{number}: an end that no block opened: {line}"
                assert where not in out.get(open_[0], {}), f"{where}: two {open_[0]!r} blocks"
                out.setdefault(open_[0], {})[where] = (open_[1], "\n".join(body), line)
                open_, body = None, []
            elif begin := re.match(r"<!-- ([^:]+): .* -->$", line):
                assert open_ is None, f"{where}:{number}: {begin[1]!r} opens inside {open_[0]!r}"
                open_ = (begin[1], line)
            elif "<!--" in line:
                raise AssertionError(f"{where}:{number}: an HTML comment that marks no block: {line}")
            elif open_:
                body.append(line)
        assert open_ is None, f"{where}: {open_[0]!r} is never closed"
    return out


def test_every_block_has_a_renderer_and_every_renderer_a_block():
    assert sorted(found()) == sorted(BLOCKS), "a block without a renderer in BLOCKS, or a renderer without a block"


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_each_block_is_its_rendering(name):
    path, marker_names, render = BLOCKS[name]
    markers = tuple(getattr(module(path), m) for m in marker_names)
    for page, (begin, body, end) in found().get(name, {}).items():
        assert (begin, end) == markers, f"{page}: {name!r}'s marker lines are not {path}'s"
        assert body == render(page), f"{page}: {name!r} is stale or edited by hand: run the script its marker names"


@pytest.mark.parametrize("page", sorted(GENERATED_PAGES))
def test_each_generated_page_is_its_rendering(page):
    assert (ROOT / page).read_text() == GENERATED_PAGES[page](), f"{page} is stale or edited by hand"


# -- 4. figures the code holds ---------------------------------------------------------------------


def flag_table_rows():
    """(page, line, flag, stated default) of each row of the `| flag | default | ... |` tables."""
    for path in DOCS:
        for start, text in read(path).paragraphs:
            for i, row in enumerate(table_rows(text), 2):
                if "flag" in row and "default" in row:
                    names = re.findall(r"--(\w+)", row["flag"])
                    stated = re.sub(r"\s*\(.*\)$", "", row["default"].replace("`", "")).strip()
                    values = [v.strip() for v in stated.split(" / ")] if len(names) > 1 else [stated]
                    assert len(values) == len(names), f"{rel(path)}:{start + i}: {names} but {row['default']!r}"
                    yield from ((path, start + i, n, v) for n, v in zip(names, values))


def test_every_flag_tables_default_is_the_fields():
    problems = []
    for path, line, name, value in flag_table_rows():
        owner = page_cli(path)
        cls = next((c for c in cli(owner) if name in c.__dataclass_fields__), None)
        if cls is None:
            problems.append(f"{rel(path)}:{line}: --{name} is not a flag of {owner}")
            continue
        try:
            parsed = _converter(typing.get_type_hints(cls)[name])[1](value)
        except (ValueError, TypeError) as e:
            problems.append(f"{rel(path)}:{line}: --{name}: cannot read the default {value!r} ({e})")
            continue
        if parsed != cls.__dataclass_fields__[name].default:
            problems.append(f"{rel(path)}:{line}: --{name}: {value} here, {cls.__dataclass_fields__[name].default!r}")
    assert not problems, "\n".join(problems)


def memory_figures():
    """docs/SCALING.md's memory arithmetic: the preflight's bytes per parameter, activations and KV per token (bf16
    autocast), the fp32 output-weight buffer, DeepSpeed's fp32 gradients and a 7B checkpoint, from the models'
    published shapes."""
    from recipe_memory import MODELS

    from common.batching import activation_bytes_per_token as act
    from common.models import GIB, bytes_per_parameter, kv_bytes_per_token, model_shape

    (c15, p15), (c7, p7) = ((SimpleNamespace(**MODELS[m][0]), MODELS[m][1]) for m in (B15, B7))
    gib = lambda p, each: f"{p * each / GIB:.1f}"
    one = [gib(p, bytes_per_parameter("single", 1, "auto")) for p in (p15, p7)]
    on8 = {m: [gib(p, bytes_per_parameter(m, 8, "auto")) for p in (p15, p7)] for m in ("fsdp2", "zero3", "zero2")}
    kept = [c.num_hidden_layers * 2 * c.hidden_size / KIB for c in (c15, c7)]
    layer = [2 * (6 * c.hidden_size + 3 * c.intermediate_size) / KIB for c in (c15, c7)]
    checkpointed = [act(c, 2, True) for c in (c15, c7)]
    assert [k + lay for k, lay in zip(kept, layer)] == [b / KIB for b in checkpointed]
    budget = [16_384 * b / GIB + 2.0 for b in checkpointed]  # + the log-prob path's four 512 MiB chunks
    whole, kv = act(c15, 2, False), [kv_bytes_per_token(model_shape(c), 2) / KIB for c in (c15, c7)]
    buffer, state, weights = [c.vocab_size * c.hidden_size * 4 / 1e9 for c in (c15, c7)], 12 * p7 / 1e9, 2 * p7 / 1e9
    return [
        f"16 bytes per parameter: {one[0]} GiB at 1.5B, {one[1]} GiB at 7B",
        "{} / {} GiB on 8".format(*on8["fsdp2"]),
        "ZeRO-3 18 / N, {} / {} GiB on 8".format(*on8["zero3"]),
        "ZeRO-2 2 + 16 / N, {} / {} GiB on 8".format(*on8["zero2"]),
        f"the training state alone is {one[1]} GiB",
        f"+2 bytes per parameter: {gib(p7, 2)} GiB at 7B",  # FSDP2's unsharded gradients under no_sync
        f"bf16 weights ({gib(p15, 2)} / {gib(p7, 2)} GiB)",  # vLLM's copy
        f"28 x 2 x D bytes: {kept[0]:.0f} KiB at 1.5B, {kept[1]:.0f} KiB at 7B",
        f"2 x (6 D + 3 MLP) bytes: {layer[0]:.1f} KiB / {layer[1]:.0f} KiB",
        f"At a 16,384-token budget: {budget[0]:.1f} GiB at 1.5B, {budget[1]:.1f} GiB at 7B",
        f"{whole / MIB:.1f} MiB per token at 1.5B ({16_384 * whole / GIB:.1f} GiB at 16k tokens)",
        f"128 x 2 bytes per token: {kv[0]:.0f} KiB at 1.5B, {kv[1]:.0f} KiB at 7B",
        f"({buffer[0]:.1f} GB at 1.5B, {buffer[1]:.1f} GB at 7B)",
        f"+{2 * p7 / 8 / 1e9:.1f} GB per GPU at 7B on 8 GPUs",
        f"~{state + weights:.0f} GB (arithmetic: 12 bytes of fp32 state per parameter, {state:.0f} GB, and the "
        f"{weights:.0f} GB of bf16 weights)",
        f"its ~{state / 8:.0f} GB optimiser shard, or the ~{weights:.0f} GB weights",
    ]


def step_figures():
    """docs/SCALING.md's figures of a step: the output layer's chunk (`head_chunk_rows`, the GEMMs' FLOPs per byte),
    micro-batches sized for SmolLM2 in fp32 and the demo model, the real-model demo's FLOPs and shared prompts."""
    from test_logprobs import H100_RIDGE, gemm_flop_per_byte

    from common.batching import activation_bytes_per_token as act
    from common.logprobs import head_chunk_rows
    from common.models import GIB

    cpu, gpu = head_chunk_rows(V, "cpu"), head_chunk_rows(V, "cuda", device_memory=80 * 10**9)
    ai = lambda rows, acc=False: " / ".join(f"{gemm_flop_per_byte(rows, D, V, acc):.0f}" for D in (1536, 3584))
    assert all(gemm_flop_per_byte(2 * gpu, D, V, True) > H100_RIDGE for D in (1536, 3584))
    smollm2 = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)  # its config.json
    demo = SimpleNamespace(**stored("models/tiny-arith/config.json"))
    per_token = act(smollm2, 4, False)
    tokens = int(24 * GIB / 8 // per_token)  # 1/8 of a 24 GiB machine: common.batching.micro_batch_tokens' budget
    sequence, shared = round(125 + 24, -1), 125 + 8 * 24  # the real-model demo: ~125 prompt, ~24 completion tokens
    return [
        f"{cpu} and {gpu} rows at V = 151,936",
        f"= {H100_RIDGE:.0f} FLOP/byte",
        f"At {cpu} rows the chunk's GEMMs (forward, recompute, dZ @ W) ran at {ai(cpu)} FLOP/byte",
        f"at {gpu}, {ai(gpu)}",
        f"{gemm_flop_per_byte(cpu, 1536, V, True):.0f} FLOP/byte at {cpu} rows, {ai(gpu, True)} at {gpu}",
        f"({2 * gpu:,} rows would pass the ridge",
        f"SmolLM2-135M in fp32, {per_token / MIB:.2f} MiB a token, so on a 24 GiB machine ~{round(tokens, -2):,} "
        f"tokens, {tokens // 173} sequences of 173 tokens; the demo model ({act(demo, 4, False) / KIB:.0f} KiB a token)",
        f"48 x ~{sequence} tokens, are about 6 x 135M x {48 * sequence:,} = {6 * 135e6 * 48 * sequence / 1e12:.1f} TFLOP",
        f"~125 + 8 x 24 = ~{round(shared, -1)} tokens instead of 8 x ~{sequence} = ~{8 * sequence:,}, about "
        f"{8 * sequence / shared:.1f} times fewer",
    ]


def stored_figures():
    """(page, phrase) of the figures read from stored files and the shipped model, and the standard error."""
    from common.vllm_engine import CPU_KV_CACHE_GIB

    rows = [json.loads(line) for line in (ROOT / "docs" / "real_demo_metrics.jsonl").read_text().splitlines()]
    peak = [r["time/peak_mem_gb"] for r in rows if "time/peak_mem_gb" in r]
    gap = [r["train/rollout_logp_gap"] for r in rows if "train/rollout_logp_gap" in r]
    assert 1e-7 <= min(gap) and max(gap) <= 2e-6, (min(gap), max(gap))
    assert abs(rows[0]["eval/sums/pass@1"] - 0.25) <= 0.03  # "about a quarter", before training
    seed0 = next(r for r in stored("docs/demo_runs.json") if r["seed"] == 0)["eval"][0]
    size = sum(p.stat().st_size for p in (ROOT / "models" / "tiny-arith").iterdir())
    build = stored("models/tiny-arith/tiny_model.json")
    assert build["sft_noise"] == 0.5  # "half state the right sum without \boxed{}"
    assert math.sqrt(0.25 / 200) < 0.04 < math.sqrt(0.25 / 100)  # pass@1's standard error over 100 sums x 2
    return [
        (SCALING, f"is {min(peak):.1f}-{max(peak):.1f} GB over its steps"),
        (SCALING, "stays between 1e-7 and 2e-6 over the demo's steps"),
        (GUIDE, "gets about a quarter of unseen sums right"),
        (GUIDE, f"gave step 0's pass@1 of seed 0 here, {seed0:g}"),
        (GUIDE, f"its own tokenizer, {size / 1e6:.0f} MB"),
        (GUIDE, f"({build['sft_steps']} SFT steps)"),
        (GUIDE, "a standard error of about 0.04 (arithmetic: sqrt(0.5 x 0.5 / 200) to"),
        ("docs/EVALUATION.md", f"at most {CPU_KV_CACHE_GIB} GiB, unless `VLLM_CPU_KVCACHE_SPACE`"),
    ]


KIB, MIB, V = 2**10, 2**20, 151_936
B15, B7, SCALING, GUIDE = "Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-Math-7B", "docs/SCALING.md", "docs/GUIDE.md"


def test_every_figure_the_prose_gives_follows_from_the_code():
    text = functools.cache(lambda page: " ".join((ROOT / page).read_text().split()))  # figures wrap across lines
    figures = [(SCALING, f) for f in memory_figures() + step_figures()] + stored_figures()
    missing = [f"{page}: {phrase}" for page, phrase in figures if " ".join(phrase.split()) not in text(page)]
    assert not missing, "these pages no longer say:\n" + "\n".join(missing)
