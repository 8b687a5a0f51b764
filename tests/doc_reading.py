"""How tests/test_docs.py reads the docs: markdown as headings, code blocks and paragraphs; shell text as commands;
each command parsed by the real parser of its CLI. No model loads: the scripts are imported for their Args."""

import dataclasses
import functools
import importlib
import io
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from train_utils import BASELINES, ROOT

from common.cli import parse_args
from common.run_flags import RunFlags

SCRIPTS = ("grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo", *(b.removesuffix(".py") for b in BASELINES))
MODULES = ("tools.evaluate", "tools.plot", "tools.tiny_model", "tools.smollm2", "data.prepare", "data.hard_subset")
DOCS = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@functools.cache
def cli(name: str) -> tuple:
    """The config dataclasses `name` parses: a script's Args + RunFlags, a tool's Args."""
    module = importlib.import_module(name.replace("/", "."))
    return (module.Args, RunFlags) if name in SCRIPTS else (module.Args,)


def page_cli(path: Path) -> str:
    """The CLI whose flags a page's flag tables give: an algorithm page's script, else tools.evaluate's."""
    return next((s for s in SCRIPTS if s.rpartition("/")[2] == path.stem), "tools.evaluate")


@functools.cache
def accelerate_parser():
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser()


# -- markdown --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Page:
    headings: list = dataclasses.field(default_factory=list)
    blocks: list = dataclasses.field(default_factory=list)  # (first line, text) of each fenced code block
    paragraphs: list = dataclasses.field(default_factory=list)  # (first line, text): prose, tables included


