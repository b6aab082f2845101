#!/usr/bin/env bash
# Session 23 call 1: wheels of main 3cb7b00 (dist_s23, "O") and of main + mhc_pre_split_mixes_bwd
# in one launch (dist_s23b, "N"). The mHC / modeling / plan GPU tests and session 22's new tests
# on N; the split-mixes tests recorded and replayed under the four compute-sanitizer tools; the
# split-mixes anchors on O and N alternately (graph and CUPTI); mHC host times on O and N.
set -uo pipefail
R=$OUT/r; mkdir -p $R
for s in O N; do rm -rf /tmp/site$s; done
python3 -m pip install -q --no-index --no-deps --target /tmp/siteO dist_s23/tilebake-*.whl dist_s23/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteN dist_s23b/tilebake-*.whl dist_s23b/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; cat $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteN
timeout 170 python3 -m pytest tests/mhc tests/modeling tests/test_plans_mhc.py tests/test_api_surface.py \
  tests/test_config_names.py tests/test_testing_module*.py tests/test_launch_device.py tests/test_mixed_devices.py \
  -m gpu -q -p no:cacheprovider -n 14 -rf > $R/tests.log 2>&1
echo "tests rc=$?: $(tail -1 $R/tests.log)"; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-250 | head
OUT=$R/san LIMIT=60 JOBS=4 bash bench/sanitize.sh record /tmp/recS tests/mhc/test_pre_split_mixes.py
for tool in memcheck racecheck initcheck synccheck; do
  OUT=$R/san LIMIT=40 bash bench/sanitize.sh $tool /tmp/recS | grep -E "replay|ERROR|RACECHECK|errors|hazard" | head -4
done
cd bench
for s in O N O N; do
  PYTHONPATH=/tmp/site$s timeout 60 python3 anchors.py --cases "split_mixes" --name anchors_s23c1_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| mhc" $R/anchors_$s.log | cut -c1-160
done
for s in O N; do
  PYTHONPATH=/tmp/site$s timeout 60 python3 host_time.py --families mhc --name host_time_s23c1_$s > $R/host_$s.log 2>&1
  echo "host $s rc=$?"; grep -iE "split|mul" $R/host_$s.log | cut -c1-160
done
cd ..
gzip $R/tests.log
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*
