"""Every method script shares grpo_base.py's skeleton, and stays readable; common/ stays layered.

`diff grpo_base.py egpo.py` must show the paper's idea and nothing else. So an edit to the shared
loop, the loss or the common flags in one script alone fails here: make it in all of them (or declare
the region below, with the paper's reason). The sizes the scripts are held to are checked too.

A script declares itself a method by its docstring's first line: the method and its paper with its
arXiv id, "GSPO (Group Sequence Policy Optimization, arXiv 2507.18071), ...", whatever characters the
name holds ("80/20 forking tokens (..., arXiv 2506.01939)"). Every such file at the top level or in
baselines/ is found and must have its regions declared in DECLARED (README: "Adding a method"); a file
there that looks like a method (an `Args` dataclass and a `main`, or "arXiv" in its first line) but is
not recognised as one fails, rather than going unchecked.
"""

import ast
import difflib
import re
from pathlib import Path

import pytest
from train_utils import BASELINES, ROOT, user_env

# The docstring's first line of a method: any name (its characters are the paper's: "80/20", "GRPO++", "(2)"),
# then, in the last parentheses of the line, its paper with an arXiv id.
METHOD_LINE = re.compile(r"\S.*? \((?:[^()]|\([^()]*\))*\barXiv \d{4}\.\d{4,5}(?:v\d+)?\b[^()]*\)")


def candidates() -> list[Path]:
    """Every file where a method script may sit: the top level and baselines/."""
    return sorted([*ROOT.glob("*.py"), *(ROOT / "baselines").glob("*.py")])


def first_line(path: Path) -> str:
    return (ast.get_docstring(ast.parse(path.read_text())) or "").partition("\n")[0]


def is_method(line: str) -> bool:
    """Does a docstring's first line declare a method (METHOD_LINE)?"""
    return METHOD_LINE.match(line) is not None


