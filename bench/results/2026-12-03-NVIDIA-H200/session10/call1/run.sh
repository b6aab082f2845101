#!/usr/bin/env bash
# Session 10 call 1: main's wheels (session 9's tree): the engram GPU tests, engram anchors, host
# times, Nsight Compute reports of the Sinkhorn step + step_reduce (100001 x 5120) and the gate
# backward's 16384 class (8001 x 4 x 16384); the Sinkhorn step's candidates (.carry/step: the
# shipped cp.async kernel and bulk-copy ones, bench/tune_engram.py build .carry/step step); the
# multilayer recompute's candidates (.carry/ml: bench/candidates.py build mhc_multilayer_recompute).
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
timeout 200 python3 -m pytest tests/engram tests/modeling/test_engram.py tests/test_plans_engram.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/engram_tests.log 2>&1
echo "engram tests rc=$?"; tail -1 $R/engram_tests.log; grep -E "^FAILED|^ERROR" $R/engram_tests.log | head -10
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in "engram_sinkhorn step 100001x5120" "engram_gate_bwd hc 8001x16384"; do
  set -- $c
  timeout 120 $NCU --clock-control none --profile-from-start off --set full python3 bench/ncu_case.py $1 "$2" $3 > /tmp/ncu.txt 2>&1
  echo "ncu $1 rc=$?"; { echo "===== $c"; cat /tmp/ncu.txt; } >> $R/ncu.txt
done
grep -E "=====|step_kernel|engram_gate_bwd_kernel|Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Registers Per|No Eligible|One or More Eligible" $R/ncu.txt | head -60
timeout 150 python3 bench/tune_engram.py run .carry/step step > $R/tune_step.log 2>&1
echo "tune rc=$?"; cat $R/tune_step.log
for cand in .carry/ml/sm_90a/mhc_multilayer_recompute.max_mult-4.*.json; do  # bench/candidates.py
  rm -rf /tmp/cand; cp -r /tmp/site /tmp/cand
  PYTHONPATH=/tmp/cand python3 bench/candidates.py swap /tmp/cand $cand
  (cd bench && PYTHONPATH=/tmp/cand timeout 60 python3 anchors.py --cases multilayer --name ml_cand) >> $R/ml_candidates.log 2>&1
  grep -E "^\| mhc_multilayer" $R/ml_candidates.log | tail -1
done
rm -f bench/results/*/ml_cand.*
cd bench
timeout 120 python3 anchors.py --cases "engram" --name anchors_s10_call1 > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| engram|copy" $R/anchors.log | head -20
timeout 60 python3 host_time.py --name host_time_s10_call1 > $R/host_time.log 2>&1
echo "host rc=$?"; grep -E "engram|mul" $R/host_time.log | head -14
cd ..
find bench/results -newer $R/date.txt -type f -exec cp {} $R/ \;
rm -f $R/anchors.log $R/host_time.log
tar czf $OUT/results.tgz -C $R . && rm -rf $R  # one file back (the tool returns at most 8)
