#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, for a bare GPU machine (no network, no Rust, no make):
#   1. the extension imports (built elsewhere and carried: python/trash_panda/_core.abi3.so);
#   2. the `cuda` tests;
#   3. each defect put back (tests/support/faults.py, TRASH_PANDA_FAULT=name): the cuda test that names
#      it must fail, or the check proves nothing;
#   4. the same tests under TORCH_CUDA_SANITIZER=1 (torch's stream-race checker, made to key
#      accesses by allocation and to watch the loader's thread: tests/support/sanitizer.py);
#   5. the sanitizer with a missing wait put back: it must report the race;
#   6. examples/pipeline_stages.py on the GPU (chained stages and the Pipeline runner against the
#      plain pipeline on the same device);
#   7. bench/gpu_stream.py (copy rates against torch's own pinned copy and the model's).
# It uses the python3 that has torch (or PYTHON=..., or a virtualenv given as an argument).
# What is missing, an extension that does not import, or no GPU is said in one line, and it
# stops in seconds. Each check has its own time limit, and all of them together fit in
# 8 minutes on one H200; one summary line per check at the end; non-zero exit when any failed.
#
#   scripts/gpu-check.sh [VENV]            run the checks
#   scripts/gpu-check.sh --dry-run [VENV]  say what would run and whether this machine can
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
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

# Seconds; the sum stays under 8 minutes with room for starting up.
LIMIT_IMPORT=${LIMIT_IMPORT:-15}
LIMIT_TESTS=${LIMIT_TESTS:-75}
LIMIT_FAULT=${LIMIT_FAULT:-25}  # each of the seven
LIMIT_SANITIZER=${LIMIT_SANITIZER:-80}
LIMIT_SANITIZER_FAULT=${LIMIT_SANITIZER_FAULT:-20}  # each of the two
LIMIT_EXAMPLE=${LIMIT_EXAMPLE:-30}
LIMIT_BENCH=${LIMIT_BENCH:-60}

# Each defect put back, and the cuda test that must then fail.
C=tests/device/test_cuda.py
FAULTS=(
  "first-copy-wait $C::test_the_first_copy_into_a_slot_waits_for_the_kernels_its_memory_carries"
  "retire-current-stream $C::test_freed_blocks_wait_for_the_work_of_another_stream[given_back]"
  "close-no-sync $C::test_an_expansion_buffer_is_freed_after_the_work_of_another_stream"
  "loader-default-stream $C::test_the_loader_copies_beside_the_kernels_queued_on_the_default_stream"
  "ram-tier-on-arrival $C::test_a_ram_tier_read_ahead_is_pinned_when_it_arrives"
  "staging-unpinned $C::test_staging_views_are_pinned_and_copies_do_not_block"
  "meter-reset $C::test_the_meter_leaves_the_users_peak_and_the_device_alone"
)
# A missing wait the sanitizer must report, and the cuda test it runs.
SANITIZER_FAULTS=(
  "compute-no-wait $C::test_every_tier_on_gpu"
  "loader-no-event-wait $C::test_a_block_read_ahead_computes_after_its_copies"
)
EXT=python/trash_panda/_core.abi3.so
summary=()
missing=()
started=$SECONDS

say() { echo "gpu-check: $*"; }

plan() {
  say "1. import:          $PY -c 'import trash_panda._core'                (limit ${LIMIT_IMPORT}s)"
  say "2. cuda tests:      $PY -m pytest -q -m cuda tests/device/test_cuda.py tests/offload/test_gpu_swap.py tests/runner/test_pipeline_devices.py (limit ${LIMIT_TESTS}s)"
  say "3. defects put back: ${#FAULTS[@]} runs of one cuda test each, TRASH_PANDA_FAULT=name; each must fail (limit ${LIMIT_FAULT}s each)"
  say "4. with sanitizer:  TORCH_CUDA_SANITIZER=1, the tests of 2           (limit ${LIMIT_SANITIZER}s)"
  say "5. sanitizer faults: ${#SANITIZER_FAULTS[@]} missing waits it must report (limit ${LIMIT_SANITIZER_FAULT}s each)"
  say "6. example:         $PY examples/pipeline_stages.py --device cuda     (limit ${LIMIT_EXAMPLE}s)"
  say "7. benchmark:       $PY bench/gpu_stream.py                           (limit ${LIMIT_BENCH}s)"
}

