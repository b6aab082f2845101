#!/usr/bin/env bash
# Nsight Compute reports of the ops below their performance bar (GPU machine, after
# bench/run_on_device.sh has installed the wheel into /tmp/site), into one file, $OUT/ncu_reports.txt.
set -uo pipefail
OUT=${OUT:-bench/results}
export PYTHONPATH=/tmp/site
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
: > "$OUT/ncu_reports.txt"
profile() {  # name op variant
  "$NCU" --clock-control none --profile-from-start off --set full --print-details all \
    python3 bench/ncu_case.py "$2" "$3" > /tmp/ncu_$1.txt 2>&1
  echo "$1: rc $? $(grep -m1 'Duration' /tmp/ncu_$1.txt)"
  { echo "===== $1: $2 / $3"; cat /tmp/ncu_$1.txt; } >> "$OUT/ncu_reports.txt"
}
profile lossless per_block_cast_lossless "e2m1 1x32 UE8M0 -> e4m3 128x128 UE8M0"
profile sr_e2m1 per_token_cast "bf16->e2m1, 1x16, e4m3 SF, stochastic rounding"
profile sr_e4m3 per_token_cast "bf16->e4m3, 1x128, fp32 SF, stochastic rounding"
profile nvfp4 per_token_cast "bf16->e2m1, 1x16, e4m3 SF"
profile swiglu_bwd swiglu_backward "swiglu_backward_and_per_token_cast"
profile cast_back_e2m1 cast_back "e2m1 1x32 packed UE8M0 SF -> bf16"
