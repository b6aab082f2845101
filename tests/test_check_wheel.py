"""build_tools/check_wheel.py (wheels.yml's wheel-content check) and check_size.py (its size
gate): each passes sound trees (the runtime's, the CUDA kernels') and names each defect it exists
to catch. The last test runs the check on the tilebake and tilebake-cuda this environment
installed, which in .ci/run is the full CI build
(so .ci/run needs no extra step, and no second build is made for it)."""

import hashlib
import importlib.util
import json
import re
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load(name):
    spec = importlib.util.spec_from_file_location(f"build_tools_{name}", ROOT / "build_tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_wheel = load("check_wheel")
check_size = load("check_size")


@pytest.fixture(scope="module")
def launcher_bytes():
    """The installed native launcher: a real ELF of this build."""
    pkg = Path(next(iter(importlib.util.find_spec("tilebake").submodule_search_locations)))
    found = sorted((pkg / "_runtime").glob("_launcher*.so"))
    if not found:
        pytest.skip("tilebake is installed without its native launcher")
    return found[0].read_bytes()


def runtime_tree(launcher: bytes) -> dict:
    """{path: bytes} of a minimal runtime wheel."""
    return {"tilebake/__init__.py": b"", "tilebake/_runtime/_launcher.abi3.so": launcher}


def kernel_tree() -> dict:
    """{path: bytes} of a minimal kernel wheel: one op, one variant, two archs."""
    kdir = "tilebake_cuda/kernels"
    files = {"tilebake_cuda/__init__.py": b""}
    kernels = {}
    for arch in ("sm_90a", "sm_100a"):
        image = b"\x7fELF cubin for " + arch.encode()
        files[f"{kdir}/{arch}/op_a.v1.cubin"] = image
        kernels[arch] = {"binary": f"{arch}/op_a.v1.cubin", "sha256": hashlib.sha256(image).hexdigest()}
    header = {"ops": ["op_a"], "partial_build_ops": None, "tilebake_version": "0.1.0"}
    files[f"{kdir}/manifest.json"] = json.dumps(header).encode()
    files[f"{kdir}/ops/op_a.json"] = json.dumps({"kernels": {"op_a.v1": kernels}}).encode()
    files["tilebake_cuda-0.1.0.dist-info/METADATA"] = b"Name: tilebake-cuda\nRequires-Dist: tilebake==0.1.0\n"
    return files


def check(files: dict, allow_partial=False) -> list[str]:
    return check_wheel.check_tree({k: (lambda v=v: v) for k, v in files.items()}, allow_partial)


def test_the_launcher_needs_only_glibc(launcher_bytes):
    needed = check_wheel.elf_needed(launcher_bytes)
    assert "libc.so.6" in needed
    assert set(needed) <= check_wheel.ALLOWED_NEEDED, needed


def test_sound_trees_pass(launcher_bytes):
    assert check(runtime_tree(launcher_bytes)) == []
    assert check(kernel_tree()) == []


KDIR = "tilebake_cuda/kernels"


@pytest.mark.parametrize(
    "defect, message",
    [
        ("tampered", "sm_90a/op_a.v1.cubin does not match its sha256"),
        ("missing_cubin", "sm_100a/op_a.v1.cubin is missing"),
        ("orphan_cubin", "stale.cubin: a .cubin binary no manifest names"),
        ("kernel_source", "op_a.v1.cu: source file shipped"),
        ("missing_op_file", "ops/op_a.json is missing"),
        ("partial", "partial build"),
        ("host_code", "host code in the data-only kernel package"),
        ("other_runtime", r"requires \['tilebake==0.0.9'\], not tilebake==0.1.0"),
        ("both_packages", r"holds \['tilebake', 'tilebake_cuda'\]"),
    ],
)
def test_each_kernel_package_defect_is_named(defect, message):
    files = kernel_tree()
    if defect == "tampered":
        files[f"{KDIR}/sm_90a/op_a.v1.cubin"] += b"!"
    elif defect == "missing_cubin":
        del files[f"{KDIR}/sm_100a/op_a.v1.cubin"]
    elif defect == "orphan_cubin":
        files[f"{KDIR}/sm_90a/stale.cubin"] = b"\x7fELF"
    elif defect == "kernel_source":
        files[f"{KDIR}/sm_90a/op_a.v1.cu"] = b"__global__ void k() {}"
    elif defect == "missing_op_file":
        del files[f"{KDIR}/ops/op_a.json"]
    elif defect == "partial":
        header = {"ops": ["op_a"], "partial_build_ops": ["op_a"], "tilebake_version": "0.1.0"}
        files[f"{KDIR}/manifest.json"] = json.dumps(header).encode()
    elif defect == "host_code":
        files["tilebake_cuda/_helper.so"] = b"\x7fELF"
    elif defect == "other_runtime":
        files["tilebake_cuda-0.1.0.dist-info/METADATA"] = b"Requires-Dist: tilebake==0.0.9\n"
    elif defect == "both_packages":
        files["tilebake/__init__.py"] = b""
    errors = check(files)
    assert any(re.search(message, e) for e in errors), errors
    # Without its op file, that op's cubins are also unnamed; every other defect is one error.
    assert len(errors) == (3 if defect == "missing_op_file" else 1), errors


@pytest.mark.parametrize(
    "defect, message",
    [
        ("launcher_source", "launcher.c: source file shipped"),
        ("torch_linked", "links libc10.so"),
        ("no_launcher", "launcher .* is missing"),
        ("kernels_inside", "kernels in the runtime package"),
    ],
)
def test_each_runtime_defect_is_named(launcher_bytes, defect, message):
    files = runtime_tree(launcher_bytes)
    if defect == "launcher_source":
        files["tilebake/_runtime/launcher.c"] = b"int x;"
    elif defect == "torch_linked":
        # Same length, so the ELF stays valid: the launcher now NEEDs a torch library.
        assert launcher_bytes.count(b"libc.so.6\0") >= 1
        files["tilebake/_runtime/_launcher.abi3.so"] = launcher_bytes.replace(b"libc.so.6\0", b"libc10.so\0")
    elif defect == "no_launcher":
        del files["tilebake/_runtime/_launcher.abi3.so"]
    elif defect == "kernels_inside":
        files["tilebake/kernels/sm_90a/x.cubin"] = b"\x7fELF"
    errors = check(files)
    assert any(re.search(message, e) for e in errors), errors
    assert len(errors) == 1, errors


def test_partial_builds_pass_when_allowed():
    files = kernel_tree()
    header = {"ops": ["op_a"], "partial_build_ops": ["op_a"], "tilebake_version": "0.1.0"}
    files[f"{KDIR}/manifest.json"] = json.dumps(header).encode()
    assert check(files, allow_partial=True) == []


def write_wheel(path: Path, files: dict) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def test_wheel_files_tags_and_the_size_limit(launcher_bytes, tmp_path, capsys):
    kernels = write_wheel(tmp_path / "tilebake_cuda-0.1.0-py3-none-any.whl", kernel_tree())
    runtime = write_wheel(
        tmp_path / "tilebake-0.1.0-cp310-abi3-manylinux_2_28_x86_64.whl", runtime_tree(launcher_bytes)
    )
    assert check_wheel.main([str(kernels), str(runtime)]) == 0
    assert "ok (2 binaries" in capsys.readouterr().out
    assert check_wheel.main([str(kernels), "--max-mb", "0.001"]) == 1
    assert check_size.main([str(kernels), "--max-mb", "100"]) == 0
    assert check_size.main([str(kernels), "--max-mb", "0.001"]) == 1
    assert "MB > 0.001 MB" in capsys.readouterr().err
    # A kernel wheel with a platform tag, a runtime wheel that is not the stable ABI.
    misnamed = write_wheel(tmp_path / "tilebake_cuda-0.1.0-py3-none-manylinux_2_28_x86_64.whl", kernel_tree())
    assert check_wheel.main([str(misnamed)]) == 1
    py311 = write_wheel(tmp_path / "tilebake-0.1.0-cp311-cp311-linux_x86_64.whl", runtime_tree(launcher_bytes))
    assert check_wheel.main([str(py311)]) == 1
    assert "the data-only kernel package is py3-none-any" in capsys.readouterr().err


def test_the_installed_packages_pass():
    """The check on this environment's own build (partial builds allowed: developers' trees)."""
    for package in ("tilebake", "tilebake_cuda"):
        pkg, files = check_wheel.installed_files(package)
        assert any(p.endswith(".dist-info/METADATA") for p in files), f"{pkg}: no dist-info found"
        assert check_wheel.check_tree(files, allow_partial=True) == [], pkg
