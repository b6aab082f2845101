"""Binds the precompiled kernels to torch tensors.

The kernels are not in this package: they are the tilebake-cuda package (import name
`tilebake_cuda`), found here at run time, so that a backend's kernels install without the
others' (README, "Packages"). Its manifest (written by build_tools/aot.py) is the one
contract with the build: per variant and arch it names the binary, its sha256, the entry
symbol, the kernel's parameter order and the launch geometry as expressions of runtime
dims. Nothing here compiles, writes files or imports tilelang. A binary (a bundle of
several variants' kernels, build_tools/bundle.py) is read, verified and loaded the first time
one of its variants runs on a device; later calls cost one dict lookup, two small Python
calls and one native launch.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import json
import operator
import threading
from pathlib import Path

import torch

from tilebake._variants import PARAM_DTYPES
from tilebake.errors import CorruptArtifactError, KernelsNotInstalledError, NoBinaryForDeviceError, VariantNotBuiltError

MANIFEST_VERSION = 1
# The CUDA kernels' distribution and import names.
CUDA_KERNELS_PACKAGE = "tilebake-cuda"
CUDA_KERNELS_MODULE = "tilebake_cuda"


def _version() -> str:
    import tilebake  # at call time: tilebake/__init__.py imports the ops, which import this module

    return tilebake.__version__


def install_hint() -> str:
    return f"pip install {CUDA_KERNELS_PACKAGE}=={_version()} (or tilebake[cuda])"


def package_kernel_dir(module: str, package: str, backend: str, hint: str) -> Path:
    """The `kernels/` directory of kernel package `module` (pip name `package`, `backend`'s: 'CUDA'
    or 'NPU'); KernelsNotInstalledError naming `hint`, its install command, when it is absent."""
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise KernelsNotInstalledError(
            f"tilebake's {'Ascend' if backend == 'NPU' else backend} kernels are not installed: {backend} tensors "
            f"need the {package} package next to tilebake. {hint}"
        ) from None
    return Path(found.KERNEL_DIR)


@functools.cache
def kernel_dir() -> Path:
    """The installed CUDA kernels' directory (the `tilebake_cuda` package's `kernels/`)."""
    return package_kernel_dir(CUDA_KERNELS_MODULE, CUDA_KERNELS_PACKAGE, "CUDA", install_hint())


def _read_manifest_file(path: Path, package: str = CUDA_KERNELS_PACKAGE, hint=install_hint) -> dict:
    """A manifest file of kernel package `package` (its reinstall command: hint())."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CorruptArtifactError(
            f"{path} is missing: the installed {package} has no compiled kernels "
            f"(was it installed from a source tree without building?). Reinstall it: {hint()}"
        ) from None
    except (OSError, ValueError) as e:
        raise CorruptArtifactError(f"{path} is unreadable: {e}") from None
    if data.get("manifest_version") != MANIFEST_VERSION:
        raise CorruptArtifactError(
            f"{path} has manifest_version {data.get('manifest_version')!r}; this runtime reads {MANIFEST_VERSION}"
        )
    return data


@functools.cache
def op_kernels(op: str) -> dict:
    """{variant id: {arch: entry}} of one op, from its own manifest file: an op's first call
    parses only its own kernels."""
    if op not in manifest_header()["ops"]:
        return {}
    return _read_manifest_file(kernel_dir() / "ops" / f"{op}.json")["kernels"]


@functools.cache
def manifest_header() -> dict:
    """The build facts (versions, archs, commit) and the list of ops the kernel package holds.
    Refuses kernels of another tilebake version: their parameter lists may differ."""
    header = _read_manifest_file(kernel_dir() / "manifest.json")
    if header.get("tilebake_version") != _version():
        raise KernelsNotInstalledError(
            f"the installed {CUDA_KERNELS_PACKAGE} is for tilebake {header.get('tilebake_version')}, this is "
            f"tilebake {_version()}: the two must be the same version. {install_hint()}"
        )
    return header


