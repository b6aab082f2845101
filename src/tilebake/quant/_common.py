"""Argument checks and scale-factor allocation shared by the quant ops.

Every check names the argument, what is allowed and what was given, and mirrors an
assumption a kernel was compiled with (the `T.assume`s in kernels_tl/quant/)."""

from __future__ import annotations

from typing import Optional

import torch

from tilebake import utils
from tilebake._checks import check_device
from tilebake.utils import FLOAT_FORMATS, align, ceil_div

QuantTensor = tuple[torch.Tensor, torch.Tensor]
# The unquantised formats kernels take and return (tilebake.utils.FLOAT_FORMATS): name -> dtype.
FLOAT_DTYPES = {name: dtype for dtype, name in FLOAT_FORMATS.items()}
NUM_PER_CHANNELS = (16, 32, 64, 128)  # per-token SF block widths (1, npc); also of quantized inputs


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
    check_device(x, name)
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
    """A preallocated output: `shape` and `dtype`, on `like`'s device, rows as check_rows wants
    and apart (a row stride below the row length would make rows overlap)."""
    if not (
        isinstance(t, torch.Tensor) and t.dtype == dtype and t.shape == shape and t.device == like.device
    ):
        _explain_tensor(t, name, shape, dtype, like)
    check_rows(t, name, hidden_multiple=1)
    if shape[0] > 1 and t.stride(0) < shape[1]:
        check_no_overlap(t, name)


def quant_data_shape(fmt: str, num_tokens: int, hidden: int) -> tuple[tuple[int, int], torch.dtype]:
    """The quantized data of (T, H) values: e4m3 (T, H), or e2m1 pairs packed in int8 (T, H / 2)."""
    if fmt == "e2m1":
        return (num_tokens, hidden // 2), torch.int8
    return (num_tokens, hidden), torch.float8_e4m3fn


def split_out(out, name: str = "out") -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """A cast op's `out=`: None, or a (data, sf) pair whose parts may each be None; the op then
    allocates those parts (as the original does: its own callers pass (data, None) when the SF
    is column-major). Returns (data or None, sf or None)."""
    if out is None:
        return None, None
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return out[0], out[1]
    raise TypeError(
        f"{name} must be a (data, sf) pair (either part may be None, then allocated) or None, got {type(out).__name__}"
    )


def fill_out(result: QuantTensor, data: Optional[torch.Tensor], sf: Optional[torch.Tensor]) -> QuantTensor:
    """A computed (data, sf) copied into the given parts of out=; the missing parts as computed."""
    return (
        result[0] if data is None else data.copy_(result[0]),
        result[1] if sf is None else sf.copy_(result[1]),
    )


def check_no_overlap(t: torch.Tensor, name: str) -> None:
    """Kernels write every element of an output at its own address: no two may share one (as in
    a broadcast or expanded view, or rows closer than their length)."""
    _check_no_overlap(tuple(t.shape), t.stride(), name)


def _check_no_overlap(shape: tuple, strides: tuple, name: str) -> None:
    """Dim by dim from the smallest stride: each must step past all that the smaller ones span."""
    if 0 in shape:  # no elements
        return
    if len(shape) == 2:  # the usual case, without the general loop's cost on the hot path
        (rows, cols), (row_stride, col_stride) = shape, strides
        if rows <= 1 or cols <= 1:
            if (rows <= 1 or row_stride > 0) and (cols <= 1 or col_stride > 0):
                return
        elif (0 < col_stride and (cols - 1) * col_stride < row_stride) or (
            0 < row_stride and (rows - 1) * row_stride < col_stride
        ):
            return
    span = 0
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape) if sz > 1):
        if stride <= span:
            raise ValueError(
                f"{name} must not overlap itself (each element its own address), "
                f"got shape {tuple(shape)} and strides {tuple(strides)}"
            )
        span += (size - 1) * stride


def check_out_sf_layout(sf, name: str, shape: tuple, dtype: torch.dtype, like: torch.Tensor, col_major: bool) -> None:
    """A preallocated SF output of `shape` and `dtype` on `like`'s device. The kernels write SF
    at any strides, so without `col_major` any non-overlapping layout is taken. With
    use_tma_aligned_col_major_sf=True (`col_major`) it must be the layout that flag returns,
    which TMA reads: the last two dims column-major (stride(-2) == 1) with columns 16 bytes
    apart, starting at a 16-byte aligned address (e.g. a (cols, padded) buffer's transposed
    view, as alloc_sf makes)."""
    if not (isinstance(sf, torch.Tensor) and sf.dtype == dtype and sf.shape == shape and sf.device == like.device):
        _explain_tensor(sf, name, shape, dtype, like)
    strides = sf.stride()
    _check_no_overlap(shape, strides, name)
    if not col_major or 0 in shape:  # an empty SF has no layout to keep
        return
    rows, cols = shape[-2:]
    if utils.npu_layouts(sf.device):  # the Ascend layout: column-major, no TMA padding
        if rows > 1 and strides[-2] != 1:
            raise ValueError(f"{name} must be column-major (stride(-2) == 1) with use_tma_aligned_col_major_sf=True, "
                             f"got strides {strides}")  # fmt: skip
        return
    if (rows > 1 and strides[-2] != 1) or (cols > 1 and (strides[-1] * sf.element_size()) % 16):
        raise ValueError(
            f"{name} must be TMA-aligned column-major with use_tma_aligned_col_major_sf=True: stride(-2) == 1 "
            f"and stride(-1) a multiple of 16 bytes (pass None to have it allocated), got strides {strides} "
            f"of {sf.element_size()}-byte elements"
        )
    if not torch.compiler.is_compiling():  # fake tensors have no address
        check_aligned(sf.data_ptr(), name)


