#!/usr/bin/env bash
# Session 14 call 4: full wheels of main's head (dist_s14f/, built in the fresh-clone CI run's tree):
# the whole GPU suite, the mhc anchors, host times of the mhc family.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_s14f/tilebake-*.whl dist_s14f/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 420 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "suite rc=$?"; tail -1 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-250 | head -20
gzip $R/gpu_tests.log
cd bench
PYTHONPATH=/tmp/site timeout 100 python3 anchors.py --cases "mhc|expand" --name anchors_s14c4 > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (mhc|expand)" $R/anchors.log | cut -c1-120 | head -20
PYTHONPATH=/tmp/site timeout 100 python3 host_time.py --families mhc --name host_time_s14c4 > $R/host_time.log 2>&1
echo "host rc=$?"; grep -E "torch.mul|mhc" $R/host_time.log | head -24
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
