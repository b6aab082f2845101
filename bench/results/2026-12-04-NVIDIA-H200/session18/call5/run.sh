#!/usr/bin/env bash
# Session 18 call 5: the quant, transform and top-level GPU tests under compute-sanitizer memcheck (bench/sanitize.sh: each
# tensor its own allocation, 64-byte padding, device heap checks), 4 processes (12 ran out of memory in call 4), stopped after 400
# s; the report names the errors and the variants the tests run so far did not reach.
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s18/tilebake-*.whl dist_s18/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
compute-sanitizer --version | tail -1 > $R/sanitizer_version.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
(nvidia-smi --query-gpu=memory.used --format=csv,noheader -l 20 > $R/gpu_memory.log 2>&1 &)
NO_CACHING=1 OUT=$R/san JOBS=4 LIMIT=400 bash bench/sanitize.sh memcheck tests/quant tests/transform tests/test_native_path.py tests/test_out_buffers.py 2>&1 | head -60
pkill -f "memory.used" || true
gzip $R/san/sanitize_memcheck.log
tar czf $OUT/results.tgz -C $R . && rm -rf $R
