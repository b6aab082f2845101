"""per_token_cast (+ _with_sf_only, _with_precomputed_sf): row-wise (1 x num_per_channels)
block quantisation to FP8 e4m3 or FP4 e2m1.

Validate, allocate, launch. The kernel is kernels_tl/quant/per_token_cast.py; the
reference (and the CPU path) is tilebake.torch.cast with block (1, num_per_channels). Here: the
declarations, the hot path and the public functions; _per_token_cast_general.py: everything off
the hot path; _per_token_cast_sf.py: _with_sf_only and _with_precomputed_sf past their native
path; _per_token_cast_compile.py: the torch.library ops and the traced call; _cast_plans.py: the
call plans of all three functions.
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
    NUM_PER_CHANNELS,
    QuantTensor,
    alloc_sf,
    check_aligned,
    check_fmt,
    check_num_per_channels,
    check_out_data,
    check_out_sf_layout,
    check_rows,
    check_sf_options,
    fill_out,
    sf_layout,
    sf_strides_for_kernel,
    split_out,
)
from tilebake.quant._per_token_cast_compile import _compiled_path, register_ops
from tilebake.quant._per_token_cast_general import (  # SF_* / X_SF_* codes, launch: kernels_tl, tests import them here
    _HOT_SF_MODES,
    FMTS,
    SF_E4M3,  # noqa: F401
    SF_PLAIN,  # noqa: F401
    SF_PRECOMPUTED,  # noqa: F401
    SF_ROUND,  # noqa: F401
    SF_UE8M0,  # noqa: F401
    X_SF_E4M3,  # noqa: F401
    X_SF_FP32,  # noqa: F401
    X_SF_UE8M0,  # noqa: F401
    _sf_mode,
    general,
    launch,  # noqa: F401
    variant_key,
)
from tilebake.quant._per_token_cast_sf import sf_only, with_precomputed_sf
from tilebake.utils import ceil_div


@dataclasses.dataclass(frozen=True)
class PerTokenCastVariant(Variant):
    family = "quant"
    op = "per_token_cast"

    in_dtype: str  # 'bf16' | 'fp32', or a quantized input's data: 'e4m3' | 'e2m1' (packed int8)
    fmt: str  # output data: 'e4m3' | 'e2m1' (packed int8)
    num_per_channels: int
    # 'fp32' | 'round' (power-of-two fp32) | 'ue8m0' (packed 4 to an int32): the hot path, one
    # binary per SF mode. 'runtime': every SF mode (also e4m3 SF, SF only, a precomputed SF) as
    # a kernel argument, and a quantized input's SF storage and block size too. 'rne': the e2m1
    # hot path, a plain input rounded to nearest, the SF mode (fp32/round/UE8M0/e4m3) an argument.
    sf_mode: str

    @classmethod
    def all(cls):
        hot = [
            cls(in_dtype, "e4m3", npc, sf_mode)
            for in_dtype, npc, sf_mode in itertools.product(
                ("bf16", "fp32"), NUM_PER_CHANNELS, ("fp32", "round", "ue8m0")
            )
        ]
        runtime = [
            cls(in_dtype, fmt, npc, "runtime")
            for in_dtype, fmt, npc in itertools.product(("bf16", "fp32", "e4m3", "e2m1"), FMTS, NUM_PER_CHANNELS)
        ]
        e2m1 = [
            cls(in_dtype, "e2m1", npc, "rne") for in_dtype, npc in itertools.product(("bf16", "fp32"), NUM_PER_CHANNELS)
        ]
        return tuple(hot + runtime + e2m1)

    def params(self):
        if self.sf_mode not in ("runtime", "rne"):
            return _HOT_PARAMS
        if self.sf_mode == "rne":
            return _RNE_PARAMS
        return _RUNTIME_PARAMS + (_QUANTIZED_PARAMS if self.in_dtype in ("e4m3", "e2m1") else ())


# The kernels' parameters (kernels_tl/quant/per_token_cast.py: build, build_runtime_sf, build_e2m1_rne).
_HOT_PARAMS = (
    ptr("X", "Y", "S")
    + f32("amax_clamp")
    + i32("num_tokens", "hidden", "x_stride", "y_stride", "sf_stride_t", "sf_stride_g")
)
_SF_PARAMS = ptr("X", "Y", "S", "SB", "SE") + f32("amax_clamp") + i32("sf_mode")
_SHAPE_PARAMS = i32("num_tokens", "hidden", "x_stride", "y_stride", "sf_stride_t", "sf_stride_g")
_RNE_PARAMS = _SF_PARAMS + _SHAPE_PARAMS
_RUNTIME_PARAMS = _SF_PARAMS + i32("store_data", "stochastic") + _SHAPE_PARAMS
_QUANTIZED_PARAMS = ptr("XS", "XSB", "XSE")
_QUANTIZED_PARAMS += i32("x_sf_kind", "x_block_m", "x_block_k", "x_sf_stride_t", "x_sf_stride_g")


# The Ascend 950 kernels (kernels_tl/ascend/quant/per_token_cast.py; the original's Ascend
# constraints: e4m3, 32 columns a group, hidden % 128 == 0; packed UE8M0 two bytes to an int16).
ASCEND_NUM_PER_CHANNELS = 32


@dataclasses.dataclass(frozen=True)
class PerTokenCastAscendVariant(Variant):
    family = "quant"
    op = "per_token_cast"
    backend = "ascend"

    in_dtype: str  # 'bf16' | 'fp32'
    # 'fp32' | 'round' (power-of-two fp32) | 'ue8m0' (packed two to an int16), or 'precomputed':
    # S is read (fp32, per_token_cast_with_precomputed_sf), q = x * (1 / sf)
    sf_mode: str
    store_data: bool  # False: per_token_cast_with_sf_only (the SF alone; no Y parameter)
    num_vec_cores: int  # the grid: one block a vector core, each taking every num_vec_cores-th row

    @classmethod
    def all(cls):
        keys = itertools.product(("bf16", "fp32"), ("fp32", "round", "ue8m0"), (True, False), ASCEND_VEC_CORES)
        given = itertools.product(("bf16", "fp32"), ("precomputed",), (True,), ASCEND_VEC_CORES)
        return tuple(cls(*key) for key in (*keys, *given))

    def params(self):
        data = ptr("X", "Y", "S") if self.store_data else ptr("X", "S")
        clamp = () if self.sf_mode == "precomputed" else f32("amax_clamp")  # (a given SF needs none)
        return data + clamp + i32("num_tokens", "hidden", "x_stride", "sf_cols")


# validated (dtype, fmt, npc, round_sf, packed) -> hot variant key, or None: the general path
_KEYS: dict[tuple, Optional[tuple]] = {}


def _key_of(x, fmt, num_per_channels, round_sf, use_packed_ue8m0) -> Optional[tuple]:
    """Check the non-tensor arguments (and x's type and dtype); remember the valid combination.
    None: not the hot path (an e2m1 output or a quantized input); _general checks the rest."""
    if not isinstance(x, torch.Tensor):
        if isinstance(x, (tuple, list)):
            return None
        raise TypeError(f"x must be a torch.Tensor or a QuantTensor (data, sf), got {type(x).__name__}")
    in_dtype = FLOAT_FORMATS.get(x.dtype)
    if in_dtype is None:
        raise TypeError(f"x must be bfloat16 or float32 (or a QuantTensor (data, sf)), got {x.dtype}")
    check_fmt(fmt, FMTS)
    check_num_per_channels(num_per_channels)
    check_sf_options(round_sf, use_packed_ue8m0)
    key = variant_key(in_dtype, fmt, num_per_channels, _sf_mode(round_sf, use_packed_ue8m0, False), 1, 0)
    key = key if key[3] in _HOT_SF_MODES.values() else None
    _KEYS[x.dtype, fmt, num_per_channels, round_sf, use_packed_ue8m0] = key
    return key


def _check_out(out, x, num_tokens, hidden, num_per_channels, use_packed_ue8m0, col_major):
    """The hot path's out= parts (either may be None), checked."""
    data, sf = split_out(out)
    if data is not None:
        check_out_data(data, "out[0]", (num_tokens, hidden), torch.float8_e4m3fn, x)
    if sf is not None:
        dtype, cols = sf_layout(ceil_div(hidden, num_per_channels), use_packed_ue8m0, x)
        check_out_sf_layout(sf, "out[1]", (num_tokens, cols), dtype, x, col_major)
    return data, sf


_KERNELS = KernelTable(PerTokenCastVariant)


def per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    x_block_size=None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    stochastic_cast: bool = False,
    out: Optional[QuantTensor] = None,
) -> QuantTensor:
    """Quantise each row of `x` in blocks of `num_per_channels` to FP8 e4m3 or FP4 e2m1.

    Args:
        x: (T, H) bf16 or fp32, last dim contiguous, rows 16-byte aligned (any row stride
            that is a multiple of 16 bytes), H a multiple of 16. Or a QuantTensor (data, sf)
            to re-quantise: data e4m3 (T, H) or packed e2m1 int8 (T, H/2) (rows 16- resp.
            8-byte aligned), sf fp32 / packed UE8M0 int32 / e4m3, row- or column-major.
        fmt: 'e4m3', or 'e2m1' (int8 (T, H/2), the even element in the low nibble).
        num_per_channels: block width, one of 16, 32, 64, 128. A last partial block
            (H not a multiple of it) is scaled over its valid elements.
        x_block_size: (bm, bk) of a QuantTensor input's SF blocks, bk a multiple of 16;
            None for a plain tensor.
        use_tma_aligned_col_major_sf: return the SF column-major, its token dim padded
            to 16 bytes, as a (T, ceil(H/npc)) view with stride (1, padded T) (on an NPU
            unpadded: stride (1, T), the original's Ascend layout).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: SF as UE8M0 exponent bytes packed 4 to an int32 along H (needs
            round_sf); shape (T, ceil(ceil(H/npc)/4)). On an NPU two to an int16 (T, ceil(ceil(H/npc)/2)).
        use_e4m3_sf: SF as float8_e4m3fn (not with round_sf).
        stochastic_cast: round the quantised values stochastically instead of to nearest even
            (e4m3 or e2m1 output, plain or quantized input; not on the hot path): each value
            goes to one of its two neighbouring codes, up with probability equal to its distance
            from the lower one over the gap, so the dequantised result is unbiased. The SF are
            exactly those of stochastic_cast=False. The 16 random bits per element are a hash of
            the input values (fp32 bits; the decoded data for a QuantTensor) of its pair of flat
            indices row * H + col (2p, 2p + 1) and p, so equal inputs give equal outputs (no RNG
            state); the rounding probability is resolved to 2^-16. Reference:
            tilebake.torch.cast(..., stochastic_rounding=True).
        out: optional preallocated (data, sf) with the returned dtypes and shapes; either part
            may be None (then allocated). data's rows as x's; sf at any strides, or with
            use_tma_aligned_col_major_sf the column-major layout it returns. The given tensors
            are returned themselves.

    Returns:
        (data, sf) so that x ~= data * sf per block. CPU tensors take the pure-torch
        reference path (same bytes, slower).
    """
    # The native path: a call whose key has been seen runs as one plan (validate, allocate and
    # launch in C); a call the plan does not take (NotImplemented) goes on below. Not while
    # torch.compile traces (dynamo cannot trace the native call; the traced op runs it later).
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[x.dtype, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                          use_packed_ue8m0, use_e4m3_sf, stochastic_cast, out is None]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, out)
            if result is not NotImplemented:
                return result
    # Validate. The non-tensor arguments are checked once per combination (the cached
    # kernel key); the tensor is checked on every call.
    try:
        key = _KEYS[x.dtype, fmt, num_per_channels, round_sf, use_packed_ue8m0]
    except (KeyError, AttributeError, TypeError):
        key = _key_of(x, fmt, num_per_channels, round_sf, use_packed_ue8m0)
    if key is None or x_block_size is not None or use_e4m3_sf or stochastic_cast:
        return general(
            _KERNELS, _PLANS, x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
            use_packed_ue8m0, use_e4m3_sf, stochastic_cast, out,
        )  # fmt: skip
    num_tokens, hidden = check_rows(x, "x", hidden_multiple=16)
    data = sf = None
    if out is not None:
        col = use_tma_aligned_col_major_sf
        data, sf = _check_out(out, x, num_tokens, hidden, num_per_channels, use_packed_ue8m0, col)
    if torch.compiler.is_compiling():
        return _compiled_path(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, data, sf)

    if x.device.type == "npu":  # the Ascend kernels where they apply (else the reference below)
        from tilebake.quant import _per_token_cast_ascend

        result = _per_token_cast_ascend.per_token_cast(
            x, num_per_channels, round_sf, use_packed_ue8m0, use_tma_aligned_col_major_sf
        )
        if result is not None:
            return fill_out(result, data, sf)  # given outputs (the Ascend layouts) filled from the kernel's
    if not x.is_cuda:  # the slow path: the reference builds the same layouts itself
        from tilebake.torch import cast

        result = cast(
            x,
            "e4m3",
            (1, num_per_channels),
            round_sf=round_sf,
            use_packed_ue8m0=use_packed_ue8m0,
            use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
            amax_clamp=config.get_amax_clamp_for_quant("e4m3", False),
        )
        return fill_out(result, data, sf)

    # Allocate what out= does not give, then launch.
    if data is None:
        data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    if sf is None:
        sf = alloc_sf(x, num_tokens, ceil_div(hidden, num_per_channels), use_packed_ue8m0, use_tma_aligned_col_major_sf)
    if num_tokens == 0:
        return data, sf
    x_ptr, data_ptr = x.data_ptr(), data.data_ptr()
    if (x_ptr | data_ptr) % 16:
        check_aligned(x_ptr, "x")
        check_aligned(data_ptr, "out[0]")
    sf_stride_t, sf_stride_g = sf_strides_for_kernel(sf, use_packed_ue8m0)
    _KERNELS[key](
        x.get_device(),
        x_ptr, data_ptr, sf.data_ptr(), config.get_amax_clamp_for_quant("e4m3", False),
        num_tokens, hidden, x.stride(0), data.stride(0), sf_stride_t, sf_stride_g,
    )  # fmt: skip
    if out is not None:  # written in place, as by torch's out= ops
        plan.bump(*out)
    if out is None or (out[0] is not None and out[1] is not None):
        plan_key = (x.dtype, fmt, num_per_channels, None, use_tma_aligned_col_major_sf, round_sf,
                    use_packed_ue8m0, use_e4m3_sf, stochastic_cast, out is None)  # fmt: skip
        plan.remember(
            _PLANS, plan_key, plans.per_token_plan, _KERNELS[key], x.get_device(), x.dtype, "e4m3", num_per_channels,
            sf.dtype, use_packed_ue8m0, use_tma_aligned_col_major_sf, out is not None,
            config.get_amax_clamp_for_quant("e4m3", False),
        )  # fmt: skip
    return data, sf


