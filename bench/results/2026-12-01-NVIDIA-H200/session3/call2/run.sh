#!/usr/bin/env bash
# Session call 2: install the two wheels; allocation costs, host times, anchors x2, then the whole GPU suite.
set -uo pipefail
rm -rf /tmp/site-s2
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s2 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s2 PYTHONUNBUFFERED=1
R="$OUT"
date -u +%FT%TZ > "$R/date.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$R/nvidia-smi.txt"
python3 -c "import sys, torch, tilebake; print(sys.version.split()[0], torch.__version__, tilebake.__file__)" | tee "$R/env.txt"
PYTHONPATH=/tmp/site-s2:bench python3 bench/alloc_cost.py > "$R/alloc_cost.log" 2>&1
OUT="$R" python3 bench/host_time.py --name host_time > "$R/host_time.log" 2>&1; tail -40 "$R/host_time.log"
for i in ${ANCHOR_RUNS:-1 2}; do
  OUT="$R" python3 bench/anchors.py --name "anchors$i" > "$R/anchors$i.log" 2>&1; grep -E "^\| " "$R/anchors$i.log" | cut -c1-110
done
timeout ${TEST_TIMEOUT:-330} python3 -m pytest tests -m gpu -n 16 -v -p no:cacheprovider -rf --tb=short > "$R/gpu_tests.log" 2>&1
echo "pytest rc=$?"; tail -2 "$R/gpu_tests.log"; grep -cE "PASSED" "$R/gpu_tests.log"; grep -E "FAILED|ERROR" "$R/gpu_tests.log" | grep -v "^\[gw" | cut -c1-220 | head -30; grep -E "^\[gw.*(FAILED|ERROR)" "$R/gpu_tests.log" | cut -c1-200 | head -30
gzip -f "$R/gpu_tests.log"
PYTHONPATH=/tmp/site-s2 timeout 200 python3 bench/tune_norm.py run .carry/tune_norm2 > "$R/tune_norm_rows.log" 2>&1; tail -8 "$R/tune_norm_rows.log"