@functools.cache
def manifest() -> dict:
    """The whole manifest, every op's kernels under "kernels" (for listings and checks)."""
    header = manifest_header()
    return {**header, "kernels": {vid: e for op in header["ops"] for vid, e in op_kernels(op).items()}}


def arch_of(capability: tuple[int, int]) -> str:
    """The binary arch that runs on a compute capability. Hopper and newer binaries are
    built for the arch-specific targets (sm_90a, sm_100a), which run on exactly one CC."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@functools.cache
def device_arch(device_index: int) -> str:
    return arch_of(torch.cuda.get_device_capability(device_index))


@functools.cache
def _native():
    """The native launcher, imported on the first launch so `import tilebake` loads no extension."""
    from tilebake._runtime import _launcher
    from tilebake.errors import AscendRuntimeError, CudaDriverError

    _launcher._set_error_type(CudaDriverError)
    _launcher._set_acl_error_type(AscendRuntimeError)
    return _launcher


_LAUNCH_EXPR_NODES = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Name, ast.Load,
                      ast.Constant, ast.Call)  # fmt: skip


def launch_expr_error(text: str, names) -> str | None:
    """Why a grid expression from the manifest is not plain integer arithmetic on the kernel's
    parameter names (and min/max), or None. Checked by the build and again before evaluating."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return f"launch expression {text!r} does not parse"
    for node in ast.walk(tree):
        if (
            not isinstance(node, _LAUNCH_EXPR_NODES)
            or (isinstance(node, ast.Name) and node.id not in {*names, "min", "max"})
            or (isinstance(node, ast.Constant) and type(node.value) is not int)
            or (isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in ("min", "max")))
        ):
            return f"launch expression {text!r} uses {ast.dump(node)}, which is not integer arithmetic on parameters"
    return None


def _compile_grid(exprs: list[str], arg_names: tuple[str, ...], where: str):
    for text in exprs:
        error = launch_expr_error(text, arg_names)
        if error:
            raise CorruptArtifactError(f"{where}: {error}")
    return eval(f"lambda {', '.join(arg_names)}: ({', '.join(exprs)},)", {"__builtins__": {"min": min, "max": max}})


