"""Command-line flags from config dataclasses, and one-line errors.

One flag per field, its help and range on the field (`arg`): a bad value stops in one line naming the flag, before
anything heavy loads. `--help` groups the flags under the dataclass's comment lines (`# What to train.`);
`--config FILE.yaml` (a recipe) sets flags that the command line overrides. Imports nothing heavy, nothing of common/.
"""

import argparse
import dataclasses
import inspect
import operator
import os
import re
import sys
import typing
from contextlib import contextmanager
from pathlib import Path

# Flags that set the same thing two ways: given on the command line, one drops a recipe's value of the
# other (back to its default), so `--config R.yaml --steps 2` runs 2 steps whatever R says of epochs.
ALTERNATIVES = {"steps": "epochs", "epochs": "steps"}


def arg(
    default,
    help: str,
    choices: list | None = None,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    resumable: bool | None = None,
    positional: bool = False,
    required: bool = False,
    repeatable: bool = False,
):
    """A config field: default, help, allowed values or range, whether `--resume` may change it (`is_resumable`),
    and for tools, positional or required. `repeatable`: `--stop a --stop b` gives "a,b"."""
    bounds = {"at_least": at_least, "above": above, "at_most": at_most, "below": below}
    meta = {"help": help, "choices": choices, "bounds": {k: v for k, v in bounds.items() if v is not None}}
    meta |= {"positional": positional, "required": required, "repeatable": repeatable}
    if resumable is not None:
        meta["resumable"] = resumable
    return dataclasses.field(default=default, metadata=meta)


_BOUND_TEXT = {"at_least": ">=", "above": ">", "at_most": "<=", "below": "<"}
_BOUND_TEST = {"at_least": operator.ge, "above": operator.gt, "at_most": operator.le, "below": operator.lt}


def range_text(field: dataclasses.Field) -> str:
    """ "> 0, <= 1" for a field declared with above=0, at_most=1 ("" without bounds)."""
    return ", ".join(f"{_BOUND_TEXT[k]} {b:g}" for k, b in field.metadata.get("bounds", {}).items())


def check_range(field: dataclasses.Field, value) -> str | None:
    """Why `value` is outside the field's range, or None; None (an optional flag) passes."""
    if value is None:
        return None
    for kind, bound in field.metadata.get("bounds", {}).items():
        if not _BOUND_TEST[kind](value, bound) or value != value:  # NaN fails every bound
            return f"--{field.name} must be {range_text(field)} (got {value:g})"
    return None


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _converter(kind):
    """(The type, str -> value) of a field's type; `X | None` accepts "none"."""
    args = typing.get_args(kind)
    if type(None) not in args:
        return kind, _bool if kind is bool else kind
    kind = next(a for a in args if a is not type(None))
    convert = _bool if kind is bool else kind
    return kind, lambda s: None if s.lower() == "none" else convert(s)


def _sections(cls) -> dict[str, str]:
    """field name -> the title of the comment section it sits in (`# What to train. ...` -> "What to train")."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out, title = {}, cls.__name__
    for line in source.splitlines():
        if m := re.match(r"\s+# ([^.:]+)[.:]", line):
            title = m.group(1).strip()
        elif m := re.match(r"\s+(\w+): ", line):
            out[m.group(1)] = title
    return out


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), printed by rank 0."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n" if _rank0() else None)


class _Joined(argparse.Action):
    """A repeatable flag: each occurrence's value joined to the earlier ones' with a comma."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = getattr(namespace, f"_seen_{self.dest}", False)
        before = getattr(namespace, self.dest)
        setattr(namespace, self.dest, f"{before},{values}" if seen and before is not None else values)
        setattr(namespace, f"_seen_{self.dest}", True)


