#!/usr/bin/env bash
# The kernels under compute-sanitizer (GPU only): the GPU tests (or the pytest arguments given)
# run under one tool, every loaded variant recorded (TILEBAKE_VARIANT_LOG, tests/conftest.py);
# bench/sanitize_report.py then sums the tool's errors and lists the variants no test reached.
# NO_CACHING=1: each tensor its own cudaMalloc (PYTORCH_NO_CUDA_MEMORY_CACHING; the caching
# allocator's shared segments hide a read past a tensor's end, memcheck's padding puts a guard
# zone after each allocation). It breaks the CUDA-graph tests (no cudaMalloc while capturing), and
# under memcheck it filled the H200's 141 GiB within 40 s even with 4 processes (session 18 call 5):
# run it on a few test files at a time.
#   usage: bash bench/sanitize.sh TOOL [pytest args...]    TOOL: memcheck | racecheck | initcheck | synccheck
#   JOBS: pytest-xdist processes (default 8); OUT: the logs' folder (default bench/results/sanitize);
#   LIMIT: seconds before the run is stopped (default none; the report then covers the tests run)
set -uo pipefail
tool=$1
shift
OUT=${OUT:-bench/results/sanitize}
mkdir -p "$OUT"
case $tool in
  memcheck) opts=(--check-device-heap yes --padding 64) ;;
  racecheck) opts=(--racecheck-report all) ;;
  initcheck | synccheck) opts=() ;;
  *) echo "TOOL must be memcheck, racecheck, initcheck or synccheck, got $tool" >&2; exit 2 ;;
esac
[ $# -gt 0 ] || set -- tests
rm -f "$OUT"/variants_"$tool".*
nocache=()
[ "${NO_CACHING:-0}" = 1 ] && nocache=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
env "${nocache[@]}" TILEBAKE_VARIANT_LOG="$OUT/variants_$tool" \
  timeout "${LIMIT:-0}" compute-sanitizer --tool "$tool" "${opts[@]}" --target-processes all --print-limit 20 \
  python3 -m pytest "$@" -m gpu -q -p no:cacheprovider -n "${JOBS:-8}" --ignore=tests/test_under_load.py \
  > "$OUT/sanitize_$tool.log" 2>&1
echo "pytest under $tool: rc=$? ($(grep -E '(passed|failed)' "$OUT/sanitize_$tool.log" | tail -1))"
python3 bench/sanitize_report.py "$tool" "$OUT/sanitize_$tool.log" "$OUT"/variants_"$tool".* | tee "$OUT/report_$tool.md"
