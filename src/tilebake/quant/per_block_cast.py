"""per_block_cast (+ _with_sf_only, _with_precomputed_sf): 2-D (bm x bk) block quantisation
to FP8 e4m3 or FP4 e2m1, the weight cast.

Validate, allocate, launch. The kernel is kernels_tl/quant/per_block_cast.py; the reference
(and the CPU path) is tilebake.torch.cast with block (bm, bk) and cast_with_precomputed_sf.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

import torch

from tilebake import config
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.quant import _cast_plans as plans
from tilebake.quant._common import (
    FLOAT_FORMATS,
    QuantTensor,
    alloc_sf,
    check_aligned,
    check_fmt,
    check_out_data,
    check_out_sf,
    check_out_sf_layout,
    check_rows,
    check_sf_options,
    fill_out,
    quant_data_shape,
    sf_layout,
    split_out,
)
from tilebake.quant._per_block_cast_compile import _compiled_path, register_ops
from tilebake.utils import ceil_div

BLOCK_SIZES = (32, 128)
_FORMATS = ("e4m3", "e2m1")
_MODE_CAST, _MODE_SF_ONLY, _MODE_PRECOMPUTED = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class PerBlockCastVariant(Variant):
    family = "quant"
    op = "per_block_cast"
    PARAMS = (
        ptr("X", "Y", "S")
        + f32("amax_clamp")
        + i32(
            "mode", "round_sf", "packed_sf", "sf_stride_m", "sf_stride_k", "num_tokens", "hidden", "x_stride",
            "y_stride"
        )
    )  # fmt: skip

    in_dtype: str  # 'bf16' | 'fp32'
    fmt: str  # 'e4m3' | 'e2m1'
    block_m: int
    block_k: int

    @classmethod
    def all(cls):
        return tuple(
            cls(in_dtype, fmt, bm, bk)
            for in_dtype, fmt, bm, bk in itertools.product(("bf16", "fp32"), _FORMATS, BLOCK_SIZES, BLOCK_SIZES)
        )


# The Ascend 950 kernels (kernels_tl/ascend/quant/per_block_cast.py; the original's Ascend
# constraint: 32 x 32 blocks; packed UE8M0 two bytes to an int16).
ASCEND_BLOCK = 32


@dataclasses.dataclass(frozen=True)
class PerBlockCastAscendVariant(Variant):
    family = "quant"
    op = "per_block_cast"
    backend = "ascend"

    in_dtype: str  # 'bf16' | 'fp32'
    fmt: str  # 'e4m3' | 'e2m1'
    # 'fp32' | 'round' (power-of-two fp32) | 'ue8m0' (packed two to an int16), or 'precomputed':
    # S is read (fp32, per_block_cast_with_precomputed_sf), q = x * (1 / sf)
    sf_mode: str
    store_data: bool  # False: per_block_cast_with_sf_only (the SF alone; no Y parameter)
    num_vec_cores: int

    @classmethod
    def all(cls):
        keys = itertools.product(("bf16", "fp32"), _FORMATS, ("fp32", "round", "ue8m0"), (True, False))
        given = itertools.product(("bf16", "fp32"), _FORMATS, ("precomputed",), (True,))
        return tuple(cls(*key, cores) for key in (*keys, *given) for cores in ASCEND_VEC_CORES)

    def params(self):
        data = ptr("X", "Y", "S") if self.store_data else ptr("X", "S")
        clamp = () if self.sf_mode == "precomputed" else f32("amax_clamp")
        return data + clamp + i32("num_tokens", "hidden", "x_stride", "sf_cols")


def check_block_size(block_size, name: str = "block_size") -> tuple[int, int]:
    try:
        bm, bk = block_size
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (bm, bk) with bm, bk in {BLOCK_SIZES}, got {block_size!r}") from None
    if bm not in BLOCK_SIZES or bk not in BLOCK_SIZES or isinstance(bm, bool) or isinstance(bk, bool):
        raise ValueError(f"{name} must be a pair (bm, bk) with bm, bk in {BLOCK_SIZES}, got {block_size!r}")
    return int(bm), int(bk)


def _check_x(x) -> str:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    in_dtype = FLOAT_FORMATS.get(x.dtype)
    if in_dtype is None:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    return in_dtype


def _check_flags(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0) -> None:
    for name, value in (
        ("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf),
        ("round_sf", round_sf),
        ("use_packed_ue8m0", use_packed_ue8m0),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    check_sf_options(round_sf, use_packed_ue8m0)


_KERNELS = KernelTable(PerBlockCastVariant)
# The three functions' plans, by their fast paths' keys: the arguments and the flags' types (1 ==
# True, but the flags must be bools).
_PLANS, _SF_ONLY_PLANS, _PRECOMPUTED_PLANS = plan.cache(), plan.cache(), plan.cache()


def _launch(key, mode, x, data, sf, fmt, round_sf, packed) -> bool:
    """The kernel's launch; False: nothing to do (an empty x)."""
    num_tokens, hidden = x.shape
    if num_tokens == 0 or hidden == 0:
        return False
    x_ptr = x.data_ptr()
    data_ptr = data.data_ptr() if data is not None else x_ptr
    if (x_ptr | data_ptr) % 16:
        check_aligned(x_ptr, "x")
        check_aligned(data_ptr, "out")
    size = sf.element_size()
    _KERNELS[key](
        x.get_device(),
        x_ptr, data_ptr, sf.data_ptr(), config.get_amax_clamp_for_quant(fmt, False),
        mode, int(round_sf), int(packed), sf.stride(0) * size, sf.stride(1) * size,
        num_tokens, hidden, x.stride(0), data.stride(0) if data is not None else 0,
    )  # fmt: skip
    return True


