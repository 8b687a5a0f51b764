"""Every --flag a message names is a flag of the program that says it (issue 40, item 8: a training run's
--eval_benchmarks error said to pass --benchmarks or --data_dir, tools.evaluate's flags, which the training
scripts refuse).

A static scan. The programs: the five scripts and four baselines (each its Args and the shared RunFlags), and each
tool or data command that parses flags (its own Args). The messages: the texts of errors (raise, SystemExit,
`require`, `clear_errors`) and of what a function returns for a caller to raise or say. Which programs can say a
message: those whose code reaches its function through calls (by name through imports, `self.` and module
attributes; a method called on another object, by its name: more programs than can, never fewer). A flag inside a
quoted command (`python -m tools.evaluate --export_data DIR`) is that command's; a flag built at run time
(--{key}_field) is not read.
"""

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo", *(f"baselines.{b}" for b in
           ("dapo", "dr_grpo", "gspo", "kl_cov"))]  # fmt: skip
SCANNED = ["common", "tools", "data", "baselines"]  # the code programs reach, besides the scripts
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*)(?![\w{-])")  # ours have underscores; --no-build-isolation is pip's
# Commands a message may quote: the program whose flags follow (None: not ours, not checked).
COMMANDS = [
    (re.compile(r"python -m (tools\.\w+|data\.\w+)"), lambda m: m.group(1)),
    (re.compile(r"python (?:\S*/)?(\w+|\{\})\.py"), lambda m: _script(m.group(0), m.group(1))),
    (re.compile(r"\b(accelerate|pip|huggingface-cli|git|wandb|iconv|torchrun|pytest)\b"), lambda m: None),
]
CLAUSE_END = re.compile(r"; |\. |$")  # where an unquoted command's flags end


def _script(command: str, name: str) -> str:
    """The training script a `python X.py` names ("{}": a run's own, filled in at run time: any of them)."""
    return "grpo_base" if name == "{}" else ("baselines." if "baselines/" in command else "") + name


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def modules() -> dict[str, ast.Module]:
    paths = [ROOT / f"{s.replace('.', '/')}.py" for s in SCRIPTS if "." not in s]
    paths += [p for d in SCANNED for p in sorted((ROOT / d).glob("*.py"))]
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in paths}