def parse_args(*classes, argv: list[str] | None = None, description: str | None = None, given: set | None = None):
    """One instance of each dataclass in `classes` from `--field value` flags (the instance itself for one class).
    Bools take `--flag` or `--flag false`. `given`: filled with the flags set on the command line or by `--config`,
    for a tool that takes the others' defaults elsewhere (tools/evaluate.py: from the run it evaluates)."""
    fields = [(cls, f) for cls in classes for f in dataclasses.fields(cls)]
    names = [f.name for _, f in fields]
    if len(set(names)) < len(names):
        raise ValueError(f"flag names repeat across {[c.__name__ for c in classes]}")
    positionals = [
        f.name + (" ..." if typing.get_origin(f.type) is list else "")
        for _, f in fields
        if f.metadata.get("positional")
    ]
    usage = " ".join(["%(prog)s", *positionals, "[--config RECIPE.yaml] [--flag value ...]"])  # the flags: below
    parser = _Parser(description=description, usage=usage, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="YAML file of flags (recipes/); command-line flags override it")
    groups, converters = {}, {}
    for cls in classes:
        hints, sections = typing.get_type_hints(cls), _sections(cls)
        for f in dataclasses.fields(cls):
            kind, convert = _converter(hints[f.name])
            converters[f.name] = convert
            title = sections.get(f.name, cls.__name__)
            group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
            limits = range_text(f)
            text = f.metadata.get("help", "")
            if also := getattr(f.metadata.get("choices"), "also", None):  # choices that admit more than they list
                text += f", {also}"
            if f.metadata.get("positional"):
                many = typing.get_origin(kind) is list
                item = typing.get_args(kind)[0] if many else convert
                group.add_argument(
                    f.name, type=item, nargs="+" if many else None, choices=f.metadata.get("choices"), help=text
                )
                continue
            extra = {"nargs": "?", "const": True} if kind is bool else {}
            if f.metadata.get("repeatable"):
                extra["action"] = _Joined
            if f.metadata.get("required"):
                extra["required"] = True
            else:
                text += f" (default: {f.default}{'; ' + limits if limits else ''})"
            group.add_argument(
                f"--{f.name}", type=convert, default=f.default, choices=f.metadata.get("choices"), help=text, **extra
            )
    argv = sys.argv[1:] if argv is None else argv
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("--config", default=None)
    path = config.parse_known_args(argv)[0].config
    recipe = {}
    if path:
        recipe = _recipe(path, converters, {f.name: f for _, f in fields})
        on_line = _given(parser, names, argv)
        defaults = {f.name: f.default for _, f in fields}
        for name, other in ALTERNATIVES.items():
            if name in on_line and other in recipe and other not in on_line and other in defaults:
                recipe[other] = defaults[other]  # the command line's --steps beats the recipe's epochs
        parser.set_defaults(**recipe)
    values = vars(parser.parse_args(argv))
    values.pop("config")
    explicit = _given(parser, names, argv) | set(recipe)  # set here, by the command line or the recipe
    if given is not None:
        given |= explicit
    values = _resumed(classes, values, explicit, Path(sys.argv[0]).stem if argv is None else None)
    for _, f in fields:
        if problem := check_range(f, values[f.name]):
            require(False, problem)
    out = tuple(cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)}) for cls in classes)
    return out[0] if len(out) == 1 else out


