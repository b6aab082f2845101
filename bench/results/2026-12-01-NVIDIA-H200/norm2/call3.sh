#!/usr/bin/env bash
# Device call 3 (H200): the chosen configuration, built into this branch's wheels (runtime; the
# kernels of norm_forward, norm_forward_and_per_token_cast and norm_backward, sm_90a): the norm
# GPU tests, bench/anchors.py for the two norm cases three times, bench/norm_configs.py.
set -uo pipefail
cd "$(dirname "$0")"
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site ./*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv; date -u; } | tee "$OUT/nvidia-smi.txt"
timeout 150 python3 -m pytest tests/quant/test_norm_forward.py tests/quant/test_norm_backward.py -m gpu -n 8 -q -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc $?" >> "$OUT/gpu_tests.log"
tail -4 "$OUT/gpu_tests.log"
for i in 1 2 3; do
  # (its .json / .md go to /tmp/anch, then into the log: the device returns at most 8 files)
  OUT=/tmp/anch timeout 60 python3 bench/anchors.py --cases '^norm_forward' --name anchors$i > "$OUT/anchors$i.log" 2>&1; echo "anchors rc $?" >> "$OUT/anchors$i.log"
  cat /tmp/anch/*/anchors$i.json >> "$OUT/anchors$i.log"
  grep "original .* us  tilebake" "$OUT/anchors$i.log"
done
timeout 100 python3 bench/norm_configs.py new > "$OUT/configs_new.log" 2>&1; echo "configs rc $?" >> "$OUT/configs_new.log"
cat "$OUT/configs_new.log"
