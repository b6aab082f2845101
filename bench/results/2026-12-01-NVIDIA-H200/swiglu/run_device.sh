#!/usr/bin/env bash
# One device call for the SwiGLU numerics change (issue 13 item 1), run from a copy of this
# branch's tests/ and bench/ next to its two wheels (runtime + tilebake-cuda built with
# TILEBAKE_OPS=swiglu_forward,swiglu_backward for sm_90a):
#   bash run_device.sh      (logs under $OUT/swiglu)
set -uo pipefail
R=$OUT/swiglu
mkdir -p "$R"
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  python3 -c "import sys, torch, tilebake; print(sys.version.split()[0], torch.__version__, tilebake.__file__)"; } > "$R/env.txt" 2>&1
# GPU tests: kernels against the reference evaluated on the GPU, bit for bit.
timeout 140 python3 -m pytest tests/quant/test_swiglu_forward.py tests/quant/test_swiglu_backward.py \
  -m gpu -q -n 8 -p no:cacheprovider -rf --durations=5 > "$R/gpu_tests.log" 2>&1
echo "pytest rc=$?" >> "$R/gpu_tests.log"
# The two smoke cases of `python -m tilebake doctor` on the GPU.
python3 -c "
import torch
from tilebake._smoke import SMOKE_CASES
for op in ('swiglu_forward', 'swiglu_backward'):
    SMOKE_CASES[op](torch.device('cuda')); torch.cuda.synchronize(); print(op, 'smoke ok')
" >> "$R/gpu_tests.log" 2>&1
tail -4 "$R/gpu_tests.log"
# Speed: the bench cases at 16384 x 7168 (the host-cost table needs ops this wheel lacks, so
# host_time.py measures torch.mul(out=) and these two ops instead).
OUT=$R timeout 60 python3 bench/bench.py --ops swiglu_forward,swiglu_backward --shapes 16384x7168 --no-compile \
  --name bench > "$R/bench.log" 2>&1
echo "bench rc=$?" >> "$R/bench.log"
timeout 20 python3 bench/results/2026-12-01-NVIDIA-H200/swiglu/host_time.py >> "$R/bench.log" 2>&1
grep -E "us |GB/s|torch_mul|swiglu_" "$R/bench.log" | tail -8
