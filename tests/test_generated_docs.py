"""Every generated part of the README and the docs pages is what its script writes from its stored run or its
arithmetic (issue 40, item 7): this file renders each again and fails on a difference.

A generated block sits between two marker lines, `<!-- NAME: written by ... -->` and `<!-- end of NAME -->`
(`common/marked_text.py` writes them; benchmarks/stored_run.py for a benchmark's stored run). BLOCKS knows, for
each NAME, the script that writes it, what it is rendered from and how; GENERATED_PAGES the pages written whole.
Every HTML comment on README.md and docs/**/*.md (docs/real_compare/ aside: stored data) must be one of BLOCKS'
markers, so a block without a known renderer fails here. A block or page still awaiting its first stored run is
listed in AWAITING, by name: its text is not a rendering, its first marker line says so, and the test fails as
soon as its stored run exists, so that none is left unrendered. The figures outside the blocks (arithmetic, and
prose read from stored files): tests/test_doc_arithmetic.py.
"""

import functools
import importlib.util
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from train_utils import ROOT

BEGIN_LINE = re.compile(r"^<!-- (?P<name>[^:]+): (?P<says>.*) -->$")
END_LINE = re.compile(r"^<!-- end of (?P<name>.+) -->$")
README, SCALING = "README.md", "docs/SCALING.md"


def module(path: str):
    """A repository file (scripts/ and benchmarks/ are not packages) imported once, under its own name."""
    name = "generated_docs_" + path.removesuffix(".py").replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def stored(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


@functools.cache
def real_compare():
    """compare_real's module, its page module and the stored runs' figures."""
    compare = module("scripts/compare_real.py")  # puts the repository root on sys.path for scripts.comparison
    from scripts.comparison import figures, page

    return compare, page, figures.load(ROOT / "docs" / page.STORE)


def real_model_table() -> str:
    demo = module("scripts/real_model_demo.py")
    from common.jsonl import read_jsonl

    return demo.table(read_jsonl(demo.METRICS), json.loads(demo.RUN_INFO.read_text())["wall_s"])


def compared_pages() -> list[str]:
    compare, _, (figs, _) = real_compare()
    return [f"docs/algorithms/{m}.md" for m in compare.compared_methods(figs)]


def bench(path: str, name: str, markers=("BEGIN", "END"), renderer=None, render="render", flags="", pages=None):
    """A benchmark's block: its markers (`markers`: their names in its module), its body from its stored run
    (`render` of `renderer`, default the benchmark's own module), the command that writes it (`flags`)."""
    json_path = f"docs/bench/{name}.json"
    return Block(
        markers=lambda: tuple(getattr(module(path), m) for m in markers),
        stored=json_path,
        render=lambda page: getattr(module(renderer or path), render)(stored(json_path)),
        writes=f"python {path} {flags}--render_only",
        **({"pages": pages} if pages else {}),
    )


@dataclass(frozen=True)
class Block:
    markers: Callable[[], tuple[str, str]]  # its first and last line
    stored: str  # what it is rendered from, relative to the repository
    render: Callable[[str], str]  # the page it sits on -> the text between its markers
    writes: str  # the command that writes it
    pages: Callable[[], list[str]] = lambda: [SCALING]  # the pages it sits on
    empty_elsewhere: bool = False  # other pages may hold it empty, waiting for what it will be written from


BLOCKS = {
    "demo table": Block(
        markers=lambda: (module("scripts/readme_demo_table.py").BEGIN, module("scripts/readme_demo_table.py").END),
        stored="docs/demo_runs.json",
        render=lambda page: module("scripts/readme_demo_table.py").table(stored("docs/demo_runs.json")),
        writes="bash scripts/compare_demo.sh runs/compare_demo seeds",
        pages=lambda: [README],
    ),
    "held bands": Block(
        markers=lambda: (module("tests/test_learning.py").HELD_BEGIN, module("tests/test_learning.py").HELD_END),
        stored="docs/demo_runs.json",
        render=lambda page: module("tests/test_learning.py").held_table(),
        writes="PYTHONPATH=. python tests/test_learning.py",
        pages=lambda: [README],
    ),
    "real-model table": Block(
        markers=lambda: (module("scripts/real_model_demo.py").BEGIN, module("scripts/real_model_demo.py").END),
        stored="docs/real_demo_metrics.jsonl",
        render=lambda page: real_model_table(),
        writes="python scripts/real_model_demo.py",
        pages=lambda: [README],
    ),
    "real-model comparison": Block(
        markers=lambda: (real_compare()[0].README_BEGIN, real_compare()[0].README_END),
        stored="docs/real_compare",
        render=lambda page: real_compare()[1].readme_block(*real_compare()[2]),
        writes="python scripts/compare_real.py --render_only",
        pages=lambda: [README],
    ),
    "real-model reading": Block(
        markers=lambda: (real_compare()[0].READING_BEGIN, real_compare()[0].READING_END),
        stored="docs/real_compare",
        render=lambda page: real_compare()[1].method_block(Path(page).stem, *real_compare()[2]),
        writes="python scripts/compare_real.py --render_only",
        pages=compared_pages,
        empty_elsewhere=True,  # a method page whose comparison runs are not stored yet (the grid runs them)
    ),
    "KV room": Block(
        markers=lambda: (module("benchmarks/kv_room.py").KV_TABLE_BEGIN, module("benchmarks/kv_room.py").KV_TABLE_END),
        stored="recipes",
        render=lambda page: module("benchmarks/kv_room.py").kv_table(),
        writes="python benchmarks/kv_room.py --write",
    ),
    "per-GPU budget": Block(
        markers=lambda: (module("benchmarks/kv_room.py").BUDGET_BEGIN, module("benchmarks/kv_room.py").BUDGET_END),
        stored="recipes",
        render=lambda page: module("benchmarks/kv_room.py").budget_table(),
        writes="python benchmarks/kv_room.py --write",
    ),
    "bf16 grads": bench("benchmarks/bf16_grads.py", "bf16_grads"),
    "memory": bench("benchmarks/memory.py", "memory"),
    "host syncs": bench("benchmarks/host_syncs.py", "host_syncs"),
    "update overhead": bench("benchmarks/step_time.py", "update_overhead"),
    "suite time": bench("benchmarks/suite_time.py", "suite", pages=lambda: [README]),
    "real_step": bench("benchmarks/real_step.py", "real_step", renderer="benchmarks/real_step_render.py"),
    "stop_strings": bench("benchmarks/stop_strings.py", "stop_strings"),
    "real_step memory": bench(
        "benchmarks/real_step.py",
        "real_step_memory",
        ("MEMORY_BEGIN", "MEMORY_END"),
        "benchmarks/real_step_render.py",
        "memory_block",
        "--memory ",
    ),  # fmt: skip
}
# Pages written whole: page -> (stored, render, the command that writes it).
GENERATED_PAGES = {
    "docs/results_real.md": (
        "docs/real_compare",
        lambda: real_compare()[1].page(*real_compare()[2], real_compare()[0].task_text()),
        "python scripts/compare_real.py --render_only",
    ),
    "docs/results_demo.md": (
        "docs/demo_compare",
        lambda: module("scripts/readme_demo_table.py").results_page(),
        "python scripts/readme_demo_table.py --results_demo",
    ),
}
# Blocks and pages whose figures are not yet a stored run's (the commands that store them: the docstrings of the
# scripts in BLOCKS' `writes`). A timing among them is taken alone, on a quiet machine.
AWAITING: set[str] = set()


def pages() -> list[Path]:
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "real_compare" not in p.relative_to(ROOT).parts]
    return [ROOT / README, *docs]


