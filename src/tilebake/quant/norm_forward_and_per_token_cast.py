"""norm_forward_and_per_token_cast: RMSNorm with an optional residual add, then a per-token FP8
e4m3 cast of the result (optionally its bf16 copy and the mega-MoE UE8M0 SF as well).

Validate, allocate, launch (kernels_tl/quant/norm_forward_and_per_token_cast.py; the checks and
the launch are norm_forward's); the reference (and the CPU path) is tilebake.torch.norm_forward_ref
followed by tilebake.torch.cast. A CUDA call whose key was seen before runs as one call plan
(quant/_norm_plans.py).
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
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.quant import _norm_plans
from tilebake.quant._common import (
    FLOAT_FORMATS,
    QuantTensor,
    alloc_sf,
    check_fmt,
    check_out_sf_layout,
    check_sf_options,
    col_major_rows,
    sf_layout,
    split_out,
)
from tilebake.quant.norm_forward import (
    _check_forward_inputs,
    _into,
    _launch_forward,
    _none_as_empty,
    check_out_like,
    check_pointers,
    forward_params,
    rows_strides,
)
from tilebake.utils import align

# norm_forward_and_per_token_cast's grid, per (dtype, has_residual): CTAs per SM of a persistent
# launch (min(rows, that x SMs) CTAs, CTA c taking rows c, c + num_ctas, ...: w * out_scale is
# computed once per CTA), or None for one CTA per row (measured faster with residual).
# kernels_tl/quant/norm_forward_and_per_token_cast.py builds with these as its minimum CTAs per
# SM (4 where None). norm_forward's kernel takes one CTA per row.
CAST_CTAS_PER_SM = {("bf16", False): 4, ("bf16", True): None, ("fp32", False): 4, ("fp32", True): 3}


@dataclasses.dataclass(frozen=True)
class NormForwardCastVariant(Variant):
    family = "quant"
    op = "norm_forward_and_per_token_cast"

    in_dtype: str  # 'bf16' | 'fp32'
    has_weight: bool
    has_residual: bool
    num_per_channels: int  # 32 | 128; SF layout (round, packed, column-major) is runtime

    @classmethod
    def all(cls):
        return tuple(cls(*k) for k in itertools.product(("bf16", "fp32"), (False, True), (False, True), (32, 128)))

    def params(self):
        return forward_params(self.has_weight, self.has_residual, quant=True)


@dataclasses.dataclass(frozen=True)
class NormForwardCastAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/norm_forward_and_per_token_cast.py): the
    norm and the (1, 32) e4m3 cast in one pass, contiguous rows of at most 8192 columns, a
    multiple of 128; eps, out_scale, has_weight, with_rstd and with_out_bf16 run-time arguments."""

    family = "quant"
    op = "norm_forward_and_per_token_cast"
    backend = "ascend"

    in_dtype: str  # 'bf16' | 'fp32'
    has_residual: bool
    sf_mode: str  # 'fp32' | 'round' (power-of-two fp32) | 'ue8m0' (bytes, two to an int16)
    num_vec_cores: int

    @classmethod
    def all(cls):
        keys = itertools.product(("bf16", "fp32"), (False, True), ("fp32", "round", "ue8m0"), ASCEND_VEC_CORES)
        return tuple(cls(*k) for k in keys)

    def params(self):
        buffers = ("X", "D", "S", "YB", "RSTD", "W", *(("R", "RO") if self.has_residual else ()))
        flags = i32("num_rows", "hidden", "has_weight", "with_rstd", "with_out_bf16")
        return ptr(*buffers) + f32("eps", "out_scale", "amax_clamp") + flags


_CAST_KERNELS = KernelTable(NormForwardCastVariant)
_CAST_PLANS = plan.cache()  # call plans by call key (_norm_plans.py builds them)


CAST_NUM_PER_CHANNELS = (32, 128)


