#!/usr/bin/env bash
# Session 20 call 2: wheels of main + mhc_pre_apply_mix's forward for m <= 4 as its own variant
# (256 threads stepping over a token pair's columns, 4-stream registers): its GPU tests and the
# plans', the big fuse's and the modeling layer's; three alternating tune.py rounds of the old and
# new forward configs (CUPTI); the pre_apply_mix and big-fuse anchors twice; issue 18's damaged
# kernel package tests (tests/test_damaged_package_gpu.py) and long run (bench/long_run.py, 10^6
# launches); then issue 18's
# compute-sanitizer memcheck (torch's caching allocator, 64-byte padding, device heap checks) over
# the mhc and engram GPU tests, 6 processes, stopped at 90 s.
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s20b/tilebake-*.whl dist_s20b/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
timeout 120 python3 -m pytest tests/mhc/test_mhc_pre_apply_mix.py tests/mhc/test_mhc_pre_big_fuse.py tests/modeling tests/test_plans_mhc.py tests/test_plans_mhc_norm.py -m gpu -q -p no:cacheprovider -n 14 -rf > $R/tests.log 2>&1
echo "tests rc=$?: $(tail -1 $R/tests.log)"; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-250 | head
for i in 1 2 3; do
  timeout 40 python3 bench/tune.py run .carry/tune_am2 mhc_pre_apply_mix > $R/tune_apply_$i.log 2>&1
  echo "tune $i rc=$?"; grep -E "^mhc" $R/tune_apply_$i.log | awk '{print $1, $2, $3, $4, $7}' | sed 's/.*column_loop-0.//'
done
timeout 120 python3 -m pytest tests/test_damaged_package_gpu.py -m gpu -q -p no:cacheprovider -n 5 -rf > $R/damaged.log 2>&1
echo "damaged package tests rc=$?: $(tail -1 $R/damaged.log)"; grep -E "^FAILED|^ERROR" $R/damaged.log | cut -c1-250 | head
timeout 150 python3 bench/long_run.py > $R/long_run.log 2>&1
echo "long run rc=$?"; cat $R/long_run.log
cd bench
for i in 1 2; do
  timeout 90 python3 anchors.py --cases "pre_apply_mix_fwd|big_fuse" --name anchors_s20c2_$i > $R/anchors_$i.log 2>&1
  echo "anchors rc=$?"; grep -E "^\| (mhc|expand)" $R/anchors_$i.log | cut -c1-150
done
cd ..
compute-sanitizer --version | tail -1 > $R/sanitizer_version.txt
OUT=$R/san JOBS=6 LIMIT=90 bash bench/sanitize.sh memcheck tests/mhc tests/engram 2>&1 | head -40
gzip $R/tests.log $R/san/sanitize_memcheck.log
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*