def _resumed(classes, values: dict, explicit: set[str], script: str | None) -> dict:
    """`--resume`: each flag not set here (`explicit`) takes its value from the run's record (the class with
    `recorded_flags`, RunFlags; never its START_FLAGS), so a resume needs only --output_dir. A change `--resume` may
    not make (`is_resumable`) is refused in one line; the changes taken, and flags the record lacks, are said."""
    owner = next((c for c in classes if hasattr(c, "recorded_flags")), None)
    found = owner.recorded_flags(values, script) if owner is not None and values.get("resume") else None
    if found is None:
        return values
    recorded, source = found
    start_only = set(getattr(owner, "START_FLAGS", ()))  # where the run is, how this start treats it
    fields = {f.name: (c, f) for c in classes for f in dataclasses.fields(c) if f.name not in start_only}
    dropped = {ALTERNATIVES[n] for n in explicit if n in ALTERNATIVES} - explicit
    out = dict(values)
    for name, (_, f) in fields.items():
        if name in recorded and name not in explicit:
            out[name] = f.default if name in dropped else recorded[name]
            if (choices := f.metadata.get("choices")) and out[name] not in choices:
                require(
                    False,
                    f"--resume: {source} records --{name} {out[name]!r}, which this version does not take (choose "
                    f"from {', '.join(map(str, choices))}); give --{name}",
                )
    changed = {n: (recorded[n], out[n]) for n in fields if n in recorded and out[n] != recorded[n]}
    refused = {n: v for n, v in changed.items() if not is_resumable(*fields[n])}
    if refused:
        raise SystemExit(owner.refused_changes(source.parent, refused) if _rank0() else 1)
    if _rank0():
        taken = ", ".join(f"--{k} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
        unknown = sorted(set(recorded) - set(fields) - start_only)
        unrecorded = sorted(n for n in explicit if n in fields and n not in recorded)
        print(
            f"--resume: the run's flags from {source}"
            + (f"; changed here: {taken}" if taken else "")
            + (f"; not in the record, taken as given: --{', --'.join(unrecorded)}" if unrecorded else "")
            + (f"; recorded but not flags of this script, left out: {', '.join(unknown)}" if unknown else "")
        )
    return out


def _given(parser: argparse.ArgumentParser, names: list[str], argv: list[str]) -> set[str]:
    """The flags `argv` sets itself (abbreviations included), as argparse reads them."""
    unset = object()
    saved = {name: parser.get_default(name) for name in names}
    parser.set_defaults(**dict.fromkeys(names, unset))
    try:
        values = vars(parser.parse_known_args(argv)[0])
    finally:
        parser.set_defaults(**saved)
    return {name for name in names if values.get(name) is not unset}


def not_utf8(path) -> str:
    """Where a text file that should be UTF-8 stops being it (line, byte), and the command that converts it."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(2) in (b"\xff\xfe", b"\xfe\xff"):
            return (
                f"{path} is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8; convert it: "
                f"iconv -f UTF-16 -t UTF-8 {path} > {path.with_suffix('.utf8' + path.suffix)}"
            )
        f.seek(0)
        for lineno, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return (
                    f"{path}: line {lineno}: byte 0x{line[e.start]:02x} (column {e.start + 1}) is not UTF-8: the file "
                    f"is in another encoding (latin-1 / cp1252?); convert it, e.g. iconv -f LATIN1 -t UTF-8 {path} > "
                    f"{path.with_suffix('.utf8' + path.suffix)}"
                )
    return f"{path} is not UTF-8"


def _recipe(path: str, converters: dict, fields: dict) -> dict:
    """A recipe's flags, each converted and checked as its command-line flag would be."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except UnicodeDecodeError:
        raise SystemExit(f"error: --config: {not_utf8(path)}") from None
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"error: --config: cannot read {path} ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise SystemExit(f"error: --config: {path} must map flag names to values")
    unknown = sorted(set(raw) - set(converters))
    if unknown:
        raise SystemExit(f"error: --config: {path} sets unknown flag(s) {unknown}; see --help")
    values = {}
    for key, value in raw.items():
        try:
            values[key] = value if value is None else converters[key](value if isinstance(value, str) else str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            raise SystemExit(f"error: --config: {path}: {key}: {e}") from None
        choices = fields[key].metadata.get("choices")
        if choices and values[key] not in choices:
            raise SystemExit(f"error: --config: {path}: {key} must be one of {choices} (got {value!r})")
    return values


def flag_record(*configs) -> tuple[dict, set[str]]:
    """(Every flag's value, the names `--resume` may change) of parsed configs: what a run directory records."""
    fields = [(c, f) for c in configs for f in dataclasses.fields(c)]
    return {f.name: getattr(c, f.name) for c, f in fields}, {f.name for c, f in fields if is_resumable(type(c), f)}


def is_resumable(cls, f: dataclasses.Field) -> bool:
    """May `--resume` change field `f` of `cls`? Its `arg(resumable=...)`, else `cls.RESUMABLE`, else no."""
    return bool(f.metadata.get("resumable", getattr(cls, "RESUMABLE", False)))


def _rank0() -> bool:
    """Rank 0 of a launch, or not launched: the one process that prints a flag error every rank finds."""
    return os.environ.get("RANK", "0") == "0"


def require(condition: bool, message: str) -> None:
    """Stop with a one-line message naming the bad flag (no traceback); every rank checks, rank 0 prints."""
    if not condition:
        raise SystemExit(f"error: {message}" if _rank0() else 1)


@contextmanager
def clear_errors(flag: str | None = None):
    """A loader's error (missing file, unreachable hub, missing column) as one line, naming the flag if given."""
    try:
        yield
    except (OSError, ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {flag}: {e}" if flag else f"error: {e}") from None
