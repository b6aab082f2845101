"""The installed build: the manifest holds exactly the declared variants, for every arch,
with binaries that exist, match their sha256 and are ELF cubins of the right arch."""

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tilebake._registry import all_variants
from tilebake._runtime import loader

ARCHS = ("sm_90a", "sm_100a")


@pytest.fixture(scope="module")
def manifest():
    return loader.manifest()


def test_manifest_holds_exactly_the_declared_variants(manifest):
    assert manifest.get("partial_build_ops") is None, "a developer's partial build (TILEBAKE_OPS); rebuild all"
    assert set(manifest["kernels"]) == {v.id for v in all_variants()}
    assert manifest["backends"]["cuda"]["archs"] == list(ARCHS)
    assert manifest["tilelang_version"] == "0.1.15"
    assert manifest["nvcc_version"].startswith("release 1"), manifest["nvcc_version"]
    assert len(manifest["source_sha256"]) == 64


def test_each_op_manifest_file_holds_exactly_that_op(manifest):
    """kernels/ops/<op>.json: the kernels one op's first call parses (no more, no less)."""
    declared = {}
    for v in all_variants():
        declared.setdefault(v.op, set()).add(v.id)
    assert manifest["ops"] == sorted(declared)
    files = sorted(p.stem for p in (loader.kernel_dir() / "ops").glob("*.json"))
    assert files == sorted(declared)
    for op, ids in declared.items():
        kernels = loader.op_kernels(op)
        assert set(kernels) == ids, op
        assert {entry["op"] for per_arch in kernels.values() for entry in per_arch.values()} == {op}


def test_every_variant_has_every_arch_with_intact_binaries(manifest):
    op_digest = {}
    for vid, per_arch in manifest["kernels"].items():
        assert set(per_arch) == set(ARCHS), vid
        for arch, entry in per_arch.items():
            image = (loader.kernel_dir() / entry["binary"]).read_bytes()
            assert image[:4] == b"\x7fELF", entry["binary"]
            assert hashlib.sha256(image).hexdigest() == entry["sha256"], entry["binary"]
            assert entry["arch"] == arch and entry["backend"] == "cuda"
            assert entry["entry"].endswith("_kernel"), entry["entry"]
            # Its kernel is in that binary (a bundle of its op's variants: build_tools/bundle.py).
            assert b"\0" + entry["entry"].encode() + b"\0" in image, (vid, arch, entry["entry"])
            # The hash of its op's sources (`aot.py list`): one per op, whatever the variant or arch.
            assert len(entry["source_sha256"]) == 64, vid
            assert op_digest.setdefault(entry["op"], entry["source_sha256"]) == entry["source_sha256"], vid


def test_launch_metadata_is_complete(manifest):
    for vid, per_arch in manifest["kernels"].items():
        for entry in per_arch.values():
            names = [p["name"] for p in entry["params"]]
            assert len(names) == len(set(names)) and all(p["kind"] in "pilf" for p in entry["params"]), vid
            assert len(entry["grid"]) == 3 and len(entry["block"]) == 3
            # Runtime dims stay runtime: the grid is a function of the kernel's parameters
            # (the token count, or the SM count of a persistent kernel), never a baked size.
            assert any(name in " ".join(entry["grid"]) for name in names), (vid, entry["grid"])
            assert isinstance(entry["dynamic_smem"], int) and entry["tma_descriptors"] == []
            # The loader accepts every expression it will evaluate on a GPU.
            assert all(loader.launch_expr_error(e, names) is None for e in entry["grid"] + entry["block"]), entry[
                "grid"
            ]


def _cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia.cu13  # PyPI's nvidia-cuda-cuobjdump
    except ImportError:
        return None
    path = Path(nvidia.cu13.__path__[0]) / "bin" / "cuobjdump"
    return str(path) if path.exists() else None


def test_cuobjdump_sees_the_right_elf_arch(manifest):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    binaries = {(arch, entry["binary"]) for per_arch in manifest["kernels"].values() for arch, entry in per_arch.items()}
    for arch, binary in sorted(binaries):
        listing = subprocess.run(
            [tool, "-lelf", str(loader.kernel_dir() / binary)], capture_output=True, text=True, check=True
        ).stdout
        assert f".{arch}.cubin" in listing, (binary, listing)


def test_launcher_links_neither_libtorch_nor_libcuda():
    """One wheel for every torch and driver: the native module needs only libc (and libdl)."""
    from tilebake._runtime import _launcher

    needed = subprocess.run(["readelf", "-d", _launcher.__file__], capture_output=True, text=True, check=True).stdout
    libraries = [line.split("[")[1].rstrip("]") for line in needed.splitlines() if "(NEEDED)" in line]
    assert not [lib for lib in libraries if "torch" in lib or "cuda" in lib or "c10" in lib or "python" in lib], (
        libraries
    )
    assert ".abi3." in Path(_launcher.__file__).name  # Python's stable ABI: every CPython >= 3.10


def _kernel_tables():
    """Every KernelTable the ops launch through (module globals)."""
    import importlib
    import pkgutil

    from tilebake._registry import FAMILIES

    modules = [
        f"{package}.{info.name}"
        for package in (f"tilebake.{family}" for family in FAMILIES)
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__)
    ]
    return [
        v for name in modules for v in vars(importlib.import_module(name)).values() if isinstance(v, loader.KernelTable)
    ]


def test_every_kernel_takes_its_declared_parameters(manifest):
    """What the build checks at lowering and the loader at a variant's first GPU launch, checked
    here for every built kernel: its parameters (TileLang drops unused ones) are exactly the names
    and dtypes its variant declares (Variant.params()), and each op launches through a KernelTable."""
    from tilebake._variants import PARAM_DTYPES

    tables = {t.variant_type for t in _kernel_tables()}
    for v in all_variants():
        assert type(v) in tables, f"{type(v).__name__} has no KernelTable"
        declared = sorted((p.name, PARAM_DTYPES[p.dtype]) for p in v.params())
        for arch, entry in manifest["kernels"].get(v.id, {}).items():
            assert sorted((p["name"], p["kind"]) for p in entry["params"]) == declared, (v.id, arch)
