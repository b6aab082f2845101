"""per_token_cast (+ _with_sf_only, _with_precomputed_sf): row-wise (1 x num_per_channels)
block quantisation to FP8 e4m3 or FP4 e2m1.

Validate, allocate, launch. The kernel is kernels_tl/quant/per_token_cast.py; the
reference (and the CPU path) is tilebake.torch.cast with block (1, num_per_channels).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

import torch

from tilebake import config
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, f32, i32, ptr
from tilebake.quant._common import (
    FLOAT_FORMATS,
    NUM_PER_CHANNELS,
    QuantTensor,
    _explain_tensor,
    alloc_sf,
    check_aligned,
    check_fmt,
    check_no_overlap,
    check_num_per_channels,
    check_out_data,
    check_out_sf_layout,
    check_packed_rows,
    check_rows,
    check_sf_options,
    fill_out,
    sf_layout,
    sf_strides_for_kernel,
    split_out,
)
from tilebake.utils import align, ceil_div


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


FMTS = ("e4m3", "e2m1")
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
        dtype, cols = sf_layout(ceil_div(hidden, num_per_channels), use_packed_ue8m0)
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
            to 16 bytes, as a (T, ceil(H/npc)) view with stride (1, padded T).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: SF as UE8M0 exponent bytes packed 4 to an int32 along H
            (needs round_sf); shape (T, ceil(ceil(H/npc)/4)).
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
    try:
        call = _PLANS[x.dtype, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, use_e4m3_sf, stochastic_cast, out is None]  # fmt: skip
    except (KeyError, AttributeError, TypeError):
        pass
    else:
        if not torch.compiler.is_compiling():
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
        return _general(
            x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
            use_e4m3_sf, stochastic_cast, out,
        )  # fmt: skip
    num_tokens, hidden = check_rows(x, "x", hidden_multiple=16)
    data = sf = None
    if out is not None:
        col = use_tma_aligned_col_major_sf
        data, sf = _check_out(out, x, num_tokens, hidden, num_per_channels, use_packed_ue8m0, col)
    if torch.compiler.is_compiling():
        return _compiled_path(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, data, sf)

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
        torch.autograd.graph.increment_version([t for t in out if t is not None])
    plan_key = (x.dtype, fmt, num_per_channels, None, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                False, False, out is None)  # fmt: skip
    if plan_key not in _PLANS and (out is None or (out[0] is not None and out[1] is not None)):
        _PLANS[plan_key] = plan.build_if_available(
            _hot_plan, _KERNELS[key], x.get_device(), x.dtype, num_per_channels, use_tma_aligned_col_major_sf,
            use_packed_ue8m0, out is not None,
        )  # fmt: skip
    return data, sf


_PLANS = plan.cache()


def _hot_plan(kernel, device, dtype, npc, col_major, packed, given_out):
    """The hot path above as a call plan: the same checks (some stricter: those calls take the
    Python path), allocations and kernel arguments."""
    b = plan.Builder()
    x = b.tensor(0, dtype, ("T", "H"), strides=("xs", 1))
    b.check(f"T >= 1 and H >= 16 and H % 16 == 0 and (T == 1 or xs % {16 // dtype.itemsize} == 0)")
    b.let("C", f"((H + {npc - 1}) // {npc} + 3) // 4" if packed else f"(H + {npc - 1}) // {npc}")
    sf_dtype, unit = (torch.int32, 4) if packed else (torch.float32, 1)  # packed SF strides are in bytes
    if given_out:
        data = b.tensor((1, 0), torch.float8_e4m3fn, ("T", "H"), strides=("ds", 1))
        b.check("T == 1 or (ds % 16 == 0 and ds >= H)")
        if col_major:  # TMA-aligned column-major, as check_out_sf_layout wants it
            sf = b.tensor((1, 1), sf_dtype, ("T", "C"), strides=(1, "sg"))
            b.check("T >= 1 and (C == 1 or (sg % 4 == 0 and sg >= T))")
            b.let("st", 1)
        else:  # row-major rows apart, or column-major columns apart: no two SF at one address
            sf = b.tensor((1, 1), sf_dtype, ("T", "C"), strides=("st", "sg"), align=4)
            b.check("(sg == 1 and (T == 1 or st >= C)) or (st == 1 and (C == 1 or sg >= T))")
    else:
        data = b.alloc(torch.float8_e4m3fn, ("T", "H"))
        b.let("ds", "H")
        if col_major:  # a (C, padded T) buffer, handed out as its transposed (T, C) view
            b.let("sg", "(T + 3) // 4 * 4")
            sf = b.alloc(sf_dtype, ("C", "sg"), view=(("T", "C"), (1, "sg")))
            b.let("st", 1)
        else:
            sf = b.alloc(sf_dtype, ("T", "C"))
            b.let("st", "C")
            b.let("sg", 1)
    b.launch(
        kernel, device, X=x, Y=data, S=sf, amax_clamp=config.get_amax_clamp_for_quant("e4m3", False),
        num_tokens="T", hidden="H", x_stride="xs", y_stride="ds", sf_stride_t=f"st * {unit}",
        sf_stride_g=f"sg * {unit}",
    )  # fmt: skip
    if given_out:
        b.bump(data)
        b.bump(sf)
    b.returns((data, sf))
    return b.build()


# --- Everything off the hot path: e2m1 output, e4m3 SF, quantized inputs, SF only, a given SF.
# One kernel per (input, fmt, npc) takes the SF mode and the input SF's storage as arguments
# (kernels_tl/quant/per_token_cast.py build_runtime_sf; the codes below are its constants).

SF_PLAIN, SF_ROUND, SF_UE8M0, SF_E4M3, SF_PRECOMPUTED = 0, 1, 2, 3, 4  # the kernel's sf_mode argument
X_SF_FP32, X_SF_UE8M0, X_SF_E4M3 = 0, 1, 2  # its x_sf_kind: how a quantized input's SF is stored
_X_SF_KINDS = {torch.float32: X_SF_FP32, torch.int32: X_SF_UE8M0, torch.float8_e4m3fn: X_SF_E4M3}
_HOT_SF_MODES = {SF_PLAIN: "fp32", SF_ROUND: "round", SF_UE8M0: "ue8m0"}  # sf_mode code -> hot variant's


def variant_key(in_dtype: str, fmt: str, num_per_channels: int, sf_mode: int, store_data: int, stochastic: int):
    """Which kernel runs a call (the PerTokenCastVariant fields): a plain input's e4m3 cast with
    an fp32/round/UE8M0 SF has a hot kernel per SF mode; a plain input's e2m1 cast rounded to
    nearest the lean 'rne' kernel; everything else (e4m3 SF, SF only, a precomputed SF,
    stochastic rounding, a quantized input) the 'runtime' kernel."""
    plain = in_dtype in ("bf16", "fp32")
    if plain and store_data and not stochastic:
        if fmt == "e4m3" and sf_mode in _HOT_SF_MODES:
            return in_dtype, fmt, num_per_channels, _HOT_SF_MODES[sf_mode]
        if fmt == "e2m1" and sf_mode != SF_PRECOMPUTED:
            return in_dtype, fmt, num_per_channels, "rne"
    return in_dtype, fmt, num_per_channels, "runtime"


def _check_flags(round_sf, use_packed_ue8m0, use_e4m3_sf) -> None:
    check_sf_options(round_sf, use_packed_ue8m0)
    if use_e4m3_sf and round_sf:
        raise ValueError("use_e4m3_sf=True is incompatible with round_sf=True (an e4m3 scale is not rounded to 2^e)")


def _sf_mode(round_sf, use_packed_ue8m0, use_e4m3_sf) -> int:
    if use_e4m3_sf:
        return SF_E4M3
    return SF_UE8M0 if use_packed_ue8m0 else SF_ROUND if round_sf else SF_PLAIN


def _sf_dtype_and_cols(num_groups: int, sf_mode: int) -> tuple[torch.dtype, int]:
    if sf_mode == SF_E4M3:
        return torch.float8_e4m3fn, num_groups
    return sf_layout(num_groups, sf_mode == SF_UE8M0)


def _alloc_any_sf(like, num_tokens: int, num_groups: int, sf_mode: int, col_major: bool) -> torch.Tensor:
    if sf_mode != SF_E4M3:
        return alloc_sf(like, num_tokens, num_groups, sf_mode == SF_UE8M0, col_major)
    if col_major:  # the token dim padded to 16 bytes = 16 e4m3 scales
        padded = align(num_tokens, 16)
        return like.new_empty_strided((padded, num_groups), (1, padded), dtype=torch.float8_e4m3fn)[:num_tokens]
    return like.new_empty((num_tokens, num_groups), dtype=torch.float8_e4m3fn)


def _check_any_sf(sf, name: str, num_tokens: int, num_groups: int, sf_mode: int, like) -> None:
    dtype, cols = _sf_dtype_and_cols(num_groups, sf_mode)
    if not (
        isinstance(sf, torch.Tensor)
        and sf.dtype == dtype
        and sf.shape == (num_tokens, cols)
        and sf.device == like.device  # not get_device(): it is -1 on the CPU and on meta alike
    ):
        _explain_tensor(sf, name, (num_tokens, cols), dtype, like)


def _check_out_sf(sf, name: str, num_tokens: int, num_groups: int, sf_mode: int, like, col_major: bool) -> None:
    dtype, cols = _sf_dtype_and_cols(num_groups, sf_mode)
    check_out_sf_layout(sf, name, (num_tokens, cols), dtype, like, col_major)


def _sf_strides(sf: torch.Tensor, sf_mode: int) -> tuple[int, int]:
    """Kernels address fp32 SF in elements, packed UE8M0 and e4m3 SF in bytes."""
    return sf_strides_for_kernel(sf, sf_mode == SF_UE8M0)


def _check_data_out(t, name: str, num_tokens: int, hidden: int, fmt: str, like) -> None:
    if fmt == "e4m3":
        check_out_data(t, name, (num_tokens, hidden), torch.float8_e4m3fn, like)
    else:
        shape = (num_tokens, hidden // 2)
        if not (isinstance(t, torch.Tensor) and t.dtype == torch.int8 and t.shape == shape and t.device == like.device):
            _explain_tensor(t, name, shape, torch.int8, like)
        check_packed_rows(t, name)
        check_no_overlap(t, name)


def _alloc_data(like, num_tokens: int, hidden: int, fmt: str) -> torch.Tensor:
    if fmt == "e4m3":
        return like.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    return like.new_empty((num_tokens, hidden // 2), dtype=torch.int8)


def _parse_plain_x(x, op: str):
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{op}: x must be a bfloat16 or float32 torch.Tensor (no QuantTensor input), got {type(x).__name__}"
        )
    return _parse_x(x, None)


def _parse_x(x, x_block_size):
    """(data tensor, in_dtype key, logical T, logical H, input SF or None, (bm, bk) or None), checked."""
    if isinstance(x, torch.Tensor):
        if x_block_size is not None:
            raise ValueError(
                "x_block_size must be None when x is a plain tensor (it gives the SF blocks of a "
                f"QuantTensor input), got {x_block_size!r}"
            )
        in_dtype = FLOAT_FORMATS.get(x.dtype)
        if in_dtype is None:
            raise TypeError(f"x must be bfloat16 or float32 (or a QuantTensor (data, sf)), got {x.dtype}")
        num_tokens, hidden = check_rows(x, "x", hidden_multiple=16)
        return x, in_dtype, num_tokens, hidden, None, None
    if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
        raise TypeError(f"x must be a torch.Tensor or a QuantTensor (data, sf) of two tensors, got {type(x).__name__}")
    data, x_sf = x
    if x_block_size is None:
        raise ValueError("x_block_size must be given as (bm, bk) when x is a QuantTensor (data, sf)")
    if (
        not isinstance(x_block_size, (tuple, list))
        or len(x_block_size) != 2
        or not all(type(b) is int and b >= 1 for b in x_block_size)
    ):
        raise ValueError(f"x_block_size must be a pair (bm, bk) of positive ints, got {x_block_size!r}")
    block_m, block_k = x_block_size
    if block_k % 16:
        raise ValueError(
            f"x_block_size[1] must be a multiple of 16 (16 consecutive elements share one input scale), "
            f"got {x_block_size!r}"
        )
    if data.dtype == torch.float8_e4m3fn:
        in_dtype = "e4m3"
        num_tokens, hidden = check_rows(data, "x[0]", hidden_multiple=16)
    elif data.dtype == torch.int8:
        in_dtype = "e2m1"
        num_tokens, half = check_packed_rows(data, "x[0]")
        if half % 8:
            raise ValueError(f"x[0].shape[1] (packed e2m1, hidden / 2) must be a multiple of 8, got {half}")
        hidden = 2 * half
    else:
        raise TypeError(f"x[0] (the data) must be float8_e4m3fn or int8 (packed e2m1), got {data.dtype}")
    kind = _X_SF_KINDS.get(x_sf.dtype)
    if kind is None:
        raise TypeError(f"x[1] (the SF) must be float32, int32 (packed UE8M0) or float8_e4m3fn, got {x_sf.dtype}")
    sf_rows, sf_cols = ceil_div(num_tokens, block_m), ceil_div(hidden, block_k)
    if kind == X_SF_UE8M0:
        sf_cols = ceil_div(sf_cols, 4)
    if x_sf.shape != (sf_rows, sf_cols):
        raise ValueError(
            f"x[1] (the SF) must have shape {(sf_rows, sf_cols)} for T={num_tokens}, H={hidden}, "
            f"x_block_size={tuple(x_block_size)}{' (packed 4 to an int32)' if kind == X_SF_UE8M0 else ''}, "
            f"got {tuple(x_sf.shape)}"
        )
    if x_sf.device != data.device:
        raise ValueError(f"x[1] (the SF) must be on x[0]'s device {data.device}, got {x_sf.device}")
    return data, in_dtype, num_tokens, hidden, x_sf, (block_m, block_k)


def _general(
    x, fmt, num_per_channels, x_block_size, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic_cast, out
) -> QuantTensor:
    check_fmt(fmt, FMTS)
    check_num_per_channels(num_per_channels)
    _check_flags(round_sf, use_packed_ue8m0, use_e4m3_sf)
    stochastic_cast = bool(stochastic_cast)
    data_in, in_dtype, num_tokens, hidden, x_sf, block = _parse_x(x, x_block_size)
    num_groups = ceil_div(hidden, num_per_channels)
    sf_mode = _sf_mode(round_sf, use_packed_ue8m0, use_e4m3_sf)
    clamp = config.get_amax_clamp_for_quant(fmt, use_e4m3_sf)
    data, sf = split_out(out)
    if data is not None:
        _check_data_out(data, "out[0]", num_tokens, hidden, fmt, data_in)
    if sf is not None:
        _check_out_sf(sf, "out[1]", num_tokens, num_groups, sf_mode, data_in, col_major)

    if not data_in.is_cuda:  # the slow path: the reference builds the same layouts itself
        from tilebake.torch import cast

        result = cast(
            x, fmt, (1, num_per_channels), x_block_size, round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0,
            use_tma_aligned_col_major_sf=col_major, use_e4m3_sf=use_e4m3_sf, amax_clamp=clamp,
            stochastic_rounding=stochastic_cast,
        )  # fmt: skip
        return fill_out(result, data, sf)

    if data is None:
        data = _alloc_data(data_in, num_tokens, hidden, fmt)
    if sf is None:
        sf = _alloc_any_sf(data_in, num_tokens, num_groups, sf_mode, col_major)
    if num_tokens:
        _launch(
            data_in, in_dtype, x_sf, block, fmt, num_per_channels, data, sf, sf_mode, clamp, 1, hidden,
            int(stochastic_cast),
        )  # fmt: skip
    return data, sf


def _launch(
    data_in, in_dtype, x_sf, block, fmt, num_per_channels, data, sf, sf_mode, clamp, store_data, hidden, stochastic=0
):
    """One launch of build_runtime_sf's kernel, or of build_e2m1_rne's for a plain input rounded
    to nearest into e2m1; `data` may be None when store_data is 0; stochastic 1 rounds the data
    stochastically."""
    if in_dtype == "e2m1":
        if data_in.data_ptr() % 8:
            raise ValueError(f"x[0] must start at an 8-byte aligned address, got {data_in.data_ptr():#x}")
    else:
        check_aligned(data_in.data_ptr(), "x[0]" if x_sf is not None else "x")
    y_ptr, y_stride = 0, 0
    if data is not None:
        y_ptr, y_stride = data.data_ptr(), data.stride(0)
        if y_ptr % (8 if fmt == "e2m1" else 16):
            raise ValueError(
                f"out must start at a {8 if fmt == 'e2m1' else 16}-byte aligned address "
                f"(a view with a misaligned offset?), got {y_ptr:#x}"
            )
    sf_stride_t, sf_stride_g = _sf_strides(sf, sf_mode)
    num_tokens, x_ptr, sf_ptr = data_in.shape[0], data_in.data_ptr(), sf.data_ptr()
    key = variant_key(in_dtype, fmt, num_per_channels, sf_mode, store_data, stochastic)
    device, kernel = data_in.get_device(), _KERNELS[key]
    x_stride = data_in.stride(0)
    if key[3] == "rne":  # the common e2m1 case: a lean kernel without the runtime kernel's rarer options
        kernel(
            device, x_ptr, y_ptr, sf_ptr, sf_ptr, sf_ptr, clamp, sf_mode,
            num_tokens, hidden, x_stride, y_stride, sf_stride_t, sf_stride_g,
        )  # fmt: skip
    elif key[3] != "runtime":  # a hot kernel (per_token_cast launches it itself)
        kernel(device, x_ptr, y_ptr, sf_ptr, clamp, num_tokens, hidden, x_stride, y_stride, sf_stride_t, sf_stride_g)
    elif x_sf is None:
        kernel(
            device, x_ptr, y_ptr, sf_ptr, sf_ptr, sf_ptr, clamp, sf_mode, store_data, stochastic,
            num_tokens, hidden, x_stride, y_stride, sf_stride_t, sf_stride_g,
        )  # fmt: skip
    else:
        kind = _X_SF_KINDS[x_sf.dtype]
        x_sf_ptr = x_sf.data_ptr()
        x_sf_stride_t, x_sf_stride_g = sf_strides_for_kernel(x_sf, kind == X_SF_UE8M0)
        kernel(
            device, x_ptr, y_ptr, sf_ptr, sf_ptr, sf_ptr, clamp, sf_mode, store_data, stochastic,
            num_tokens, hidden, x_stride, y_stride, sf_stride_t, sf_stride_g,
            x_sf_ptr, x_sf_ptr, x_sf_ptr, kind, block[0], block[1], x_sf_stride_t, x_sf_stride_g,
        )  # fmt: skip


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
    check_fmt(fmt, FMTS)
    check_num_per_channels(num_per_channels)
    _check_flags(round_sf, use_packed_ue8m0, use_e4m3_sf)
    data_in, in_dtype, num_tokens, hidden, _, _ = _parse_plain_x(x, "per_token_cast_with_sf_only")
    num_groups = ceil_div(hidden, num_per_channels)
    sf_mode = _sf_mode(round_sf, use_packed_ue8m0, use_e4m3_sf)
    if out_sf is not None:  # the original takes none with use_tma_aligned_col_major_sf; here its layout
        _check_out_sf(out_sf, "out_sf", num_tokens, num_groups, sf_mode, data_in, use_tma_aligned_col_major_sf)
    clamp = config.get_amax_clamp_for_quant(fmt, use_e4m3_sf)
    if not data_in.is_cuda:
        from tilebake.torch import cast

        sf = cast(
            x, fmt, (1, num_per_channels), round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0,
            use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, use_e4m3_sf=use_e4m3_sf, amax_clamp=clamp,
        )[1]  # fmt: skip
        return sf if out_sf is None else out_sf.copy_(sf)
    sf = out_sf
    if sf is None:
        sf = _alloc_any_sf(data_in, num_tokens, num_groups, sf_mode, use_tma_aligned_col_major_sf)
    if num_tokens:
        _launch(data_in, in_dtype, None, None, fmt, num_per_channels, None, sf, sf_mode, clamp, 0, hidden)
    return sf


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
    check_fmt(fmt, FMTS)
    check_num_per_channels(num_per_channels)
    _check_flags(round_sf, use_packed_ue8m0, use_e4m3_sf)
    if use_tma_aligned_col_major_sf or use_packed_ue8m0:
        raise ValueError(
            "per_token_cast_with_precomputed_sf needs a row-major, non-packed fp32 sf: "
            "use_tma_aligned_col_major_sf and use_packed_ue8m0 must be False"
        )
    data_in, in_dtype, num_tokens, hidden, _, _ = _parse_plain_x(x, "per_token_cast_with_precomputed_sf")
    num_groups = ceil_div(hidden, num_per_channels)
    _check_any_sf(sf, "sf", num_tokens, num_groups, SF_PLAIN, data_in)
    if num_groups > 1 and num_tokens > 0 and sf.stride(1) != 1:
        raise ValueError(f"sf must be row-major (stride(1) == 1), got strides {sf.stride()}")
    if out is not None:
        _check_data_out(out, "out", num_tokens, hidden, fmt, data_in)
    if not data_in.is_cuda:
        from tilebake.torch.cast import cast_with_precomputed_sf

        data = cast_with_precomputed_sf(x, fmt, (1, num_per_channels), sf)
        return data if out is None else out.copy_(data)
    data = _alloc_data(data_in, num_tokens, hidden, fmt) if out is None else out
    if num_tokens:
        _launch(data_in, in_dtype, None, None, fmt, num_per_channels, data, sf, SF_PRECOMPUTED, 0.0, 1, hidden)
    return data


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it ---


def _op_impl(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0):
    data, sf = per_token_cast(
        x,
        "e4m3",
        num_per_channels,
        use_tma_aligned_col_major_sf=col_major_sf,
        round_sf=round_sf,
        use_packed_ue8m0=packed_ue8m0,
    )
    return data, sf


def _op_out_impl(x, num_per_channels, round_sf, packed_ue8m0, out_data, out_sf):
    per_token_cast(
        x, "e4m3", num_per_channels, round_sf=round_sf, use_packed_ue8m0=packed_ue8m0, out=(out_data, out_sf)
    )


# Shape functions as Meta kernels (what torch.compile's fake tensors run): registering
# them costs nothing at import, where register_fake spends ~2 ms each reading source.
def _meta(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0):
    num_tokens, hidden = x.shape
    data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    return data, alloc_sf(x, num_tokens, ceil_div(hidden, num_per_channels), packed_ue8m0, col_major_sf)


def _meta_out(x, num_per_channels, round_sf, packed_ue8m0, out_data, out_sf):
    return None


register(
    "per_token_cast(Tensor x, int num_per_channels, bool col_major_sf, bool round_sf, bool packed_ue8m0)"
    " -> (Tensor, Tensor)",
    _op_impl,
    _meta,
)
register(
    "per_token_cast_out(Tensor x, int num_per_channels, bool round_sf, bool packed_ue8m0,"
    " Tensor(a!) out_data, Tensor(b!) out_sf) -> ()",
    _op_out_impl,
    _meta_out,
)


def _compiled_path(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0, data, sf):
    """Traced: the functional op, or with any part of out= given, the missing part allocated (as
    eager mode lays it out) and both written by the mutating op."""
    if data is None and sf is None:
        return torch.ops.tilebake.per_token_cast(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0)
    num_tokens, hidden = x.shape
    if data is None:
        data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    if sf is None:
        sf = alloc_sf(x, num_tokens, ceil_div(hidden, num_per_channels), packed_ue8m0, col_major_sf)
    torch.ops.tilebake.per_token_cast_out(x, num_per_channels, round_sf, packed_ue8m0, data, sf)
    return data, sf
