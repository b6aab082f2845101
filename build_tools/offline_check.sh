#!/usr/bin/env bash
# Offline install check (issue 6): make a wheelhouse with hashes for tilebake's wheels, then,
# with no network (a new network namespace: `unshare -n`), install them into a fresh virtual
# environment from that wheelhouse alone and run the CPU tests against the installed packages.
#
#   bash build_tools/offline_check.sh RUNTIME_WHEEL KERNEL_WHEEL [PYTEST ARGS...]
#
# RUNTIME_WHEEL: tilebake-*.whl (pip wheel --no-build-isolation --no-deps -w dist .); KERNEL_WHEEL:
# tilebake_cuda-*.whl (... -w dist backends/cuda). Either order.
# PYTEST ARGS: default `-m "not gpu" -q`; a partial wheel (TILEBAKE_OPS) fails the tests of the
# ops it lacks and tests/test_build.py, so pass a selection for one, e.g. `-m "not gpu" -q tests/moe`.
# Environment:
#   WHEELHOUSE   where to put the wheelhouse (default: a new temporary directory); an existing one
#                is reused (only missing files are downloaded; pip's cache serves repeats), but it
#                must not hold other versions of the same packages: every file in it is pinned
#   TORCH        the torch requirement, pinned to a +cpu build so nothing pulls a CUDA torch (default:
#                the CPU torch that $PYTHON has, else torch==2.13.0+cpu)
#   TORCH_INDEX  where the CPU torch comes from (default https://download.pytorch.org/whl/cpu; empty,
#                or unreachable: pip's own configuration and cache must provide it)
#   EXTRA_REQUIREMENTS  more packages for the wheelhouse, space-separated (e.g. numpy for a wheel
#                built before numpy joined the test extra)
#   PYTHON       the interpreter of the fresh venv (default python3); the wheelhouse is for it
#   OFFLINE_REQUIRE_UNSHARE=1   fail instead of skipping where `unshare -n` is not permitted
#   OFFLINE_KEEP=1   keep the work dir (venv, test copy) after success
# The wheelhouse holds WHEELHOUSE/requirements.txt (every file pinned, with --hash=sha256:); on the
# air-gapped machine: pip install --no-index --find-links WHEELHOUSE --require-hashes -r WHEELHOUSE/requirements.txt
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 RUNTIME_WHEEL KERNEL_WHEEL [PYTEST ARGS...]"
RUNTIME_WHEEL="" KERNEL_WHEEL=""
for _ in 1 2; do
  [ $# -ge 1 ] && [ -f "$1" ] || { echo "$usage" >&2; exit 2; }
  case "$(basename "$1")" in  # pip needs the file names
    tilebake-*.whl) RUNTIME_WHEEL="$(realpath "$1")" ;;
    tilebake_cuda-*.whl) KERNEL_WHEEL="$(realpath "$1")" ;;
    *) echo "offline_check: $1 is named like neither tilebake-*.whl nor tilebake_cuda-*.whl" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$RUNTIME_WHEEL" ] && [ -n "$KERNEL_WHEEL" ] || { echo "$usage" >&2; exit 2; }
PYTEST_ARGS=("$@")
[ ${#PYTEST_ARGS[@]} -gt 0 ] || PYTEST_ARGS=(-m "not gpu" -q)
PY="${PYTHON:-python3}"
if [ -z "${TORCH:-}" ]; then  # the CPU torch of the build environment if it has one (pip's cache holds it)
  TORCH="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
  case "$TORCH" in *+cpu) TORCH="torch==$TORCH" ;; *) TORCH="torch==2.13.0+cpu" ;; esac
fi
TORCH_INDEX="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
if [ -n "$TORCH_INDEX" ] && ! "$PY" -c 'import sys, urllib.request as u
u.urlopen(u.Request(sys.argv[1], method="HEAD"), timeout=10)' "$TORCH_INDEX/" 2>/dev/null; then
  echo "offline_check: $TORCH_INDEX is not reachable; $TORCH must come from pip's configuration or cache"
  TORCH_INDEX=