def blocks_on(page: Path) -> list[tuple[str, str, str, str]]:
    """(name, begin line, body, end line) of every marked block on `page`; any other HTML comment, an unclosed
    or unopened block, is an error naming the line."""
    out, open_, body = [], None, []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        where = f"{page.relative_to(ROOT)}:{number}"
        if end := END_LINE.match(line):
            assert open_ and open_[0] == end["name"], f"{where}: an end of {end['name']!r} that no block opened"
            out.append((open_[0], open_[1], "\n".join(body), line))
            open_, body = None, []
        elif begin := BEGIN_LINE.match(line):
            assert open_ is None, f"{where}: {begin['name']!r} opens inside {open_[0]!r}"
            open_ = (begin["name"], line)
        elif "<!--" in line:
            raise AssertionError(f"{where}: an HTML comment that marks no block: {line}")
        elif open_:
            body.append(line)
    assert open_ is None, f"{page.relative_to(ROOT)}: {open_[0]!r} is never closed"
    return out


def found() -> dict[str, dict[str, tuple[str, str, str]]]:
    """name -> page -> (begin line, body, end line), over every page."""
    out: dict[str, dict[str, tuple[str, str, str]]] = {}
    for page in pages():
        for name, begin, body, end in blocks_on(page):
            where = str(page.relative_to(ROOT))
            assert where not in out.get(name, {}), f"{where}: two {name!r} blocks"
            out.setdefault(name, {})[where] = (begin, body, end)
    return out


def test_every_marked_block_has_a_known_renderer():
    """A block this file does not know (a new one, or a typo in a marker) fails here: add it to BLOCKS."""
    unknown = {name: sorted(where) for name, where in found().items() if name not in BLOCKS}
    assert not unknown, f"blocks with no renderer in BLOCKS: {unknown}"


