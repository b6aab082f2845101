#!/bin/bash
# Device call 2 of helper "router": candidates (graph-replay timing, equivalences), bench.py of
# wheel A (the default kernel) and B (tpw=2 + select softplus), host cost, GPU tests of A.
set -uo pipefail
cd "$(dirname "$0")"
rm -rf /tmp/site /tmp/siteB /tmp/benchout
python3 -m pip install -q --no-index --no-deps --target /tmp/site tilebake-*.whl A/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteB tilebake-*.whl B/tilebake_cuda-*.whl || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/nvidia-smi.txt
date -u
PYTHONPATH=/tmp/site:$PWD timeout 75 python3 bench/gate_candidates.py run cand old 2>&1 | tee $OUT/candidates.log | grep -v "^DIFFERS" | tail -30
for w in A B; do
  site=/tmp/site; [ $w = B ] && site=/tmp/siteB
  OUT=/tmp/benchout PYTHONPATH=$site:$PWD timeout 40 python3 bench/bench.py --ops moe_topk_gate_forward --shapes 16384x7168 --no-compile --name router_$w 2>&1 | grep -E "moe_topk|Command|copy" | head -4
done
cp /tmp/benchout/*/router_A.json $OUT/bench_A.json; cp /tmp/benchout/*/router_B.json $OUT/bench_B.json
cat /tmp/benchout/*/router_A.md /tmp/benchout/*/router_B.md > $OUT/bench.md
PYTHONPATH=/tmp/site:$PWD timeout 30 python3 host_time.py 2>&1 | tee $OUT/host.log
PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m pytest tests/moe/test_moe_topk_gate_forward.py -m gpu -q -n 8 -p no:cacheprovider --maxfail=30 -rf > $OUT/gpu_tests.log 2>&1; grep -v "Warning\|warner\|^$" $OUT/gpu_tests.log | tail -15 | cut -c1-250
date -u