def _alloc_sf_rows(x: torch.Tensor, num_groups: int, packed: bool, col_major: bool) -> torch.Tensor:
    """SF for a 2-D or 3-D x, per (batch) matrix as per_token_cast lays them out."""
    if x.dim() == 2:
        return alloc_sf(x, x.shape[0], num_groups, packed, col_major)
    batch, num_tokens = x.shape[:2]
    dtype, cols = sf_layout(num_groups, packed, x)
    if col_major:
        padded = col_major_rows(x, num_tokens, 4)
        return x.new_empty((batch, cols, padded), dtype=dtype).transpose(1, 2)[:, :num_tokens]
    return x.new_empty((batch, num_tokens, cols), dtype=dtype)


def _check_out(out, x: torch.Tensor, num_groups: int, packed: bool, col_major: bool):
    """out=: None or (data, sf), either part None (then allocated); the given parts checked."""
    data, sf = split_out(out)
    if data is not None:
        check_out_like(data, "out[0]", x, torch.float8_e4m3fn)
    if sf is not None:
        dtype, cols = sf_layout(num_groups, packed, x)
        check_out_sf_layout(sf, "out[1]", (*x.shape[:-1], cols), dtype, x, col_major)
    return data, sf


def _sf_strides3(sf: torch.Tensor, packed: bool) -> tuple[int, int, int]:
    """(batch, token, group-or-word) strides: elements for fp32 SF, bytes for packed UE8M0."""
    strides = sf.stride() if sf.dim() == 3 else (0, *sf.stride())
    return tuple(s * 4 for s in strides) if packed else tuple(strides)


def mega_moe_rows(num_tokens: int, block_m: int) -> torch.Tensor:
    """Row of each token in the mega MoE SF buffer: chunks of block_m tokens, each padded to a
    multiple of 128 rows; within each 128 rows, token i goes to row (i % 32) * 4 + i // 32."""
    t = torch.arange(num_tokens)
    i = t % block_m
    return t // block_m * align(block_m, 128) + i // 128 * 128 + i % 32 * 4 + i % 128 // 32


