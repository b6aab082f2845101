#!/usr/bin/env bash
# Session 23 call 4 (the H200 of call 3, still warm): the split-mixes backward's anchor with main's
# wheels (dist_s23, "O") and the one-launch candidate's (dist_s23b, "N"), alternating.
for s in O N; do rm -rf /tmp/site$s; done; python3 -m pip install -q --no-index --no-deps --target /tmp/siteO dist_s23/tilebake-*.whl dist_s23/tilebake_cuda-*.whl; python3 -m pip install -q --no-index --no-deps --target /tmp/siteN dist_s23b/tilebake-*.whl dist_s23b/tilebake_cuda-*.whl; nvidia-smi --query-gpu=name --format=csv,noheader; cd bench; for s in O N O N; do PYTHONPATH=/tmp/site$s timeout 60 python3 anchors.py --cases "split_mixes_bwd" --name anchors_s23c4_$s > $OUT/anchors_$s.log 2>&1; echo "anchors $s rc=$?"; grep -E "^\| mhc|copy" $OUT/anchors_$s.log | cut -c1-170; done
