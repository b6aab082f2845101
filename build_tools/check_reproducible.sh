#!/usr/bin/env bash
# Build each wheel (the runtime, tilebake, and the CUDA kernels, tilebake-cuda) twice from this
# tree, in separate build dirs and output dirs, and check that each pair is byte-identical
# (issue 6). Usage:
#
#   bash build_tools/check_reproducible.sh [OPS]
#
# OPS (or $TILEBAKE_OPS): comma-separated ops for a quick partial build (e.g.
# per_block_cast_lossless: its cubins hold the _INTERNAL_ symbols whose hash a source path would
# change); empty: every op (the CI check; two full builds). Run it in the build environment
# (pip install -r build_tools/requirements-build.txt). The second build runs under another
# umask and from a build dir at a path of another length, so permissions or build paths that
# leak into the wheel show up here and not only on someone else's machine; the comparison also
# fails if the source, build or tool paths occur in any member. SOURCE_DATE_EPOCH is left as
# the caller has it: the wheel must be reproducible with and without it (pyproject.toml sets
# wheel.reproducible, which uses a fixed date when it is unset).
# $REPRO_WORK: where to build (default: a new temporary directory, removed on success).
set -euo pipefail
cd "$(dirname "$0")/.."
OPS="${1:-${TILEBAKE_OPS:-}}"
WORK="${REPRO_WORK:-$(mktemp -d /tmp/tilebake-repro.XXXXXX)}"
mkdir -p "$WORK"
PY="${PYTHON:-python}"

echo "check_reproducible: ops=${OPS:-<all>} work=$WORK SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-<unset>} commit=$(git rev-parse HEAD 2>/dev/null || echo none)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "check_reproducible: note: the tree has uncommitted changes; both builds use them"
fi

# The sources (tracked and untracked, not ignored) before and after: an edit during the builds
# would look like a reproducibility failure.
tree_fingerprint() {
  git ls-files -z -co --exclude-standard | sort -z | (xargs -0 -r sha256sum 2>/dev/null || true) | sha256sum
}
before="$(tree_fingerprint)"

build() {  # build NAME UMASK: both packages
  local start=$SECONDS
  (
    umask "$2"
    "$PY" -m pip wheel -q --no-build-isolation --no-deps -C build-dir="$WORK/$1/build-runtime" -w "$WORK/$1/dist" .
    "$PY" -m pip wheel -q --no-build-isolation --no-deps \
      -C build-dir="$WORK/$1/build-cuda" -C cmake.define.TILEBAKE_OPS="$OPS" -w "$WORK/$1/dist" backends/cuda
  )
  echo "check_reproducible: build $1 (umask $2) took $((SECONDS - start)) s"
}
build a 022
build second-build 002

TL_DIR="$("$PY" -c 'import os, tilelang; print(os.path.dirname(tilelang.__file__))')"
NVCC_DIR="$(dirname "$(command -v nvcc || echo /nonexistent/nvcc)")"
rc=0
for wheel in "$WORK"/a/dist/*.whl; do
  "$PY" build_tools/compare_wheels.py "$wheel" "$WORK/second-build/dist/$(basename "$wheel")" \
    --forbid "$PWD" --forbid "$WORK" --forbid "$TL_DIR" --forbid "$("$PY" -c 'import sys; print(sys.prefix)')" \
    --forbid "$NVCC_DIR" || rc=1
done
[ "$(ls "$WORK"/a/dist/*.whl | wc -l)" = 2 ] || { echo "check_reproducible: expected 2 wheels per build" >&2; rc=1; }
if [ "$(tree_fingerprint)" != "$before" ]; then
  echo "check_reproducible: INCONCLUSIVE: the source tree changed while it was building; run it again" >&2
  rc=3
fi
if [ $rc -eq 0 ] && [ -z "${REPRO_WORK:-}" ]; then
  rm -rf "$WORK"
else
  echo "check_reproducible: the builds are kept in $WORK"
fi
exit $rc