def _check_mega_moe_sf(mega_moe_sf, block_m, x: torch.Tensor, num_per_channels: int, round_sf: bool) -> int:
    """The mega MoE SF view's physical row count (its stride(1)); 0 without it."""
    if isinstance(block_m, bool) or not isinstance(block_m, int) or block_m < 0:
        raise ValueError(f"mega_moe_block_m must be an int >= 0, got {block_m!r}")
    if (mega_moe_sf is None) != (block_m == 0):
        raise ValueError(
            f"mega_moe_sf and mega_moe_block_m > 0 go together, got mega_moe_sf="
            f"{'None' if mega_moe_sf is None else 'a tensor'} and mega_moe_block_m={block_m}"
        )
    if mega_moe_sf is None:
        return 0
    if x.dim() != 2:
        raise ValueError(f"mega_moe_sf needs a 2-D x, got shape {tuple(x.shape)}")
    if num_per_channels != 32 or not round_sf:
        raise ValueError(
            f"mega_moe_sf needs num_per_channels=32 and round_sf=True, got {num_per_channels} and {round_sf}"
        )
    num_tokens, hidden = x.shape
    if hidden % 128:
        raise ValueError(f"mega_moe_sf needs hidden % 128 == 0, got {hidden}")
    if not isinstance(mega_moe_sf, torch.Tensor):
        raise TypeError(f"mega_moe_sf must be a torch.Tensor, got {type(mega_moe_sf).__name__}")
    if mega_moe_sf.dtype != torch.int32:
        raise TypeError(f"mega_moe_sf must be torch.int32, got {mega_moe_sf.dtype}")
    if mega_moe_sf.shape != (num_tokens, hidden // 128):
        raise ValueError(f"mega_moe_sf must have shape {(num_tokens, hidden // 128)}, got {tuple(mega_moe_sf.shape)}")
    if mega_moe_sf.device != x.device:
        raise ValueError(f"mega_moe_sf must be on {x.device} (as x), got {mega_moe_sf.device}")
    if num_tokens > 1 and mega_moe_sf.stride(0) != 1:
        raise ValueError(f"mega_moe_sf must be M-major (stride(0) == 1), got strides {mega_moe_sf.stride()}")
    rows = mega_moe_sf.stride(1)
    needed = -(-num_tokens // block_m) * align(block_m, 128)
    if rows < needed:
        raise ValueError(
            f"mega_moe_sf has {rows} rows (its stride(1)); {num_tokens} tokens in blocks of {block_m} need {needed}"
        )
    return rows


def norm_forward_and_per_token_cast(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    fmt: str,
    num_per_channels: int,
    residual: Optional[torch.Tensor] = None,
    out_scale: float = 1.0,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    with_out_bf16: bool = False,
    out: Optional[QuantTensor] = None,
    out_bf16: Optional[torch.Tensor] = None,
    residual_out: Optional[torch.Tensor] = None,
    mega_moe_sf: Optional[torch.Tensor] = None,
    mega_moe_block_m: int = 0,
    with_rstd: bool = False,
) -> tuple[QuantTensor, Optional[torch.Tensor], Optional[torch.Tensor], torch.Tensor]:
    """RMSNorm (as norm_forward), then a per-token FP8 e4m3 cast of the normalised output.

    The normalised output is rounded to x's dtype first, so the result equals per_token_cast
    of norm_forward's output, byte for byte.

    Args:
        x, weight, eps, residual, out_scale, residual_out, with_rstd: as norm_forward.
        fmt: 'e4m3'.
        num_per_channels: 32 or 128; hidden must be a multiple of it.
        use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0: SF layout, as per_token_cast
            (for a 3-D x, per batch matrix).
        with_out_bf16: also return the normalised output as bf16.
        out: optional preallocated (data e4m3 like x, sf of shape x.shape[:-1] + (cols,)); either
            part may be None (then allocated). sf at any strides, or with
            use_tma_aligned_col_major_sf the column-major layout it returns (per batch matrix).
            The given tensors are returned themselves.
        out_bf16: optional bf16 buffer like x for the normalised output (needs with_out_bf16).
        mega_moe_sf: optional int32 (num_tokens, hidden // 128) M-major view (stride(0) == 1) of
            a mega MoE kernel's shared activation SF buffer, which also receives the UE8M0 SF
            bytes (4 groups of 32 to a word): tokens are split into chunks of mega_moe_block_m,
            each padded to a multiple of 128 rows, and in every 128 rows token i is stored at
            row (i % 32) * 4 + i // 32 (see mega_moe_rows). Padding rows are not written.
            Needs a 2-D x, num_per_channels == 32, round_sf and hidden % 128 == 0.
        mega_moe_block_m: the mega MoE kernel's token block, > 0 exactly when mega_moe_sf is given.

    Returns:
        ((data, sf), out_bf16 or None, rstd or None, norm_input). CPU tensors take the
        reference path (same bytes).
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _CAST_PLANS[x.dtype, x.ndim, weight is None, eps, eps.__class__, fmt, num_per_channels, residual is None,
                               out_scale, out_scale.__class__, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                               with_out_bf16, out is None, out_bf16 is None, residual_out is None, mega_moe_sf is None,
                               mega_moe_block_m, mega_moe_block_m.__class__, with_rstd]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, weight, residual, out, out_bf16, residual_out, mega_moe_sf)
            if result is not NotImplemented:
                return result
    eps_arg, out_scale_arg = eps, out_scale  # as passed: the plan key's
    check_fmt(fmt, ("e4m3",))
    if num_per_channels not in CAST_NUM_PER_CHANNELS or isinstance(num_per_channels, bool):
        raise ValueError(f"num_per_channels must be one of {CAST_NUM_PER_CHANNELS}, got {num_per_channels!r}")
    check_sf_options(round_sf, use_packed_ue8m0)
    eps, out_scale = _check_forward_inputs(x, weight, eps, residual, out_scale, residual_out, 16)
    hidden = x.shape[-1]
    if hidden % num_per_channels:
        raise ValueError(
            f"x.shape[-1] (hidden) must be a multiple of num_per_channels={num_per_channels}, got {hidden}"
        )
    if out_bf16 is not None and not with_out_bf16:
        raise ValueError("out_bf16 is given but with_out_bf16=False; pass with_out_bf16=True to fill it")
    if out_bf16 is not None:
        check_out_like(out_bf16, "out_bf16", x, torch.bfloat16)
    num_groups = hidden // num_per_channels
    mega_rows = _check_mega_moe_sf(mega_moe_sf, mega_moe_block_m, x, num_per_channels, round_sf)
    data, sf = _check_out(out, x, num_groups, use_packed_ue8m0, use_tma_aligned_col_major_sf)
    if torch.compiler.is_compiling():
        new_data, new_sf, y_bf16, rstd, norm_input = torch.ops.tilebake.norm_forward_and_per_token_cast(
            x, weight, eps, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf, round_sf,
            use_packed_ue8m0, with_out_bf16, with_rstd, mega_moe_sf, mega_moe_block_m,
        )  # fmt: skip
        return (
            (_into(data, new_data), _into(sf, new_sf)),
            _into(out_bf16, y_bf16) if with_out_bf16 else None,
            rstd if with_rstd else None,
            x if residual is None else _into(residual_out, norm_input),
        )
    npu_applies = num_per_channels == 32 and not use_tma_aligned_col_major_sf and mega_moe_sf is None
    if x.device.type == "npu" and npu_applies:  # the Ascend kernels where they apply; given outputs filled after
        from tilebake.quant import _norm_forward_ascend

        result = _norm_forward_ascend.norm_forward_and_per_token_cast(
            x, weight, eps, residual, out_scale, round_sf, use_packed_ue8m0, with_out_bf16, with_rstd
        )
        if result is not None:
            (new_data, new_sf), y_bf16, rstd, norm_input = result
            return (
                (_into(data, new_data), _into(sf, new_sf)),
                _into(out_bf16, y_bf16) if with_out_bf16 else None,
                rstd,
                x if residual is None else _into(residual_out, norm_input),
            )
    plan_key = (x.dtype, x.ndim, weight is None, eps_arg, eps_arg.__class__, fmt, num_per_channels, residual is None,
                out_scale_arg, out_scale_arg.__class__, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                with_out_bf16, out is None, out_bf16 is None, residual_out is None, mega_moe_sf is None,
                mega_moe_block_m, mega_moe_block_m.__class__, with_rstd)  # fmt: skip
    # what the kernel writes of the caller's tensors, and whether a plan takes this call's out=
    given = (data, sf, out_bf16, residual_out if residual is not None else None, mega_moe_sf)
    plan_out = out is None or (data is not None and sf is not None)
    given_bf16, given_ro = out_bf16 is not None, residual is not None and residual_out is not None
    if data is None:
        data = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
    if sf is None:
        sf = _alloc_sf_rows(x, num_groups, use_packed_ue8m0, use_tma_aligned_col_major_sf)
    if with_out_bf16 and out_bf16 is None:
        out_bf16 = x.new_empty(x.shape, dtype=torch.bfloat16)
    amax_clamp = config.get_amax_clamp_for_quant("e4m3", False)

    if not x.is_cuda:  # the slow path: the references, written into the same layouts
        from tilebake.torch import cast
        from tilebake.torch.norm import norm_forward_ref

        y, rstd, norm_input = norm_forward_ref(x, weight, eps, residual, out_scale)
        for b, (y_b, data_b, sf_b) in enumerate(zip(*(t if x.dim() == 3 else t.unsqueeze(0) for t in (y, data, sf)))):
            q, s = cast(y_b, "e4m3", (1, num_per_channels), round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0,
                        amax_clamp=amax_clamp)  # fmt: skip
            data_b.copy_(q)
            sf_b.copy_(s)
        if out_bf16 is not None:
            out_bf16.copy_(y)
        if mega_moe_sf is not None:
            words = cast(y, "e4m3", (1, 32), round_sf=True, use_packed_ue8m0=True, amax_clamp=amax_clamp)[1]
            rows = mega_moe_rows(x.shape[0], mega_moe_block_m)
            mega_moe_sf.as_strided((mega_rows, words.shape[1]), (1, mega_rows))[rows] = words
        if residual is not None and residual_out is not None:
            norm_input = residual_out.copy_(norm_input)
        return (data, sf), out_bf16, (rstd if with_rstd else None), norm_input

    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if with_rstd else None
    if out_bf16 is not None:
        check_pointers(out_bf16=out_bf16)
        ob_bs, ob_rs = rows_strides(out_bf16)
    else:
        ob_bs = ob_rs = 0
    sf_bs, sf_ts, sf_gs = _sf_strides3(sf, use_packed_ue8m0)
    rows = x.numel() // x.shape[-1]
    per_sm = CAST_CTAS_PER_SM[FLOAT_FORMATS[x.dtype], residual is not None]
    _launch_forward(
        _CAST_KERNELS, x, weight, eps, residual, out_scale, data, residual_out, rstd,
        key_extra=(num_per_channels,), num_ctas=rows if per_sm is None else min(rows, per_sm * config.get_num_sms()),
        YB=(out_bf16 if out_bf16 is not None else x).data_ptr(), S=sf.data_ptr(), SP=sf.data_ptr(),
        amax_clamp=amax_clamp, round_sf=int(bool(round_sf)), packed=int(bool(use_packed_ue8m0)),
        with_out_bf16=int(out_bf16 is not None), out_bf16_batch_stride=ob_bs, out_bf16_stride=ob_rs,
        sf_batch_stride=sf_bs, sf_stride_t=sf_ts, sf_stride_g=sf_gs,
        MM=(mega_moe_sf if mega_moe_sf is not None else sf).data_ptr(), mm_rows=mega_rows,
        mega_block_m=mega_moe_block_m, mega_aligned_block_m=align(mega_moe_block_m, 128),
    )  # fmt: skip
    plan.bump(*given)
    # A plan for out=None and out= fully given; with either part None, the Python path.
    if x.numel() and plan_out:
        key = (FLOAT_FORMATS[x.dtype], weight is not None, residual is not None, num_per_channels)
        plan.remember(
            _CAST_PLANS, plan_key, _norm_plans.cast_plan, _CAST_KERNELS[key], x.get_device(), x.dtype, x.dim(),
            *key[1:3], eps, out_scale, num_per_channels, bool(use_tma_aligned_col_major_sf), bool(round_sf),
            bool(use_packed_ue8m0), bool(with_out_bf16), out is not None, given_bf16, given_ro,
            mega_moe_block_m, bool(with_rstd), amax_clamp, config.get_num_sms(),
        )  # fmt: skip
    return (data, sf), out_bf16, rstd, (x if residual is None else residual_out)


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it (see
# norm_forward.py: outputs a caller passes are filled by a copy; outputs a call does not produce
# are empty tensors in the schema) ---


def _cast_impl(
    x, weight, eps, npc, residual, out_scale, col_major, round_sf, packed, with_bf16, with_rstd, mega, mega_m
):
    (data, sf), y_bf16, rstd, norm_input = norm_forward_and_per_token_cast(
        x, weight, eps, "e4m3", npc, residual, out_scale, col_major, round_sf, packed, with_bf16,
        mega_moe_sf=mega, mega_moe_block_m=mega_m, with_rstd=with_rstd,
    )  # fmt: skip
    norm_input = norm_input if residual is not None else x.new_empty(0)
    return data, sf, _none_as_empty(y_bf16, x), _none_as_empty(rstd, x), norm_input


def _cast_meta(
    x, weight, eps, npc, residual, out_scale, col_major, round_sf, packed, with_bf16, with_rstd, mega, mega_m
):
    data = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
    sf = _alloc_sf_rows(x, x.shape[-1] // npc, packed, col_major)
    y_bf16 = x.new_empty(x.shape, dtype=torch.bfloat16) if with_bf16 else x.new_empty(0)
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if with_rstd else x.new_empty(0)
    norm_input = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else x.new_empty(0)
    return data, sf, y_bf16, rstd, norm_input


# Meta kernels rather than register_fake: free at import (see per_token_cast.py).
register(
    "norm_forward_and_per_token_cast(Tensor x, Tensor? weight, float eps, int num_per_channels, Tensor? residual,"
    " float out_scale, bool col_major_sf, bool round_sf, bool packed_ue8m0, bool with_out_bf16, bool with_rstd,"
    " Tensor(a!)? mega_moe_sf, int mega_moe_block_m) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _cast_impl,
    _cast_meta,
)
