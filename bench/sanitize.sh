#!/usr/bin/env bash
# The kernels under compute-sanitizer (GPU only), in two steps (bench/sanitize_calls.py says why):
#   bash bench/sanitize.sh record DIR [pytest args...]
#       the GPU tests (default: tests) run normally, recording into DIR each variant's smallest
#       distinct calls (tensors' storages at most 32 MiB, snapshotted before the call; with call
#       plans and the recording wrappers, test_native_path's and the torch.compile tests may fail);
#   bash bench/sanitize.sh TOOL DIR        TOOL: memcheck | racecheck | initcheck | synccheck
#       those calls replayed in one process under TOOL, each tensor its own cudaMalloc
#       (PYTORCH_NO_CUDA_MEMORY_CACHING: memcheck's 64-byte padding then guards each tensor's
#       end), then bench/sanitize_report.py: the tool's errors and the variants no call reached.
# JOBS: pytest-xdist processes for record (default 12); OUT: logs and reports (default
# bench/results/sanitize); LIMIT: seconds before a step is stopped (default none: what ran is kept).
set -uo pipefail
step=$1 dir=$2
shift 2
OUT=${OUT:-bench/results/sanitize}
mkdir -p "$OUT" "$dir"
here=$(cd "$(dirname "$0")" && pwd)
if [ "$step" = record ]; then
  [ $# -gt 0 ] || set -- tests
  TILEBAKE_RECORD_CALLS="$dir" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" timeout "${LIMIT:-0}" \
    python3 -m pytest "$@" -p sanitize_calls -m gpu -q -p no:cacheprovider -n "${JOBS:-12}" \
    --ignore=tests/test_under_load.py --ignore=tests/test_damaged_package_gpu.py --ignore=tests/test_native_path.py > "$OUT/record.log" 2>&1
  echo "record: rc=$? ($(tail -1 "$OUT/record.log")); $(ls "$dir"/*.pt 2>/dev/null | wc -l) calls kept"
  exit 0
fi
case $step in
  memcheck) opts=(--check-device-heap yes --padding 64) ;;
  racecheck) opts=(--racecheck-report all) ;;
  initcheck | synccheck) opts=() ;;
  *) echo "the first argument must be record, memcheck, racecheck, initcheck or synccheck, got $step" >&2; exit 2 ;;
esac
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${LIMIT:-0}" compute-sanitizer --tool "$step" "${opts[@]}" --print-limit 20 \
  python3 "$here/sanitize_calls.py" replay "$dir" --variant-log "$OUT/variants_$step" > "$OUT/sanitize_$step.log" 2>&1
echo "replay under $step: rc=$? ($(grep -E '^replayed' "$OUT/sanitize_$step.log" | tail -1))"
python3 "$here/sanitize_report.py" "$step" "$OUT/sanitize_$step.log" "$OUT/variants_$step" | tee "$OUT/report_$step.md"
