"""Binds the precompiled Ascend 950 kernels to torch_npu tensors: the Ascend half of loader.py.

The kernels are the tilebake-ascend package (import name `tilebake_ascend`), found at run time
like tilebake-cuda; its manifest (build_tools/aot_ascend.py) names, per variant, the .aibin
binary, its sha256, the entry symbol, the kernel's parameter order, its block count (the
variant's vector-core count) and its unified-buffer bytes. A binary is read, verified and loaded
on a device the first time its variant runs there (aclrtBinaryLoadFromData with that device
current), then launched by the native launcher (acl_launcher.c) on torch_npu's current stream.
`import tilebake` imports neither torch_npu nor this module's kernels. Written from the documented
ACL facts and tested against a stand-in libascendcl; never run on an NPU here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from pathlib import Path

import torch

from tilebake._runtime.loader import _native, _read_manifest_file, _version, package_kernel_dir
from tilebake._variants import PARAM_DTYPES
from tilebake.errors import (
    CorruptArtifactError,
    KernelsNotInstalledError,
    NoBinaryForDeviceError,
    VariantNotBuiltError,
)

ASCEND_KERNELS_PACKAGE = "tilebake-ascend"
ASCEND_KERNELS_MODULE = "tilebake_ascend"
ARCH = "dav-3510"  # Ascend 950


def install_hint() -> str:
    return f"pip install {ASCEND_KERNELS_PACKAGE}=={_version()} (or tilebake[ascend])"


@functools.cache
def kernel_dir() -> Path:
    return package_kernel_dir(ASCEND_KERNELS_MODULE, ASCEND_KERNELS_PACKAGE, "NPU", install_hint())


def _read(path: Path) -> dict:
    return _read_manifest_file(path, ASCEND_KERNELS_PACKAGE, install_hint)


@functools.cache
def manifest_header() -> dict:
    header = _read(kernel_dir() / "manifest.json")
    if header.get("tilebake_version") != _version():
        raise KernelsNotInstalledError(
            f"the installed {ASCEND_KERNELS_PACKAGE} is for tilebake {header.get('tilebake_version')}, this is "
            f"tilebake {_version()}: the two must be the same version. {install_hint()}"
        )
    if header.get("stage1_only"):
        raise CorruptArtifactError(
            f"the installed {ASCEND_KERNELS_PACKAGE} holds stage-1 output only (AscendC sources, no binaries): "
            f"it was built without a CANN toolkit. {install_hint()}"
        )
    return header


@functools.cache
def op_kernels(op: str) -> dict:
    if op not in manifest_header()["ops"]:
        return {}
    return _read(kernel_dir() / "ops" / f"{op}.json")["kernels"]


# What a launch needs from torch_npu, one place (the tests replace these: there is no NPU here).
def device_facts(index: int) -> tuple[str, int]:
    """(model name, vector cores) of npu:index: 2 vector cores per AI (cube) core."""
    return torch.npu.get_device_name(index), 2 * torch.npu.get_device_properties(index).cube_core_num


def current_stream(index: int) -> int:
    """torch_npu's current raw aclrtStream of npu:index (flushing its task queue first, so the
    launch is ordered after earlier torch ops on the stream)."""
    import torch_npu

    return torch_npu._C._npu_getCurrentRawStream(index)


def device_scope(index: int):
    return torch.npu.device(index)


_VECTOR_CORES: dict[int, int] = {}  # by NPU index: asked of torch_npu once a device


def vector_cores(index: int) -> int:
    """The vector-core count of npu:index, the key that picks a variant's binary."""
    try:
        return _VECTOR_CORES[index]
    except KeyError:
        cores = _VECTOR_CORES[index] = device_facts(index)[1]
        return cores


def device_index(x: torch.Tensor) -> int:
    """The NPU index of tensor x (torch_npu's current device where the tensor names none)."""
    return x.device.index if x.device.index is not None else torch.npu.current_device()


