#!/usr/bin/env bash
# Session 21 call 3 (issue 18): the property tests (tests/properties + tests/test_properties.py,
# 100 random examples a property); the launch-device mocks (tests/test_launch_device.py), the
# mixed-device pairs and engram_hash's out-of-range ids; the index contract
# (tests/test_index_contract.py) under memcheck; then the sanitizer record / replay over the quant
# tests (call 2's record stopped before 26 quant variants were reached). Wheels: dist_s21/.
set -uo pipefail
R=$OUT/r; mkdir -p $R/san; rm -rf /tmp/rec /tmp/siteS
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s21/tilebake-*.whl dist_s21/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
TILEBAKE_HYPOTHESIS_EXAMPLES=100 TILEBAKE_HYPOTHESIS_RANDOM=1 timeout 90 python3 -m pytest tests/properties tests/test_properties.py \
  -m gpu -q -p no:cacheprovider -n 12 -rf > $R/properties.log 2>&1
echo "properties rc=$?: $(tail -1 $R/properties.log)"; grep -E "^FAILED|^ERROR" $R/properties.log | cut -c1-300 | head -20
timeout 60 python3 -m pytest tests/test_launch_device.py tests/test_mixed_devices.py tests/engram/test_engram_hash.py tests/test_damaged_package_gpu.py \
  -m gpu -q -p no:cacheprovider -n 8 -rf > $R/devices.log 2>&1
echo "devices rc=$?: $(tail -1 $R/devices.log)"; grep -E "^FAILED|^ERROR" $R/devices.log | cut -c1-300 | head -20
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 60 compute-sanitizer --tool memcheck --check-device-heap yes --padding 64 --print-limit 20 \
  python3 -m pytest tests/test_index_contract.py -m gpu -q -p no:cacheprovider -rf > $R/index_contract_memcheck.log 2>&1
echo "index contract under memcheck rc=$?: $(grep -E 'passed|failed' $R/index_contract_memcheck.log | tail -1)"
grep -E "ERROR SUMMARY|^FAILED|^ERROR|Invalid" $R/index_contract_memcheck.log | cut -c1-300 | head -20
OUT=$R/san LIMIT=140 JOBS=16 bash bench/sanitize.sh record /tmp/rec tests/quant
du -sh /tmp/rec > $R/san/record_size.txt
for tool in memcheck racecheck initcheck synccheck; do
  OUT=$R/san LIMIT=30 bash bench/sanitize.sh $tool /tmp/rec | head -12
done
gzip $R/*.log $R/san/*.log; tar czf $R/san/index.tgz -C /tmp/rec $(cd /tmp/rec && ls index_*.json)
tar czf $OUT/results.tgz -C $R .
