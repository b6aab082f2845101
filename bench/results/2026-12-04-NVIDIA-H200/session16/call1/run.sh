#!/usr/bin/env bash
# Session 16 call 1. ta_A / ta_B: partial tilebake-cuda (mhc_pre_apply_mix only, m <= 4 register
# arrays; B: the forward 4 tokens a thread, the backward by cp.async 3 stages). B = dist_s16B (main 9b961e1, partial: the mhc ops the script runs, sm_90a). C24 / C34 / C30: main's tilebake +
# a partial tilebake-cuda (mhc_post only, sm_90a): the backward's loads by cp.async into shared
# memory, STAGES steps in flight a warp, min CTAs a SM (2/4, 3/4, 3/none).
set -uo pipefail
R=$OUT/r; mkdir -p $R
pip() { python3 -m pip install -q --no-index --no-deps --target "$@" || exit 1; }
pip /tmp/siteB dist_s16B/tilebake-*.whl dist_s16B/tilebake_cuda-*.whl
for c in 2_4 3_4 3_0 ta_A ta_B; do pip /tmp/site$c dist_s16B/tilebake-*.whl dist_s16_$c/tilebake_cuda-*.whl; done
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
for c in 2_4 3_4 3_0; do
  PYTHONPATH=/tmp/site$c timeout 100 python3 -m pytest tests/mhc/test_mhc_post.py -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_$c.log 2>&1
  echo "tests $c rc=$?"; tail -1 $R/tests_$c.log; grep -E "^FAILED|^ERROR" $R/tests_$c.log | cut -c1-250 | head -6
done
for c in ta_A ta_B; do  # (m <= 4 kernels: the m = 8 cases are expected to fail)
  PYTHONPATH=/tmp/site$c timeout 60 python3 -m pytest tests/mhc/test_mhc_pre_apply_mix.py -m "gpu" -n 8 -p no:cacheprovider -q -rf --tb=line > $R/tests_$c.log 2>&1
  echo "tests $c rc=$?"; tail -1 $R/tests_$c.log; grep -E "^FAILED|^ERROR" $R/tests_$c.log | cut -c1-160 | head -6
done
cd bench
for s in siteB site2_4 site3_4 site3_0 siteB site2_4 site3_4 site3_0; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "mhc_post" --name anchors_s16c1_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | cut -c1-100 | head -2
done
for s in siteB siteta_A siteta_B siteB siteta_A siteta_B; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "pre_apply_mix" --name anchors_s16c1a_$s > $R/anchors_a_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_a_$s.log | cut -c1-100 | head -2
done
for s in siteB site2_4 site3_4; do
  PYTHONPATH=/tmp/$s timeout 120 python3 - > $R/post_small_$s.log 2>&1 <<'PY'
# mhc_post at the issue's small shapes: CUDA-graph replays against the same run's copy (2 GiB) and a
# copy of the same bytes (half read, half written; four rotated buffer pairs)
import torch, bench, cases, harness
copy = harness.copy_bandwidth_gbs()
print(f"copy {copy:.0f} GB/s")
for d, make in enumerate(cases.CASES["mhc_post"]):
    for t, h in ((4096, 1280), (8192, 1280), (8192, 4096), (8192, 7168)):
        case = make(t, h)
        row = bench.measure(case, copy, None)
        n = case["bytes"] // 2 // 4
        pairs = [(torch.empty(n, device="cuda").uniform_(), torch.empty(n, device="cuda")) for _ in range(4)]
        same = case["bytes"] / harness.time_graph(lambda s, o: o.copy_(s), pairs) / 1e3
        print(f"{'fwd' if d == 0 else 'bwd'} {t}x{h}: graph {row['graph_us']:7.1f} us {row['graph_pct_copy']:5.1f}% of copy, "
              f"{100 * row['graph_gbs'] / same:5.1f}% of a same-bytes copy ({same:.0f} GB/s), eager {row['eager_us']:7.1f} us, matches {row['output_matches_reference']}")
PY
  echo "post small $s rc=$?"; tail -8 $R/post_small_$s.log
done
cd ..
PYTHONPATH=/tmp/siteB timeout 60 python3 .carry/s16/host_breakdown.py > $R/host_breakdown.log 2>&1; echo "host breakdown rc=$?"; cat $R/host_breakdown.log | head -20
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
