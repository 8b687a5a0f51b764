#!/usr/bin/env bash
# gpu_check/first_run.py's dry run (every part at toy sizes, on CPU) under the lent GPU machine's versions:
# Python 3.12, torch 2.11.0, transformers 5.17.0, accelerate 1.15.0 and math-verify 0.9.0; no vLLM, no DeepSpeed.
# This machine's environment has other versions (torch 2.13+cpu, vLLM), so a dry run here can pass where the GPU
# machine's first call fails on an import or an API that moved. Not a timing: the machine may be shared.
#
#   bash gpu_check/gpu_versions_dry_run.sh [REPORT]     # default docs/gpu_first_run_dry.md (its JSON beside it)
#
# The virtual environment is .venv-gpu-versions/ (in .gitignore), made once and reused while its versions are
# right; torch comes from PyPI (its plain Linux wheel, CUDA libraries and all: ~3 GB, once). Python: $PYTHON, else
# pyenv's or uv's 3.12, else python3 (with a warning). Runs and logs go to $WORK_DIR (default /tmp/gpu_versions_dry_run).
# Exits with first_run.py's status.
set -euo pipefail
cd "$(dirname "$0")/.."
report=${1:-docs/gpu_first_run_dry.md}
venv=.venv-gpu-versions
work=${WORK_DIR:-/tmp/gpu_versions_dry_run}
pins=(torch==2.11.0 transformers==5.17.0 accelerate==1.15.0
    math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2)

find_python() {
    [[ -n ${PYTHON:-} ]] && { echo "$PYTHON"; return; }
    local p
    for p in "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/3.12*/bin/python3.12 \
        "$(uv python find 3.12 2>/dev/null)"; do
        [[ -x $p ]] && { echo "$p"; return; }
    done
    echo "gpu_versions_dry_run: no Python 3.12 found; using python3 (the GPU machine has 3.12)" >&2
    echo python3
}
py=$(find_python)
py_minor=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# True when the venv's Python is $py_minor and every pin is installed at its version.
venv_ok() {
    [[ -x $venv/bin/python ]] && "$venv/bin/python" - "$py_minor" "${pins[@]}" 2>/dev/null <<'EOF_PY'
import sys
from importlib.metadata import version

pins = [p.split("==") for p in sys.argv[2:]]
ok = "%d.%d" % sys.version_info[:2] == sys.argv[1] and all(version(n).split("+")[0] == v for n, v in pins)
sys.exit(0 if ok else 1)
EOF_PY
}

if venv_ok; then
    echo "gpu_versions_dry_run: reusing $venv"
else
    echo "gpu_versions_dry_run: making $venv with Python $py_minor and ${pins[*]}"
    rm -rf "$venv"
    if command -v uv >/dev/null; then  # PyPI only: torch 2.11.0 lies there and not in this machine's local indexes
        uv venv -q --python "$py" "$venv"
        uv pip install -q --python "$venv/bin/python" --index-url https://pypi.org/simple "${pins[@]}"
    else
        "$py" -m venv "$venv"
        "$venv/bin/python" -m pip install -q "${pins[@]}"
    fi
    venv_ok || { echo "gpu_versions_dry_run: $venv lacks a pinned version" >&2; exit 1; }
fi
"$venv/bin/python" -c 'import sys, torch, transformers, accelerate
print(f"gpu_versions_dry_run: Python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, accelerate {accelerate.__version__}")'

mkdir -p "$work" "$(dirname "$report")"
exec "$venv/bin/python" gpu_check/first_run.py --dry_run --out "$report" --work_dir "$work"
