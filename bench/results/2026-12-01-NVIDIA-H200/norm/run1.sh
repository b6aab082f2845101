#!/usr/bin/env bash
# Device call 1 (2026-12-01, H200), run from .carry/norm holding the two wheels (built from
# commit 53e2ba4: kernels for norm_forward and norm_forward_and_per_token_cast, sm_90a), the
# worktree's bench/ and tests/, and tune/ (the candidate cubins of `bench/tune_norm.py build`
# and `baseline` at that commit, the .base ones from main ce78883).
set -uo pipefail
cd "$(dirname "$0")"
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site ./*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.txt"
date -u | tee -a "$OUT/nvidia-smi.txt"
timeout 90 python3 bench/tune_norm.py run tune > "$OUT/tune.log" 2>&1; echo "tune rc $?" >> "$OUT/tune.log"
timeout 50 python3 bench/bench.py --ops norm_forward,norm_forward_and_per_token_cast --shapes 16384x7168 --no-compile --name norm1 > "$OUT/bench.log" 2>&1; echo "bench rc $?" >> "$OUT/bench.log"
timeout 85 python3 -m pytest tests/quant/test_norm_forward.py -q -m gpu -n 8 -p no:cacheprovider -x > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc $?" >> "$OUT/gpu_tests.log"
