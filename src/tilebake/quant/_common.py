"""Argument checks and scale-factor allocation shared by the quant ops.

Every check names the argument, what is allowed and what was given, and mirrors an
assumption a kernel was compiled with (the `T.assume`s in kernels_tl/quant/)."""

from __future__ import annotations

import torch

from tilebake.utils import align, ceil_div

QuantTensor = tuple[torch.Tensor, torch.Tensor]
# The unquantised formats kernels take and return: dtype -> format name, and back.
FLOAT_FORMATS = {torch.bfloat16: "bf16", torch.float32: "fp32"}
FLOAT_DTYPES = {name: dtype for dtype, name in FLOAT_FORMATS.items()}
NUM_PER_CHANNELS = (16, 32, 64, 128)


def check_fmt(fmt, allowed: tuple[str, ...], name: str = "fmt") -> None:
    if fmt not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {fmt!r}")


def check_num_per_channels(num_per_channels) -> None:
    if num_per_channels not in NUM_PER_CHANNELS or isinstance(num_per_channels, bool):
        raise ValueError(f"num_per_channels must be one of {NUM_PER_CHANNELS}, got {num_per_channels!r}")


def check_sf_options(round_sf: bool, use_packed_ue8m0: bool) -> None:
    if use_packed_ue8m0 and not round_sf:
        raise ValueError("use_packed_ue8m0=True needs round_sf=True (UE8M0 holds only powers of two)")


def check_rows(x: torch.Tensor, name: str, hidden_multiple: int, row_bytes: int = 16) -> tuple[int, int]:
    """A (T, H) matrix whose rows the kernels read as `row_bytes`-byte vectors. One combined
    test on the hot path; the exact complaint is worked out only when it fails."""
    if x.dim() == 2:
        num_tokens, hidden = x.shape
        row_stride, col_stride = x.stride()
        if not (
            hidden % hidden_multiple
            or (col_stride != 1 and hidden > 1)
            or (num_tokens > 1 and (row_stride * x.element_size()) % row_bytes)
            or not (x.is_cuda or x.is_cpu)
        ):
            return num_tokens, hidden
    _explain_rows(x, name, hidden_multiple, row_bytes)
    raise AssertionError("unreachable")


def _explain_rows(x: torch.Tensor, name: str, hidden_multiple: int, row_bytes: int = 16) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (num_tokens, hidden), got shape {tuple(x.shape)}")
    num_tokens, hidden = x.shape
    if hidden % hidden_multiple:
        raise ValueError(f"{name}.shape[1] (hidden) must be a multiple of {hidden_multiple}, got {hidden}")
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{name} must be on a CUDA device or the CPU, got {x.device}")
    if hidden > 1 and x.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {x.stride()}")
    if num_tokens > 1 and (x.stride(0) * x.element_size()) % row_bytes:
        raise ValueError(
            f"{name}'s row stride must be a multiple of {row_bytes} bytes, "
            f"got {x.stride(0)} elements of {x.element_size()} bytes"
        )


def check_aligned(pointer: int, name: str, alignment: int = 16) -> None:
    """Kernels read and write whole vectors (16 bytes unless said). Checked at launch, where the
    data pointers are at hand anyway (and not while torch.compile traces, where they are not)."""
    if pointer % alignment:
        raise ValueError(
            f"{name} must start at a {alignment}-byte aligned address (a view with a misaligned offset?), "
            f"got {pointer:#x}"
        )


def check_out_data(t, name: str, shape: tuple[int, int], dtype: torch.dtype, like: torch.Tensor) -> None:
    """A preallocated output: `shape` and `dtype`, on `like`'s device, rows as check_rows wants."""
    if not (
        isinstance(t, torch.Tensor) and t.dtype == dtype and t.shape == shape and t.get_device() == like.get_device()
    ):
        _explain_tensor(t, name, shape, dtype, like)
    check_rows(t, name, hidden_multiple=1)


def _explain_tensor(t, name: str, shape, dtype: torch.dtype, like: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    raise ValueError(f"{name} must be on {like.device}, got {t.device}")


def sf_layout(num_groups: int, use_packed_ue8m0: bool) -> tuple[torch.dtype, int]:
    """SF dtype and column count: fp32 per group, or int32 words of 4 UE8M0 bytes."""
    return (torch.int32, ceil_div(num_groups, 4)) if use_packed_ue8m0 else (torch.float32, num_groups)


def alloc_sf(
    like: torch.Tensor, num_tokens: int, num_groups: int, use_packed_ue8m0: bool, col_major: bool
) -> torch.Tensor:
    """Scale factors on `like`'s device."""
    dtype, cols = sf_layout(num_groups, use_packed_ue8m0)
    if col_major:
        # TMA-aligned: column-major, the token dim padded to 16 bytes (4 x 4-byte scales),
        # handed out as a (T, cols) view with stride (1, padded T).
        padded = align(num_tokens, 4)
        return like.new_empty_strided((padded, cols), (1, padded), dtype=dtype)[:num_tokens]
    return like.new_empty((num_tokens, cols), dtype=dtype)


def check_out_sf(sf, name: str, num_tokens: int, num_groups: int, use_packed_ue8m0: bool, like: torch.Tensor) -> None:
    """Scale factors of the right dtype and shape on `like`'s device; any strides."""
    dtype, cols = sf_layout(num_groups, use_packed_ue8m0)
    if not (
        isinstance(sf, torch.Tensor)
        and sf.dtype == dtype
        and sf.shape == (num_tokens, cols)
        and sf.get_device() == like.get_device()
    ):
        _explain_tensor(sf, name, (num_tokens, cols), dtype, like)


def sf_strides_for_kernel(sf: torch.Tensor, use_packed_ue8m0: bool) -> tuple[int, int]:
    """Kernels address fp32 SF in elements and packed UE8M0 SF in bytes."""
    if use_packed_ue8m0:
        return sf.stride(0) * 4, sf.stride(1) * 4
    return sf.stride(0), sf.stride(1)


def check_packed_rows(x: torch.Tensor, name: str) -> tuple[int, int]:
    """A (T, H/2) int8 matrix of packed e2m1 pairs, which the kernels read or write as 8-byte
    vectors: last dim contiguous, row stride a multiple of 8 bytes, on a CUDA device or the CPU.
    Returns its (physical) shape."""
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (num_tokens, hidden / 2), got shape {tuple(x.shape)}")
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{name} must be on a CUDA device or the CPU, got {x.device}")
    num_tokens, cols = x.shape
    if cols > 1 and x.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {x.stride()}")
    if num_tokens > 1 and (x.stride(0) * x.element_size()) % 8:
        raise ValueError(
            f"{name}'s row stride must be a multiple of 8 bytes, got {x.stride(0)} elements of {x.element_size()} bytes"
        )
    return num_tokens, cols
