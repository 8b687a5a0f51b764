"""How tests/test_docs.py reads the docs against the code: the CLIs and their parsers, markdown sections, shell
text as commands, flag tables, and the metric names the scripts log. No model loads: the scripts are imported
for their Args and their advantage and metric functions."""

import dataclasses
import fnmatch
import functools
import importlib
import importlib.util
import inspect
import io
import math
import re
import shlex
import typing
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

from train_utils import ROOT

from common.cli import _converter, parse_args
from common.rollout_correction import RolloutCorrection
from common.run_flags import RunFlags

SPEC_FILES = "|".join((r"ALGORITHMS" + r"\.md", r"\bpapers" + "/"))  # spelled in parts: this file cites neither

# The training scripts, as paths without ".py": the five methods, then the baselines (baselines/<name>.py).
BASELINES = tuple(sorted(f"baselines/{p.stem}" for p in (ROOT / "baselines").glob("*.py") if p.stem != "__init__"))
SCRIPTS = ("grpo_base", "edge_grpo", "egpo", "cw_grpo", "pro_grpo", *BASELINES)
PAGE_SCRIPT = {s.rpartition("/")[2]: s for s in SCRIPTS}  # docs/algorithms/<page>.md -> its script
MODULES = ("tools.evaluate", "tools.plot", "tools.tiny_model", "data.prepare", "data.hard_subset")
NOT_OURS = {"pytest", "pip"}  # `python -m` modules whose flags are not this project's
FOREIGN = {"ruff", "pip", "bash", "sh", "tensorboard", "wandb", "git", "cd", "export", "nvidia-smi", "huggingface-cli"}
DOCS = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = {p.stem: p for p in sorted((ROOT / "docs" / "algorithms").glob("*.md"))}
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)")
PLACEHOLDER = re.compile(r"<[^<>\n]*>")  # <the main command's flags>, <lower>: stands for something
SEPARATORS = {";", "&&", "||", "|", "&"}
METRIC = re.compile(r"`((?:train|time|reward|eval|edge|gec|egpo|cw|pro|dr|kl_cov|dapo)/[^`\s]+)`")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- the CLIs --------------------------------------------------------------------------------------


@functools.cache
def cli(name: str) -> tuple:
    """The config dataclasses `name` parses: a script's Args + RunFlags, a tool's Args."""
    if name in SCRIPTS:
        return (importlib.import_module(name.replace("/", ".")).Args, RunFlags)
    return (importlib.import_module(name).Args,)


@functools.cache
def flags_of(name: str) -> frozenset[str]:
    if name.startswith(("benchmarks/", "scripts/")):  # plain argparse inside main(): its add_argument calls
        return frozenset(re.findall(r'add_argument\(\s*"--(\w+)"', (ROOT / name).read_text()))
    fields = [f for c in cli(name) for f in dataclasses.fields(c) if not f.metadata.get("positional")]
    return frozenset({f.name for f in fields} | {"config", "help"})


@functools.cache
def accelerate_parser():
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser()


@functools.cache
def accelerate_flags() -> frozenset[str]:
    return frozenset(o[2:] for a in accelerate_parser()._actions for o in a.option_strings if o.startswith("--"))


def named_clis(text: str) -> set[str]:
    """The CLIs a piece of text names: `egpo.py`, `tools.evaluate` / `tools/evaluate.py`, `benchmarks/x.py`,
    `scripts/x.py`."""
    out = {s for s in SCRIPTS if re.search(rf"(?<![\w/$]){s}\.py\b", text)}
    out |= {m for m in MODULES if re.search(rf"\b{m.replace('.', '[./]')}\b", text)}
    out |= {f"{d}/{b}.py" for d, b in re.findall(r"(?<![\w/])(benchmarks|scripts)/(\w+)\.py", text)}
    return out


def file_cli(path: Path) -> str:
    """The CLI a docs file is about when a section names none."""
    if path.parent.name == "algorithms" and path.stem in PAGE_SCRIPT:
        return PAGE_SCRIPT[path.stem]
    return {"EVALUATION.md": "tools.evaluate"}.get(
        path.name, "data.prepare" if path.parent.name == "data" else "grpo_base"
    )


# -- reading markdown ------------------------------------------------------------------------------


@dataclasses.dataclass
class Section:
    heading: str
    paragraphs: list = dataclasses.field(default_factory=list)  # (first line, text): prose, tables included
    blocks: list = dataclasses.field(default_factory=list)  # (first line, text): fenced code

    def clis(self, path: Path) -> list[str]:
        text = "\n".join([self.heading] + [t for _, t in self.paragraphs + self.blocks])
        return [file_cli(path), *sorted(named_clis(text) - {file_cli(path)})]


