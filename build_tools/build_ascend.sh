#!/usr/bin/env bash
# The Ascend build entry for CI (wheels.yml, in a CANN container image). It checks for the CANN
# toolchain and then builds the Ascend kernel package, tilebake-ascend (backends/ascend, the
# counterpart of backends/cuda: README, "Packages") into wheelhouse/.
# Exit codes: 0 built, 2 no CANN toolchain, else the build's own failure.
# --setup: first make the build environment (a venv with a CPU torch from PyTorch's CPU index,
# never PyPI's CUDA build, then build_tools/requirements-build.txt), as the CI job's step does:
#   docker run --rm -v "$PWD":/src -w /src quay.io/ascend/cann:9.1.1-950-ubuntu22.04-py3.11 \
#     bash build_tools/build_ascend.sh --setup
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--setup" ]]; then
  python3 -m venv /tmp/tilebake-ascend-build
  # shellcheck disable=SC1091
  . /tmp/tilebake-ascend-build/bin/activate
  pip install -q "$(grep -E '^torch==' build_tools/requirements-build.txt)" --index-url https://download.pytorch.org/whl/cpu
  pip install -q -r build_tools/requirements-build.txt
fi

# CANN images install the toolkit under /usr/local/Ascend; its set_env.sh exports
# ASCEND_HOME_PATH and PATH, but a CI step's shell does not source it by itself.
if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
  for env_script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh; do
    if [[ -f "$env_script" ]]; then
      # set_env.sh reads unset variables.
      set +u
      # shellcheck disable=SC1090
      source "$env_script"
      set -u
      break
    fi
  done
fi

compiler=""
for candidate in ascendc bisheng; do
  if command -v "$candidate" >/dev/null 2>&1; then
    compiler=$(command -v "$candidate")
    break
  fi
done
if [[ -z "$compiler" && -n "${ASCEND_HOME_PATH:-}" && -x "$ASCEND_HOME_PATH/compiler/ccec_compiler/bin/bisheng" ]]; then
  compiler="$ASCEND_HOME_PATH/compiler/ccec_compiler/bin/bisheng"
fi
if [[ -z "${ASCEND_HOME_PATH:-}" || -z "$compiler" ]]; then
  echo "::error::CANN toolchain not found: ASCEND_HOME_PATH='${ASCEND_HOME_PATH:-}', no ascendc or bisheng" \
    "on PATH or under \$ASCEND_HOME_PATH/compiler. Run this in a CANN image (e.g. ascendai/cann) or source" \
    "the toolkit's set_env.sh first." >&2
  exit 2
fi
echo "CANN toolchain: ASCEND_HOME_PATH=$ASCEND_HOME_PATH, compiler $compiler"
"$compiler" --version 2>&1 | head -n 3 || true
for info in "$ASCEND_HOME_PATH"/*/version.cfg "$ASCEND_HOME_PATH"/version.cfg; do
  if [[ -f "$info" ]]; then
    echo "$info:"
    head -n 5 "$info"
  fi
done

# The Ascend kernel package (backends/ascend): stage 1 lowers every Ascend variant with
# TileLang's Ascend backend, stage 2 compiles each with CANN's bisheng and ld.lld, then the
# manifest (as backends/cuda does with nvcc). aot_ascend.py finds bisheng through BISHENG_HOME.
export BISHENG_HOME="${BISHENG_HOME:-$(dirname "$(dirname "$(command -v bisheng 2>/dev/null || echo "$compiler")")")}"
SOURCE_DATE_EPOCH="$(git -c safe.directory='*' log -1 --format=%ct 2>/dev/null || date +%s)"
export SOURCE_DATE_EPOCH
python -m pip wheel --no-build-isolation --no-deps -w wheelhouse backends/ascend