def looks_like_method(path: Path) -> bool:
    """A method's shape, whatever its docstring says: an `Args` dataclass and a `main`, or "arXiv" in its first
    line. Such a file must be recognised (`is_method`) and declared, else it would be silently left unchecked."""
    tree = ast.parse(path.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    return {"Args", "main"} <= names or "arXiv" in first_line(path)


def method_scripts() -> list[str]:
    """The scripts that declare themselves a method, as paths from the repository root."""
    return [p.relative_to(ROOT).as_posix() for p in candidates() if is_method(first_line(p))]


SCRIPTS = method_scripts()
# Per variant: the prefix of its advantage function (<prefix>_advantages; its metrics are <prefix>/...), the
# steps of main() it may change (setup = before "# 2."), the shared functions it may rewrite, and the non-method
# flags whose defaults it may change; and its diff budget (changed lines against grpo_base.py).
DECLARED = {
    # GEC's data check and longer context (setup), GEC itself (2b), EDA (5), GEC's metrics (8);
    # update(): --eda_entropy_grad takes P_i from the training pass. The authors' reward. --eda_ratio_bound, the
    # authors' commented-out clamp of P_hat, as a departure off by default.
    "edge_grpo.py": {
        "prefix": "edge", "main": {"setup", "2b", "5", "8"}, "functions": {"update"}, "flags": {"rewards"}, "diff": 200,
    },
    # 5: --entropy_span answer. Built on verl: its AdamW weight decay (as Pro-GRPO, whose Table 1 is verl's).
    "egpo.py": {"prefix": "egpo", "main": {"5"}, "functions": set(), "flags": {"weight_decay"}, "diff": 140},
    "cw_grpo.py": {"prefix": "cw", "main": {"5"}, "functions": set(), "flags": set(), "diff": 120},
    # old_logprobs() scores the prompt too, for c(q).
    "pro_grpo.py": {"prefix": "pro", "main": {"5"}, "functions": {"old_logprobs"}, "flags": {"weight_decay"}, "diff": 130},
    # The baselines (baselines/): each paper's idea, nothing else. DAPO: dynamic sampling fills the step with
    # mixed groups (setup: its checks; 2-3: sampling until full, scored as it goes; fill_groups, its rounds, lives
    # here), overlong shaping (5), its log (8).
    "baselines/dapo.py": {"prefix": "dapo", "main": {"setup", "2", "3", "5", "8"}, "functions": set(), "flags": set(),
                          "diff": 240},
    "baselines/dr_grpo.py": {"prefix": "dr", "main": {"5"}, "functions": set(), "flags": {"adam_beta2"}, "diff": 60},
    # The sequence ratio replaces the token ratio in the loss; the advantage is GRPO's.
    "baselines/gspo.py": {"prefix": "grpo", "main": set(), "functions": {"policy_loss"}, "flags": set(), "diff": 60},
    # The loss selects tokens by covariance; step_metrics logs how many it selected.
    "baselines/kl_cov.py": {
        "prefix": "kl_cov", "main": {"5"}, "functions": {"policy_loss", "step_metrics"}, "flags": set(), "diff": 125,
    },
}  # fmt: skip
ALWAYS_FREE = {"Args", "validate", "grpo_advantages"}  # the docstring and imports are free too
BLOCKS = (ast.For, ast.While, ast.If, ast.With, ast.Try)


def parse(name):
    src = (ROOT / name).read_text()
    tree = ast.parse(src)
    top = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top[node.name] = ast.get_source_segment(src, node)
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            top[node.targets[0].id] = ast.get_source_segment(src, node)
    return src, tree, top


def main_sections(main_src):
    """main()'s lines by step: "setup" before the first `# 2.` comment, then "2", "2b", "3", ... ."""
    out, name = {}, "setup"
    for line in main_src.splitlines():
        if m := re.match(r"\s*# (\d+b?)\. ", line):
            name = m.group(1)
        out.setdefault(name, []).append(line)
    return out


def shared_flags(args_src):
    """Args fields outside the method block ("# The method." to the end): name -> source."""
    fields, current = {}, None
    for line in args_src.splitlines()[1:]:
        if "# The method." in line:
            break
        if m := re.match(r"    (\w+): ", line):
            current = m.group(1)
            fields[current] = [line]
        elif current and (line.startswith("        ") or line.strip() == ")"):
            fields[current].append(line)
    return {k: "\n".join(v) for k, v in fields.items()}


def explain(a, b, what):
    diff = "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), "grpo_base.py", what, lineterm="", n=1))
    return f"{what} differs from grpo_base.py outside the regions its paper declares:\n{diff}"


def depth(node, d=0):
    return max([depth(c, d + isinstance(c, BLOCKS)) for c in ast.iter_child_nodes(node)] + [d])


def test_every_method_script_is_found_and_declared():
    """Discovery finds the five methods (the marker still matches them) and every other method script has its
    regions declared; a declaration names a script that exists."""
    assert {"grpo_base.py", "edge_grpo.py", "egpo.py", "cw_grpo.py", "pro_grpo.py"} <= set(SCRIPTS), SCRIPTS
    undeclared = sorted(set(SCRIPTS) - set(DECLARED) - {"grpo_base.py"})
    assert not undeclared, (
        f"{undeclared}: declare each one's regions and diff budget in DECLARED (README: Adding a method)"
    )
    assert set(DECLARED) <= set(SCRIPTS), f"declared but not found as a method: {set(DECLARED) - set(SCRIPTS)}"


def test_no_script_that_looks_like_a_method_goes_unchecked():
    """Before: a method named "80/20 forking tokens" was not recognised (the name's "/" failed the pattern), and
    the suite passed without checking it. Every top-level or baselines/ file shaped like a method must be
    recognised by its first line and declared."""
    shaped = [p.relative_to(ROOT).as_posix() for p in candidates() if looks_like_method(p)]
    assert {"grpo_base.py", *DECLARED} <= set(shaped), shaped  # the shape test sees the known methods
    unrecognised = {s: first_line(ROOT / s) for s in shaped if s not in SCRIPTS}
    assert not unrecognised, (
        f"{unrecognised}: shaped like a method script but its docstring's first line is not `Name (Title, arXiv "
        "NNNN.NNNNN)`; write it so (README: Adding a method), or move the file out of the top level / baselines/"
    )
    undeclared = sorted(set(shaped) - set(DECLARED) - {"grpo_base.py"})
    assert not undeclared, f"{undeclared}: declare each one's regions and diff budget in DECLARED"


@pytest.mark.parametrize(
    "line, method",
    [
        ("80/20 forking tokens (Wang et al., arXiv 2506.01939), one file.", True),
        ("GRPO++ (arXiv 2501.12345)", True),
        ("DAPO-2 (Decoupled Clip (v2), arXiv 2503.14476v3), top to bottom.", True),
        ("Pass@k (k) training (Chen et al. 2025, arXiv 2508.10751)", True),
        ("1 shot RLVR (arXiv 2504.20571)", True),
        ("Vanilla GRPO (DeepSeekMath, Shao et al. 2024, arXiv 2402.03300), one file, top to bottom.", True),
        ("GSPO (Group Sequence Policy Optimization, arXiv 2507.18071)", True),
        ("A tool that cites arXiv 2402.03300 without parentheses", False),
        ("Some helper (no paper)", False),
        ("", False),
    ],
)
def test_a_method_line_is_recognised_whatever_its_name_holds(line, method):
    assert is_method(line) is method, line


def test_a_method_shaped_file_is_seen_whatever_its_docstring(tmp_path):
    """The shape test (`looks_like_method`) on files with and without the first line."""
    files = {
        "forking.py": '"""80/20 forking tokens (arXiv 2506.01939)."""\n',
        "nameless.py": '"""No paper named."""\nclass Args:\n    pass\n\n\ndef main():\n    pass\n',
        "helper.py": '"""A helper."""\n\n\ndef main():\n    pass\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert looks_like_method(tmp_path / "forking.py") and is_method(first_line(tmp_path / "forking.py"))
    assert looks_like_method(tmp_path / "nameless.py") and not is_method(first_line(tmp_path / "nameless.py"))
    assert not looks_like_method(tmp_path / "helper.py")


@pytest.mark.parametrize("script", list(DECLARED))
def test_variant_changes_only_its_declared_regions(script):
    _, _, base = parse("grpo_base.py")
    _, _, variant = parse(script)
    declared = DECLARED[script]
    for name, src in base.items():
        if name in ALWAYS_FREE or name in declared["functions"]:
            continue
        assert name in variant, f"{script} lacks the shared {name}"
        if name != "main":
            assert variant[name] == src, explain(src, variant[name], f"{script}: {name}")
    a, b = main_sections(base["main"]), main_sections(variant["main"])
    assert set(a) <= set(b), f"{script}: main() lost step(s) {set(a) - set(b)}"
    for section in set(a) | set(b):
        if section not in declared["main"]:
            assert a.get(section) == b.get(section), explain(
                "\n".join(a.get(section, [])), "\n".join(b.get(section, [])), f"{script}: main() step {section}"
            )
    fa, fb = shared_flags(base["Args"]), shared_flags(variant["Args"])
    assert set(fa) == set(fb), f"{script}: shared flags differ: {set(fa) ^ set(fb)}"
    for flag in set(fa) - declared["flags"]:
        assert fa[flag] == fb[flag], explain(fa[flag], fb[flag], f"{script}: --{flag}")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_reads_the_same(script):
    src, _, top = parse(script)
    method = DECLARED[script]["prefix"] if script in DECLARED else "grpo"
    step5 = "\n".join(main_sections(top["main"])["5"])
    # the shared arguments, then any the method needs passed explicitly (EGPO's entropy mask, DAPO's R_length)
    assert re.search(rf"advantages, info = {method}_advantages\(scores\.reward, old, batch, G, args(, \w+)*\)", step5)
    assert "advantages = without_unchecked_groups(advantages, scores.checked, G)" in step5
    assert "| info" in top["main"], "the method's metrics are logged from info"
    assert "start_session(\n        Path(__file__).stem," in top["main"], (
        "the run directory's default follows the file name"
    )
    doc = ast.get_docstring(ast.parse(src))
    assert is_method(doc.splitlines()[0]), "first line: the method and its paper"
    assert f"python {script}" in doc and "accelerate launch --config_file configs/accelerate/" in doc, (
        "the docstring shows the CPU demo and the GPU launch line"
    )
    assert re.search(r"--config recipes/\S+\.yaml", doc) and all(
        (ROOT / p).is_file() for p in re.findall(r"--config (recipes/\S+\.yaml)", doc)
    ), "the GPU line names a recipe that exists"
    if method != "grpo":  # every method metric sits in the method's own namespace
        adv_src = top[f"{method}_advantages"]
        keys = re.findall(r'"(\w+/[\w.]+)"', adv_src) + re.findall(r'f"(\w+)/\{', adv_src)
        assert keys and all(k.startswith(f"{method}/") or k == method for k in keys), keys


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_stay_readable(script):
    """The reader's yardsticks: main() on about two screens and at most 4 blocks deep; grpo_base.py
    about 400 lines; each variant's diff against it within its budget."""
    src, tree, _ = parse(script)
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert main.end_lineno - main.lineno + 1 <= 120, f"{script}: main() is {main.end_lineno - main.lineno + 1} lines"
    assert depth(main) <= 4, f"{script}: main() is {depth(main)} blocks deep"
    if script == "grpo_base.py":
        assert len(src.splitlines()) <= 400
    else:
        base = (ROOT / "grpo_base.py").read_text().splitlines()
        changed = sum(line[:1] in "+-" for line in difflib.ndiff(base, src.splitlines()) if line[:2] in ("+ ", "- "))
        assert changed <= DECLARED[script]["diff"], f"{script}: {changed} changed lines against grpo_base.py"


@pytest.mark.parametrize("script", BASELINES)
def test_a_baseline_runs_as_a_file_from_anywhere(script, tmp_path):
    """`python baselines/x.py` (and accelerate launch, which runs it the same way) finds common/ through the
    script's sys.path line, from any working directory."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=tmp_path, env=user_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]


def _imports(path: Path) -> set[str]:
    """The common.* modules a file imports, at its top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("common."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "common":
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("common.")}
    return found


def test_common_is_layered():
    """No cycle among common/'s modules, lazy imports included: each module only imports modules
    below it. And none reads a script's flags: common/ takes explicit parameters."""
    modules = {p.stem: p for p in (ROOT / "common").glob("*.py") if p.stem != "__init__"}
    graph = {name: _imports(path) - {name} for name, path in modules.items()}
    assert all(dep in modules for deps in graph.values() for dep in deps)
    order, done = [], set()

    def visit(name, stack):
        assert name not in stack, f"import cycle in common/: {' -> '.join([*stack, name])}"
        if name not in done:
            for dep in sorted(graph[name]):
                visit(dep, [*stack, name])
            done.add(name)
            order.append(name)

    for name in sorted(graph):
        visit(name, [])
    for name, path in modules.items():
        assert not re.search(r"\bargs\.\w+", path.read_text()), f"common/{name}.py reads a script's flags (args.x)"
    assert _imports(ROOT / "common" / "cli.py") == set(), "common/cli.py is the bottom floor"