@functools.cache
def sections(path: Path) -> list[Section]:
    out, fence, block, para = [Section("")], None, None, None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if fence:
            if line.strip().startswith(fence):
                out[-1].blocks.append(block)
                fence = None
            else:
                block = (block[0], block[1] + line + "\n")
            continue
        if m := re.match(r"\s*(```+|~~~+)", line):
            fence, block, para = m.group(1), (n + 1, ""), None
        elif re.match(r"#{1,6} ", line):
            out.append(Section(line.lstrip("#").strip()))
            para = None
        elif not line.strip():
            para = None
        elif para is None:
            para = [n, line]
            out[-1].paragraphs.append(para)
        else:
            para[1] += "\n" + line
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


# -- shell text -> commands ------------------------------------------------------------------------


def shell_commands(text: str, first_line: int) -> list[tuple[int, list[str]]]:
    """(line, argv) of each simple command in shell text: `\\` continuations joined, comments and
    placeholders (`<...>`) dropped, `for v in a b; do ...; done` expanded."""
    segments, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        lexer = shlex.shlex(PLACEHOLDER.sub(" ... ", line), posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        try:
            tokens = list(lexer)
        except ValueError as e:
            segments.append((first_line + start, ["<shell>", str(e)]))
            continue
        segment = []
        for t in [*tokens, ";"]:
            if t in SEPARATORS:
                if segment:
                    segments.append((first_line + start, segment))
                segment = []
            else:
                segment.append(t)
    out, k = [], 0
    while k < len(segments):
        n, seg = segments[k]
        k += 1
        if seg[0] != "for" or len(seg) < 3 or seg[2] != "in":
            out.append((n, seg))
            continue
        body = []
        while k < len(segments) and segments[k][1] != ["done"]:
            line, s = segments[k]
            body += [(line, s[1:] if s[0] == "do" else s)] if s != ["do"] else []
            k += 1
        k += 1
        for word in seg[3:]:
            out += [
                (line, [t.replace("${" + seg[1] + "}", word).replace("$" + seg[1], word) for t in s])
                for line, s in body
            ]
    return [(n, argv) for n, argv in out if argv]


def program(argv: list[str]) -> list[str]:
    """argv without leading VAR=value assignments."""
    while argv and re.match(r"\w+=", argv[0]):
        argv = argv[1:]
    return argv


def is_ours(argv: list[str]) -> bool:
    argv = program(argv)
    return bool(argv) and (argv[0] in ("python", "python3") or argv[:2] == ["accelerate", "launch"])


def is_launch(argv: list[str]) -> bool:
    """A training script's command (not a tool's)."""
    return is_ours(argv) and any(t.endswith(".py") and t.removeprefix("./")[:-3] in SCRIPTS for t in argv)


def doc_commands(path: Path) -> list[tuple[int, list[str]]]:
    """Every python / accelerate launch command of a docs file: fenced, and inline (`python ...`)."""
    out = []
    for sec in sections(path):
        for start, text in sec.blocks:
            out += [c for c in shell_commands(text, start) if is_ours(c[1])]
        for start, text in sec.paragraphs:
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
    """None if `parse()` accepts its argv; else the one-line error it stops with."""
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


def script_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without `...` and the flags whose value it stands for, those flags): `--model ...`."""
    out, dropped = [], []
    for t in argv:
        if t == "...":
            if out and out[-1].startswith("--") and "=" not in out[-1]:
                dropped.append(out.pop())
            continue
        out.append(t)
    return out, dropped


def check_command(argv: list[str]) -> str | None:
    """Why a documented command would not start as written, or None."""
    argv = program(argv)
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
        target, rest = argv[at], argv[at + 1 :]
        if target == "tests/engines/cpu_entry.py" and rest:  # the CPU engine harness runs the script after it
            target, rest = rest[0], rest[1:]
    elif len(argv) > 2 and argv[1] == "-m":
        target, rest = argv[2], argv[3:]
    elif len(argv) > 1 and argv[1].endswith(".py"):
        target, rest = argv[1], argv[2:]
    else:
        return None  # python -c, python --version: not a CLI of this project
    target = target.removeprefix("./")
    rest, elided = script_argv(rest)
    if "$" in " ".join([target, *rest]):
        return f"unexpanded shell variable in {shlex.join([target, *rest])}"
    if target.endswith(".py"):
        if not (ROOT / target).is_file():
            return f"no script {target}"
        if target.startswith(("benchmarks/", "scripts/")):
            unknown = [t for t in rest if t.startswith("--") and t[2:].split("=")[0] not in flags_of(target)]
            return f"{target}: unknown flag(s) {unknown}" if unknown else None
        name = target.removesuffix(".py")
        if name not in SCRIPTS:
            return f"{target} is not a CLI this test knows: add it to tests/test_docs.py"
    else:
        name = target
        if name in NOT_OURS:
            return None
        if name not in MODULES:
            if importlib.util.find_spec(name.split(".")[0]) is None or importlib.util.find_spec(name) is None:
                return f"no module {name}"
            return f"python -m {name} is not a CLI this test knows: add it to tests/test_docs.py"
    if unknown := [f for f in elided if f[2:] not in flags_of(name)]:
        return f"{target}: unknown flag(s) {unknown}"
    if "--config" in rest and rest.index("--config") + 1 < len(rest):
        recipe = rest[rest.index("--config") + 1]
        if not (ROOT / recipe).is_file():
            return f"{target}: --config {recipe}: no such recipe"
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


# -- flags named in the text -----------------------------------------------------------------------


def mention_problems(path: Path) -> list[str]:
    problems = []

    def check(line: int, text: str, clis: list[str]) -> None:
        known = set().union(*(flags_of(c) for c in clis)) | accelerate_flags()
        for m in FLAG.finditer(text):
            if m.group(1) not in known:
                where = line + text[: m.start()].count("\n")
                problems.append(f"{rel(path)}:{where}: --{m.group(1)} is not a flag of {', '.join(clis)}")

    for sec in sections(path):
        clis = sec.clis(path)
        for start, text in sec.paragraphs:
            # Inline commands are parsed whole (below); another program's flags are its own.
            prose = re.sub(r"`((?:python3?|accelerate launch) [^`]+|(?:" + "|".join(FOREIGN) + r") [^`]*)`", "``", text)
            check(start, prose, clis)
        for start, text in sec.blocks:
            kind, continued = "text", False
            for i, line in enumerate(text.split("\n")):
                words = program(line.split())
                if not continued:  # a new line of shell (not a `\\` continuation), or of something else
                    kind = "text"
                    if words and words[0] in ("python", "python3", "accelerate", "for", "do", "done"):
                        kind = "ours"
                    elif words and words[0] in FOREIGN:
                        kind = "foreign"
                continued = line.rstrip().endswith("\\")
                if kind == "ours":  # the command itself is parsed whole (test_every_command_parses); its comment
                    if comment := re.search(r"(?:^|\s)#(\s.*)$", line):
                        check(start + i, comment.group(1), clis)
                elif kind == "text":
                    check(start + i, line, clis)
    return problems


# -- defaults in flag tables -----------------------------------------------------------------------


def table_rows(text: str):
    """(row offset, {column: cell}) of each body row of the markdown tables in a paragraph."""
    rows = text.split("\n")
    if len(rows) < 3 or not rows[0].startswith("|") or not re.match(r"\|[\s:|-]+\|?$", rows[1]):
        return
    header = [c.strip().lower() for c in rows[0].strip("|").split("|")]
    for i, row in enumerate(rows[2:], 2):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]
        yield i, dict(zip(header, cells))


def default_problems(path: Path) -> list[str]:
    problems = []
    for sec in sections(path):
        clis = sec.clis(path)
        for start, text in sec.paragraphs:
            for i, row in table_rows(text):
                if "flag" not in row or "default" not in row:
                    continue
                names = re.findall(r"--(\w+)", row["flag"])
                stated = re.sub(r"\s*\(.*\)$", "", row["default"].replace("`", "")).strip()
                values = [v.strip() for v in stated.split(" / ")] if len(names) > 1 else [stated]
                where = f"{rel(path)}:{start + i}"
                if len(values) != len(names):
                    problems.append(f"{where}: {len(names)} flags but default {row['default']!r}")
                    continue
                for name, value in zip(names, values):
                    owner = next((c for c in clis if name in flags_of(c)), None)
                    if owner is None:
                        continue  # reported by the flag check
                    cls = next(c for c in cli(owner) if name in {f.name for f in dataclasses.fields(c)})
                    field = next(f for f in dataclasses.fields(cls) if f.name == name)
                    try:
                        parsed = _converter(typing.get_type_hints(cls)[name])[1](value)
                    except (ValueError, TypeError) as e:
                        problems.append(f"{where}: --{name}: cannot read the default {value!r} ({e})")
                        continue
                    if parsed != field.default:
                        problems.append(f"{where}: --{name}: the table says {value}, {owner} says {field.default!r}")
    return problems


# -- metrics ---------------------------------------------------------------------------------------


@functools.cache
def logged_metrics() -> dict[str, frozenset[str]]:
    """Each script's metric keys beyond the shared ones, from its own functions on a tiny batch;
    "shared": step_metrics' (grpo_base.py, the same in every script) and end_step's."""
    from collections import Counter

    import torch

    from common.dynamic_sampling import Filled
    from common.session import Session

    G, C, P = 4, 5, 3
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1])  # mixed, all wrong, all right
    N = len(rewards)
    torch.manual_seed(0)
    logp = -torch.rand(N, C) - 0.1
    old = {"logp": logp, "entropy": torch.rand(N, C) + 0.1, "prompt_logp": -torch.rand(N, P - 1) - 0.1}
    batch = {
        "completion_mask": torch.ones(N, C), "prompt_mask": torch.ones(N, P), "rollout_logp": logp.clone(),
        "finished": torch.ones(N, dtype=torch.bool),
    }  # fmt: skip
    out = {}
    for name, fn in [("edge_grpo", "edge_advantages"), ("egpo", "egpo_advantages"), ("cw_grpo", "cw_advantages"),
                     ("pro_grpo", "pro_advantages"), ("dr_grpo", "dr_advantages"), ("kl_cov", "kl_cov_advantages"),
                     ("dapo", "dapo_advantages")]:  # fmt: skip
        module = importlib.import_module(PAGE_SCRIPT[name].replace("/", "."))
        explicit = {"egpo": [batch["completion_mask"]], "dapo": [torch.zeros(N)]}.get(
            name, []
        )  # entropy mask, R_length
        advantages, info = getattr(module, fn)(rewards, old, batch, G, module.Args(), *explicit)
        out[name] = set(info)
    edge = importlib.import_module("edge_grpo")
    out["edge_grpo"] |= set(edge.gec_metrics(["reflection", None] * (N // 2), [0.0] * N, [1.0] * N)) | {"time/gec_s"}
    base = importlib.import_module("grpo_base")
    s = SimpleNamespace(accelerator=SimpleNamespace(device="cpu", num_processes=1))
    scores = SimpleNamespace(reward=rewards, accuracy=rewards)
    sums = Counter(clip_low=0, clip_high=0, approx_kl=0, tokens=N * C, loss=1.0, optimizer_steps=1)
    timer = SimpleNamespace(seconds={"rollout": 1.0})
    shared = set(base.step_metrics(s, scores, batch, old, rewards, sums, G, timer))
    kl_cov = importlib.import_module("baselines.kl_cov")  # its step_metrics adds what the loss selected
    out["kl_cov"] |= set(kl_cov.step_metrics(s, scores, batch, old, rewards, sums, G, timer)) - shared
    dapo = importlib.import_module("baselines.dapo")  # dynamic sampling's figures, beside the advantage's
    out["dapo"] |= set(dapo.sampling_metrics(s, Filled([], 0, 1, 0, 0, False), Counter(), 4))
    shared |= set(re.findall(r'"((?:train|time|reward)/\w+)"', inspect.getsource(Session.end_step)))
    correction = RolloutCorrection("none", 0.0, math.inf)  # every script logs the rollout correction's figures
    _, stats = correction.weights(old["logp"], batch | {"rollout_logp": old["logp"]})
    shared |= set(correction.figures(s.accelerator, stats))
    return {k: frozenset(v) for k, v in out.items()} | {"shared": frozenset(shared)}


@functools.cache
def phases() -> frozenset[str]:
    """The step phases timed as time/<phase>_s."""
    sources = [(ROOT / f"{s}.py").read_text() for s in SCRIPTS] + [(ROOT / "common" / "session.py").read_text()]
    return frozenset(p for src in sources for p in re.findall(r'timer\("(\w+)"\)', src))


def known_metric(name: str) -> bool:
    everything = set().union(*logged_metrics().values())
    if name in everything or name == "time/<phase>_s":
        return True
    if name.endswith("*"):  # a pattern: train/clip_frac_*, or a namespace as tools.plot --metrics takes it (egpo/*)
        return any(fnmatch.fnmatchcase(k, name) for k in everything)
    if m := re.fullmatch(r"time/(\w+)_s", name):
        return m.group(1) in phases()
    return bool(re.fullmatch(r"eval/[\w<>.-]+/(pass@[\w<>]+|num_problems|response_len|truncated_frac)", name))


def covered(key: str, listed: set[str]) -> bool:
    return key in listed or (re.fullmatch(r"time/\w+_s", key) is not None and "time/<phase>_s" in listed)