# What is needed, checked in seconds.
command -v "$PY" >/dev/null 2>&1 || missing+=("python ($PY not found; pass a virtualenv or PYTHON=)")
if [ ${#missing[@]} -eq 0 ]; then
  for mod in torch pytest safetensors; do
    "$PY" -c "import $mod" >/dev/null 2>&1 || missing+=("the Python package $mod (for $PY)")
  done
fi
[ -f "$EXT" ] || missing+=("the extension $EXT (build it with 'make build' where Rust is, and carry it)")

if [ ${#missing[@]} -gt 0 ]; then
  [ $dry -eq 1 ] && plan
  for m in "${missing[@]}"; do say "missing: $m"; done
  exit 2
fi

# 1. The extension first: an ABI or glibc mismatch would otherwise show as a traceback in
# every check after it.
start=$SECONDS
if ! err=$(timeout "$LIMIT_IMPORT" "$PY" -c "import trash_panda._core" 2>&1); then
  say "FAIL  import: $EXT does not import with $PY: $(printf '%s\n' "$err" | grep -v '^[[:space:]]*$' | tail -n 1)"
  exit 2
fi
summary+=("PASS  import of the extension ($((SECONDS - start))s)")

gpu_out=$("$PY" -c "
import torch
if not torch.cuda.is_available():
    print('no CUDA device visible to torch', torch.__version__, '(CUDA build:', str(torch.version.cuda) + ')')
    raise SystemExit(1)
print(torch.cuda.get_device_name(), '| torch', torch.__version__, '| CUDA', torch.version.cuda)
" 2>&1)
gpu=$?
gpu_line=$(printf '%s\n' "$gpu_out" | tail -n 1)
if [ $dry -eq 1 ]; then
  plan
  if [ $gpu -ne 0 ]; then say "$gpu_line: nothing would run"; else say "ready to run on $gpu_line"; fi
  exit 0
fi
if [ $gpu -ne 0 ]; then
  say "$gpu_line: nothing to check here"
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>/dev/null || true
say "$gpu_line"
plan

run() {  # name limit command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  say "== $name"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  local took=$((SECONDS - start))
  case $rc in
    0) summary+=("PASS  $name (${took}s)") ;;
    124 | 137) summary+=("TIMEOUT $name (limit ${limit}s)") ;;
    *) summary+=("FAIL  $name (exit $rc, ${took}s)") ;;
  esac
}

# A defect put back must make its check fail: pytest's exit 1 (tests failed) is the pass here;
# 0 means the check cannot see the defect, anything else that it did not run.
caught() {  # name limit fault [env...] -- pytest arguments...
  local name=$1 limit=$2 fault=$3
  shift 3
  local start=$SECONDS
  say "== $name"
  timeout --kill-after=10 "$limit" env TRASH_PANDA_FAULT="$fault" "$@"
  local rc=$?
  local took=$((SECONDS - start))
  case $rc in
    1) summary+=("PASS  $name: caught (${took}s)") ;;
    0) summary+=("FAIL  $name: NOT caught, the check passed with the defect put back (${took}s)") ;;
    124 | 137) summary+=("TIMEOUT $name (limit ${limit}s)") ;;
    *) summary+=("FAIL  $name: did not run (exit $rc, ${took}s)") ;;
  esac
}

pytest=(-m pytest -q -m cuda -p no:cacheprovider)
tests=("${pytest[@]}" tests/device/test_cuda.py tests/offload/test_gpu_swap.py tests/runner/test_pipeline_devices.py)
run "cuda tests" "$LIMIT_TESTS" "$PY" "${tests[@]}"
for entry in "${FAULTS[@]}"; do
  read -r fault test <<<"$entry"
  caught "put back: $fault" "$LIMIT_FAULT" "$fault" "$PY" "${pytest[@]}" -x "$test"
done
run "cuda tests under TORCH_CUDA_SANITIZER" "$LIMIT_SANITIZER" env TORCH_CUDA_SANITIZER=1 "$PY" "${tests[@]}"
for entry in "${SANITIZER_FAULTS[@]}"; do
  read -r fault test <<<"$entry"
  caught "sanitizer reports: $fault" "$LIMIT_SANITIZER_FAULT" "$fault" \
    env TORCH_CUDA_SANITIZER=1 "$PY" "${pytest[@]}" -x "$test"
done
run "pipeline example on the GPU" "$LIMIT_EXAMPLE" "$PY" examples/pipeline_stages.py --device cuda
run "gpu_stream benchmark" "$LIMIT_BENCH" \
  "$PY" bench/gpu_stream.py --blocks 32 --resident 8 --passes 3 --workers 2 --lookahead 2

echo
for line in "${summary[@]}"; do say "$line"; done
say "all checks took $((SECONDS - started))s"
case "${summary[*]}" in *FAIL* | *TIMEOUT*) exit 1 ;; esac
exit 0