_PLANS = plan.cache()  # per_token_cast's, by its fast path's key
_SF_ONLY_PLANS = plan.cache()
_PRECOMPUTED_PLANS = plan.cache()


def per_token_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out_sf: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Only the scale factors `per_token_cast` would return for the same arguments (same
    layouts and dtypes); the quantized data is not written. x: (T, H) bf16/fp32 as there."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:  # the native path, as per_token_cast's
            call = _SF_ONLY_PLANS[x.dtype, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
                                  use_packed_ue8m0, use_e4m3_sf, out_sf is None]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, out_sf)
            if result is not NotImplemented:
                return result
    return sf_only(
        _KERNELS, _SF_ONLY_PLANS, x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
        use_e4m3_sf, out_sf,
    )  # fmt: skip


def per_token_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Quantise `x` with the given scale factors: q = x * (1 / sf) per block.

    Args:
        x: (T, H) bf16/fp32 as for `per_token_cast`.
        sf: float32 (T, ceil(H/npc)), row-major (the last dim contiguous); not packed, not
            column-major (as in the original).
        use_tma_aligned_col_major_sf, use_packed_ue8m0: must be False (the SF is row-major fp32).
        round_sf, use_e4m3_sf: describe how `sf` was made; checked for consistency only.
        out: optional preallocated data, e4m3 (T, H) or int8 (T, H/2).
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:  # the native path, as per_token_cast's
            call = _PRECOMPUTED_PLANS[x.dtype, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
                                      use_packed_ue8m0, use_e4m3_sf, out is None]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, sf, out)
            if result is not NotImplemented:
                return result
    return with_precomputed_sf(
        _KERNELS, _PRECOMPUTED_PLANS, x, fmt, num_per_channels, sf, use_tma_aligned_col_major_sf, round_sf,
        use_packed_ue8m0, use_e4m3_sf, out,
    )  # fmt: skip


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it ---
# The ops, their shape functions as Meta kernels (free at import, unlike register_fake) and the
# traced call: _per_token_cast_compile.py.
register_ops(per_token_cast)
