"""per_token_cast_with_sf_only and per_token_cast_with_precomputed_sf past their native path: the
checks, the NPU and CPU paths, the allocation, the 'runtime' kernel's launch and the plan it
leaves. Apart from per_token_cast.py (which holds the public functions, the kernel table and the
plan caches, passed in here) as _per_token_cast_general.py is: neither is per_token_cast's hot path.
"""

from __future__ import annotations

import torch

from tilebake import config
from tilebake._runtime import plan
from tilebake.quant import _cast_plans as plans
from tilebake.quant._common import check_fmt, check_num_per_channels
from tilebake.quant._per_token_cast_general import (
    FMTS,
    SF_PLAIN,
    SF_PRECOMPUTED,
    SF_UE8M0,
    _alloc_any_sf,
    _alloc_data,
    _check_any_sf,
    _check_data_out,
    _check_flags,
    _check_out_sf,
    _parse_plain_x,
    _sf_mode,
    launch,
    variant_key,
)
from tilebake.utils import ceil_div


def sf_only(
    kernels, plans_cache, x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
    use_e4m3_sf, out_sf,
) -> torch.Tensor:  # fmt: skip
    """per_token_cast_with_sf_only off its native path (kernels: per_token_cast's KernelTable;
    plans_cache: the function's plans)."""
    check_fmt(fmt, FMTS)
    check_num_per_channels(num_per_channels)
    _check_flags(round_sf, use_packed_ue8m0, use_e4m3_sf)
    data_in, in_dtype, num_tokens, hidden, _, _ = _parse_plain_x(x, "per_token_cast_with_sf_only")
    num_groups = ceil_div(hidden, num_per_channels)
    sf_mode = _sf_mode(round_sf, use_packed_ue8m0, use_e4m3_sf)
    if out_sf is not None:  # the original takes none with use_tma_aligned_col_major_sf; here its layout
        _check_out_sf(out_sf, "out_sf", num_tokens, num_groups, sf_mode, data_in, use_tma_aligned_col_major_sf)
    clamp = config.get_amax_clamp_for_quant(fmt, use_e4m3_sf)
    if data_in.device.type == "npu" and fmt == "e4m3" and not use_e4m3_sf:
        from tilebake.quant import _per_token_cast_ascend  # the Ascend kernels where they apply

        result = _per_token_cast_ascend.per_token_cast(
            data_in, num_per_channels, round_sf, use_packed_ue8m0, use_tma_aligned_col_major_sf, False
        )
        if result is not None:
            return result[1] if out_sf is None else out_sf.copy_(result[1])
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
        launch(kernels, data_in, in_dtype, None, None, fmt, num_per_channels, None, sf, sf_mode, clamp, 0, hidden)
        if out_sf is not None:
            plan.bump(out_sf)
        plan_key = (x.dtype, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                    use_e4m3_sf, out_sf is None)  # fmt: skip
        kernel = kernels[variant_key(in_dtype, fmt, num_per_channels, sf_mode, 0, 0)]
        plan.remember(
            plans_cache, plan_key, plans.per_token_plan, kernel, x.get_device(), x.dtype, fmt, num_per_channels,
            sf.dtype, sf_mode == SF_UE8M0, use_tma_aligned_col_major_sf, out_sf is not None, clamp, plans.SF_ONLY,
            sf_mode,
        )  # fmt: skip
    return sf


def with_precomputed_sf(
    kernels, plans_cache, x, fmt, num_per_channels, sf, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
    use_e4m3_sf, out,
) -> torch.Tensor:  # fmt: skip
    """per_token_cast_with_precomputed_sf off its native path (kernels: per_token_cast's
    KernelTable; plans_cache: the function's plans)."""
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
    if data_in.device.type == "npu" and out is None and fmt == "e4m3":  # the Ascend kernel where it applies
        from tilebake.quant import _per_token_cast_ascend

        data = _per_token_cast_ascend.with_precomputed_sf(data_in, num_per_channels, sf)
        if data is not None:
            return data
    if not data_in.is_cuda:
        from tilebake.torch.cast import cast_with_precomputed_sf

        data = cast_with_precomputed_sf(x, fmt, (1, num_per_channels), sf)
        return data if out is None else out.copy_(data)
    data = _alloc_data(data_in, num_tokens, hidden, fmt) if out is None else out
    if num_tokens:
        launch(kernels, data_in, in_dtype, None, None, fmt, num_per_channels, data, sf, SF_PRECOMPUTED, 0.0, 1, hidden)
        if out is not None:
            plan.bump(out)
        plan_key = (x.dtype, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                    use_e4m3_sf, out is None)  # fmt: skip
        kernel = kernels[variant_key(in_dtype, fmt, num_per_channels, SF_PRECOMPUTED, 1, 0)]
        plan.remember(
            plans_cache, plan_key, plans.per_token_plan, kernel, x.get_device(), x.dtype, fmt,
            num_per_channels, torch.float32, False, False, out is not None, 0.0, plans.PRECOMPUTED, SF_PRECOMPUTED,
        )  # fmt: skip
    return data
