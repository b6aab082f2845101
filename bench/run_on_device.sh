#!/usr/bin/env bash
# Runs on the GPU machine (Python 3.12, torch 2.11, no tilelang, no network): installs the
# wheel built on the GPU-less build host, runs the GPU tests and the benchmark.
#   usage: bash bench/run_on_device.sh [pytest args...]     (results under $OUT)
set -uo pipefail
OUT=${OUT:-bench/results}
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -c "import sys, torch, tilebake; print(sys.version.split()[0], torch.__version__, tilebake.__file__)"
[ "${SKIP_TESTS:-0}" = 1 ] || python3 -m pytest tests -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
python3 bench/bench.py 2>&1 | tee "$OUT/bench.log" | tail -45
