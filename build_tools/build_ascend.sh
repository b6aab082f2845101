#!/usr/bin/env bash
# The Ascend build entry for CI (wheels.yml, in a CANN container image). It checks for the CANN
# toolchain and then builds the Ascend kernel package, tilebake-ascend (backends/ascend, the
# counterpart of backends/cuda: README, "Packages") into wheelhouse/. tilebake has no Ascend
# kernels yet, so after the toolchain check this script fails on purpose, saying so, rather than
# report a build it did not do.
# Exit codes: 0 built, 2 no CANN toolchain, 3 no Ascend kernel package in this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

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

# The Ascend kernel package (lower every variant with TileLang's Ascend backend, compile with
# CANN, write the manifest, as backends/cuda does with nvcc); it does not exist yet.
package=backends/ascend
if [[ ! -f "$package/pyproject.toml" ]]; then
  echo "::error::No Ascend kernels to build yet: $package/pyproject.toml (the tilebake-ascend package)" \
    "does not exist in this checkout. The CANN toolchain is there; this job fails until the Ascend" \
    "backend lands." >&2
  exit 3
fi
python -m pip wheel --no-build-isolation --no-deps -w wheelhouse "$package"