@functools.cache
def read(path: Path) -> Page:
    page, fence, para = Page(), None, None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if fence:
            if line.strip().startswith(fence[0]):
                page.blocks.append((fence[1], "\n".join(fence[2])))
                fence = None
            else:
                fence[2].append(line)
        elif m := re.match(r"\s*(```+|~~~+)", line):
            fence, para = (m.group(1), n + 1, []), None
        elif re.match(r"#{1,6} ", line):
            page.headings.append(line.lstrip("#").strip())
            para = None
        elif not line.strip():
            para = None
        elif para is None:
            para = [n, line]
            page.paragraphs.append(para)
        else:
            para[1] += "\n" + line
    return page


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def table_rows(text: str):
    """{column: cell} of each body row of a paragraph that is a markdown table."""
    rows = text.split("\n")
    if len(rows) < 3 or not rows[0].startswith("|") or not re.match(r"\|[\s:|-]+\|?$", rows[1]):
        return
    header = [c.strip().lower() for c in rows[0].strip("|").split("|")]
    for row in rows[2:]:
        yield dict(zip(header, (c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|")))))


# -- shell text -> commands ------------------------------------------------------------------------


def shell_commands(text: str, first_line: int) -> list[tuple[int, list[str]]]:
    """(line, argv) of each simple command in shell text: `\\` continuations joined, comments and placeholders
    (`<...>`) dropped, `for v in a b; do ...; done` expanded."""
    segments, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        lexer = shlex.shlex(re.sub(r"<[^<>\n]*>", " ... ", line), posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        try:
            tokens = list(lexer)
        except ValueError as e:
            segments.append((first_line + start, ["<shell>", str(e)]))
            continue
        segment = []
        for t in [*tokens, ";"]:
            if t not in {";", "&&", "||", "|", "&"}:
                segment.append(t)
            elif segment:
                segments.append((first_line + start, segment))
                segment = []
    out, loop = [], None  # loop: (variable, words, body) while inside `for ... do ... done`
    for n, seg in segments:
        if seg[0] == "for" and len(seg) > 2 and seg[2] == "in":
            loop = (seg[1], seg[3:], [])
        elif loop and seg == ["done"]:
            var, words, body = loop
            out += [
                (m, [t.replace("${" + var + "}", w).replace("$" + var, w) for t in s]) for w in words for m, s in body
            ]
            loop = None
        elif loop:
            loop[2].extend([(n, seg[1:] if seg[0] == "do" else seg)] if seg != ["do"] else [])
        else:
            out.append((n, seg))
    return [(n, argv) for n, argv in out if argv]


def program(argv: list[str]) -> list[str]:
    """argv without leading VAR=value assignments."""
    while argv and re.match(r"\w+=", argv[0]):
        argv = argv[1:]
    return argv


def is_ours(argv: list[str]) -> bool:
    argv = program(argv)
    return bool(argv) and (argv[0] in ("python", "python3") or argv[:2] == ["accelerate", "launch"])


def doc_commands(path: Path) -> list[tuple[int, list[str]]]:
    """Every python / accelerate launch command of a docs file: fenced, and inline (`python ...`)."""
    page, out = read(path), []
    for start, text in page.blocks:
        out += [c for c in shell_commands(text, start) if is_ours(c[1])]
    for start, text in page.paragraphs:
        for m in re.finditer(r"`((?:python3?|accelerate launch) [^`]+)`", text):
            line = start + text[: m.start()].count("\n")
            for _, argv in shell_commands(m.group(1).replace("\n", " "), line):
                # `python -m data.prepare` alone names the tool: only that it exists is checked
                out.append((line, argv + ["--help"] if argv[:2] == ["python", "-m"] and len(argv) == 3 else argv))
    return out


def recipe_header(path: Path) -> str:
    """The shell commands in a recipe's leading comment (`#   python -m data.prepare ...`)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("#   "):
            lines.append(line[4:])
    return "\n".join(lines)


# -- parsing a command as its CLI would ------------------------------------------------------------


def run_parser(parse) -> str | None:
    """None if `parse()` accepts its argv; else the last line of the error it stops with."""
    err = io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            parse()
    except SystemExit as e:
        if e.code in (0, None):
            return None
        lines = (e.code if isinstance(e.code, str) else err.getvalue()).strip().splitlines()
        return lines[-1] if lines else f"exit {e.code}"
    return None


def target_of(argv: list[str]) -> tuple[str, list[str]] | str | None:
    """(the CLI a command runs, its arguments); a problem with the launcher; None if it runs no CLI of ours."""
    if argv[0] == "<shell>":
        return f"not shell: {argv[1]}"
    if argv[0] == "accelerate":
        at = next((i for i, t in enumerate(argv) if t.endswith(".py")), None)
        if at is None:
            return "accelerate launch without a script"
        launcher = argv[2:at]
        if problem := run_parser(lambda: accelerate_parser().parse_args([*launcher, argv[at]])):
            return f"accelerate launch: {problem}"
        if "--config_file" in launcher and not (ROOT / launcher[launcher.index("--config_file") + 1]).is_file():
            return f"accelerate launch: no config file {launcher[launcher.index('--config_file') + 1]}"
        if argv[at] == "tests/engines/cpu_entry.py" and argv[at + 1 :]:  # the CPU harness runs the script after it
            at += 1
        return argv[at].removeprefix("./"), argv[at + 1 :]
    if len(argv) > 2 and argv[1] == "-m":
        return (argv[2], argv[3:]) if argv[2] not in ("pytest", "pip", "ruff") else None
    if len(argv) > 1 and argv[1].endswith(".py"):
        return argv[1].removeprefix("./"), argv[2:]
    return None  # python -c, python --version: not a CLI of this project


def check_command(argv: list[str]) -> str | None:
    """Why a documented command would not start as written, or None. `--flag ...` stands for a value: the flag
    must exist, the rest is parsed."""
    found = target_of(program(argv))
    if not isinstance(found, tuple):
        return found
    target, args = found
    gone = {i - 1 for i, t in enumerate(args) if t == "..." and i and re.fullmatch(r"--\w+", args[i - 1])}
    elided = [args[i] for i in sorted(gone)]
    rest = [t for i, t in enumerate(args) if t != "..." and i not in gone]
    if "$" in " ".join([target, *rest]):
        return f"unexpanded shell variable in {shlex.join([target, *rest])}"
    if target.endswith(".py") and not (ROOT / target).is_file():
        return f"no script {target}"
    if target.startswith(
        ("benchmarks/", "scripts/", "gpu_check/")
    ):  # plain argparse inside main(): its add_argument calls
        known = set(re.findall(r'add_argument\(\s*"--(\w+)"', (ROOT / target).read_text())) | {"help"}
        unknown = [t for t in args if t.startswith("--") and t[2:].split("=")[0] not in known]
        return f"{target}: unknown flag(s) {unknown}" if unknown else None
    name = target.removesuffix(".py")
    if name not in SCRIPTS + MODULES:
        return f"{target} is not a CLI tests/doc_reading.py knows"
    fields = {f.name for c in cli(name) for f in dataclasses.fields(c)} | {"config", "help"}
    if unknown := [f for f in elided if f[2:] not in fields]:
        return f"{target}: unknown flag(s) {unknown}"
    if "--config" in rest[:-1] and not (ROOT / rest[rest.index("--config") + 1]).is_file():
        return f"{target}: no recipe {rest[rest.index('--config') + 1]}"
    if problem := run_parser(lambda: validate(name, parse_args(*cli(name), argv=rest))):
        return f"{target}: {problem}"
    return None


def validate(name: str, parsed) -> None:
    """The CLI's own cross-flag checks, where it has them (trackers installed or not is this machine's business)."""
    module = importlib.import_module(name.replace("/", "."))
    if name in SCRIPTS:
        args, run = parsed
        module.validate(args, dataclasses.replace(run, report_to="none"))
    elif hasattr(module, "validate"):
        module.validate(parsed)
