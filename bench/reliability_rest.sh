#!/usr/bin/env bash
# What issue 18 still needs from a GPU, in one device call (from the repository root):
#   bash bench/reliability_rest.sh WHEEL_DIR     (tilebake-*.whl and tilebake_cuda-*.whl)
# 1. the quant tests that reach the 26 variants no other GPU test reached (-k "every or alone"),
#    recorded by bench/sanitize_calls.py and replayed under memcheck, racecheck, initcheck and
#    synccheck (closing the sanitizer matrix at every variant);
# 2. the property tests at 100 random examples a property (their six test fixes of session 21);
# 3. the load-dependent cases repeated under load (tests/test_under_load.py).
# Logs and the sanitizer reports under $OUT (copy them to bench/results/<date>-<GPU>/).
set -uo pipefail
WHEELS=${1:?usage: bash bench/reliability_rest.sh WHEEL_DIR}
OUT=${OUT:-bench/results/reliability_rest}
mkdir -p "$OUT/san"
rm -rf /tmp/siteR /tmp/recR  # a warm machine may hold an earlier call's install
python3 -m pip install -q --no-index --no-deps --target /tmp/siteR "$WHEELS"/tilebake-*.whl "$WHEELS"/tilebake_cuda-*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteR
{ echo "command: bash bench/reliability_rest.sh $*"; date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; compute-sanitizer --version | tail -1; } > "$OUT/env.txt"

OUT=$OUT/san LIMIT=240 JOBS=16 bash bench/sanitize.sh record /tmp/recR tests/quant -k "every or alone"
for tool in memcheck racecheck initcheck synccheck; do
  OUT=$OUT/san LIMIT=45 bash bench/sanitize.sh $tool /tmp/recR | head -12
done

TILEBAKE_HYPOTHESIS_EXAMPLES=100 TILEBAKE_HYPOTHESIS_RANDOM=1 timeout 120 python3 -m pytest tests/properties \
  tests/test_properties.py -m gpu -q -p no:cacheprovider -n 12 -rf > "$OUT/properties.log" 2>&1
echo "properties rc=$?: $(tail -1 "$OUT/properties.log")"; grep -E "^(FAILED|ERROR)" "$OUT/properties.log" | cut -c1-300 | head -20
timeout 120 python3 -m pytest tests/test_under_load.py -m gpu -q -p no:cacheprovider -rf > "$OUT/under_load.log" 2>&1
echo "under load rc=$?: $(tail -1 "$OUT/under_load.log")"
gzip -f "$OUT"/*.log "$OUT"/san/*.log 2>/dev/null
