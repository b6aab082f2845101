"""Argument checks shared by the mhc ops (each raises TypeError / ValueError naming the argument
and what is allowed), and their plan keys' helper."""

from __future__ import annotations

import dataclasses

import torch

from tilebake._variants import ASCEND_VEC_CORES, Variant
from tilebake.engram._common import check_same_device

MAX_MHC_MULT = 8  # streams: 1 to 8 (the original: 4)
VEC = 8  # the kernels' bf16 columns a thread: hidden must be a multiple on CUDA


def check_streams(t, name: str, dtype: torch.dtype, min_dims: int) -> None:
    """A contiguous torch.Tensor of `dtype` with at least `min_dims` dims, on CUDA or the CPU."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {str(dtype).replace('torch.', '')}, got {t.dtype}")
    if t.dim() < min_dims:
        raise ValueError(f"{name} must have at least {min_dims} dims, got shape {tuple(t.shape)}")
    if t.device.type not in ("cuda", "cpu", "npu"):
        raise ValueError(f"{name} must be on a CUDA device, an NPU or the CPU, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")


def check_shape(t, name: str, shape: tuple, like: torch.Tensor, like_name: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    check_same_device(name, t, like, like_name)


def check_mult_and_hidden(mhc_mult: int, hidden: int, name: str, t: torch.Tensor) -> None:
    if not 1 <= mhc_mult <= MAX_MHC_MULT:
        raise ValueError(f"{name}'s stream count (dim -2) must be 1 to {MAX_MHC_MULT}, got {mhc_mult}")
    if t.is_cuda and (hidden % VEC or hidden < VEC):
        raise ValueError(f"{name}'s hidden size (last dim) must be a positive multiple of {VEC} on CUDA, got {hidden}")
    if t.numel() >= 2**31:
        raise ValueError(f"{name} must have fewer than 2^31 elements, got {t.numel()}")


def check_aligned(**tensors) -> None:
    for name, t in tensors.items():
        if t.data_ptr() % 16:
            raise ValueError(f"{name}'s data must be 16-byte aligned, got address {t.data_ptr():#x}")


def check_int(value, name: str, minimum: int) -> int:
    """A Python int (not a bool) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_float(value, name: str) -> float:
    """A Python float (or int, not a bool): a kernel's fp32 scalar."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")
    return float(value)


def check_disjoint(inputs: dict, outputs: dict) -> None:
    """No output's bytes overlap an input's or another output's (a kernel reading an input
    after a write to an output would see it). A sweep over the byte ranges sorted by start."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), is_out, name)
                   for is_out, named in ((False, inputs), (True, outputs))
                   for name, t in named.items() if t.numel())  # fmt: skip
    reach = {False: (0, ""), True: (0, "")}  # the furthest end so far of an input, of an output; whose
    for start, end, is_out, name in spans:
        for other_is_out in (False, True) if is_out else (True,):
            other_end, other = reach[other_is_out]
            if start < other_end:
                if is_out and other_is_out:
                    raise ValueError(f"{other} and {name} must not overlap")
                out, into = (name, other) if is_out else (other, name)
                raise ValueError(f"{out} must not share storage with the inputs it is computed from ({into})")
        reach[is_out] = max(reach[is_out], (end, name))


def ndim_or_none(t) -> int | None:
    """A given output's rank (a plan key's item), None where the op allocates it."""
    return None if t is None else t.ndim


@dataclasses.dataclass(frozen=True)
class MhcAscendVariant(Variant):
    """An mhc op's Ascend 950 kernels (kernels_tl/ascend/mhc/<op>.py): one a direction, m and every
    size at run time. A subclass names the op, its DIRECTIONS and its params (the CUDA variant's)."""

    family = "mhc"
    backend = "ascend"
    DIRECTIONS = ("fwd", "bwd")

    direction: str
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(d, cores) for d in cls.DIRECTIONS for cores in ASCEND_VEC_CORES)