def _explain_tensor(t, name: str, shape, dtype: torch.dtype, like: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    raise ValueError(f"{name} must be on {like.device}, got {t.device}")


def sf_layout(num_groups: int, use_packed_ue8m0: bool, like: torch.Tensor) -> tuple[torch.dtype, int]:
    """SF dtype and column count on `like`'s device: fp32 per group, or packed UE8M0 words (int32
    of 4 bytes; on an NPU int16 of 2, the original's Ascend packing)."""
    if not use_packed_ue8m0:
        return torch.float32, num_groups
    dtype, per_word = utils.ue8m0_word(like.device)
    return dtype, ceil_div(num_groups, per_word)


def col_major_rows(like: torch.Tensor, rows: int, element_size: int) -> int:
    """The row count a column-major SF of `rows` rows is allocated with: padded to 16 bytes for
    TMA, or as is on an NPU (the original's Ascend layout)."""
    return rows if utils.npu_layouts(like.device) else align(rows, 16 // element_size)


def alloc_sf(
    like: torch.Tensor, num_tokens: int, num_groups: int, use_packed_ue8m0: bool, col_major: bool
) -> torch.Tensor:
    """Scale factors on `like`'s device."""
    dtype, cols = sf_layout(num_groups, use_packed_ue8m0, like)
    if col_major:
        # column-major, handed out as a (T, cols) view with stride (1, padded T)
        padded = col_major_rows(like, num_tokens, 4)
        return like.new_empty_strided((padded, cols), (1, padded), dtype=dtype)[:num_tokens]
    return like.new_empty((num_tokens, cols), dtype=dtype)


def check_out_sf(sf, name: str, num_tokens: int, num_groups: int, use_packed_ue8m0: bool, like: torch.Tensor) -> None:
    """Scale factors of the right dtype and shape on `like`'s device; any strides."""
    dtype, cols = sf_layout(num_groups, use_packed_ue8m0, like)
    if not (
        isinstance(sf, torch.Tensor)
        and sf.dtype == dtype
        and sf.shape == (num_tokens, cols)
        and sf.device == like.device
    ):
        _explain_tensor(sf, name, (num_tokens, cols), dtype, like)


def sf_strides_for_kernel(sf: torch.Tensor, use_packed_ue8m0: bool) -> tuple[int, int]:
    """Kernels address fp32 SF in elements and packed UE8M0 SF in bytes."""
    if use_packed_ue8m0:
        return sf.stride(0) * 4, sf.stride(1) * 4
    return sf.stride(0), sf.stride(1)


def check_packed_rows(x: torch.Tensor, name: str) -> tuple[int, int]:
    """A (T, H/2) int8 matrix of packed e2m1 pairs, which the kernels read or write as 8-byte
    vectors: last dim contiguous, row stride a multiple of 8 bytes, on a CUDA device, an NPU or the CPU.
    Returns its (physical) shape."""
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (num_tokens, hidden / 2), got shape {tuple(x.shape)}")
    check_device(x, name)
    num_tokens, cols = x.shape
    if cols > 1 and x.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {x.stride()}")
    if num_tokens > 1 and (x.stride(0) * x.element_size()) % 8:
        raise ValueError(
            f"{name}'s row stride must be a multiple of 8 bytes, got {x.stride(0)} elements of {x.element_size()} bytes"
        )
    return num_tokens, cols


# The Ascend kernels' SF dtypes: fp32, or UE8M0 bytes packed two to an int16 (the original's
# Ascend packing), as (kind, groups an element).
ASCEND_SF_KINDS = {torch.float32: ("fp32", 1), torch.int16: ("ue8m0", 2)}


def ascend_sf_mode(round_sf: bool, use_packed_ue8m0: bool) -> str:
    """The Ascend cast variants' sf_mode: 'ue8m0' (bytes two to an int16), 'round' (power-of-two
    fp32) or 'fp32'."""
    return "ue8m0" if use_packed_ue8m0 else "round" if round_sf else "fp32"


def alloc_ascend_sf(like: torch.Tensor, rows: int, groups: int, packed: bool) -> torch.Tensor:
    """An Ascend kernel's row-major SF of `groups` per row (an even count when packed): UE8M0
    bytes two to an int16 (rows, groups / 2), or fp32 (rows, groups)."""
    if packed:
        return like.new_empty((rows, groups // 2), dtype=torch.int16)
    return like.new_empty((rows, groups), dtype=torch.float32)
