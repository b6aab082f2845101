#!/usr/bin/env bash
# Call 2 (ptc helper): the release window, the fixed anchors loop, the sweep, the candidate wheels in
# anchors.py's setting; the fastest candidate for UE8M0 column-major gets the GPU tests.
set -uo pipefail
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.txt"
for w in base new c1 c2 c3; do
  [ -d $w ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/$w rt/*.whl $w/*.whl || echo "no $w"
done
export PYTHONUNBUFFERED=1
date -u
{ PYTHONPATH=/tmp/base python3 bench/ptc_diag.py window
  PYTHONPATH=/tmp/base python3 bench/ptc_diag.py anchors 0
  PYTHONPATH=/tmp/base python3 bench/ptc_diag.py anchors 1; } 2>&1 | tee "$OUT/window.log"
PYTHONPATH=/tmp/base python3 bench/ptc_diag.py sweep sweep 2>&1 | tee "$OUT/sweep.log"
for w in base new c1 c2 c3; do
  [ -d /tmp/$w ] && { echo "== $w: $(cat $w/CONFIG)"; PYTHONPATH=/tmp/$w python3 bench/ptc_diag.py layouts 3 1; }
done 2>&1 | tee "$OUT/layouts.log"
best=$(awk '/^== /{w=$2; sub(":","",w)} /^ue8m0 col/{if (w!="base" && (b=="" || $NF<m)) {m=$NF; b=w}} END{print b}' "$OUT/layouts.log")
echo "best: $best" | tee -a "$OUT/layouts.log"
for w in base $best $best $best; do echo -n "$w: "; PYTHONPATH=/tmp/$w python3 bench/ptc_diag.py anchors 1; done 2>&1 | tee "$OUT/anchors_final.log"
date -u
# Only the packed UE8M0 hot kernels differ from wheel "new", whose 810 GPU tests passed in call 1.
PYTHONPATH=/tmp/$best timeout 100 python3 -m pytest tests/quant/test_per_token_cast.py -m gpu -n 16 -q -p no:cacheprovider \
  -k "packed or ue8m0 or compile or graph" 2>&1 | tail -6 | tee "$OUT/gpu_tests.log"
date -u