def _remember(plans_cache, plan_key, key, mode, x, fmt, round_sf, packed, col_major, given, form) -> None:
    """The call's plan, built once per key after its launch (given: out= was given whole)."""
    plan.remember(
        plans_cache, plan_key, plans.per_block_plan, _KERNELS[key], x.get_device(), x.dtype, fmt, key[2], key[3],
        packed, col_major, given, config.get_amax_clamp_for_quant(fmt, False), mode, round_sf, form,
    )  # fmt: skip


def _check_out_sf(sf, name: str, num_row_blocks: int, num_groups: int, packed: bool, like, col_major: bool) -> None:
    dtype, cols = sf_layout(num_groups, packed, like)
    check_out_sf_layout(sf, name, (num_row_blocks, cols), dtype, like, col_major)


def _reference(x, fmt, bm, bk, col, round_sf, packed):
    from tilebake.torch import cast

    return cast(
        x,
        fmt,
        (bm, bk),
        round_sf=round_sf,
        use_packed_ue8m0=packed,
        use_tma_aligned_col_major_sf=col,
        amax_clamp=config.get_amax_clamp_for_quant(fmt, False),
    )


def _prepare(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0):
    in_dtype = _check_x(x)
    check_fmt(fmt, _FORMATS)
    bm, bk = check_block_size(block_size)
    _check_flags(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    # e2m1 rows of H / 2 bytes must stay 16-byte aligned, as x's rows are.
    num_tokens, hidden = check_rows(x, "x", hidden_multiple=32 if fmt == "e2m1" else 16)
    return (in_dtype, fmt, bm, bk), num_tokens, hidden


def per_block_cast(
    x: torch.Tensor,
    fmt: str,
    block_size,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: Optional[QuantTensor] = None,
) -> QuantTensor:
    """Quantise `x` in 2-D blocks of `block_size = (bm, bk)` rows x columns (weights).

    Args:
        x: (T, H) bf16 or fp32, last dim contiguous, rows 16-byte aligned, H a multiple of 16
            (of 32 for e2m1).
            Unlike the original (T and H multiples of 128), partial edge blocks are allowed
            and scaled over their valid elements.
        fmt: 'e4m3' (data float8_e4m3fn (T, H)) or 'e2m1' (int8 (T, H/2), two codes a byte,
            the even element in the low nibble).
        block_size: (bm, bk), each 32 or 128.
        use_tma_aligned_col_major_sf: return the SF column-major, its row-block dim padded
            to 16 bytes, as a (ceil(T/bm), K blocks) view with stride (1, padded).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: SF as UE8M0 bytes packed 4 to an int32 (2 to an int16 on an NPU) along K (needs round_sf),
            shape (ceil(T/bm), ceil(ceil(H/bk)/4)).
        out: optional preallocated (data, sf) with the returned dtypes and shapes; either part
            may be None (then allocated). data's rows as x's; sf at any strides, or with
            use_tma_aligned_col_major_sf the column-major layout it returns. The given tensors
            are returned themselves.

    Returns:
        (data, sf) with x ~= data * sf per block. CPU tensors take the reference path.
    """
    # The native path (see per_token_cast): a call whose key has been seen runs as one plan.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[x.dtype, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                          out is None, use_tma_aligned_col_major_sf.__class__, round_sf.__class__,
                          use_packed_ue8m0.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, out)
            if result is not NotImplemented:
                return result
    key, num_tokens, hidden = _prepare(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    _, _, bm, bk = key
    shape, dtype = quant_data_shape(fmt, num_tokens, hidden)
    num_row_blocks, num_groups = ceil_div(num_tokens, bm), ceil_div(hidden, bk)
    col = use_tma_aligned_col_major_sf
    data, sf = split_out(out)
    if data is not None:
        check_out_data(data, "out[0]", shape, dtype, x)
    if sf is not None:
        _check_out_sf(sf, "out[1]", num_row_blocks, num_groups, use_packed_ue8m0, x, col)
    if torch.compiler.is_compiling():
        return _compiled_path(x, fmt, bm, bk, col, round_sf, use_packed_ue8m0, data, sf)
    if x.device.type == "npu":  # the Ascend kernels where they apply; given outputs filled after
        from tilebake.quant import _per_block_cast_ascend

        result = _per_block_cast_ascend.per_block_cast(x, fmt, (bm, bk), col, round_sf, use_packed_ue8m0)
        if result is not None:
            return fill_out(result, data, sf)
    if not x.is_cuda:  # the slow path: the reference builds the same layouts itself
        return fill_out(_reference(x, fmt, bm, bk, col, round_sf, use_packed_ue8m0), data, sf)
    given = data is not None and sf is not None
    if data is None:
        data = x.new_empty(shape, dtype=dtype)
    if sf is None:
        sf = alloc_sf(x, num_row_blocks, num_groups, use_packed_ue8m0, col)
    if not _launch(key, _MODE_CAST, x, data, sf, fmt, round_sf, use_packed_ue8m0):
        return data, sf
    if out is not None:  # written in place, as by torch's out= ops
        plan.bump(*out)
    if out is None or given:
        plan_key = (x.dtype, fmt, block_size, col, round_sf, use_packed_ue8m0, out is None, bool, bool, bool)
        _remember(_PLANS, plan_key, key, _MODE_CAST, x, fmt, round_sf, use_packed_ue8m0, col, given, plans.CAST)
    return data, sf


def per_block_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    block_size,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out_sf: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Only the scale factors of `per_block_cast` (same arguments, same SF bytes and layout)."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:  # the native path, as per_block_cast's
            call = _SF_ONLY_PLANS[x.dtype, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                                  out_sf is None, use_tma_aligned_col_major_sf.__class__, round_sf.__class__,
                                  use_packed_ue8m0.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, out_sf)
            if result is not NotImplemented:
                return result
    key, num_tokens, hidden = _prepare(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    _, _, bm, bk = key
    num_row_blocks, num_groups = ceil_div(num_tokens, bm), ceil_div(hidden, bk)
    if out_sf is not None:
        _check_out_sf(out_sf, "out_sf", num_row_blocks, num_groups, use_packed_ue8m0, x, use_tma_aligned_col_major_sf)
    if x.device.type == "npu":  # the Ascend kernels where they apply; a given out_sf filled after
        from tilebake.quant import _per_block_cast_ascend

        result = _per_block_cast_ascend.per_block_cast(
            x, fmt, (bm, bk), use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, store_data=False
        )
        if result is not None:
            return result[1] if out_sf is None else out_sf.copy_(result[1])
    if not x.is_cuda:
        sf = _reference(x, fmt, bm, bk, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)[1]
        return sf if out_sf is None else out_sf.copy_(sf)
    sf = out_sf
    if sf is None:
        sf = alloc_sf(x, num_row_blocks, num_groups, use_packed_ue8m0, use_tma_aligned_col_major_sf)
    if _launch(key, _MODE_SF_ONLY, x, None, sf, fmt, round_sf, use_packed_ue8m0):
        if out_sf is not None:
            plan.bump(out_sf)
        col = use_tma_aligned_col_major_sf
        plan_key = (x.dtype, fmt, block_size, col, round_sf, use_packed_ue8m0, out_sf is None, bool, bool, bool)
        _remember(
            _SF_ONLY_PLANS, plan_key, key, _MODE_SF_ONLY, x, fmt, round_sf, use_packed_ue8m0, col, out_sf is not None,
            plans.SF_ONLY,
        )  # fmt: skip
    return sf


def per_block_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    block_size,
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Quantise `x` with a given fp32 SF (ceil(T/bm), ceil(H/bk)): q = x * (1 / sf).

    `sf` may have any strides (row-major or the TMA-aligned column-major view). Packed
    UE8M0 SF are not accepted (as in the original): use_packed_ue8m0 must be False.
    use_tma_aligned_col_major_sf and round_sf describe how `sf` was made and do not change
    the arithmetic; they are accepted for signature compatibility. Returns the data only.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:  # the native path, as per_block_cast's
            call = _PRECOMPUTED_PLANS[x.dtype, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                                      use_packed_ue8m0, out is None, use_tma_aligned_col_major_sf.__class__,
                                      round_sf.__class__, use_packed_ue8m0.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, sf, out)
            if result is not NotImplemented:
                return result
    key, num_tokens, hidden = _prepare(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    if use_packed_ue8m0:
        raise ValueError("use_packed_ue8m0 must be False: a precomputed SF is fp32 (unpack UE8M0 first)")
    _, _, bm, bk = key
    num_row_blocks, num_groups = ceil_div(num_tokens, bm), ceil_div(hidden, bk)
    check_out_sf(sf, "sf", num_row_blocks, num_groups, False, x)
    shape, dtype = quant_data_shape(fmt, num_tokens, hidden)
    if out is not None:
        check_out_data(out, "out", shape, dtype, x)
    if x.device.type == "npu":  # the Ascend kernel where it applies; a given out filled after
        from tilebake.quant import _per_block_cast_ascend

        data = _per_block_cast_ascend.with_precomputed_sf(x, fmt, (bm, bk), sf)
        if data is not None:
            return data if out is None else out.copy_(data)
    if not x.is_cuda:
        from tilebake.torch.cast import cast_with_precomputed_sf

        data = cast_with_precomputed_sf(x, fmt, (bm, bk), sf)
        return data if out is None else out.copy_(data)
    data = out if out is not None else x.new_empty(shape, dtype=dtype)
    if _launch(key, _MODE_PRECOMPUTED, x, data, sf, fmt, False, False):
        if out is not None:
            plan.bump(out)
        col = use_tma_aligned_col_major_sf
        plan_key = (x.dtype, fmt, block_size, col, round_sf, use_packed_ue8m0, out is None, bool, bool, bool)
        _remember(
            _PRECOMPUTED_PLANS, plan_key, key, _MODE_PRECOMPUTED, x, fmt, False, False, False, out is not None,
            plans.PRECOMPUTED,
        )  # fmt: skip
    return data


# torch.library: the ops torch.compile traces, registered with the function they run; the
# traced call: _per_block_cast_compile.py.
register_ops(per_block_cast)
