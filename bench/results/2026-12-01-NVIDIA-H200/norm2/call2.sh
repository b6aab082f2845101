#!/usr/bin/env bash
# Device call 2 (H200): the second round of candidates (bench/tune_norm.py build + baseline into
# tune/), with this branch's runtime wheel for the launcher.
set -uo pipefail
cd "$(dirname "$0")"
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site ./tilebake-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv; date -u; } | tee "$OUT/nvidia-smi.txt"
timeout 200 python3 bench/tune_norm.py run tune > "$OUT/tune.log" 2>&1; echo "tune rc $?" >> "$OUT/tune.log"
grep -v "^and_per_token_cast.*4096x\|^in_dtype.*4096x" "$OUT/tune.log" | cut -c 60-200
