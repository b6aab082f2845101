#!/usr/bin/env bash
# On the GPU machine, after bench/run_on_device.sh installed dist/'s two wheels into /tmp/site:
# the CLI as a user runs it (list, doctor, doctor --require) with both packages, and then with
# the runtime alone (no tilebake-cuda: a CUDA call and doctor must say what to install).
#   usage: OUT=... bash bench/device_packaging.sh      (writes $OUT/packaging.txt)
set -uo pipefail
OUT=${OUT:-bench/results}
show() {  # show TITLE CMD...: the command, its output and its exit status
  echo "\$ $1"
  shift
  "$@" 2>&1
  echo "[exit status $?]"
  echo
}
{
  export PYTHONPATH=/tmp/site
  show "python -m tilebake doctor" python3 -m tilebake doctor
  show "python -m tilebake doctor --require per_token_cast,moe_topk_gate_forward,apply_rotary,reduce_fused" \
    python3 -m tilebake doctor --require per_token_cast,moe_topk_gate_forward,apply_rotary,reduce_fused
  show "python -m tilebake doctor --require no_such_op" python3 -m tilebake doctor --require no_such_op
  show "python -m tilebake list | head -3; ... | wc -l" sh -c 'python3 -m tilebake list | head -3; python3 -m tilebake list | wc -l'

  echo "=== the runtime wheel alone (no tilebake-cuda) ==="
  rm -rf /tmp/site-runtime
  python3 -m pip install -q --no-index --no-deps --target /tmp/site-runtime dist/tilebake-*.whl
  export PYTHONPATH=/tmp/site-runtime
  show "a CUDA call without the kernels" python3 -c '
import torch, tilebake
from tilebake.errors import KernelsNotInstalledError
x = torch.randn(4, 128, device="cuda").bfloat16()
try:
    tilebake.quant.per_token_cast(x, "e4m3", 128)
except KernelsNotInstalledError as e:
    print("KernelsNotInstalledError:", e)
else:
    raise SystemExit("the call ran without the kernel package")
y, s = tilebake.quant.per_token_cast(x.cpu(), "e4m3", 128)
print("CPU tensors still work:", tuple(y.shape), tuple(s.shape))'
  show "python -m tilebake doctor --require cast" python3 -m tilebake doctor --require cast
  show "python -m tilebake list" python3 -m tilebake list
} > "$OUT/packaging.txt"
cat "$OUT/packaging.txt"
