#!/usr/bin/env bash
# The checks that need an NVIDIA GPU: the `cuda` tests and a short streaming benchmark.
# Runs in a few minutes. Needs python3 with torch, pytest and safetensors, and the extension:
# build it with `make build` (here or on a machine with Rust), or carry
# python/trash_panda/_core.abi3.so from a machine of the same architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python:$PWD/tests" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ ! -f python/trash_panda/_core.abi3.so ]; then
  make build
  PY=.venv/bin/python
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__)"
timeout 300 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py
timeout 240 "$PY" bench/gpu_stream.py --blocks 32 --resident 8
