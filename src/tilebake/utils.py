"""Small integer helpers and the format <-> dtype table (the original's tile_kernels.utils)."""

from __future__ import annotations

import torch


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# Format names and torch dtypes: the one table (e2m1 travels packed, two codes to an int8 byte).
_FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "e2m1": torch.int8}
# dtype -> format name for the dtypes that name one format alone (an int8 tensor is not always e2m1).
FORMAT_NAMES = {dtype: fmt for fmt, dtype in _FORMATS.items() if fmt != "e2m1"}
# The unquantised formats kernels take and return, bf16 first (the order of variants and messages).
FLOAT_FORMATS = {dtype: FORMAT_NAMES[dtype] for dtype in (torch.bfloat16, torch.float32)}
# Largest finite magnitude of each quantised format.
FMT_MAX = {"e4m3": 448.0, "e2m1": 6.0}


def npu_layouts(device: torch.device) -> bool:
    """Whether tensors on `device` take the Ascend SF layouts, as the original's do there: UE8M0
    bytes packed two to an int16, column-major SF without the TMA padding. The one place that
    decides it (tests patch it to run those layouts on the CPU)."""
    return device.type == "npu"


def ue8m0_word(device: torch.device) -> tuple[torch.dtype, int]:
    """(dtype, bytes a word) of packed UE8M0 SF on `device`: int32 of four (CUDA, CPU), int16 of
    two (Ascend)."""
    return (torch.int16, 2) if npu_layouts(device) else (torch.int32, 4)


def str_to_dtype(fmt: str) -> torch.dtype:
    try:
        return _FORMATS[fmt]
    except KeyError:
        raise ValueError(f"fmt must be one of {sorted(_FORMATS)}, got {fmt!r}") from None


def dtype_to_str(dtype: torch.dtype) -> str:
    for fmt, d in _FORMATS.items():
        if d == dtype:
            return fmt
    raise ValueError(f"dtype must be one of {list(_FORMATS.values())}, got {dtype}")
