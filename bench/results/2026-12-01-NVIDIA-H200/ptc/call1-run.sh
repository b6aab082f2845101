#!/usr/bin/env bash
# Call 1 (ptc helper): diagnose anchors.py's UE8M0 column-major figure, sweep the candidates, test the new kernel.
set -uo pipefail
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/base rt/*.whl base/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/new rt/*.whl new/*.whl || exit 1
export PYTHONUNBUFFERED=1
date -u
PYTHONPATH=/tmp/base python3 bench/ptc_diag.py diag 2>&1 | tee "$OUT/diag.log"
PYTHONPATH=/tmp/base python3 bench/ptc_diag.py sweep sweep 2>&1 | tee "$OUT/sweep.log"
PYTHONPATH=/tmp/base python3 bench/ptc_diag.py layouts 3 2>&1 | tee "$OUT/layouts_base.log"
PYTHONPATH=/tmp/new python3 bench/ptc_diag.py layouts 3 2>&1 | tee "$OUT/layouts_new.log"
date -u
PYTHONPATH=/tmp/new timeout 150 python3 -m pytest tests/quant/test_per_token_cast.py -m gpu -n 8 -q -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
date -u
