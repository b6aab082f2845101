#!/usr/bin/env bash
# Session 8 call 1: the gate backward's candidates (bench/tune_engram_gate.py run: staged 256/512/1024
# threads against the unstaged 256 x 2 of session 4), the Engram GPU tests, the anchors (engram, mhc),
# host times; all on the full wheels of this tree.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 120 python3 bench/tune_engram_gate.py run .carry/tune_bwd > $R/tune_gate_bwd.log 2>&1
echo "tune rc=$?"; cat $R/tune_gate_bwd.log | tail -12
PYTHONPATH=/tmp/site timeout 100 python3 bench/tune_engram.py run .carry/tune_step step > $R/tune_step.log 2>&1
echo "tune step rc=$?"; cat $R/tune_step.log | tail -16
PYTHONPATH=/tmp/site timeout 150 python3 -m pytest tests/engram tests/modeling/test_engram.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/engram_tests.log 2>&1
echo "engram tests rc=$?"; tail -1 $R/engram_tests.log; grep -E "^FAILED|^ERROR" $R/engram_tests.log | cut -c1-200 | head
cd bench
PYTHONPATH=/tmp/site timeout 120 python3 anchors.py --cases "engram|mhc|expand" --name anchors_s8 > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (engram|mhc|expand)|copy" $R/anchors.log | head -40
PYTHONPATH=/tmp/site timeout 90 python3 host_time.py --name host_time_s8 > $R/host_time.log 2>&1
echo "host rc=$?"; grep -E "engram|mhc|mul|expand" $R/host_time.log | head -40
cd ..
find bench/results -newer $R/date.txt -type f -exec cp {} $R/ \;
