#!/usr/bin/env bash
# Session call 4: the wheels of main with Engram's first part: host times, anchors x2 (Engram's too),
# the whole GPU suite; everything packed into one archive (the tool returns few files).
set -uo pipefail
rm -rf /tmp/site-s4
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s4 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s4 PYTHONUNBUFFERED=1
R=/tmp/r4; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/nvidia-smi.txt
python3 -c "import sys, torch, tilebake; print(sys.version.split()[0], torch.__version__, tilebake.__file__)" > $R/env.txt
OUT=$R python3 bench/host_time.py --name host_time > $R/host_time.log 2>&1; grep -E "^\| " $R/host_time.log | cut -c1-100
for i in 1 2; do
  OUT=$R python3 bench/anchors.py --name anchors$i > $R/anchors$i.log 2>&1; grep -E "^\| " $R/anchors$i.log | cut -c1-110
done
timeout 330 python3 -m pytest tests -m gpu -n 16 -v -p no:cacheprovider -rf --tb=short > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"; tail -2 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-200 | head -40
tar czf $OUT/results.tgz -C $R .
