"""The package split (README, "Packages"): the runtime `tilebake` and the CUDA kernels
`tilebake-cuda` carry one version, and the runtime finds the kernels at run time, refusing a
missing package or one of another version with an error that says what to install."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilebake
from tilebake._runtime import loader
from tilebake.errors import KernelsNotInstalledError
from tilebake.quant.per_token_cast import PerTokenCastVariant

from .test_workflows import load_toml

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = load_toml(ROOT / "pyproject.toml")
CUDA_KERNELS = load_toml(ROOT / "backends" / "cuda" / "pyproject.toml")
ASCEND_KERNELS = load_toml(ROOT / "backends" / "ascend" / "pyproject.toml")


def test_one_version_everywhere():
    version = RUNTIME["project"]["version"]
    assert tilebake.__version__ == version
    assert CUDA_KERNELS["project"]["version"] == version
    # Each pins the other exactly: the manifest's parameter lists belong to one runtime.
    assert CUDA_KERNELS["project"]["dependencies"] == [f"tilebake=={version}"]
    assert RUNTIME["project"]["optional-dependencies"]["cuda"] == [f"tilebake-cuda=={version}"]
    assert CUDA_KERNELS["project"]["name"] == loader.CUDA_KERNELS_PACKAGE
    from tilebake._runtime import ascend

    assert ASCEND_KERNELS["project"]["version"] == version
    assert ASCEND_KERNELS["project"]["dependencies"] == [f"tilebake=={version}"]
    assert RUNTIME["project"]["optional-dependencies"]["ascend"] == [f"tilebake-ascend=={version}"]
    assert ASCEND_KERNELS["project"]["name"] == ascend.ASCEND_KERNELS_PACKAGE


def test_kernel_package_is_data_only():
    # py3-none-any: no host code, so one wheel serves x86_64 and aarch64 and every Python.
    wheel = CUDA_KERNELS["tool"]["scikit-build"]["wheel"]
    assert wheel["platlib"] is False and wheel["py-api"] == "py3"
    assert wheel["packages"] == [f"src/{loader.CUDA_KERNELS_MODULE}"]
    wheel = ASCEND_KERNELS["tool"]["scikit-build"]["wheel"]
    assert wheel["platlib"] is False and wheel["py-api"] == "py3" and wheel["packages"] == ["src/tilebake_ascend"]


def test_installed_kernels_are_this_runtimes():
    header = loader.manifest_header()
    assert header["package"] == "tilebake-cuda" and header["tilebake_version"] == tilebake.__version__
    assert loader.kernel_dir().parent.name == loader.CUDA_KERNELS_MODULE


@pytest.fixture
def fresh_loader_caches():
    caches = (loader.kernel_dir, loader.manifest, loader.manifest_header, loader.op_kernels)
    for cached in caches:
        cached.cache_clear()
    yield
    for cached in caches:
        cached.cache_clear()


def test_missing_kernel_package_says_what_to_install(monkeypatch, fresh_loader_caches):
    monkeypatch.setitem(sys.modules, loader.CUDA_KERNELS_MODULE, None)  # import fails as if not installed
    with pytest.raises(KernelsNotInstalledError, match=r"pip install tilebake-cuda==0\.1\.0 \(or tilebake\[cuda\]\)"):
        loader.Kernel(PerTokenCastVariant("bf16", "e4m3", 128, "fp32"))
    # CPU tensors need no kernels: the reference path still works.
    x = torch.randn(3, 128).to(torch.bfloat16)
    data, sf = tilebake.quant.per_token_cast(x, "e4m3", 128)
    assert data.shape == (3, 128) and sf.shape == (3, 1)


def test_kernels_of_another_version_are_refused(monkeypatch, tmp_path, fresh_loader_caches):
    kernels = tmp_path / "kernels"
    shutil.copytree(loader.kernel_dir(), kernels)
    header = json.loads((kernels / "manifest.json").read_text())
    header["tilebake_version"] = "0.0.1"
    (kernels / "manifest.json").write_text(json.dumps(header))
    monkeypatch.setattr(loader, "kernel_dir", lambda: kernels)
    with pytest.raises(KernelsNotInstalledError, match=r"is for tilebake 0\.0\.1, this is tilebake 0\.1\.0"):
        loader.manifest_header()


def test_cli_without_kernels():
    """list exits 1 naming the package to install; doctor still reports (and exits 0 without a GPU,
    where nothing needs the kernels)."""
    block = f"import sys; sys.modules[{loader.CUDA_KERNELS_MODULE!r}] = None; from tilebake.__main__ import main; "
    listing = subprocess.run([sys.executable, "-c", block + "sys.exit(main(['list']))"], capture_output=True, text=True)
    assert listing.returncode == 1 and "pip install tilebake-cuda==" in listing.stdout, listing.stdout + listing.stderr
    doctor_code = block + "sys.exit(main(['doctor', '--require', 'cast']))"
    doctor = subprocess.run([sys.executable, "-c", doctor_code], capture_output=True, text=True)
    assert "tilebake-cuda: tilebake's CUDA kernels are not installed" in doctor.stdout, doctor.stdout + doctor.stderr
    # cast cannot run on a GPU here either way: not covered, exit 1.
    assert doctor.returncode == 1 and "NOT covered: ['cast']" in doctor.stdout, doctor.stdout
