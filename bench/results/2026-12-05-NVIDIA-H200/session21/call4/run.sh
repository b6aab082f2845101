#!/usr/bin/env bash
# Session 21 call 4 (issue 18): the property tests again after call 3's six test fixes (100 random
# examples a property); the new GPU tests that reach the 26 quant variants no test reached
# (`-k "every or alone"` in five quant test files), then their calls recorded and replayed under
# the four compute-sanitizer tools. Wheels: dist_s21/.
set -uo pipefail
R=$OUT/r; mkdir -p $R/san; rm -rf /tmp/rec /tmp/siteS
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s21/tilebake-*.whl dist_s21/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
TILEBAKE_HYPOTHESIS_EXAMPLES=100 TILEBAKE_HYPOTHESIS_RANDOM=1 timeout 100 python3 -m pytest tests/properties tests/test_properties.py \
  -m gpu -q -p no:cacheprovider -n 12 -rf > $R/properties.log 2>&1
echo "properties rc=$?: $(tail -1 $R/properties.log)"; grep -E "^FAILED|^ERROR" $R/properties.log | cut -c1-300 | head -20
Q="tests/quant/test_cast_back.py tests/quant/test_per_token_cast.py tests/quant/test_norm_forward.py tests/quant/test_swiglu_forward.py tests/quant/test_swiglu_backward.py"
timeout 60 python3 -m pytest $Q -k "every or alone" -m gpu -q -p no:cacheprovider -n 8 -rf > $R/new_tests.log 2>&1
echo "new tests rc=$?: $(tail -1 $R/new_tests.log)"; grep -E "^FAILED|^ERROR" $R/new_tests.log | cut -c1-300 | head -20
OUT=$R/san LIMIT=60 JOBS=8 bash bench/sanitize.sh record /tmp/rec $Q -k "every or alone"
for tool in memcheck racecheck initcheck synccheck; do
  OUT=$R/san LIMIT=40 bash bench/sanitize.sh $tool /tmp/rec > $R/san/out_$tool.txt; head -4 $R/san/out_$tool.txt
done
gzip $R/*.log $R/san/*.log; tar czf $R/san/index.tgz -C /tmp/rec $(cd /tmp/rec && ls index_*.json)
tar czf $OUT/results.tgz -C $R .
