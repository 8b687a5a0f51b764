"""The docs against the code: README.md, data/README.md and docs/**/*.md.

- Every `--flag` they name exists in the CLI the text is about: the file's own CLI (an algorithm
  page: its script; docs/EVALUATION.md: tools.evaluate; data/README.md: data.prepare; else
  grpo_base.py) and every CLI named in the same section (`egpo.py`, `tools.plot`, ...), or accelerate.
- Every flag table row (`| --group_size | 8 | ... |`) states the field's default.
- Every command, in fenced code blocks and inline (`python X.py ...`, `accelerate launch ... X.py ...`,
  `python -m tools.evaluate ...`, `python -m data.prepare ...`, ...; `\\` continuations joined, for-loops
  expanded, `...` dropped), parses with the real parser of its CLI (common.cli.parse_args; accelerate's
  own for the launcher), recipes given with --config included; so do the commands in recipes' headers.
- An algorithm page runs every recipe of its script with the recipe header's launcher, prepares the
  recipe's data, and launches nothing with an inline list of flags.
- The metric names the docs give are the ones the scripts log; an algorithm page lists all of its method's.
- Relative links and anchors resolve; the code's citations of docs/...md#anchor too.

The reading itself (markdown, shell text, the CLIs' parsers): tests/doc_reading.py.
"""

import dataclasses
import re
import shlex

import pytest
from doc_reading import (
    DOCS,
    METRIC,
    PAGES,
    RECIPES,
    SCRIPTS,
    SPEC_FILES,
    check_command,
    cli,
    covered,
    default_problems,
    doc_commands,
    is_launch,
    is_ours,
    known_metric,
    logged_metrics,
    mention_problems,
    phases,
    program,
    recipe_header,
    rel,
    sections,
    shell_commands,
    slug,
    table_rows,
)
from train_utils import ROOT

