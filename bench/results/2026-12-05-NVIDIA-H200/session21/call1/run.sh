#!/usr/bin/env bash
# Session 21 call 1 (issue 18): the sanitizer matrix by record and replay (bench/sanitize.sh):
# the GPU tests recording each variant's smallest distinct calls (stopped at 190 s), then those
# calls replayed in one process under memcheck (64-byte padding, device heap), racecheck, initcheck
# and synccheck, each tensor its own cudaMalloc. Wheels: main b379f82's (dist_s21/).
set -uo pipefail
R=$OUT/r; mkdir -p $R/san
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s21/tilebake-*.whl dist_s21/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
compute-sanitizer --version | tail -1 > $R/sanitizer_version.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
OUT=$R/san LIMIT=190 JOBS=16 bash bench/sanitize.sh record /tmp/rec tests
du -sh /tmp/rec | tee $R/san/record_size.txt
cp /tmp/rec/index_*.json $R/san/ 2>/dev/null
OUT=$R/san LIMIT=100 bash bench/sanitize.sh memcheck /tmp/rec | head -40
OUT=$R/san LIMIT=110 bash bench/sanitize.sh racecheck /tmp/rec | head -30
OUT=$R/san LIMIT=60 bash bench/sanitize.sh initcheck /tmp/rec | head -30
OUT=$R/san LIMIT=50 bash bench/sanitize.sh synccheck /tmp/rec | head -30
gzip $R/san/*.log $R/san/index_*.json
tar czf $OUT/results.tgz -C $R .
