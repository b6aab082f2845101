"""Incremental kernel builds: `aot.py list` names every repository module a kernel's lowering
imports (kernels_tl/ and src/tilebake/), CMake re-lowers an op when one of them changes, and
each kernel's manifest entry carries the hash of exactly those files. The build test runs a
real partial build (cast, normalize_weight; sm_90a) in a copy of the repository."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AOT = ROOT / "build_tools" / "aot.py"
OPS = ("cast", "normalize_weight")
HAS_TILELANG = importlib.util.find_spec("tilelang") is not None
# The tests read the kernel sources: a copy of tests/ beside an installed wheel (offline_check.sh,
# cibuildwheel's test-sources) has none.
pytestmark = pytest.mark.skipif(
    not (ROOT / "kernels_tl").is_dir() or not (ROOT / "src" / "tilebake").is_dir(),
    reason="needs a source checkout (kernels_tl/ and src/tilebake/)",
)


def op_sources(root: Path = ROOT, ops=OPS) -> dict[str, list[str]]:
    """op -> the files `aot.py list` prints for it (what CMake makes its lowering depend on)."""
    lines = subprocess.run(
        [sys.executable, str(root / "build_tools" / "aot.py"), "list", "--ops", ",".join(ops)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    sources = {}
    for line in lines:
        vid, _bundle, files = line.split("|")
        assert sources.setdefault(vid.split(".")[0], files.split(",")) == files.split(","), line
    return sources


def test_list_names_the_transitive_repository_imports():
    sources = op_sources()
    cast, norm = sources["cast"], sources["normalize_weight"]
    assert cast[0] == "kernels_tl/quant/cast.py" and norm[0] == "kernels_tl/moe/normalize_weight.py"
    for files in sources.values():
        assert len(files) == len(set(files)) and all((ROOT / f).is_file() for f in files), files
        # The packages run on import, the Variant base and the runtime modules the declaration imports.
        assert {"src/tilebake/__init__.py", "src/tilebake/_variants.py", "kernels_tl/__init__.py"} <= set(files)
    # Directly imported (a kernels_tl helper, the variant declaration) and further down.
    assert {"kernels_tl/quant/common.py", "src/tilebake/quant/cast.py", "src/tilebake/quant/__init__.py"} <= set(cast)
    assert {"src/tilebake/moe/normalize_weight.py", "src/tilebake/moe/topk_gate.py"} <= set(norm)
    # Not another op's modules, nor the CPU references the ops import lazily inside functions.
    assert "src/tilebake/moe/normalize_weight.py" not in cast and "kernels_tl/quant/common.py" not in norm
    assert not [f for f in cast if f.startswith("src/tilebake/torch/")], cast


# In a process that has imported tilelang: per op, fork, import its kernel source (and so its
# variant declaration) and print the repository files then loaded.
_LOADED = """
import json, os, sys, traceback
import tilelang.language
root = sys.argv[1]
for name in sys.argv[2:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            __import__(name)
            files = [os.path.relpath(m.__file__, root) for m in list(sys.modules.values()) if getattr(m, "__file__", 0)]
            files = sorted(f for f in files if f.startswith(("src/tilebake/", "kernels_tl/")))  # not a venv in root
            os.write(write, json.dumps(files).encode())
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    os.close(write)
    text = os.read(read, 1 << 20).decode()
    if os.waitpid(pid, 0)[1] != 0:
        sys.exit(f"importing {name} failed")
    print(name, text)
"""


@pytest.mark.skipif(not HAS_TILELANG, reason="needs tilelang (build_tools/requirements-build.txt)")
def test_list_covers_what_importing_each_kernel_source_loads():
    """The static walk against the truth: every repository module that importing an op's kernel
    source loads is in that op's list (for every declared op)."""
    sources = op_sources(ops=())
    modules = {op: files[0][: -len(".py")].replace("/", ".") for op, files in sources.items()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", _LOADED, str(ROOT), *modules.values()],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    loaded = dict(line.split(" ", 1) for line in out.splitlines())
    assert set(loaded) == set(modules.values())
    for op, module in modules.items():
        missing = set(json.loads(loaded[module])) - set(sources[op])
        assert not missing, f"{op}: importing its kernel loads {sorted(missing)}, which `aot.py list` omits"


def _tool(name: str):
    """`name` from PATH or from this Python's environment (pip's cmake and ninja)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def _build_tools():
    """None where the build test can run (tilelang, cmake, ninja, nvcc), else why it skips."""
    if not HAS_TILELANG:
        return "needs tilelang (build_tools/requirements-build.txt)"
    for tool in ("cmake", "ninja"):
        if _tool(tool) is None:
            return f"needs {tool} (build_tools/requirements-build.txt)"
    spec = importlib.util.find_spec("nvidia.cu13") if importlib.util.find_spec("nvidia") else None
    pip_nvcc = spec is not None and any((Path(p) / "bin" / "nvcc").exists() for p in spec.submodule_search_locations)
    if shutil.which("nvcc") is None and not pip_nvcc:
        return "needs nvcc"
    return None


def _copy_repository(dest: Path) -> Path:
    """What the kernel build reads: kernels_tl/, src/tilebake/, build_tools/, backends/cuda/."""
    skip = shutil.ignore_patterns("__pycache__", "*.so", "build")
    for part in ("kernels_tl", "src/tilebake", "build_tools", "backends/cuda"):
        shutil.copytree(ROOT / part, dest / part, ignore=skip)
    return dest


class Build:
    """A CMake build tree of the copy's backends/cuda; build() returns the ops it lowered."""

    def __init__(self, root: Path):
        self.root, self.tree = root, root / "bld"
        subprocess.run(
            [
                _tool("cmake"), "-S", str(root / "backends" / "cuda"), "-B", str(self.tree), "-G", "Ninja",
                f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
                "-DSKBUILD_PROJECT_NAME=tilebake-cuda", "-DSKBUILD_PROJECT_VERSION=0.1.0",
                f"-DPython_EXECUTABLE={sys.executable}", f"-DTILEBAKE_OPS={','.join(OPS)}",
                "-DTILEBAKE_CUDA_ARCHS=sm_90a",
            ],
            check=True, capture_output=True, text=True,
        )  # fmt: skip

    def build(self) -> tuple[list[str], str]:
        # Ninja itself (not pip, which always configures): it reconfigures only when a
        # CONFIGURE_DEPENDS file changed, so this also tests that rule.
        run = subprocess.run([_tool("cmake"), "--build", str(self.tree)], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        return re.findall(r"\] lowering (\w+) \(", run.stdout), run.stdout

    def kernels(self, op: str) -> dict[str, tuple[str, bytes]]:
        """variant id -> (its manifest source_sha256, its cubin)."""
        kdir = self.tree / "kernels"
        entries = json.loads((kdir / "ops" / f"{op}.json").read_text())["kernels"]
        return {
            vid: (per_arch["sm_90a"]["source_sha256"], (kdir / per_arch["sm_90a"]["binary"]).read_bytes())
            for vid, per_arch in entries.items()
        }


def _edit(path: Path, old: str, new: str):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


@pytest.mark.skipif(_build_tools() is not None, reason=str(_build_tools()))
def test_a_dependency_edit_relowers_exactly_its_op(tmp_path):
    root = _copy_repository(tmp_path)
    decl, kernel = root / "src/tilebake/moe/normalize_weight.py", root / "kernels_tl/moe/normalize_weight.py"
    # A constant of normalize_weight's declaration module that its kernel uses (its CTA size):
    # cast imports neither file.
    assert re.search(r"^THREADS = ", kernel.read_text(), re.M), "the kernel's CTA size moved; adapt this test"
    decl.write_text(decl.read_text() + "\nKERNEL_THREADS = 256  # tests/test_build_deps.py\n")
    kernel.write_text(kernel.read_text() + "\nfrom tilebake.moe.normalize_weight import KERNEL_THREADS as THREADS\n")
    build = Build(root)
    lowered, log = build.build()
    assert sorted(lowered) == sorted(OPS), log
    before = {op: build.kernels(op) for op in OPS}
    assert all(len(h) == 64 for kernels in before.values() for h, _ in kernels.values())

    lowered, log = build.build()
    assert lowered == [], log  # nothing changed: nothing re-lowered

    _edit(decl, "KERNEL_THREADS = 256", "KERNEL_THREADS = 128")
    lowered, log = build.build()
    assert "Re-running CMake" in log, log  # a reconfigure (src/tilebake changed) that re-lowers nothing else
    assert lowered == ["normalize_weight"], log
    assert "nvcc sm_90a cast." not in log, log
    after = {op: build.kernels(op) for op in OPS}
    assert after["cast"] == before["cast"]  # the same hashes and the same cubin bytes
    for vid, (digest, cubin) in after["normalize_weight"].items():
        assert digest != before["normalize_weight"][vid][0] and cubin != before["normalize_weight"][vid][1], vid

    # A new import in a kernel source: the next edit of the module it names re-lowers that op
    # (ninja reconfigures on the kernel's edit, so the op's dependency list is current).
    new_module = root / "src/tilebake/moe/_test_dep.py"
    new_module.write_text("UNUSED = 1\n")
    kernel.write_text(kernel.read_text() + "from tilebake.moe._test_dep import UNUSED  # noqa\n")
    assert build.build()[0] == ["normalize_weight"]
    assert "src/tilebake/moe/_test_dep.py" in op_sources(root)["normalize_weight"]
    _edit(new_module, "= 1", "= 2")
    lowered, log = build.build()
    assert lowered == ["normalize_weight"], log

    # A dependency edited after its op was lowered (a missed dependency would look the same):
    # the manifest step refuses to record the stale kernel.
    _edit(new_module, "= 2", "= 3")
    manifest = subprocess.run(
        [sys.executable, str(root / "build_tools/aot.py"), "manifest", "--out", str(build.tree / "kernels"),
         "--arch", "sm_90a", "--ops", ",".join(OPS)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert manifest.returncode != 0
    assert "sm_90a/normalize_weight.dtype-fp32 was lowered from other sources" in manifest.stderr, manifest.stderr