# -- the tests -------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # commands name recipes/ and configs/ relative to the repository


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_every_flag_named_exists(path):
    problems = mention_problems(path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_every_default_in_a_flag_table_is_the_fields(path):
    problems = default_problems(path)
    assert not problems, "\n".join(problems)


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


@pytest.mark.parametrize("script", SCRIPTS)
def test_algorithm_page_runs_its_recipes(script):
    """The paper's setting is shown as `--config recipes/...`, launched as the recipe's header says,
    after the data preparation that writes the recipe's dataset; no launch carries inline flags only."""
    import yaml

    path = PAGES[script.rpartition("/")[2]]
    commands = [program(argv) for _, argv in doc_commands(path)]
    launches = [c for c in commands if c[0] == "accelerate"]
    assert all("--config" in c for c in launches), [shlex.join(c) for c in launches if "--config" not in c]
    for recipe in (r for r in RECIPES if r.stem.startswith(script.rpartition("/")[2] + "_")):
        name = rel(recipe)
        shown = [c for c in commands if "--config" in c and c[c.index("--config") + 1] == name]
        assert shown, f"{rel(path)} does not run {name}"
        header = [program(a) for _, a in shell_commands(recipe_header(recipe), 2) if "--config" in a and is_launch(a)]
        assert header, f"{name}: its header gives no launch command"
        prefix = header[0][: header[0].index("--config") + 2]
        assert any(c[: len(prefix)] == prefix for c in shown), (
            f"{rel(path)} never runs {name} as its header does: {shlex.join(prefix)}"
        )
        dataset = yaml.safe_load(recipe.read_text()).get("dataset", "")
        if dataset.startswith("data/"):
            outputs = {c[c.index("--output") + 1] for c in commands if "data.prepare" in c and "--output" in c}
            # data.prepare has no preset for the authors' own files (Dr. GRPO's Arrow dataset): a `python -c` that
            # writes the recipe's dataset is the documented step then
            outputs |= {p for c in commands if c[:2] == ["python", "-c"] for p in re.findall(r"data/[\w.-]+", c[2])}
            assert dataset in outputs, f"{rel(path)}: no `python -m data.prepare ... --output {dataset}` for {name}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_algorithm_page_lists_its_method_flags(script):
    """Each field of the script's method block (`# The method.`) is a row of its page's flag table."""
    from common.cli import _sections

    args = cli(script)[0]
    method = [f.name for f in dataclasses.fields(args) if _sections(args).get(f.name) == "The method"]
    rows = {
        name
        for sec in sections(PAGES[script.rpartition("/")[2]])
        for _, text in sec.paragraphs
        for _, row in table_rows(text)
        if "flag" in row and "default" in row
        for name in re.findall(r"--(\w+)", row["flag"])
    }
    page = PAGES[script.rpartition("/")[2]]
    assert method and not set(method) - rows, f"missing from {rel(page)}'s flag table: {set(method) - rows}"


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_metric_names_are_the_logged_ones(path):
    text = path.read_text()
    unknown = sorted({m for m in METRIC.findall(text) if not known_metric(m)})
    assert not unknown, f"{rel(path)} names metrics no script logs: {unknown}"
    script = path.stem if path.parent.name == "algorithms" else None
    if script is None:
        return
    metrics = "\n".join(
        t for sec in sections(path) if sec.heading.lower().startswith("metrics") for _, t in sec.paragraphs
    )
    listed = set(METRIC.findall(metrics))
    own = logged_metrics().get("shared" if script == "grpo_base" else script, frozenset())
    missing = {k for k in own if not covered(k, listed)}
    if script == "grpo_base":  # time/<phase>_s: each phase named
        missing |= {f"time/{p}_s" for p in phases() if not re.search(rf"\b{p}\b", metrics)}
    assert not missing, f"{rel(path)}'s Metrics section does not list {sorted(missing)}"


def link_targets():
    """(where, file, anchor) of every relative link in the docs, and of every docs/...md#anchor the code cites."""
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if not re.match(r"[a-z]+:", target):
                    file, _, anchor = target.partition("#")
                    yield f"{rel(path)}:{n}", (path.parent / file).resolve() if file else path, anchor
    for path in sorted(
        {
            *ROOT.glob("*.py"),
            *ROOT.glob("baselines/*.py"),
            *ROOT.glob("common/*.py"),
            *ROOT.glob("tools/*.py"),
            *ROOT.glob("data/*.py"),
        }
    ):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for file, anchor in re.findall(r"\b((?:docs/[\w/]+|README)\.md)#([\w-]+)", line):
                yield f"{rel(path)}:{n}", ROOT / file, anchor


def test_links_and_anchors_resolve():
    problems = []
    for where, file, anchor in link_targets():
        if not file.exists():
            problems.append(f"{where}: no {file}")
        elif anchor and file.suffix == ".md" and anchor not in {slug(s.heading) for s in sections(file)}:
            problems.append(f"{where}: no heading #{anchor} in {rel(file)}")
    assert not problems, "\n".join(problems)


def test_docs_cite_no_files_outside_the_repository():
    """Papers are cited by arXiv id and equation number, never by the team's spec or paper files (not in the repository)."""
    problems = [
        f"{rel(p)}:{n}: {line.strip()}"
        for p in DOCS
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(SPEC_FILES, line)
    ]
    assert not problems, "\n".join(problems)


def test_the_cpu_kv_cache_sentence_is_what_the_engine_does():
    """docs/EVALUATION.md once said vLLM on CPU needs VLLM_CPU_KVCACHE_SPACE; the engine sizes the cache itself,
    up to a cap (common/vllm_engine.py cpu_kv_cache_bytes)."""
    from common.rollout import CPU_KV_CACHE_GIB

    text = " ".join((ROOT / "docs" / "EVALUATION.md").read_text().split())
    [sentence] = [s for s in text.split(". ") if "VLLM_CPU_KVCACHE_SPACE" in s]
    assert "sized to what it decodes at once" in sentence and "needs" not in sentence
    assert f"at most {CPU_KV_CACHE_GIB} GiB, unless `VLLM_CPU_KVCACHE_SPACE`" in sentence