@pytest.mark.parametrize("name", sorted(set(BLOCKS) - AWAITING))
def test_each_block_is_its_rendering(name):
    """The block sits on the pages its renderer writes, between its own marker lines, and its text is what the
    renderer writes from the stored run (or the arithmetic) now."""
    block, on = BLOCKS[name], found().get(name, {})
    if block.empty_elsewhere:
        waiting = {page for page, (_, body, _) in on.items() if page not in block.pages()}
        assert all(on[page][1] == "" for page in waiting), f"{name!r} has text on {sorted(waiting)}"
        on = {page: found_on for page, found_on in on.items() if page not in waiting}
    assert sorted(on) == sorted(block.pages()), f"{name!r} is on {sorted(on)}, its renderer writes {block.pages()}"
    assert (ROOT / block.stored).exists(), f"{name!r}: {block.stored} is missing"
    first, last = block.markers()
    for page, (begin, body, end) in on.items():
        assert (begin, end) == (first, last), f"{page}: {name!r}'s markers are not its renderer's ({block.writes})"
        assert body == block.render(page), f"{page}: {name!r} is stale or edited by hand: run `{block.writes}`"


@pytest.mark.parametrize("page", sorted(set(GENERATED_PAGES) - AWAITING))
def test_each_generated_page_is_its_rendering(page):
    source, render, writes = GENERATED_PAGES[page]
    assert (ROOT / source).exists(), f"{page}: {source} is missing"
    assert (ROOT / page).read_text() == render(), f"{page} is stale or edited by hand: run `{writes}`"


@pytest.mark.parametrize("name", sorted(AWAITING))
def test_an_awaiting_block_has_no_stored_run_yet_and_says_so(name):
    """Once its run is stored, the block must be rendered and leave AWAITING; until then its first marker line
    says that the text is not a rendering (the page itself, for a whole page)."""
    if name in GENERATED_PAGES:
        source, _, writes = GENERATED_PAGES[name]
        assert not (ROOT / source).exists(), f"{source} is stored: run `{writes}` and take {name!r} off AWAITING"
        assert "awaiting a stored run" in (ROOT / name).read_text().split("\n\n", 1)[0], name
        return
    block = BLOCKS[name]
    assert not (ROOT / block.stored).exists(), (
        f"{block.stored} is stored: run `{block.writes}` and take {name!r} off AWAITING"
    )
    for page, (begin, _, _) in found().get(name, {}).items():
        assert "awaiting a stored run" in begin, f"{page}: {name!r} awaits its stored run but its marker says {begin}"


def test_every_stored_run_is_rendered_and_says_where_and_beside_what_it_ran():
    """Each record in docs/bench/ is some block's source, and holds its command, date, commit, machine and the
    load average at its start and end (what a timing needs to be read)."""
    sources = {block.stored for block in BLOCKS.values()}
    for path in sorted((ROOT / "docs" / "bench").glob("*")):
        where = str(path.relative_to(ROOT))
        assert where in sources, f"{where}: no block is rendered from it"
        record = json.loads(path.read_text())
        assert {"command", "date", "machine", "load_1min_after"} <= set(record), where
        assert {"cpu", "cores", "load_1min"} <= set(record["machine"]), where


def test_the_demo_comparison_runs_say_where_they_ran():
    """docs/demo_compare/ (once stored): each script's run with its metrics, final evaluation and launch record."""
    stored_runs = ROOT / "docs" / "demo_compare"
    if not stored_runs.exists():
        pytest.skip("docs/demo_compare/ awaits `bash scripts/compare_demo.sh runs/compare_demo compare`")
    for script in module("scripts/readme_demo_table.py").SCRIPTS:
        run = stored_runs / script
        assert {p.name for p in run.iterdir()} == {"metrics.jsonl", "eval_results.json", "run_config.json"}, run
        machine = json.loads((run / "run_config.json").read_text())["history"][0]["machine"]
        assert {"cpu", "cores", "threads", "load_1min"} <= set(machine), run


def test_the_suite_timing_reads_pytests_counts_and_every_phase():
    """benchmarks/suite_time.py's record: the counts, the slowest calls for the README, and every phase pytest
    printed (setup and teardown too, a module's shared run is its first test's setup), for finding the next cut."""
    output = """==== slowest durations ====
192.53s call     tests/test_a.py::test_x
5.75s setup    tests/test_b.py::test_y@faults
1.20s teardown tests/test_c.py::test_z[p-q]
2.00s call     tests/test_c.py::test_w
==== 2205 passed, 1 skipped in 1016.10s (0:16:56) ===="""
    record = module("benchmarks/suite_time.py").parse(output)
    assert record["counts"] == {"passed": 2205, "skipped": 1}
    assert [s["test"] for s in record["slowest"]] == ["tests/test_a.py::test_x", "tests/test_c.py::test_w"]
    assert [(p["phase"], p["seconds"]) for p in record["phases"]] == [
        ("call", 192.53),
        ("setup", 5.75),
        ("teardown", 1.2),
        ("call", 2.0),
    ]
