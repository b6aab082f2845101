"""build_tools/check_wheel.py (wheels.yml's wheel-content check) and check_size.py (its size
gate): each passes a sound tree and names each defect it exists to catch. The last test runs
the check on the tilebake this environment installed, which in .ci/run is the full CI build
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


def sound_tree(launcher: bytes) -> dict:
    """{path: bytes} of a minimal wheel: one op, one variant, two archs."""
    files = {"tilebake/_runtime/_launcher.abi3.so": launcher}
    kernels = {}
    for arch in ("sm_90a", "sm_100a"):
        image = b"\x7fELF cubin for " + arch.encode()
        files[f"tilebake/kernels/{arch}/op_a.v1.cubin"] = image
        kernels[arch] = {"binary": f"{arch}/op_a.v1.cubin", "sha256": hashlib.sha256(image).hexdigest()}
    files["tilebake/kernels/manifest.json"] = json.dumps({"ops": ["op_a"], "partial_build_ops": None}).encode()
    files["tilebake/kernels/ops/op_a.json"] = json.dumps({"kernels": {"op_a.v1": kernels}}).encode()
    return files


def check(files: dict, allow_partial=False) -> list[str]:
    return check_wheel.check_tree({k: (lambda v=v: v) for k, v in files.items()}, allow_partial)


def test_the_launcher_needs_only_glibc(launcher_bytes):
    needed = check_wheel.elf_needed(launcher_bytes)
    assert "libc.so.6" in needed
    assert set(needed) <= check_wheel.ALLOWED_NEEDED, needed


def test_a_sound_tree_passes(launcher_bytes):
    assert check(sound_tree(launcher_bytes)) == []


@pytest.mark.parametrize(
    "defect, message",
    [
        ("tampered", "sm_90a/op_a.v1.cubin does not match its sha256"),
        ("missing_cubin", "sm_100a/op_a.v1.cubin is missing"),
        ("orphan_cubin", "stale.cubin: a cubin no manifest names"),
        ("kernel_source", "op_a.v1.cu: source file shipped"),
        ("launcher_source", "launcher.c: source file shipped"),
        ("missing_op_file", "ops/op_a.json is missing"),
        ("partial", "partial build"),
        ("torch_linked", "links libc10.so"),
        ("no_launcher", "launcher .* is missing"),
    ],
)
def test_each_defect_is_named(launcher_bytes, defect, message):
    files = sound_tree(launcher_bytes)
    if defect == "tampered":
        files["tilebake/kernels/sm_90a/op_a.v1.cubin"] += b"!"
    elif defect == "missing_cubin":
        del files["tilebake/kernels/sm_100a/op_a.v1.cubin"]
    elif defect == "orphan_cubin":
        files["tilebake/kernels/sm_90a/stale.cubin"] = b"\x7fELF"
    elif defect == "kernel_source":
        files["tilebake/kernels/sm_90a/op_a.v1.cu"] = b"__global__ void k() {}"
    elif defect == "launcher_source":
        files["tilebake/_runtime/launcher.c"] = b"int x;"
    elif defect == "missing_op_file":
        del files["tilebake/kernels/ops/op_a.json"]
    elif defect == "partial":
        files["tilebake/kernels/manifest.json"] = json.dumps({"ops": ["op_a"], "partial_build_ops": ["op_a"]}).encode()
    elif defect == "torch_linked":
        # Same length, so the ELF stays valid: the launcher now NEEDs a torch library.
        assert launcher_bytes.count(b"libc.so.6\0") >= 1
        files["tilebake/_runtime/_launcher.abi3.so"] = launcher_bytes.replace(b"libc.so.6\0", b"libc10.so\0")
    elif defect == "no_launcher":
        del files["tilebake/_runtime/_launcher.abi3.so"]
    errors = check(files)
    assert any(re.search(message, e) for e in errors), errors
    # Without its op file, that op's cubins are also unnamed; every other defect is one error.
    assert len(errors) == (3 if defect == "missing_op_file" else 1), errors


def test_partial_builds_pass_when_allowed(launcher_bytes):
    files = sound_tree(launcher_bytes)
    files["tilebake/kernels/manifest.json"] = json.dumps({"ops": ["op_a"], "partial_build_ops": ["op_a"]}).encode()
    assert check(files, allow_partial=True) == []


def test_wheel_files_and_the_size_limit(launcher_bytes, tmp_path, capsys):
    wheel = tmp_path / "tilebake-0.1.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in sound_tree(launcher_bytes).items():
            zf.writestr(name, data)
    assert check_wheel.main([str(wheel)]) == 0
    assert "ok (2 cubins" in capsys.readouterr().out
    assert check_wheel.main([str(wheel), "--max-mb", "0.001"]) == 1
    assert check_size.main([str(wheel), "--max-mb", "100"]) == 0
    assert check_size.main([str(wheel), "--max-mb", "0.001"]) == 1
    assert "MB > 0.001 MB" in capsys.readouterr().err


def test_the_installed_tilebake_passes():
    """The check on this environment's own build (partial builds allowed: developers' trees)."""
    pkg, files = check_wheel.installed_files()
    assert "tilebake/kernels/manifest.json" in files, f"{pkg} has no kernels"
    assert check_wheel.check_tree(files, allow_partial=True) == []