class Module:
    """One module's functions (qualified names), its imports and the message texts and calls of each function."""

    def __init__(self, name: str, tree: ast.Module, known: set[str]):
        self.name, self.known = name, known
        self.imports: dict[str, str] = {}  # local name -> "module:function" or "module" (scanned modules only)
        self.external: set[str] = set()  # local names of modules we do not scan
        self.functions: dict[str, ast.AST] = {"<module>": tree}
        self.classes: dict[str, list[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    local = alias.asname or alias.name
                    if target in known:
                        self.imports[local] = target
                    elif node.module in known:
                        self.imports[local] = f"{node.module}:{alias.name}"
                    else:
                        self.external.add(local)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    (self.imports.__setitem__(local, alias.name) if alias.name in known else self.external.add(local))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = []
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.functions[f"{node.name}.{item.name}"] = item
                        self.classes[node.name].append(item.name)

    def body(self, qualname: str) -> list[ast.AST]:
        """The nodes of a function, nested functions included; the module's own code without its functions."""
        node = self.functions[qualname]
        if qualname != "<module>":
            return list(ast.walk(node))
        top = [n for n in node.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        classes = [n for n in node.body if isinstance(n, ast.ClassDef)]  # class bodies: field declarations
        return [x for n in top for x in ast.walk(n)] + [x for c in classes for n in c.body
                                                         if not isinstance(n, ast.FunctionDef) for x in ast.walk(n)]  # fmt: skip


def texts(node: ast.AST) -> list[str]:
    """The message texts under `node`: string constants, f-strings with "{}" for what they fill in, joined
    where they are added or implicitly concatenated."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = texts(node.left), texts(node.right)
        return ["".join(left) + "".join(right)] if left and right else left + right
    return [t for child in ast.iter_child_nodes(node) for t in texts(child)]


def messages(mod: Module, qualname: str) -> list[str]:
    """What a function raises, requires, names in clear_errors, or returns (a message a caller raises or says)."""
    found = []
    for node in mod.body(qualname):
        if isinstance(node, ast.Raise) and node.exc is not None:
            found += texts(node.exc)
        elif isinstance(node, ast.Return) and node.value is not None:  # a message, not a token it looks up
            found += [t for t in texts(node.value) if " " in t]
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "SystemExit" or name == "clear_errors":
                found += [t for a in node.args for t in texts(a)]
            elif name == "require" and len(node.args) > 1:
                found += texts(node.args[1])
    return found


def calls(mod: Module, qualname: str, index: dict[str, Module], by_method: dict[str, set[str]]) -> set[str]:
    """The functions ("module:qualname") a function may call."""
    cls = qualname.split(".")[0] if "." in qualname else None
    typed = local_classes(mod, qualname, index)
    out = set()
    for node in mod.body(qualname):
        if not isinstance(node, (ast.Call, ast.Name, ast.Attribute)):
            continue
        target = node.func if isinstance(node, ast.Call) else node  # a function passed as a value is called too
        if isinstance(target, ast.Name):
            name = target.id
            if name in mod.functions:
                out.add(f"{mod.name}:{name}")
            elif name in mod.classes:
                out |= {f"{mod.name}:{name}.{m}" for m in mod.classes[name] if m.startswith("__")}
            elif ":" in mod.imports.get(name, ""):
                out |= resolve(mod.imports[name], index)
        elif isinstance(target, ast.Attribute):
            base = target.value
            if isinstance(base, ast.Name) and base.id == "self" and cls:
                out |= {f"{mod.name}:{cls}.{target.attr}"} & {f"{mod.name}:{q}" for q in mod.functions}
            elif isinstance(base, ast.Name) and base.id in mod.imports and ":" not in mod.imports[base.id]:
                out |= resolve(f"{mod.imports[base.id]}:{target.attr}", index)
            elif isinstance(base, ast.Name) and base.id in typed and target.attr in typed[base.id][1]:
                out.add(f"{typed[base.id][0]}.{target.attr}")  # x = Class(...); x.method()
            elif isinstance(base, ast.Name) and (base.id in mod.external or base.id in mod.classes):
                continue
            elif isinstance(node, ast.Call):
                out |= by_method.get(target.attr, set())
    return out


def local_classes(mod: Module, qualname: str, index: dict[str, Module]) -> dict[str, tuple[str, list[str]]]:
    """Names a function binds to an instance of a scanned class (`x = Class(...)`): {x: ("module:Class", its
    methods)}, so that `x.check()` is Class.check, not every method named check."""
    out = {}
    for node in mod.body(qualname):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        if not (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)):
            continue
        name = node.value.func.id
        ref = f"{mod.name}:{name}" if name in mod.classes else mod.imports.get(name, "")
        where, _, cls = ref.partition(":")
        if cls and where in index and cls in index[where].classes:
            out[node.targets[0].id] = (ref, index[where].classes[cls])
    return out


def resolve(ref: str, index: dict[str, Module]) -> set[str]:
    """ "module:name" -> its function, or a class's special methods (what constructing it runs)."""
    module, name = ref.split(":")
    mod = index.get(module)
    if mod is None:
        return set()
    if name in mod.functions:
        return {f"{module}:{name}"}
    if name in mod.classes:
        return {f"{module}:{name}.{m}" for m in mod.classes[name] if m.startswith("__")}
    if ":" in mod.imports.get(name, ""):  # re-exported
        return resolve(mod.imports[name], index)
    return set()


def flags_of(mod: Module, index: dict[str, Module]) -> set[str] | None:
    """The flags the module's `parse_args(...)` call reads (its dataclasses' fields), or None if it parses none."""
    classes = [a for n in ast.walk(mod.functions["<module>"]) if isinstance(n, ast.Call)
               and getattr(n.func, "id", "") == "parse_args" for a in n.args if isinstance(a, ast.Name)]  # fmt: skip
    if not classes:
        return None
    fields = {"config", "help"}
    for cls in classes:
        where = mod if cls.id in mod.classes else index[mod.imports[cls.id].split(":")[0]]
        tree = where.functions["<module>"]
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.id)
        fields |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return fields


def named_flags(message: str) -> list[tuple[str | None, str]]:
    """(whose flag, the flag) for each --flag in `message`: a command's own where it follows one (to the end of the
    quote, or unquoted, of the clause): "tools.evaluate" after `python -m tools.evaluate`, None after a command not
    ours (accelerate, pip, ...); "<caller>" elsewhere."""
    out = []
    for i, part in enumerate(message.split("`")):
        spans = []
        for pattern, program in COMMANDS:
            for m in pattern.finditer(part):
                end = len(part) if i % 2 else CLAUSE_END.search(part, m.end()).start()
                spans.append((m.end(), end, program(m)))
        for m in FLAG.finditer(part):
            owner = next((who for start, end, who in spans if start <= m.start() < end), "<caller>")
            out.append((owner, m.group(1)))
    return out


@pytest.fixture(scope="module")
def graph():
    trees = modules()
    known = set(trees)
    index = {name: Module(name, tree, known) for name, tree in trees.items()}
    by_method = defaultdict(set)
    for mod in index.values():
        for cls, methods in mod.classes.items():
            for m in methods:
                by_method[m].add(f"{mod.name}:{cls}.{m}")
    edges = {f"{m.name}:{q}": calls(m, q, index, by_method) for m in index.values() for q in m.functions}
    programs = {name: flags for name, mod in index.items() if (flags := flags_of(mod, index)) is not None}
    return index, edges, programs


# Functions entered only when a flag is given, so only by the programs that have it: the static calls say more.
GUARDED = {"common.cli:_resumed": "resume"}  # parse_args reads a run's record only under --resume


def reachable(program: str, index, edges, flags: set[str]) -> set[str]:
    """The functions `program` may run: its own, and what they call (`flags`: its flags, for GUARDED)."""
    seen = {f"{program}:{q}" for q in index[program].functions}
    todo = list(seen)
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen and GUARDED.get(nxt, "") in flags | {""}:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_scan_sees_the_programs_and_their_flags(graph):
    index, edges, programs = graph
    assert set(SCRIPTS) | {"tools.evaluate", "tools.plot", "tools.tiny_model", "data.prepare"} <= set(programs)
    assert {"eval_benchmarks", "problem_field", "lr"} <= programs["grpo_base"]
    assert "benchmarks" in programs["tools.evaluate"] and "eval_benchmarks" not in programs["tools.evaluate"]
    # the training path reaches the benchmarks' loader, and its messages are read
    assert "common.benchmarks:load_benchmark" in reachable("grpo_base", index, edges, programs["grpo_base"])
    assert any("--eval_benchmarks" in t for t in messages(index["common.before_loading"], "check_before_loading"))
    # the user's message, as it was: two flags of tools.evaluate's said to a training run, and a quoted command's own
    was = (
        "without a network, pass a local copy: --benchmarks math500=path/to/math500.jsonl, or --data_dir DIR holding "
        "math500.jsonl (`python -m tools.evaluate --export_data DIR --benchmarks math500` writes one)"
    )
    assert named_flags(was) == [("<caller>", "benchmarks"), ("<caller>", "data_dir"),
                                ("tools.evaluate", "export_data"), ("tools.evaluate", "benchmarks")]  # fmt: skip
    assert not {"benchmarks", "data_dir"} & programs["grpo_base"]


# Found by the scan in files this change does not own, each with the fix handed to their owner (issue 40, item 8's
# report). Fixed, it leaves the scan's findings: remove it here.
KNOWN = {}  # a message that names another program's flag on purpose, with why


def test_every_flag_a_message_names_is_a_flag_of_the_program_that_says_it(graph):
    index, edges, programs = graph
    wrong = defaultdict(set)
    for program in programs:
        for fn in reachable(program, index, edges, programs[program]):
            module, qualname = fn.split(":")
            for message in messages(index[module], qualname):
                for owner, flag in named_flags(message):
                    owner = program if owner == "<caller>" else owner
                    if owner is not None and owner in programs and flag not in programs[owner]:
                        wrong[f"--{flag} ({fn})"].add(program if owner == program else f"{program} quoting {owner}")
    shown = [f"{where}: said by {', '.join(sorted(who))}" for where, who in sorted(wrong.items()) if where not in KNOWN]
    assert not shown, "messages name flags their program lacks:\n" + "\n".join(shown)
    assert set(KNOWN) <= set(wrong), f"fixed, so no longer KNOWN: {sorted(set(KNOWN) - set(wrong))}"
