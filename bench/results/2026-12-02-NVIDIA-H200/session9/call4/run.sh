#!/usr/bin/env bash
# Session 9 call 4: the final tree's full wheels: the whole GPU suite, the gate sweep, the engram anchors, host times.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 420 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -v -rf --tb=short > $R/gpu_tests.log 2>&1
echo "suite rc=$?"; tail -1 $R/gpu_tests.log; grep -E "FAILED|ERROR" $R/gpu_tests.log | grep -v "PASSED" | cut -c1-240 | head -20
grep -E "^E  " $R/gpu_tests.log | head -20
PYTHONPATH=/tmp/site timeout 240 python3 bench/gate_hidden_sweep.py > $R/sweep.log 2>&1
echo "sweep rc=$?"; cat $R/sweep.log
cd bench
PYTHONPATH=/tmp/site timeout 100 python3 anchors.py --cases "engram" --name anchors_s9_final > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| engram|copy" $R/anchors.log | head -30
PYTHONPATH=/tmp/site timeout 60 python3 host_time.py --name host_time_s9_final > $R/host_time.log 2>&1
echo "host rc=$?"; grep -E "engram|mul" $R/host_time.log | head -14
cd ..
find bench/results -newer $R/date.txt -type f -exec cp {} $R/ \;
gzip $R/gpu_tests.log
rm -f $R/anchors.log $R/host_time.log
