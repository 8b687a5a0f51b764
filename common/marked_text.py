"""Generated text inside a hand-written file (README.md, docs pages): the part between two marker lines."""

from pathlib import Path


def write_between(path: Path, begin: str, end: str, body: str, what: str, find: str | None = None) -> None:
    """Rewrite `path`'s text between the markers `begin` and `end` with `body`, keeping the rest. `find`: a prefix of
    `begin` that locates the marker (an older marker line is rewritten whole); a file without the markers is a
    one-line error naming `what` they hold."""
    text = path.read_text()
    if (find or begin) not in text or end not in text:
        raise SystemExit(f"error: {path} has no {what} markers ({begin} ... {end})")
    head, rest = text.split(find or begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}")