class AscendKernel:
    """One Ascend variant, loadable on every NPU of the model and core count it was built for;
    called with its arguments in its declaration's order (variant.params())."""

    def __init__(self, variant):
        self.variant = variant
        self.arg_names = variant.arg_names
        built = op_kernels(variant.op)
        if variant.id not in built:
            rest = {f.name: getattr(variant, f.name) for f in dataclasses.fields(variant) if f.name != "num_vec_cores"}
            cores = sorted(
                e[ARCH]["block_dim"] for e in built.values() if all(e[ARCH]["key"].get(k) == x for k, x in rest.items())
            )
            if cores:  # the device's core count (the host's key) is the one thing not built
                raise NoBinaryForDeviceError(
                    f"this NPU has {variant.num_vec_cores} vector cores; the installed {ASCEND_KERNELS_PACKAGE} has "
                    f"{variant.op} for Ascend 950 ({ARCH}) with {', '.join(map(str, cores))} vector cores"
                )
            raise VariantNotBuiltError(f"{variant.id} is not built into the installed {ASCEND_KERNELS_PACKAGE}")
        self.entry = built[variant.id][ARCH]
        declared = {p.name: PARAM_DTYPES[p.dtype] for p in variant.params()}
        if {p["name"]: p["kind"] for p in self.entry["params"]} != declared:
            raise CorruptArtifactError(f"{variant.id} takes {self.entry['params']}; the runtime passes {declared}")
        order = [p["name"] for p in self.entry["params"]]
        self._reorder = [self.arg_names.index(n) for n in order]
        self._kinds = "".join(p["kind"] for p in self.entry["params"]).encode()
        self._handles: dict[int, int] = {}
        self._lock = threading.Lock()

    def _load(self, index: int) -> int:
        with self._lock:
            if index in self._handles:
                return self._handles[index]
            model, cores = device_facts(index)
            if "950" not in model or cores != self.entry["block_dim"]:
                raise NoBinaryForDeviceError(
                    f"npu:{index} is {model} with {cores} vector cores; the installed {ASCEND_KERNELS_PACKAGE} has "
                    f"{self.variant.op} for Ascend 950 ({ARCH}) with {self.entry['block_dim']} vector cores"
                )
            path = kernel_dir() / self.entry["binary"]
            try:
                image = path.read_bytes()
            except OSError as e:
                raise CorruptArtifactError(f"kernel binary {path} is unreadable: {e}") from None
            if hashlib.sha256(image).hexdigest() != self.entry["sha256"]:
                raise CorruptArtifactError(
                    f"kernel binary {path} does not match the sha256 in the manifest; "
                    f"reinstall {ASCEND_KERNELS_PACKAGE}"
                )
            with device_scope(index):
                handle = _native().acl_load(image, self.entry["entry"], index)
            self._handles[index] = handle
            return handle

    def __call__(self, index: int, *args) -> None:
        """Launch on torch_npu's current stream of npu:index; pointers as ints, scalars as numbers."""
        try:
            handle = self._handles[index]
        except KeyError:
            handle = self._load(index)
        ordered = [args[i] for i in self._reorder]
        _native().acl_launch(
            handle, self.entry["block_dim"], current_stream(index), self.entry["ub_bytes"], self._kinds, *ordered
        )


class AscendKernelTable(dict):
    """An op's Ascend kernels by compile-time key (as loader.KernelTable)."""

    def __init__(self, variant_type):
        super().__init__()
        self.variant_type = variant_type

    def __missing__(self, key: tuple) -> AscendKernel:
        kernel = self[key] = self.build(key)
        return kernel

    def build(self, key: tuple) -> AscendKernel:
        """The kernel of `key` (tests/ascend/emulator.py builds emulated ones in its place)."""
        return AscendKernel(self.variant_type(*key))

    def on(self, t, *key) -> tuple[int, AscendKernel]:
        """(t's NPU index, the kernel of `key` built for that NPU's vector-core count): where an op
        launches."""
        index = device_index(t)
        return index, self[(*key, vector_cores(index))]
