"""The Ascend backend's stage 1 (build_tools/aot_ascend.py) on this CPU host, no CANN: every
declared Ascend variant lowered to AscendC by the wheel build, a sample lowered again to the same
bytes; the stage-1 manifest holds
every variant with the launch facts read from the IR (the kernel's parameter order: buffers by
name, then scalars by name), matching the declarations; stage 2 without CANN stops with a message
naming what is missing. Nothing here runs a kernel: there is no NPU."""

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ascend.harness import ARCH, ROOT, VARIANTS
from tilebake._registry import all_variants

pytest.importorskip("tilelang")  # a build-time dependency (the CI venv has it)

AOT = [sys.executable, str(ROOT / "build_tools" / "aot_ascend.py")]


def _run(*args, check=True):
    return subprocess.run([*AOT, *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def stage1(setup, tmp_path_factory):
    """The wheel build's stage-1 tree (backends/ascend's CMake lowered every Ascend variant), with
    the stage-1 manifest written over it by `aot_ascend.py manifest --stage1-only`."""
    out = tmp_path_factory.mktemp("stage1")
    stage2 = shutil.ignore_patterns("*.aibin", "*.o", "cann_version.txt")  # what the stand-in CANN made
    shutil.copytree(setup[0].parent / "build" / "kernels" / ARCH, out / ARCH, ignore=stage2)
    _run("manifest", "--out", str(out), "--stage1-only")
    return out


@pytest.fixture(scope="module")
def relowered(tmp_path_factory):
    """The first variant of every third op (by name) lowered again, here, in other processes (one
    an op, as many at once as there are CPUs): the sample the determinism check compares (all of
    them twice would double the lowering time of CI)."""
    out = tmp_path_factory.mktemp("relowered")
    first = {}
    for v in VARIANTS:
        first.setdefault(v.op, v.id)
    first = dict(sorted(first.items())[::3])  # every third op: the families' kernels, a third of the time
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        lowered = list(pool.map(lambda i: _run("lower", i, "--out", str(out), check=False), first.values()))
    assert all(r.returncode == 0 for r in lowered), [r.stderr[-2000:] for r in lowered if r.returncode]
    return out, sorted(first.values())


def test_there_are_ascend_variants():
    assert VARIANTS and {v.backend for v in VARIANTS} == {"ascend"}
    assert all(v.backend == "cuda" for v in all_variants())


def test_every_variant_lowers_deterministically(stage1, relowered):
    """Every variant's AscendC as C++ (the wheel build's lowering), and the same bytes again from
    another process and directory for the sample."""
    for v in VARIANTS:
        code = (stage1 / ARCH / f"{v.id}.asc").read_text()
        assert 'extern "C" __global__ __vector__ void ' in code, v.id
        assert not re.search(r"&\(\(?-?[0-9]", code), f"{v.id}: takes the address of a literal (not C++)"
        assert str(ROOT) not in code
    again, ids = relowered
    for i in ids:
        assert (again / ARCH / f"{i}.asc").read_text() == (stage1 / ARCH / f"{i}.asc").read_text(), f"{i}: two lowerings differ"


def test_manifest_holds_every_variant_with_its_launch_facts(stage1):
    out = stage1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["package"] == "tilebake-ascend" and manifest["stage1_only"] is True
    assert manifest["backends"] == {"ascend": {"archs": [ARCH]}} and manifest["cann_version"] is None
    kernels = {}
    for op in manifest["ops"]:
        kernels.update(json.loads((out / "ops" / f"{op}.json").read_text())["kernels"])
    assert set(kernels) == {v.id for v in VARIANTS}
    for v in VARIANTS:
        meta = kernels[v.id][ARCH]
        assert meta["backend"] == "ascend" and meta["arch"] == ARCH and meta["binary"] is None
        assert meta["block_dim"] == v.num_vec_cores
        assert 0 <= meta["ub_bytes"] <= 216 * 1024  # 0: SIMT threads on GM alone (engram_hash)
        assert meta["entry"] in (out / ARCH / f"{v.id}.asc").read_text()
        names = [p["name"] for p in meta["params"]]
        pointers = [p["name"] for p in meta["params"] if p["kind"] == "p"]
        scalars = [p["name"] for p in meta["params"] if p["kind"] != "p"]
        assert names == sorted(pointers) + sorted(scalars), v.id  # the kernel's order, not the PrimFunc's
        declared = {p.name: p.dtype for p in v.params()}
        kinds = {"handle": "p", "int32": "i", "int64": "l", "float32": "f"}
        assert {p["name"]: p["kind"] for p in meta["params"]} == {n: kinds[d] for n, d in declared.items()}


def test_device_asserts_are_kept(stage1):
    """tilelang drops T.device_assert when it sees no NPU; the driver keeps them."""
    for v in VARIANTS:
        source = (ROOT / Path(*v.kernel_module().split("."))).with_suffix(".py").read_text()
        if "device_assert" in source:
            assert "assert" in (stage1 / ARCH / f"{v.id}.asc").read_text(), v.id


def test_a_stale_lowering_is_refused(tmp_path):
    v = VARIANTS[0]
    _run("lower", v.id, "--out", str(tmp_path))
    meta_path = tmp_path / ARCH / f"{v.id}.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "source_sha256": "0" * 64}))
    result = _run("manifest", "--out", str(tmp_path), "--stage1-only", "--ops", v.op, check=False)
    assert result.returncode != 0 and "lowered from other sources" in result.stderr


def test_stage2_without_cann_names_what_is_missing(stage1, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("BISHENG_HOME", raising=False)
    result = _run("compile", VARIANTS[0].id, "--out", str(stage1), check=False)
    assert result.returncode != 0 and "bisheng" in result.stderr and "CANN" in result.stderr
    # and a shipping manifest (not --stage1-only) wants the binaries
    result = _run("manifest", "--out", str(stage1), check=False)
    assert result.returncode != 0 and "run `aot_ascend.py compile`" in result.stderr
