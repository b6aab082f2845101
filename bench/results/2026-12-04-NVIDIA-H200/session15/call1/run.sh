#!/usr/bin/env bash
# Session 15 call 1. S = dist_s15a: main's tilebake + a partial tilebake-cuda (mhc_sinkhorn with
# div.approx in the normalisation steps; mhc_pre_split_mixes bwd with its segment sums' loads
# first; mhc_post forward flat over the tokens' vectors). B = dist_s15b: the same ops from main.
set -uo pipefail
R=$OUT/r; mkdir -p $R
pip() { python3 -m pip install -q --no-index --no-deps --target "$@" || exit 1; }
for s in S B; do rm -rf /tmp/site$s; done
pip /tmp/siteS dist_s15a/tilebake-*.whl dist_s15a/tilebake_cuda-*.whl
pip /tmp/siteB dist_s15b/tilebake-*.whl dist_s15b/tilebake_cuda-*.whl
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteS timeout 150 python3 -m pytest tests/mhc/test_sinkhorn.py tests/mhc/test_pre_split_mixes.py tests/mhc/test_mhc_post.py -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_s.log 2>&1
echo "tests S rc=$?"; tail -1 $R/tests_s.log; grep -E "^FAILED|^ERROR" $R/tests_s.log | cut -c1-250 | head -12
gzip $R/tests_s.log
cd bench
for s in siteS siteB siteS siteB; do
  PYTHONPATH=/tmp/$s timeout 90 python3 anchors.py --cases "mhc_sinkhorn|split_mixes|mhc_post" --name anchors_s15c1_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | cut -c1-110 | head -8
done
for s in siteS siteB siteS siteB; do
  PYTHONPATH=/tmp/$s timeout 120 python3 - > $R/post_small_$s.log 2>&1 <<'PY'
# mhc_post at the issue's small shapes: CUDA-graph replays against the same run's copy
import bench, cases, harness
copy = harness.copy_bandwidth_gbs()
print(f"copy {copy:.0f} GB/s")
for d, make in enumerate(cases.CASES["mhc_post"]):
    for t, h in ((4096, 1280), (8192, 1280), (8192, 4096)):
        row = bench.measure(make(t, h), copy, None)
        print(f"{'fwd' if d == 0 else 'bwd'} {t}x{h}: graph {row['graph_us']:7.1f} us {row['graph_pct_copy']:5.1f}% of copy, "
              f"eager {row['eager_us']:7.1f} us, matches {row['output_matches_reference']}")
PY
  echo "post small $s rc=$?"; tail -6 $R/post_small_$s.log
done
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
