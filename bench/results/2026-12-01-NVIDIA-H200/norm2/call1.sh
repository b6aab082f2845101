#!/usr/bin/env bash
# Device call 1 (H200), run from .carry/norm2 holding the two wheels of this branch (runtime, and
# the kernels of norm_forward + norm_forward_and_per_token_cast, sm_90a), its bench/ and tests/,
# and tune/ (bench/tune_norm.py build + baseline cubins).
set -uo pipefail
cd "$(dirname "$0")"
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site ./*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv; date -u; } | tee "$OUT/nvidia-smi.txt"
timeout 170 python3 bench/tune_norm.py run tune > "$OUT/tune.log" 2>&1; echo "tune rc $?" >> "$OUT/tune.log"
tail -30 "$OUT/tune.log"
timeout 150 python3 -m pytest tests/quant/test_norm_forward.py tests/quant/test_norm_backward.py -m gpu -n 8 -q -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc $?" >> "$OUT/gpu_tests.log"
tail -15 "$OUT/gpu_tests.log"
timeout 60 python3 bench/anchors.py --cases '^norm_forward' --name anchors1 > "$OUT/anchors1.log" 2>&1; echo "anchors rc $?" >> "$OUT/anchors1.log"
tail -12 "$OUT/anchors1.log"
# main's wheels (3e2d91c, the same two ops): the "before" figures of the other configurations.
rm -rf /tmp/site_main
python3 -m pip install -q --no-index --no-deps --target /tmp/site_main main/*.whl || exit 1
PYTHONPATH=/tmp/site_main:$PWD timeout 100 python3 bench/norm_configs.py main > "$OUT/configs_main.log" 2>&1; echo "configs rc $?" >> "$OUT/configs_main.log"
cat "$OUT/configs_main.log"
