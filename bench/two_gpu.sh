#!/usr/bin/env bash
# Issue 19 (two GPUs of one host) in one device call, from the repository root:
#   bash bench/two_gpu.sh WHEEL_DIR        (WHEEL_DIR holds tilebake-*.whl and tilebake_cuda-*.whl)
# Installs the wheels (--no-deps), then: the two-GPU tests, the launch-device and ddp tests; the
# mixed-device tests (their own process: a missed device check can break a CUDA context); doctor;
# bench/ddp_step.py over NCCL; then, in the time left (BUDGET, default 570 s from the start), the
# whole GPU test suite on the second GPU alone. Logs under $OUT (copy them to bench/results/).
set -uo pipefail
WHEELS=${1:?usage: bash bench/two_gpu.sh WHEEL_DIR}
OUT=${OUT:-bench/results/two_gpu}
mkdir -p "$OUT"
# NVLink multicast stays off: it can take a shared host's GPUs out of service (device KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
rm -rf /tmp/site2  # a warm machine may hold an earlier call's install
python3 -m pip install -q --no-index --no-deps --target /tmp/site2 "$WHEELS"/tilebake-*.whl "$WHEELS"/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site2
{
  echo "command: bash bench/two_gpu.sh $*"; echo "date: $(date -u +%FT%TZ)"; echo "wheels: $(cd "$WHEELS" && ls *.whl)"
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv; nvidia-smi topo -m
  python3 -c "import sys, torch, tilebake; print(sys.version.split()[0], torch.__version__, tilebake.__file__)"
} 2>&1 | tee "$OUT/env.txt"

tests() {  # tests NAME LIMIT PYTEST-ARGS...: one pytest process, its log $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  timeout -s INT -k 20 "$limit" python3 -m pytest "$@" -q -p no:cacheprovider -rfs --tb=short > "$OUT/$name.log" 2>&1
  echo "$name rc=$?: $(tail -1 "$OUT/$name.log")"; grep -E "^(FAILED|ERROR)" "$OUT/$name.log" | cut -c1-300 | head -20
}
tests two_gpus 180 tests/test_two_gpus.py tests/test_launch_device.py tests/test_ddp_step.py -n 4
tests mixed_devices 120 tests/test_mixed_devices.py -n 4
timeout 120 python3 -m tilebake doctor > "$OUT/doctor.log" 2>&1; echo "doctor rc=$?"; cat "$OUT/doctor.log"
timeout 120 python3 bench/ddp_step.py --backend nccl > "$OUT/ddp_step.json" 2> "$OUT/ddp_step.err"
echo "ddp_step rc=$?"; cat "$OUT/ddp_step.json"; tail -20 "$OUT/ddp_step.err"
left=$(( ${BUDGET:-570} - SECONDS ))
echo "GPU suite on cuda:1 alone (CUDA_VISIBLE_DEVICES=1): ${left} s left"
[ "$left" -ge 60 ] && CUDA_VISIBLE_DEVICES=1 tests gpu_suite_on_gpu1 "$left" tests -m gpu -n "${JOBS:-16}"
gzip -f "$OUT"/*.log
