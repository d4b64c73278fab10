#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, for a bare GPU machine (no network, maybe no Rust):
#   1. the `cuda` tests;
#   2. the same tests under TORCH_CUDA_SANITIZER=1 (torch's stream-race checker);
#   3. bench/gpu_stream.py.
# It uses what it finds: the python3 that has torch (or PYTHON=..., or a virtualenv given as
# the first argument), and the extension built elsewhere and carried along
# (python/trash_panda/_core.abi3.so). What is missing is said in one line and it stops in
# seconds. Each check has its own time limit; all of them fit in 8 minutes. One summary line
# per check at the end.
#
#   scripts/gpu-check.sh [VENV]        run the checks
#   scripts/gpu-check.sh --dry-run [VENV]  say what would run and whether this machine can
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dry=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    *) PYTHON="$arg/bin/python" ;;
  esac
done
PY=${PYTHON:-python3}
export PYTHONPATH="$root/python:$root/tests" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

LIMIT_TESTS=${LIMIT_TESTS:-150}
LIMIT_SANITIZER=${LIMIT_SANITIZER:-150}
LIMIT_BENCH=${LIMIT_BENCH:-150}
summary=()
missing=()

say() { echo "gpu-check: $*"; }

# What is needed, checked in seconds.
command -v "$PY" >/dev/null 2>&1 || missing+=("python ($PY not found; pass a virtualenv or PYTHON=)")
if [ ${#missing[@]} -eq 0 ]; then
  for mod in torch pytest safetensors; do
    "$PY" -c "import $mod" >/dev/null 2>&1 || missing+=("the Python package $mod (for $PY)")
  done
fi
[ -f python/trash_panda/_core.abi3.so ] || missing+=(
  "the extension python/trash_panda/_core.abi3.so (build it with 'make build' where Rust is, and carry it)")
gpu=0
if [ ${#missing[@]} -eq 0 ] && "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  gpu=1
fi

plan() {
  say "1. cuda tests:       $PY -m pytest -q -m cuda tests/test_cuda.py   (limit ${LIMIT_TESTS}s)"
  say "2. with sanitizer:   TORCH_CUDA_SANITIZER=1, the same tests          (limit ${LIMIT_SANITIZER}s)"
  say "3. benchmark:        $PY bench/gpu_stream.py                         (limit ${LIMIT_BENCH}s)"
}

if [ $dry -eq 1 ]; then
  plan
  if [ ${#missing[@]} -gt 0 ]; then
    for m in "${missing[@]}"; do say "missing: $m"; done
  elif [ $gpu -eq 0 ]; then
    say "no CUDA device here: nothing would run"
  else
    say "ready to run"
  fi
  exit 0
fi

if [ ${#missing[@]} -gt 0 ]; then
  for m in "${missing[@]}"; do say "missing: $m"; done
  exit 2
fi
if [ $gpu -eq 0 ]; then
  say "no CUDA device visible to torch ($("$PY" -c 'import torch; print(torch.__version__)' 2>&1))"
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
plan

run() {  # name limit command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  say "== $name"
  timeout "$limit" "$@"
  local rc=$?
  local took=$((SECONDS - start))
  case $rc in
    0) summary+=("PASS  $name (${took}s)") ;;
    124) summary+=("TIMEOUT $name (limit ${limit}s)") ;;
    *) summary+=("FAIL  $name (exit $rc, ${took}s)") ;;
  esac
}

run "cuda tests" "$LIMIT_TESTS" "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py
run "cuda tests under TORCH_CUDA_SANITIZER" "$LIMIT_SANITIZER" \
  env TORCH_CUDA_SANITIZER=1 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py
run "gpu_stream benchmark" "$LIMIT_BENCH" "$PY" bench/gpu_stream.py --blocks 32 --resident 8 --workers 1 2 4 --lookahead 1 2

echo
for line in "${summary[@]}"; do say "$line"; done
case "${summary[*]}" in *FAIL*|*TIMEOUT*) exit 1 ;; esac
exit 0
