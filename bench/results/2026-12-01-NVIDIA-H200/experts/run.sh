#!/usr/bin/env bash
# One device call: the GPU tests of topk_gate, moe_topk_gate_backward, get_fused_mapping (pytest -n 8),
# then a short timing of the fast and general variants. Logs under $OUT/experts.
set -uo pipefail
cd "$(dirname "$0")"
L=$OUT/experts; mkdir -p "$L"
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site ./*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  python3 -c "import sys, torch, tilebake; print(sys.version.split()[0], torch.__version__, tilebake.__file__)"; } 2>&1 | tee "$L/env.txt"
echo "command: python3 -m pytest -n 8 -q -p no:cacheprovider -rfE tests/moe/test_topk_gate.py tests/moe/test_moe_topk_gate_backward.py tests/moe/test_get_fused_mapping.py" | tee "$L/pytest.log"
timeout 125 python3 -m pytest -n 8 -q -p no:cacheprovider -rfE --durations=15 tests/moe/test_topk_gate.py \
  tests/moe/test_moe_topk_gate_backward.py tests/moe/test_get_fused_mapping.py 2>&1 | tee -a "$L/pytest.log" | tail -40
echo "pytest rc ${PIPESTATUS[0]}" | tee -a "$L/pytest.log"
timeout 30 python3 bench/results/2026-12-01-NVIDIA-H200/experts/bench_experts.py 2>&1 | tee "$L/bench.md"
