#!/usr/bin/env bash
# Runs on the GPU machine (Python 3.12, torch 2.11, no tilelang, no network): installs the
# wheel built on the GPU-less build host, runs the GPU tests and the benchmark.
#   usage: bash bench/run_on_device.sh [pytest args...]     (results under $OUT)
#   SKIP_TESTS=1: benchmark only; SKIP_BENCH=1: tests only; BENCH_ARGS: passed to bench.py;
#   TEST_FILES: the test files (default: all), or TEST_JOBS=FILE: one pytest job a line (node ids
#   separated by spaces); run as JOBS (default 8) parallel pytest processes on the one GPU (the
#   tests are host-bound, so this cuts the wall time several times).
set -uo pipefail
OUT=${OUT:-bench/results}
rm -rf /tmp/site  # a warm machine may hold an earlier call's install
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -c "import sys, torch, tilebake; print(sys.version.split()[0], torch.__version__, tilebake.__file__)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  mkdir -p "$OUT/tests"
  # One job a line: one or more test files or node ids, separated by spaces.
  jobs=${TEST_JOBS:-/tmp/test_jobs.txt}
  [ -n "${TEST_JOBS:-}" ] || printf '%s\n' ${TEST_FILES:-$(find tests -name 'test_*.py' | sort)} > "$jobs"
  export OUT
  nl -ba -w3 -s' ' "$jobs" | xargs -d '\n' -P "${JOBS:-8}" -n 1 sh -c \
    'set -f; set -- $0; i=$1; shift; { echo "$1 ..."; python3 -m pytest "$@" -q -p no:cacheprovider -rf; } > "$OUT/tests/job$i.log" 2>&1'
  for log in "$OUT"/tests/*.log; do echo "$(head -1 "$log" | cut -c1-90): $(tail -1 "$log")"; done | tee "$OUT/gpu_tests.log"
  grep -h "^FAILED\|^ERROR" "$OUT"/tests/*.log | cut -c1-300 | head -60
  # One file back rather than hundreds (the device tool returns a limited number of files).
  for log in "$OUT"/tests/*.log; do echo "=== $log"; cat "$log"; done > "$OUT/gpu_tests_full.log" && rm -rf "$OUT/tests"
fi
[ "${SKIP_BENCH:-0}" = 1 ] || python3 bench/bench.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -60
