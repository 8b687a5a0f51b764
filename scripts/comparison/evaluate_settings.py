"""Several `python -m tools.evaluate` command lines in one process, each evaluating as its own process would
(every problem's seed from --seed and its place), an engine made alike reused, so that vLLM starts once per model.

    python -m scripts.comparison.evaluate_settings -- --model RUN --temperature 0 --n 1 ... -- --model RUN ...
"""

import sys

import tools.evaluate as tool
from common.cli import parse_args


def command_lines(argv: list[str]) -> list[list[str]]:
    """The command lines between the `--` separators (the first one leads)."""
    if not argv or argv[0] != "--":
        raise SystemExit("usage: python -m scripts.comparison.evaluate_settings -- FLAGS [-- FLAGS ...]")
    lines, line = [], []
    for word in argv[1:] + ["--"]:
        if word != "--":
            line.append(word)
        elif line:
            lines.append(line)
            line = []
    return lines


def main(argv: list[str]) -> None:
    parsed = []
    for line in command_lines(argv):  # every line checked before the first engine starts
        given: set[str] = set()
        args = parse_args(tool.Args, argv=line, description=tool.__doc__, given=given)
        parsed.append((args, tool.validate(args), given))
    engines: dict = {}
    try:
        for i, (args, ks, given) in enumerate(parsed):
            if i and args.model != parsed[i - 1][0].model:  # another model: the last one's engine is done with
                close(engines)
            tool.main(args, ks, given, engines=engines)
    finally:
        close(engines)


def close(engines: dict) -> None:
    for engine in engines.values():
        engine.close()
    engines.clear()


if __name__ == "__main__":
    main(sys.argv[1:])
