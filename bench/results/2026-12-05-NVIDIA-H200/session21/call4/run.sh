#!/usr/bin/env bash
# Session 21 call 4 (issue 18), cut to the device time left: the new GPU tests that reach the 26
# quant variants no test reached (`-k "every or alone"` in five quant test files), run as the
# sanitizer's record step (their pass / fail in record.log) and their calls replayed under the
# four compute-sanitizer tools; then the property tests after call 3's six test fixes (25 random
# examples a property, as far as 45 s go). Wheels: dist_s21/.
set -uo pipefail
R=$OUT/r; mkdir -p $R/san; rm -rf /tmp/rec /tmp/siteS
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s21/tilebake-*.whl dist_s21/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
Q="tests/quant/test_cast_back.py tests/quant/test_per_token_cast.py tests/quant/test_norm_forward.py tests/quant/test_swiglu_forward.py tests/quant/test_swiglu_backward.py"
OUT=$R/san LIMIT=50 JOBS=8 bash bench/sanitize.sh record /tmp/rec $Q -k "every or alone" -rf
grep -E "^FAILED|^ERROR" $R/san/record.log | cut -c1-300 | head -10
for tool in memcheck racecheck initcheck synccheck; do
  OUT=$R/san LIMIT=20 bash bench/sanitize.sh $tool /tmp/rec > $R/san/out_$tool.txt; head -4 $R/san/out_$tool.txt
done
TILEBAKE_HYPOTHESIS_EXAMPLES=25 TILEBAKE_HYPOTHESIS_RANDOM=1 timeout 45 python3 -m pytest tests/properties tests/test_properties.py \
  -m gpu -q -p no:cacheprovider -n 12 -rf > $R/properties.log 2>&1
echo "properties rc=$?: $(tail -1 $R/properties.log)"; grep -E "^FAILED|^ERROR" $R/properties.log | cut -c1-300 | head -20
gzip $R/*.log $R/san/*.log
tar czf $OUT/results.tgz -C $R .
