#!/usr/bin/env bash
# swiglu helper's device run: wheel A (dist/) = the committed kernels: GPU tests + bench of both ops;
# wheels B, C (distB/, distC/) = backward launch-bound alternatives: bench of swiglu_backward only.
sed -i 's#/tmp/site#/tmp/site-swiglu#g' bench/run_on_device.sh
# The backward bench input without per_token_cast (not in these partial wheels): the reference cast, same bytes.
sed -i 's#tilebake.quant.per_token_cast(x, "e4m3", 128)#tilebake.torch.cast(x, "e4m3", (1, 128))#' bench/cases.py
rm -rf /tmp/site-swiglu
TEST_FILES="tests/quant/test_swiglu_forward.py tests/quant/test_swiglu_backward.py" \
  BENCH_ARGS="--ops swiglu_forward,swiglu_backward --shapes 16384x7168,4096x7168 --no-compile --name swiglu" \
  bash bench/run_on_device.sh -x
for v in B C; do
  [ -d dist$v ] || continue
  rm -rf /tmp/site-swiglu-$v
  python3 -m pip install -q --no-index --no-deps --target /tmp/site-swiglu-$v dist$v/tilebake-*.whl || continue
  PYTHONPATH=/tmp/site-swiglu-$v python3 bench/bench.py --ops swiglu_backward --shapes 16384x7168,4096x7168 \
    --no-compile --name swiglu-bwd-$v > "$OUT/bench-$v.log" 2>&1
  echo "== wheel $v"; grep "^swiglu_backward" "$OUT/bench-$v.log"
done
