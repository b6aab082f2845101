"""per_token_cast off its hot path: e2m1 output, e4m3 SF, stochastic rounding, quantized
inputs, SF only, a given SF: the argument checks and layouts, and the launches of the 'rne' and
'runtime' kernels (per_token_cast.py declares them and holds the public functions)."""

from __future__ import annotations

import torch

from tilebake import config, utils
from tilebake._runtime import plan
from tilebake.quant import _cast_plans as plans
from tilebake.quant._common import (
    FLOAT_FORMATS,
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
    col_major_rows,
    fill_out,
    sf_layout,
    sf_strides_for_kernel,
    split_out,
)
from tilebake.utils import ceil_div

FMTS = ("e4m3", "e2m1")

# One kernel per (input, fmt, npc) takes the SF mode and the input SF's storage as arguments
# (kernels_tl/quant/per_token_cast.py build_runtime_sf; the codes below are its constants, which
# it imports from per_token_cast).

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


def _sf_dtype_and_cols(num_groups: int, sf_mode: int, like) -> tuple[torch.dtype, int]:
    if sf_mode == SF_E4M3:
        return torch.float8_e4m3fn, num_groups
    return sf_layout(num_groups, sf_mode == SF_UE8M0, like)


def _alloc_any_sf(like, num_tokens: int, num_groups: int, sf_mode: int, col_major: bool) -> torch.Tensor:
    if sf_mode != SF_E4M3:
        return alloc_sf(like, num_tokens, num_groups, sf_mode == SF_UE8M0, col_major)
    if col_major:
        padded = col_major_rows(like, num_tokens, 1)
        return like.new_empty_strided((padded, num_groups), (1, padded), dtype=torch.float8_e4m3fn)[:num_tokens]
    return like.new_empty((num_tokens, num_groups), dtype=torch.float8_e4m3fn)


def _check_any_sf(sf, name: str, num_tokens: int, num_groups: int, sf_mode: int, like) -> None:
    dtype, cols = _sf_dtype_and_cols(num_groups, sf_mode, like)
    if not (
        isinstance(sf, torch.Tensor)
        and sf.dtype == dtype
        and sf.shape == (num_tokens, cols)
        and sf.device == like.device  # not get_device(): it is -1 on the CPU and on meta alike
    ):
        _explain_tensor(sf, name, (num_tokens, cols), dtype, like)


def _check_out_sf(sf, name: str, num_tokens: int, num_groups: int, sf_mode: int, like, col_major: bool) -> None:
    dtype, cols = _sf_dtype_and_cols(num_groups, sf_mode, like)
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
    packed, per_word = utils.ue8m0_word(data.device)  # int32 of 4 bytes; on an NPU int16 of 2
    kind = {torch.float32: X_SF_FP32, packed: X_SF_UE8M0, torch.float8_e4m3fn: X_SF_E4M3}.get(x_sf.dtype)
    if kind is None:
        raise TypeError(f"x[1] (the SF) must be float32, {packed} (packed UE8M0) or float8_e4m3fn, got {x_sf.dtype}")
    sf_rows, sf_cols = ceil_div(num_tokens, block_m), ceil_div(hidden, block_k)
    if kind == X_SF_UE8M0:
        sf_cols = ceil_div(sf_cols, per_word)
    if x_sf.shape != (sf_rows, sf_cols):
        raise ValueError(
            f"x[1] (the SF) must have shape {(sf_rows, sf_cols)} for T={num_tokens}, H={hidden}, "
            f"x_block_size={tuple(x_block_size)}{f' (packed {per_word} to an {str(packed)[6:]})' if kind == X_SF_UE8M0 else ''}, "
            f"got {tuple(x_sf.shape)}"
        )
    if x_sf.device != data.device:
        raise ValueError(f"x[1] (the SF) must be on x[0]'s device {data.device}, got {x_sf.device}")
    return data, in_dtype, num_tokens, hidden, x_sf, (block_m, block_k)


def general(
    kernels, plans_cache, x, fmt, num_per_channels, x_block_size, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf,
    stochastic_cast, out,
) -> QuantTensor:  # fmt: skip
    """per_token_cast off its hot path (kernels: its KernelTable; plans_cache: its plans)."""
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

    given = out is not None and data is not None and sf is not None
    if data is None:
        data = _alloc_data(data_in, num_tokens, hidden, fmt)
    if sf is None:
        sf = _alloc_any_sf(data_in, num_tokens, num_groups, sf_mode, col_major)
    if num_tokens:
        launch(
            kernels, data_in, in_dtype, x_sf, block, fmt, num_per_channels, data, sf, sf_mode, clamp, 1, hidden,
            int(stochastic_cast),
        )  # fmt: skip
        if out is not None:  # written in place, as by torch's out= ops
            plan.bump(*out)
        if x_sf is None and (out is None or given):  # a plain input (the fast path's key reads x.dtype)
            plan_key = (x.dtype, fmt, num_per_channels, None, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf,
                        stochastic_cast, out is None)  # fmt: skip
            kernel = kernels[variant_key(in_dtype, fmt, num_per_channels, sf_mode, 1, int(stochastic_cast))]
            plan.remember(
                plans_cache, plan_key, plans.per_token_plan, kernel, x.get_device(), x.dtype, fmt, num_per_channels,
                sf.dtype, sf_mode == SF_UE8M0, col_major, given, clamp, plans.CAST, sf_mode, int(stochastic_cast),
            )  # fmt: skip
    return data, sf


def launch(
    kernels, data_in, in_dtype, x_sf, block, fmt, num_per_channels, data, sf, sf_mode, clamp, store_data, hidden,
    stochastic=0,
):  # fmt: skip
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
    device, kernel = data_in.get_device(), kernels[key]
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
