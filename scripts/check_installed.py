"""Exit 0 if this interpreter already has everything a requirements file asks for (setup_cpu.sh: a second run is
a no-op). Walks the requirements and, recursively, the installed dependencies (markers and extras evaluated),
checking each version; IGNORED_NAMEs are skipped, a `# no-deps` line's dependencies too. What it cannot check
counts as missing.

    python scripts/check_installed.py requirements-cpu.txt [IGNORED_NAME ...]
"""

import sys
from importlib import metadata


def main(path, ignored):
    try:
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name
    except ImportError:
        return "packaging is not installed"
    ignored = {canonicalize_name(n) for n in ignored}
    todo = []
    with open(path) as f:
        for line in f:
            line, _, comment = line.partition(" #")
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("-"):
                return f"option line not handled: {line}"
            todo.append((Requirement(line), "no-deps" if "no-deps" in comment else ""))
    seen = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in ignored:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            return f"{req.name} is not installed"
        if req.url or not req.specifier.contains(dist.version, prereleases=True):
            return f"{req.name} {dist.version} does not satisfy {req}"
        if extra == "no-deps":
            continue
        for ex in sorted(req.extras) or [""]:
            if (name, ex) in seen:
                continue
            seen.add((name, ex))
            todo.extend((Requirement(r), ex) for r in dist.requires or [])
    return None


if __name__ == "__main__":
    try:
        missing = main(sys.argv[1], sys.argv[2:])
    except Exception as e:  # an unreadable file or metadata: not known to be installed
        missing = f"{type(e).__name__}: {e}"
    if missing:
        print(f"check_installed: {missing}: installing", file=sys.stderr)
    sys.exit(1 if missing else 0)
