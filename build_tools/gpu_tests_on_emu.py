"""Run GPU-marked tests on a GPU-less host, the named ops' kernels executed by build_tools/block_emu.py
(a development check: the GPU tests' own code and assertions against the kernels' generated C++).

    python build_tools/gpu_tests_on_emu.py OP[,OP...] PYTEST_ARGS...
    python build_tools/gpu_tests_on_emu.py per_block_cast_lossless tests/quant/test_per_block_cast_lossless.py -m gpu
    python build_tools/gpu_tests_on_emu.py mhc_pre_norm_gemm:direction-bwd tests/mhc/test_mhc_pre_norm_gemm.py -m gpu

OP:TEXT takes only the op's variants whose id contains TEXT (leave out those block_emu cannot model).

Every variant of the named ops is lowered for sm_90a and compiled for the emulator, and put into the
op module's KernelTable under its key, so the op's launches run it. CUDA is faked for the rest:
`device="cuda"` arguments of torch's factory functions become the CPU, `Tensor.is_cuda` is True,
`torch.cuda.is_available()` is True, no stream is ever capturing and no call plan is built. Tests that need real CUDA
machinery (graphs, streams, events, `.cuda()`) fail here: deselect them (`-k "not graph"`). Only
kernels block_emu models (1-D blocks, 1-D or 2-D grids, no TMA; see there) can be run.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

_FACTORIES = ("empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "tensor")


def _on_cpu(fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return fn(*args, **kwargs)

    return wrapped


def emulated_kernel(variant, out_dir: Path):
    """`variant` lowered for sm_90a into out_dir and compiled by block_emu: a stand-in for the
    loader's Kernel (called with the op's arguments, CPU tensors' pointers)."""
    from build_tools import aot, block_emu

    aot.lower_one(variant, "sm_90a", out_dir)
    cu = out_dir / "sm_90a" / f"{variant.id}.cu"
    return block_emu.EmulatedKernel(str(cu), str(out_dir / f"{variant.id}.so"), variant.arg_names)


def install(ops: list[str], out_dir: Path) -> int:
    """Emulated kernels for every variant of `ops` in their KernelTables; returns how many."""
    from tilebake._registry import all_variants
    from tilebake._runtime.loader import KernelTable

    wanted = dict(op.partition(":")[::2] for op in ops)  # op -> a text its variant ids must contain
    count = 0
    for v in all_variants():
        if v.op not in wanted or wanted[v.op] not in v.id:
            continue
        module = importlib.import_module(type(v).__module__)
        tables = [t for t in vars(module).values() if isinstance(t, KernelTable) and t.variant_type is type(v)]
        if len(tables) != 1:
            raise SystemExit(f"{module.__name__}: expected one KernelTable of {type(v).__name__}, found {len(tables)}")
        key = tuple(getattr(v, f.name) for f in dataclasses.fields(v))
        tables[0][key] = emulated_kernel(v, out_dir)
        count += 1
    missing = set(wanted) - {v.op for v in all_variants()}
    if missing:
        raise SystemExit(f"unknown ops {sorted(missing)}")
    return count


def fake_cuda() -> None:
    import torch

    for name in _FACTORIES:
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    torch.cuda.is_available = lambda: True
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.Tensor.is_cuda = property(lambda self: True)
    from tilebake._runtime import plan

    plan.available = lambda: False  # no call plans: every call takes the Python path (the emulated launches)
    from tilebake import config

    config.get_device_num_sms = lambda: 132  # an H200's: persistent kernels size their grids by it


def main(argv: list[str]) -> int:
    import pytest

    ops, pytest_args = argv[0].split(","), argv[1:]

    class Plugin:
        def pytest_configure(self, config):
            out = Path(tempfile.mkdtemp(prefix="gpu_tests_on_emu_"))
            print(f"gpu_tests_on_emu: {install(ops, out)} emulated kernel(s) in {out}")
            fake_cuda()

    return pytest.main(pytest_args, plugins=[Plugin()])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
