"""Comparison helpers for the tests."""

import importlib.util
import os
import shutil

import pytest
import torch

# The opt-in emulated kernel tests (*_emulated.py): a kernel's generated CUDA C++ run on the CPU
# through build_tools' emulators, which need tilelang (to lower) and g++ (to compile).
EMULATED = pytest.mark.skipif(
    os.environ.get("TILEBAKE_EMULATE") != "1"
    or shutil.which("g++") is None
    or importlib.util.find_spec("tilelang") is None,
    reason="opt-in: TILEBAKE_EMULATE=1 with g++ and tilelang",
)

# Tests of two GPUs of one host (issue 19); with the `gpu` marker, they skip without CUDA as well.
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (issue 19's two-GPU host)")


def assert_bytes_equal(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """Same dtype, shape and every byte of every element (NaN payloads included)."""
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = (torch.empty(t.shape, dtype=t.dtype).copy_(t).view(-1).view(torch.uint8) for t in (actual, expected))
    bad = (a != e).nonzero()
    assert bad.numel() == 0, f"{name}: {bad.shape[0]} of {a.numel()} bytes differ, first at {bad[:5].tolist()}"


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill t's whole storage with 0xFF bytes (NaN for every float format), so an element
    a kernel forgets to write cannot pass as a correct one."""
    torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).fill_(0xFF)
    return t


def poison_allocator_(device, nbytes: int = 1 << 28) -> None:
    """Fill `nbytes` of the CUDA caching allocator's memory with 0xFF and free it, so that the
    next allocations (an op's freshly allocated outputs) start as NaN bytes: an element a kernel
    forgets to write cannot pass as a correct one."""
    block = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(0xFF)
    del block
