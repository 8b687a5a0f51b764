"""Command-line flags from a config dataclass (one flag per field, help from `arg`)."""

import argparse
import dataclasses
import typing
from contextlib import contextmanager


def arg(default, help: str, choices: list | None = None):
    """A config field with its help string (and allowed values)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def parse_args(cls, argv: list[str] | None = None, description: str | None = None):
    """Parse `--field value` flags into an instance of dataclass `cls`.

    Bools accept `--flag` (true) or `--flag false`; `X | None` fields accept `none`.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        optional = type(None) in typing.get_args(kind)
        if optional:
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        convert = _bool if kind is bool else kind
        if optional:
            convert = (lambda c: lambda s: None if s.lower() == "none" else c(s))(convert)
        extra = {"nargs": "?", "const": True} if kind is bool else {}
        parser.add_argument(
            f"--{f.name}",
            type=convert,
            default=f.default,
            choices=f.metadata.get("choices"),
            help=f"{f.metadata.get('help', '')} (default: {f.default})",
            **extra,
        )
    return cls(**vars(parser.parse_args(argv)))


def require(condition: bool, message: str) -> None:
    """Stop with a one-line message naming the bad flag (no traceback)."""
    if not condition:
        raise SystemExit(f"error: {message}")


@contextmanager
def clear_errors(flag: str | None = None):
    """A loader's error (missing file, unreachable hub, missing column) as one line, naming the flag if given."""
    try:
        yield
    except (OSError, ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {flag}: {e}" if flag else f"error: {e}") from None
