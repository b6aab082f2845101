#!/usr/bin/env bash
set -uo pipefail
rm -rf /tmp/site-s4
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s4 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s4 PYTHONUNBUFFERED=1
R=/tmp/r3; rm -rf $R; mkdir -p $R
timeout 200 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy -k regex:engram_gate python3 .carry/s4/ncu_gate.py > $R/ncu.log 2>&1
grep -E "engram_gate|Throughput|Hit Rate|Duration|Stall|Occupancy|Registers|Warp Cycles|L2|DRAM" $R/ncu.log | head -80
tar czf $OUT/results.tgz -C $R .
