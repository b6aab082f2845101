#!/usr/bin/env bash
# Session 7 call 2: the final tree's wheels: the whole GPU suite (-v, so a cut log still names
# its failures), the mhc anchors, the GEMM / post figures and host times; the GEMM forward's
# 3-stage tile of call 1 (a partial wheel) beside the shipped 4-stage one, same run.
set -uo pipefail
R=$OUT/r; mkdir -p $R  # written into $OUT as it goes: a cut run still brings back what it has
rm -rf /tmp/site /tmp/site3
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site3 dist/tilebake-*.whl .carry/t8/stages3/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 380 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -v -rf --tb=short > $R/gpu_tests.log 2>&1
echo "suite rc=$?"; tail -1 $R/gpu_tests.log; grep -E "FAILED|ERROR" $R/gpu_tests.log | grep -v "^tests.*PASSED" | cut -c1-220 | head -30
cd bench
PYTHONPATH=/tmp/site timeout 90 python3 anchors.py --cases "mhc|expand" --name anchors_mhc > $R/anchors_mhc.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (mhc|expand)|copy" $R/anchors_mhc.log | head -24
echo "== site"; PYTHONPATH=/tmp/site:. timeout 45 python3 ../.carry/t8/perf.py > $R/perf_site.txt 2>&1; grep -E "copy|gemm|post|host" $R/perf_site.txt | head -20
echo "== site3 (3-stage GEMM forward of call 1)"; PYTHONPATH=/tmp/site3:. timeout 25 python3 ../.carry/t8/perf_gemm.py > $R/perf_site3.txt 2>&1; cat $R/perf_site3.txt | head -8
if ls ../.carry/t8/site4/tilebake_cuda-*.whl >/dev/null 2>&1; then  # the mix kernels' rewrite (partial wheel)
  cd ..; python3 -m pip install -q --no-index --no-deps --target /tmp/site4 .carry/t8/site4/tilebake-*.whl .carry/t8/site4/tilebake_cuda-*.whl
  PYTHONPATH=/tmp/site4 timeout 60 python3 -m pytest tests/mhc/test_pre_split_mixes.py tests/mhc/test_head_compute_mix.py tests/mhc/test_mhc_fn_normw_merge.py -m gpu -n 8 -p no:cacheprovider -q -rf --tb=short > $R/site4_tests.log 2>&1
  echo "site4 tests rc=$?"; tail -1 $R/site4_tests.log; grep -E "^FAILED|^ERROR" $R/site4_tests.log | cut -c1-200 | head
  cd bench; PYTHONPATH=/tmp/site4 timeout 40 python3 anchors.py --cases "split_mixes|head_compute|normw_merge" --name anchors_site4 > $R/anchors_site4.log 2>&1
  grep -E "^\| mhc" $R/anchors_site4.log | head -8
fi
cd ..
find bench/results -newer $R/date.txt -type f -exec cp {} $R/ \;
gzip $R/gpu_tests.log  # (-v: about 1 MB)

