"""The five scripts share one skeleton: each variant differs from grpo_base.py only where its paper does.

`diff grpo_base.py egpo.py` must show the paper's idea and nothing else. So an edit to
the shared loop, the loss or the common flags in one script alone fails here: make it
in all five (or declare the region below, with the paper's reason).
"""

import ast
import difflib
import re

import pytest
from train_utils import ROOT

# Per variant: the sections of main() it may change (setup = before "# 1."), the shared
# functions it may rewrite, and the non-method flags whose defaults it may change.
DECLARED = {
    "edge_grpo.py": {
        "main": {
            "setup",
            "1b",
            "4",
            "5",
            "7",
        },  # GEC's data check + longer context, GEC, EDA, --eda_entropy_grad, its metrics
        "functions": set(),
        "flags": {"rewards"},  # boxed-format + accuracy reward, the authors' launch script
    },
    "egpo.py": {"main": {"4"}, "functions": set(), "flags": set()},
    "cw_grpo.py": {"main": {"4"}, "functions": set(), "flags": set()},
    "pro_grpo.py": {"main": {"4"}, "functions": {"old_logprobs"}, "flags": set()},  # scores the prompt too, for c(q)
}
ALWAYS_FREE = {"Args", "validate", "NEEDS_PI_OLD", "grpo_advantages"}  # the docstring and imports are free too
METHOD = {"edge_grpo.py": "edge", "egpo.py": "egpo", "cw_grpo.py": "cw", "pro_grpo.py": "pro"}


def parse(name):
    src = (ROOT / name).read_text()
    tree = ast.parse(src)
    top = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top[node.name] = ast.get_source_segment(src, node)
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            top[node.targets[0].id] = ast.get_source_segment(src, node)
    return src, top


def main_sections(main_src):
    """main()'s lines by step: "setup" before the first `# 1.` comment, then "1", "1b", "2", ... ."""
    out, name = {}, "setup"
    for line in main_src.splitlines():
        if m := re.match(r"\s*# (\d+b?)\. ", line):
            name = m.group(1)
        out.setdefault(name, []).append(line)
    return out


def shared_flags(args_src):
    """Args fields outside the method block ("# The method." .. "# Systems."): name -> source."""
    fields, in_method, current = {}, False, None
    for line in args_src.splitlines()[1:]:
        if "# The method." in line:
            in_method = True
        elif "# Systems." in line:
            in_method = False
        if m := re.match(r"    (\w+): ", line):
            current = None if in_method else m.group(1)
            if current:
                fields[current] = [line]
        elif current and line.startswith("        ") or (current and line.strip() == ")"):
            fields[current].append(line)
    return {k: "\n".join(v) for k, v in fields.items()}


def explain(a, b, what):
    diff = "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), "grpo_base.py", what, lineterm="", n=1))
    return f"{what} differs from grpo_base.py outside the regions its paper declares:\n{diff}"


@pytest.mark.parametrize("script", list(DECLARED))
def test_variant_changes_only_its_declared_regions(script):
    _, base = parse("grpo_base.py")
    _, variant = parse(script)
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


@pytest.mark.parametrize("script", ["grpo_base.py", *DECLARED])
def test_every_advantage_step_reads_the_same(script):
    src, top = parse(script)
    method = METHOD.get(script, "grpo")
    step4 = "\n".join(main_sections(top["main"])["4"])
    assert f"advantages, info = {method}_advantages(rewards, old, batch, G, args)" in step4
    assert "**info," in top["main"], "the method's metrics are logged from info"
    assert re.search(r'output_dir: str = arg\(\s*f"runs/\{Path\(__file__\)\.stem\}"', src), (
        "output_dir's default follows the file name"
    )
    if method != "grpo":  # every method metric sits in the method's own namespace
        adv_src = top[f"{method}_advantages"]
        keys = re.findall(r'"(\w+/[\w.]+)"', adv_src) + re.findall(r'f"(\w+)/\{', adv_src)
        assert keys and all(k.startswith(f"{method}/") or k == method for k in keys), keys