fi
WORK="$(mktemp -d /tmp/tilebake-offline.XXXXXX)"
trap 'echo "offline_check: FAILED (see above); the venv and the test copy are in $WORK" >&2' ERR
WHEELHOUSE="$(realpath -m "${WHEELHOUSE:-$WORK/wheelhouse}")"
mkdir -p "$WHEELHOUSE"
start=$SECONDS
cleanup() {  # after success or a skip: the work dir goes, a wheelhouse the caller named stays
  local t=$SECONDS
  [ "${OFFLINE_KEEP:-0}" = 1 ] && { echo "offline_check: kept $WORK"; return; }
  rm -rf "$WORK"
  echo "offline_check: removing the work dir took $((SECONDS - t)) s"
  case "$WHEELHOUSE" in "$WORK"/*) ;; *) echo "offline_check: the wheelhouse is $WHEELHOUSE" ;; esac
}

# --- 1. online: the wheelhouse ---
# Only wheels (no sdist builds on the offline side). The torch pin also constrains the
# resolution of tilebake's own `torch>=2.4`, so PyPI's CUDA torch is never a candidate.
rm -f "$WHEELHOUSE"/tilebake-*.whl "$WHEELHOUSE"/tilebake_cuda-*.whl
cp "$RUNTIME_WHEEL" "$KERNEL_WHEEL" "$WHEELHOUSE/"
echo "$TORCH" > "$WORK/constraints.txt"
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$WHEELHOUSE" \
  ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} -c "$WORK/constraints.txt" \
  "$TORCH" "$WHEELHOUSE/$(basename "$RUNTIME_WHEEL")[test]" "$WHEELHOUSE/$(basename "$KERNEL_WHEEL")" \
  ${EXTRA_REQUIREMENTS:-}
# One line per package, every file of it hashed (pip hash computes what --require-hashes checks).
"$PY" - "$WHEELHOUSE" <<'EOF'
import re, subprocess, sys
from pathlib import Path

house = Path(sys.argv[1])
lines = {}
for wheel in sorted(house.glob("*.whl")):
    name, version = wheel.name.split("-")[:2]  # wheel file names escape '-' inside fields
    name = re.sub(r"[-_.]+", "-", name).lower()
    out = subprocess.run([sys.executable, "-m", "pip", "hash", str(wheel)], capture_output=True, text=True, check=True)
    digest = out.stdout.split("--hash=")[1].split()[0]
    lines.setdefault(f"{name}=={version}", []).append(digest)
text = "".join(f"{req} " + " ".join(f"--hash={d}" for d in digests) + "\n" for req, digests in sorted(lines.items()))
(house / "requirements.txt").write_text(text)
print(f"offline_check: wheelhouse {house}: {len(lines)} packages, "
      f"{sum(f.stat().st_size for f in house.glob('*.whl')) / 1e6:.0f} MB")
EOF
echo "offline_check: wheelhouse ready in $((SECONDS - start)) s"

# --- 2. offline: fresh venv, install from the wheelhouse only, CPU tests ---
if ! unshare -n true 2>/dev/null; then
  echo "offline_check: SKIPPED the offline install: 'unshare -n' is not permitted here (needs root or user namespaces)" >&2
  [ "${OFFLINE_REQUIRE_UNSHARE:-0}" = 1 ] && exit 1
  cleanup
  exit 0
fi
# The tests run from a copy outside the source tree, so `import tilebake` is the installed wheel.
# The same files as cibuildwheel's test-sources: the tests also check the benchmark cases, the
# build tools and the workflows; there is no src/ beside them.
mkdir -p "$WORK/run/bench" "$WORK/run/backends/cuda" "$WORK/run/backends/ascend"
cp -r tests build_tools .github "$WORK/run/"
cp pyproject.toml "$WORK/run/"  # the pytest configuration (markers)
for backend in cuda ascend; do  # the packaging tests read them
  cp "backends/$backend/pyproject.toml" "$WORK/run/backends/$backend/"
done
cp bench/*.py "$WORK/run/bench/"
find "$WORK/run" -name __pycache__ -prune -exec rm -rf {} +

# Inside the namespace: no network at all (only a loopback that is down), and no pip
# configuration of this machine (its find-links or local indexes would make the check leaky).
cat > "$WORK/offline.sh" <<'EOF'
set -euo pipefail
for var in $(compgen -e); do case "$var" in PIP_*) unset "$var";; esac; done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
if "$PY" -c "import socket; socket.create_connection(('pypi.org', 443), timeout=5)" 2>/dev/null; then
  echo "offline_check: the network is reachable inside the namespace; not an offline check" >&2; exit 1
fi
"$PY" -m venv "$WORK/venv"
. "$WORK/venv/bin/activate"
t=$SECONDS
python -m pip install -q --no-compile --no-index --find-links "$WHEELHOUSE" --require-hashes -r "$WHEELHOUSE/requirements.txt"
echo "offline_check: offline install took $((SECONDS - t)) s"
cd "$WORK/run"
python -c "import tilebake, sys; assert tilebake.__file__.startswith(sys.prefix), tilebake.__file__; print('offline_check: testing', tilebake.__file__)"
python -m tilebake list > /dev/null
t=$SECONDS
python -m pytest -p no:cacheprovider "${PYTEST_ARGS[@]}"
echo "offline_check: tests took $((SECONDS - t)) s"
EOF
export PY WORK WHEELHOUSE
# Arrays do not cross `export`: hand the pytest arguments over as the script's arguments.
unshare -n bash -c 'PYTEST_ARGS=("$@"); . "$WORK/offline.sh"' offline "${PYTEST_ARGS[@]}"
echo "offline_check: PASSED in $((SECONDS - start)) s in all"
cleanup