class Kernel:
    """One compile-time variant of one op, loadable on any device the kernel package covers.

    The variant's declared parameters (`variant.params()`) give the order in which the op passes
    arguments; the manifest gives the order the compiled kernel takes them in, which the
    lowering is free to change (it sorts them).
    """

    def __init__(self, variant):
        self.variant = variant
        self.params = variant.params()
        self.arg_names = tuple(p.name for p in self.params)
        built = op_kernels(variant.op)
        entries = built.get(variant.id)
        if entries is None:
            closest = type(variant).closest(variant, built=built)
            if not closest:
                raise VariantNotBuiltError(
                    f"{variant.id} is not built into the installed {CUDA_KERNELS_PACKAGE}, "
                    f"nor any other {variant.op} variant"
                )
            raise VariantNotBuiltError(
                f"{variant.id} is not built into the installed {CUDA_KERNELS_PACKAGE}; the closest built variants:\n  "
                + "\n  ".join(closest)
            )
        self._entries = entries
        self._per_device: dict[int, tuple] = {}
        self._specs: dict[int, tuple] = {}

    def _load(self, device_index: int) -> tuple:
        launcher = _native()
        arch = device_arch(device_index)
        entry = self._entries.get(arch)
        if entry is None:
            raise NoBinaryForDeviceError(
                f"cuda:{device_index} ({torch.cuda.get_device_name(device_index)}) is {arch}; "
                f"the installed {CUDA_KERNELS_PACKAGE} has binaries for {', '.join(sorted(self._entries))} only"
            )
        params = [p["name"] for p in entry["params"]]
        declared = {p.name: PARAM_DTYPES[p.dtype] for p in self.params}
        if {p["name"]: p["kind"] for p in entry["params"]} != declared or len(params) != len(declared):
            raise CorruptArtifactError(
                f"{self.variant.id} for {arch} takes parameters "
                f"{[p['name'] + ':' + p['kind'] for p in entry['params']]}; the runtime passes "
                f"{[n + ':' + k for n, k in declared.items()]} (its declaration)"
            )
        grid = _compile_grid(entry["grid"], self.arg_names, f"manifest entry {self.variant.id} for {arch}")
        block = tuple(int(b) for b in entry["block"])
        smem = int(entry["dynamic_smem"])
        signature = "".join(p["kind"] for p in entry["params"]).encode()
        reorder = operator.itemgetter(*[self.arg_names.index(n) for n in params])
        # The binary is read, checked and loaded last: a mismatched manifest entry is named first.
        module = _module(entry["binary"], entry["sha256"], device_index)
        handle = launcher.get_kernel(module, entry["entry"], device_index, smem)
        loaded = (handle, grid, block, smem, signature, reorder, launcher.launch)
        self._per_device[device_index] = loaded
        loaded_variants.add(self.variant.id)
        self._specs[device_index] = (tuple(params), tuple(signature.decode()), tuple(entry["grid"]), block, smem)
        return loaded

    def launch_spec(self, device_index: int) -> tuple:
        """(parameter names and signature letters in the kernel's order, grid expressions of
        those names, block, dynamic shared memory) of its binary for `device_index` (loaded
        there first): what a call plan (plan.py) launches it with."""
        if device_index not in self._specs:
            self._load(device_index)
        return self._specs[device_index]

    def handle(self, device_index: int) -> int:
        """The native launcher's handle of this kernel on `device_index` (loaded there first)."""
        try:
            return self._per_device[device_index][0]
        except KeyError:
            return self._load(device_index)[0]

    def __call__(self, device_index: int, *args) -> None:
        """Launch on torch's current stream of `device_index`, args in `arg_names` order."""
        try:
            handle, grid, block, smem, signature, reorder, launch = self._per_device[device_index]
        except KeyError:
            handle, grid, block, smem, signature, reorder, launch = self._load(device_index)
        launch(
            handle, grid(*args), block, smem, torch._C._cuda_getCurrentRawStream(device_index), signature, reorder(args)
        )


# Ids of the variants this process has loaded on some device (bench/sanitize.sh's coverage).
loaded_variants: set[str] = set()
_modules: dict[tuple[str, str, int], int] = {}
_modules_lock = threading.Lock()


def _module(binary: str, sha256: str, device_index: int) -> int:
    """The native module of kernel binary `binary` (a cubin holding several variants' kernels,
    build_tools/bundle.py) on `device_index`: read, checked against `sha256` and loaded on first
    use, then shared by the handles of all its kernels there."""
    path = kernel_dir() / binary
    key = (str(path), sha256, device_index)
    with _modules_lock:  # threads first-calling two variants of one binary load it once
        module = _modules.get(key)
        if module is None:
            try:
                image = path.read_bytes()
            except OSError as e:
                raise CorruptArtifactError(f"kernel binary {path} is unreadable: {e}") from None
            if hashlib.sha256(image).hexdigest() != sha256:
                raise CorruptArtifactError(
                    f"kernel binary {path} does not match the sha256 in the manifest; reinstall {CUDA_KERNELS_PACKAGE}"
                )
            module = _modules[key] = _native().load_module(image, device_index)
        return module


class KernelTable(dict):
    """An op's kernels by compile-time key (a tuple of the variant's fields), built on first
    use, each taking the parameters its variant declares. A dict, so the per-call lookup
    `table[key]` is a plain C-level dict lookup."""

    def __init__(self, variant_type):
        super().__init__()
        self.variant_type = variant_type

    def __missing__(self, key: tuple) -> Kernel:
        kernel = self[key] = Kernel(self.variant_type(*key))
        return kernel
