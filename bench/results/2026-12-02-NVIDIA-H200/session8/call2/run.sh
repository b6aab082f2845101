#!/usr/bin/env bash
# Session 8 call 2: the gate backward's candidates again, the per-column divisions gone (scalars as variables).
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
export PYTHONUNBUFFERED=1
for i in 1 2; do PYTHONPATH=/tmp/site timeout 120 python3 bench/tune_engram_gate.py run .carry/tune_bwd; done > $R/tune_gate_bwd.log 2>&1
echo "tune rc=$?"; cat $R/tune_gate_bwd.log
for f in .carry/tune_bwd/sm_90a/*.cubin; do echo "$(basename $f) $(cuobjdump -sass $f | grep -cE '^\s+/\*[0-9a-f]{4}\*/') sass lines"; done
