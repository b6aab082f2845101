#!/usr/bin/env bash
# Session 14 call 5 (the machine still warm after call 4, whose suite ran out of time at 99%):
# the GPU tests of what this session changed, on the same full wheels (dist_s14f/).
rm -rf /tmp/site && python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_s14f/tilebake-*.whl dist_s14f/tilebake_cuda-*.whl && PYTHONPATH=/tmp/site timeout 140 python3 -m pytest tests/mhc/test_mhc_post.py tests/mhc/test_mhc_pre_norm_gemm.py tests/mhc/test_mhc_fn_normw_merge.py tests/test_native_path.py tests/test_out_buffers.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short 2>&1 | tail -4
