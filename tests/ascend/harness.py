"""What the Ascend tests share: the tilebake-ascend package built by backends/ascend's CMake with
a stand-in CANN toolchain (binaries that only name their variant), checked by check_wheel.py and
installed; a stand-in libascendcl (standin_ascendcl.c) that records every call; a fresh
interpreter a case (the launcher opens libascendcl once a process) with torch_npu's device facts
and stream replaced; the argument packing of ../shared/notes/ascend_aot.md computed on its own.
Nothing here runs a kernel: there is no NPU."""

import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilebake._registry import all_variants

ROOT = Path(__file__).resolve().parent.parent.parent
ARCH = "dav-3510"
VARIANTS = all_variants("ascend")


STANDIN_BISHENG = """#!/bin/sh
# stand-in bisheng: an object file naming the AscendC source it was given
out=""; src=""
while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift;; *.asc) src="$1";; esac; shift; done
printf 'REL %s' "$(basename "$src" .asc)" > "$out"
"""
STANDIN_LLD = """#!/bin/sh
out=""; obj=""
while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift;; *.o) obj="$1";; esac; shift; done
{ printf 'AIBIN '; cat "$obj"; } > "$out"
"""


def build_site(base: Path):
    """(site dir with tilebake-ascend installed, its kernel dir, the stand-in libascendcl; the
    build's stage-1 output is base/build/kernels/ARCH): the
    package built by backends/ascend's CMake with a stand-in CANN toolchain (binaries that only
    name their variant), checked by check_wheel.py, installed with pip."""
    pytest.importorskip("scikit_build_core")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the stand-in libascendcl")
    lib = base / "libascendcl_standin.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(ROOT / "tests/ascend/standin_ascendcl.c")], check=True
    )
    tools = base / "cann" / "bin"
    tools.mkdir(parents=True)
    for name, text in (("bisheng", STANDIN_BISHENG), ("ld.lld", STANDIN_LLD)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    wheels = base / "wheels"
    env = {**os.environ, "BISHENG_HOME": str(tools.parent)}
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            str(wheels),
            "-C",
            f"build-dir={base / 'build'}",  # the stage-1 test compares its own lowering with this one's
            str(ROOT / "backends" / "ascend"),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheel = next(wheels.glob("tilebake_ascend-*.whl"))
    check = subprocess.run(
        [sys.executable, str(ROOT / "build_tools" / "check_wheel.py"), str(wheel)], capture_output=True, text=True
    )
    assert check.returncode == 0 and f"ok ({len(VARIANTS)} binaries" in check.stdout, check.stdout + check.stderr
    site = base / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True
    )
    return site, site / "tilebake_ascend" / "kernels", lib


PRELUDE = """
import contextlib, json, sys
import torch
import tilebake
from tilebake._runtime import ascend
from tilebake._registry import all_variants
ascend.device_facts = lambda i: (MODEL, CORES)
ascend.current_stream = lambda i: 0x5000 + i
ascend.device_scope = lambda i: contextlib.nullcontext()
"""


# A tensor reporting device npu:0 (CPU memory: the stand-in never touches it): the public ops'
# dispatch by device type, without an NPU.
FAKE_NPU = """
torch.utils.rename_privateuse1_backend("npu")

class FakeNPU(torch.Tensor):
    @property
    def device(self):
        return torch.device("npu", 0)
"""


def run(setup, body: str, model="Ascend950PR_9589", cores=64, env=None, site=True, prelude=True, npu=False):
    """(the interpreter's result, the stand-in's recorded calls) of `body` run with the package of
    `setup`; npu: FakeNPU (a tensor class reporting device npu:0) defined first."""
    site_dir, _, lib = setup
    log = site_dir.parent / "calls.log"
    log.unlink(missing_ok=True)
    script = (f"MODEL, CORES = {model!r}, {cores}\n" + PRELUDE if prelude else "") + (FAKE_NPU if npu else "")
    script += textwrap.dedent(body)
    environ = {**os.environ, "TILEBAKE_LIBASCENDCL": str(lib), "STANDIN_ACL_LOG": str(log), **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(([str(site_dir)] if site else []) + [environ.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ, cwd=ROOT)
    calls = log.read_text().splitlines() if log.exists() else []
    return result, calls


def expected_args(params, values) -> bytes:
    """The packing the note gives, computed here on its own."""
    out = b""
    for p, value in zip(params, values):
        kind, width = p["kind"], 8 if p["kind"] in "pl" else 4
        out += b"\0" * (-len(out) % width)
        out += struct.pack({"p": "<Q", "l": "<q", "i": "<i", "f": "<f"}[kind], value)
    return out + b"\0" * (-len(out) % 8)


def launch_args(line: str) -> str:
    """The packed argument bytes (hex) of a recorded launch."""
    return line.split(" args ")[1].split()[1]
