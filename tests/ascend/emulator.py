"""Our Ascend kernels' lowered AscendC run on the CPU: each .asc of the wheel build's stage 1
compiled with g++ against emu/asc_emu.h (a model of the AscendC C API it uses: SIMT vector
functions as threads, the aligned GM <-> UB copies, syncs as no-ops), its blocks run one after
another on host memory. `install` puts these kernels behind the public ops' NPU paths, so a CPU
tensor given to e.g. topk_gate_npu goes through our wrapper, the lowered kernel and back, and the
test compares with the reference. Every launch records its GM copy ranges (`Launch.accesses`)
for bounds checks. A model, not the NPU: it tests the kernels' logic and our lowering, not the
vector cores' arithmetic or the real copy engine."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

EMU = Path(__file__).resolve().parent / "emu"


@dataclasses.dataclass
class Launch:
    args: dict  # argument name -> value (pointers as ints)
    accesses: list  # (kind 'r' / 'w', address, bytes) of every GM copy


def _compile(args: list[str], what: str) -> None:
    cmd = ["g++", "-std=c++20", "-O1", "-fPIC", "-pthread", f"-I{EMU}", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{what}: g++ failed\n{result.stderr[-4000:]}"


@functools.cache
def _runtime_object(build: Path) -> Path:
    """emu/asc_emu.cpp compiled once a session and linked into every kernel (about half of each
    kernel's compile time otherwise); named by the digest of the emulator's sources."""
    sources = sorted(p for p in EMU.rglob("*") if p.is_file())
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    obj = build / f"asc_emu.{digest}.o"
    if not obj.exists():
        _compile(["-c", str(EMU / "asc_emu.cpp"), "-o", str(obj)], "asc_emu.cpp")
    return obj


class EmulatedKernel:
    """One lowered variant compiled for the host; called as AscendKernel (index, *declared args)."""

    def __init__(self, variant, lowered: Path, build: Path, log: list):
        self.variant, self.log = variant, log
        self.meta = json.loads((lowered / f"{variant.id}.json").read_text())
        source = (lowered / f"{variant.id}.asc").read_text()
        # the kernel's UB base, address 0: the emulated block's buffer here
        source, found = re.subn(r"\(__ubuf__ (\w+) \*\)0;", r"(__ubuf__ \1 *)asc_emu_ub;", source)
        assert found == (1 if self.meta["ub_bytes"] else 0), f"{variant.id}: {found} UB bases"
        source += f"\nASC_EMU_ENTRY({self.meta['entry']})\n"
        runtime = _runtime_object(build)
        digest = hashlib.sha256((source + runtime.name).encode()).hexdigest()[:16]
        so = build / f"{variant.id}.{digest}.so"
        if not so.exists():
            cpp = so.with_suffix(".cpp")
            cpp.write_text(source)
            _compile(["-shared", str(cpp), str(runtime), "-o", str(so)], variant.id)
        self.lib = ctypes.CDLL(str(so))
        self.lib.asc_emu_launch.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_uint64)]
        self.lib.asc_emu_error.restype = ctypes.c_char_p
        self.lib.asc_emu_accesses.restype = ctypes.POINTER(ctypes.c_int64)
        self.lib.asc_emu_access_words.restype = ctypes.c_int64
        self.lib.asc_emu_set_ub_bytes.argtypes = [ctypes.c_int64]
        names = variant.arg_names
        self.order = [names.index(p["name"]) for p in self.meta["params"]]
        self.kinds = [p["kind"] for p in self.meta["params"]]

    def __call__(self, index: int, *args) -> None:
        words = []
        for kind, value in zip(self.kinds, (args[i] for i in self.order)):
            if kind == "f":
                words.append(struct.unpack("<I", struct.pack("<f", value))[0])
            else:
                words.append(int(value) & 0xFFFFFFFFFFFFFFFF)
        self.lib.asc_emu_set_ub_bytes(self.meta["ub_bytes"])
        if self.lib.asc_emu_launch(self.meta["block_dim"], (ctypes.c_uint64 * len(words))(*words)):
            raise AssertionError(f"{self.variant.id}: {self.lib.asc_emu_error().decode()}")
        n = self.lib.asc_emu_access_words()
        raw = self.lib.asc_emu_accesses()[:n]
        accesses = [(chr(raw[i]), raw[i + 1], raw[i + 2]) for i in range(0, n, 3)]
        self.log.append(Launch(dict(zip(self.variant.arg_names, args)), accesses))


class Emulator:
    """The compiled kernels of one session (build dir), from a stage-1 tree (lowered)."""

    def __init__(self, lowered: Path, build: Path):
        if not shutil.which("g++"):
            pytest.skip("no g++ for the Ascend emulator")
        self.lowered, self.build = lowered, build
        self.kernels: dict[str, EmulatedKernel] = {}
        self.launches: list[Launch] = []  # every launch, in order

    def kernel(self, variant) -> EmulatedKernel:
        if variant.id not in self.kernels:
            self.kernels[variant.id] = EmulatedKernel(variant, self.lowered, self.build, self.launches)
        return self.kernels[variant.id]

    def install(self, monkeypatch, *modules) -> None:
        """The NPU paths of `modules` (their AscendKernelTable attributes) launch these
        kernels; tensors are on the CPU, npu:0 with 64 vector cores as far as they can tell. The
        table objects themselves are patched (their entries, and what builds a missing one), so
        a module's code may reach them through any name or map; all as before after the test."""
        from tilebake._runtime import ascend

        monkeypatch.setattr(ascend, "device_index", lambda t: 0)
        monkeypatch.setattr(ascend, "vector_cores", lambda index: 64)
        tables = {id(t): t for m in modules for t in vars(m).values() if isinstance(t, ascend.AscendKernelTable)}
        for table in tables.values():
            for key in list(table):  # kernels built for an NPU: set aside until the test ends
                monkeypatch.delitem(table, key)
            # (the instance's own attribute over the class's method: removed again after the test)
            monkeypatch.setitem(vars(table), "build", functools.partial(self._build, monkeypatch, table))

    def _build(self, monkeypatch, table, key: tuple) -> EmulatedKernel:
        """table's entry for key while installed: the emulated kernel, the entry gone after the test."""
        kernel = self.kernel(table.variant_type(*key))
        monkeypatch.setitem(table, key, kernel)
        return kernel


def assert_in_bounds(launch: Launch, tensors: dict) -> None:
    """Every GM copy of `launch` inside the tensor its address falls after (of the named tensors
    given and the launch's pointer arguments), and writes only to tensors named writable
    (`tensors`: name -> (tensor, writable))."""
    spans = []
    for name, (t, writable) in tensors.items():
        lo = t.data_ptr()
        spans.append((lo, lo + t.untyped_storage().nbytes() - t.storage_offset() * t.element_size(), name, writable))
    spans.sort()
    for kind, address, size in launch.accesses:
        owner = [s for s in spans if s[0] <= address]
        assert owner, f"{kind} at {address:#x} before every tensor"
        lo, hi, name, writable = owner[-1]
        assert address + size <= hi, f"{kind} of {size} bytes at {name}+{address - lo} past its end ({hi - lo} bytes)"
        assert kind == "r" or writable, f"a write into {name}, an input"


def tensors_of(*named) -> dict:
    """Helper for assert_in_bounds: ('name', tensor, writable) triples, None tensors left out."""
    return {name: (t, w) for name, t, w in named if isinstance(t, torch.Tensor)}
