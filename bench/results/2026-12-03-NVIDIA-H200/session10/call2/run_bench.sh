#!/usr/bin/env bash
# Session 10 call 2, command 2: the final tree's wheels (dist_next/, installed by run_suite.sh):
# engram / mhc anchors, host times, Nsight Compute reports of mhc_multilayer_recompute (0.68x) and
# mhc_post fwd (0.93x) at their anchor shapes.
set -uo pipefail
R=$OUT/r; mkdir -p $R
[ -d /tmp/site/tilebake ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_next/tilebake-*.whl dist_next/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
cd bench
timeout 200 python3 anchors.py --cases "engram|mhc|expand" --name anchors_s10_final > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (engram|mhc|expand)|copy" $R/anchors.log | head -30
timeout 60 python3 host_time.py --name host_time_s10_final > $R/host_time.log 2>&1
echo "host rc=$?"; grep -E "engram|mul|expand" $R/host_time.log | head -14
cd ..
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in "mhc_multilayer_recompute layers 8192x8192" "mhc_post forward 8192x7168"; do
  set -- $c
  timeout 100 $NCU --clock-control none --profile-from-start off --set full python3 bench/ncu_case.py $1 "$2" $3 > /tmp/ncu.txt 2>&1
  echo "ncu $1 rc=$?"; { echo "===== $c"; cat /tmp/ncu.txt; } >> $R/ncu.txt
done
grep -E "=====|Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|No Eligible|L2 Hit|Mem Busy|Max Bandwidth" $R/ncu.txt | head -40
find bench/results $OUT -maxdepth 3 -newer $R/date.txt -type f -name "*s10_final*" -exec cp {} $R/ \; 2>/dev/null
rm -f $R/anchors.log $R/host_time.log
gzip $R/ncu.txt
tar czf $OUT/bench.tgz -C $R . && rm -rf $R
