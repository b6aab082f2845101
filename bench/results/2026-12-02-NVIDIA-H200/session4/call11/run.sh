#!/usr/bin/env bash
# Session 4 call 11: DRAM bytes of the gate kernels (ncu), against their ideal (each tensor once).
set -uo pipefail
rm -rf /tmp/site-s4
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s4 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s4 PYTHONUNBUFFERED=1
R=/tmp/r11; rm -rf $R; mkdir -p $R
timeout 200 ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio -k regex:engram_gate python3 .carry/s4/ncu_gate.py > $R/ncu.log 2>&1
grep -E "engram_gate|dram__|lts__|gpu__time|warps_active|stalled" $R/ncu.log
cp .carry/s4/ncu_gate.py $R/
tar czf $OUT/results.tgz -C $R .
