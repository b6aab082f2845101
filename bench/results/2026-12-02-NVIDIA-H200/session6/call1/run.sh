#!/usr/bin/env bash
# Session 6 call 1: the new mhc ops (the pre-norm projection, the mix math, the layer) on the H200:
# their GPU tests, then their benchmark rows and anchors.
set -uo pipefail
rm -rf /tmp/site-t6
python3 -m pip install -q --no-index --no-deps --target /tmp/site-t6 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-t6 PYTHONUNBUFFERED=1
R=/tmp/r1; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
timeout 330 python3 -m pytest tests/mhc tests/modeling tests/test_plans_mhc.py tests/test_smoke.py tests/test_native_path.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"; tail -1 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-300 | head -30
OPS=mhc_pre_norm_gemm,mhc_reduce_partials_and_rmsnorm,mhc_fn_normw_merge,mhc_sinkhorn,mhc_pre_split_mixes,mhc_head_compute_mix
cd bench
timeout 150 python3 bench.py --ops $OPS --shapes 8192x7168,4096x7168,1x7168 --no-compile --name mhc_new > $R/bench.log 2>&1
echo "bench rc=$?"; grep -E "mhc_pre_norm_gemm|copy" $R/bench.log | head -12
timeout 60 python3 anchors.py --cases "mhc" --name anchors_mhc > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| " $R/anchors.log | head -30
cd ..
cp -r bench/results/* $R/ 2>/dev/null
gzip -k $R/gpu_tests.log; rm $R/gpu_tests.log
tar czf $OUT/results.tgz -C $R .
