"""norm_forward and norm_forward_and_per_token_cast: RMSNorm with an optional residual add,
optionally followed by a per-token FP8 e4m3 cast.

Validate, allocate, launch. One TileLang factory (kernels_tl/quant/norm_forward.py) serves
both ops; the reference (and the CPU path) is tilebake.torch.norm_forward_ref, followed by
tilebake.torch.cast for the quantised op. A CUDA call whose key was seen before runs as one
call plan (validate, allocate, launch in C; quant/_norm_plans.py builds them).
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
from tilebake.quant._common import (
    FLOAT_FORMATS,
    QuantTensor,
    alloc_sf,
    check_aligned,
    check_fmt,
    check_no_overlap,
    check_out_sf_layout,
    check_sf_options,
    sf_layout,
    split_out,
)
from tilebake.quant import _norm_plans
from tilebake.utils import align


@dataclasses.dataclass(frozen=True)
class NormForwardVariant(Variant):
    family = "quant"
    op = "norm_forward"

    in_dtype: str  # 'bf16' | 'fp32'
    has_weight: bool
    has_residual: bool

    @classmethod
    def all(cls):
        return tuple(cls(*k) for k in itertools.product(("bf16", "fp32"), (False, True), (False, True)))

    def params(self):
        return forward_params(self.has_weight, self.has_residual, quant=False)


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
class NormForwardAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/norm_forward.py): contiguous rows of at
    most MAX_HIDDEN columns, a multiple of 128; eps, out_scale and with_rstd run-time arguments."""

    family = "quant"
    op = "norm_forward"
    backend = "ascend"

    in_dtype: str  # 'bf16' | 'fp32'
    has_weight: bool
    has_residual: bool
    num_vec_cores: int

    @classmethod
    def all(cls):
        keys = itertools.product(("bf16", "fp32"), (False, True), (False, True), ASCEND_VEC_CORES)
        return tuple(cls(*k) for k in keys)

    def params(self):
        buffers = ("X", "Y", "RSTD", *(("W",) if self.has_weight else ()), *(("R", "RO") if self.has_residual else ()))
        return ptr(*buffers) + f32("eps", "out_scale") + i32("num_rows", "hidden", "with_rstd")


# --- argument checks shared with norm_backward ---

MAX_HIDDEN = 8192

# norm_forward_and_per_token_cast's grid, per (dtype, has_residual): CTAs per SM of a persistent
# launch (min(rows, that x SMs) CTAs, CTA c taking rows c, c + num_ctas, ...: w * out_scale is
# computed once per CTA), or None for one CTA per row (measured faster with residual).
# kernels_tl/quant/norm_forward_and_per_token_cast.py builds with these as its minimum CTAs per
# SM (4 where None). norm_forward's kernel takes one CTA per row.
CAST_CTAS_PER_SM = {("bf16", False): 4, ("bf16", True): None, ("fp32", False): 4, ("fp32", True): 3}


def check_norm_rows(x, name: str, hidden_multiple: int, dims=(2, 3)) -> None:
    """x: a bf16/fp32 tensor of `dims` dims, 0 < hidden <= 8192 and a multiple of hidden_multiple,
    last dim contiguous, every other stride 16-byte aligned (the kernels read whole 16-byte vectors)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_FORMATS:
        raise TypeError(f"{name} must be bfloat16 or float32, got {x.dtype}")
    if x.dim() not in dims:
        shapes = " or ".join({2: "(num_tokens, hidden)", 3: "(batch, num_tokens, hidden)"}[d] for d in dims)
        raise ValueError(f"{name} must be {shapes}, got shape {tuple(x.shape)}")
    check_rows_like(x, name, x.shape[-1], hidden_multiple)


def check_rows_like(t, name: str, hidden: int, hidden_multiple: int = 1) -> None:
    if not 0 < hidden <= MAX_HIDDEN or hidden % hidden_multiple:
        raise ValueError(
            f"{name}.shape[-1] (hidden) must be a multiple of {hidden_multiple} in [1, {MAX_HIDDEN}], got {hidden}"
        )
    if t.device.type not in ("cuda", "cpu", "npu"):
        raise ValueError(f"{name} must be on a CUDA device, an NPU or the CPU, got {t.device}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")
    for size, stride in zip(t.shape[:-1], t.stride()[:-1]):
        if size > 1 and (stride * t.element_size()) % 16:
            raise ValueError(
                f"{name}'s row and batch strides must be multiples of 16 bytes, "
                f"got strides {t.stride()} of {t.element_size()}-byte elements"
            )


def check_like(t, name: str, x: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """An extra input or preallocated output with x's shape (and dtype unless given), on x's
    device, rows as the kernels read them."""
    dtype = dtype or x.dtype
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.shape != x.shape:
        raise ValueError(f"{name} must have shape {tuple(x.shape)} (as x), got {tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(f"{name} must be on {x.device} (as x), got {t.device}")
    check_rows_like(t, name, t.shape[-1])


def check_out_like(t, name: str, x: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """A preallocated output like x (check_like) that the kernels can write: no self-overlap."""
    check_like(t, name, x, dtype)
    check_no_overlap(t, name)


def check_weight(weight, x: torch.Tensor, name: str = "weight") -> None:
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(weight).__name__}")
    if weight.dtype != x.dtype:
        raise TypeError(f"{name} must have x's dtype {x.dtype}, got {weight.dtype}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"{name} must have shape ({x.shape[-1]},) (x's hidden), got {tuple(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"{name} must be on {x.device} (as x), got {weight.device}")
    if weight.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {weight.stride()}")


def check_float(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")
    return float(value)


def rows_strides(t: torch.Tensor) -> tuple[int, int]:
    """(batch stride, row stride) in elements of a 2-D or 3-D tensor as the kernels take them;
    0 for a dim of size 1 (never stepped over, and then trivially aligned)."""
    if t.dim() == 2:
        return 0, t.stride(0) if t.shape[0] > 1 else 0
    return (t.stride(0) if t.shape[0] > 1 else 0), (t.stride(1) if t.shape[1] > 1 else 0)


def check_pointers(**tensors) -> None:
    """Kernels read and write whole 16-byte vectors from each tensor's start."""
    for name, t in tensors.items():
        if t is not None:
            check_aligned(t.data_ptr(), name)


# --- norm_forward ---


def forward_params(has_weight: bool, has_residual: bool, quant: bool):
    """The parameters the compiled kernel keeps (the lowering drops unused buffers and dims)."""
    params = ptr("X", "Y", "RSTD") + f32("eps", "out_scale") + i32("with_rstd", "batch", "num_tokens", "hidden")
    params += i32("x_batch_stride", "x_stride", "out_batch_stride", "out_stride")
    if has_weight:
        params += ptr("W")
    if has_residual:
        params += ptr("R", "RO")
        params += i32("residual_batch_stride", "residual_stride", "residual_out_batch_stride", "residual_out_stride")
    if quant:
        params += i32("num_ctas") + ptr("YB", "S", "SP") + f32("amax_clamp")
        params += i32("round_sf", "packed", "with_out_bf16", "out_bf16_batch_stride", "out_bf16_stride")
        params += i32("sf_batch_stride", "sf_stride_t", "sf_stride_g")
        params += ptr("MM") + i32("mm_rows", "mega_block_m", "mega_aligned_block_m")
    return params


_FORWARD_KERNELS = KernelTable(NormForwardVariant)
_CAST_KERNELS = KernelTable(NormForwardCastVariant)
# Call plans by call key (_norm_plans.py builds them; plan.remember keeps at most plan.MAX_PLANS an op).
_FORWARD_PLANS = plan.cache()
_CAST_PLANS = plan.cache()


def _check_forward_inputs(x, weight, eps, residual, out_scale, residual_out, hidden_multiple):
    check_norm_rows(x, "x", hidden_multiple)
    check_weight(weight, x)
    eps = check_float(eps, "eps")
    out_scale = check_float(out_scale, "out_scale")
    if residual is not None:
        check_like(residual, "residual", x)
        if residual_out is not None:
            check_out_like(residual_out, "residual_out", x)
    return eps, out_scale


def _launch_forward(table, x, weight, eps, residual, out_scale, out, residual_out, rstd, **quant_args) -> None:
    """Launch over batch * num_tokens rows (norm_forward: one CTA per row; the cast: CAST_CTAS_PER_SM);
    nothing to do for an empty x."""
    batch, num_tokens = (1, *x.shape[:1]) if x.dim() == 2 else x.shape[:2]
    if batch * num_tokens == 0:
        return
    if table is _CAST_KERNELS:
        per_sm = CAST_CTAS_PER_SM[FLOAT_FORMATS[x.dtype], residual is not None]
        rows = batch * num_tokens
        quant_args["num_ctas"] = rows if per_sm is None else min(rows, per_sm * config.get_num_sms())
    check_pointers(x=x, weight=weight, residual=residual, residual_out=residual_out, out=out)
    key = (FLOAT_FORMATS[x.dtype], weight is not None, residual is not None, *quant_args.pop("key_extra", ()))
    x_bs, x_rs = rows_strides(x)
    o_bs, o_rs = rows_strides(out)
    args = dict(
        X=x.data_ptr(), Y=out.data_ptr(), RSTD=(rstd if rstd is not None else x).data_ptr(),
        eps=eps, out_scale=out_scale, with_rstd=int(rstd is not None),
        batch=batch, num_tokens=num_tokens, hidden=x.shape[-1],
        x_batch_stride=x_bs, x_stride=x_rs, out_batch_stride=o_bs, out_stride=o_rs,
        W=weight.data_ptr() if weight is not None else 0,
    )  # fmt: skip
    if residual is not None:
        r_bs, r_rs = rows_strides(residual)
        ro_bs, ro_rs = rows_strides(residual_out)
        args.update(
            R=residual.data_ptr(), RO=residual_out.data_ptr(), residual_batch_stride=r_bs, residual_stride=r_rs,
            residual_out_batch_stride=ro_bs, residual_out_stride=ro_rs,
        )  # fmt: skip
    args.update(quant_args)
    kernel = table[key]
    kernel(x.get_device(), *[args[name] for name in kernel.arg_names])


def norm_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    residual: Optional[torch.Tensor] = None,
    out_scale: float = 1.0,
    out: Optional[torch.Tensor] = None,
    residual_out: Optional[torch.Tensor] = None,
    with_rstd: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """RMSNorm over the last dim, with an optional residual add.

    Args:
        x: (num_tokens, hidden) or (batch, num_tokens, hidden), bf16 or fp32; last dim
            contiguous, other strides multiples of 16 bytes; hidden a multiple of 16, <= 8192.
        weight: (hidden,) in x's dtype, or None (unit weight).
        eps: added to the mean square before the reciprocal square root.
        residual: optional, like x (same shape and dtype); norm_input = x + residual,
            rounded to x's dtype, is what is normalised.
        out_scale: fp32 multiplier applied to the weight.
        out: optional preallocated output like x.
        residual_out: optional buffer for norm_input (used only with residual).
        with_rstd: also return rstd = 1 / sqrt(mean(norm_input^2) + eps).

    Returns:
        (out in x's dtype, rstd fp32 of shape x.shape[:-1] or None, norm_input); without
        residual norm_input is x itself. CPU tensors take the reference path.
    """
    # The native path: a call whose key has been seen runs as one plan; NotImplemented: go on below.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _FORWARD_PLANS[x.dtype, x.ndim, weight is None, eps, eps.__class__, residual is None, out_scale,
                                  out_scale.__class__, out is None, residual_out is None, with_rstd]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, weight, residual, out, residual_out)
            if result is not NotImplemented:
                return result
    eps_arg, out_scale_arg = eps, out_scale  # as passed: the plan key's
    eps, out_scale = _check_forward_inputs(x, weight, eps, residual, out_scale, residual_out, 16)
    if out is not None:
        check_out_like(out, "out", x)
    if torch.compiler.is_compiling():
        y, rstd, norm_input = torch.ops.tilebake.norm_forward(x, weight, eps, residual, out_scale, with_rstd)
        return (
            _into(out, y),
            (rstd if with_rstd else None),
            (x if residual is None else _into(residual_out, norm_input)),
        )
    if x.device.type == "npu" and out is None and residual_out is None:  # the Ascend kernels where they apply
        from tilebake.quant import _norm_forward_ascend

        result = _norm_forward_ascend.norm_forward(x, weight, eps, residual, out_scale, with_rstd)
        if result is not None:
            return result
    if not x.is_cuda:
        from tilebake.torch.norm import norm_forward_ref

        y, rstd, norm_input = norm_forward_ref(x, weight, eps, residual, out_scale)
        if out is not None:
            y = out.copy_(y)
        if residual is not None and residual_out is not None:
            norm_input = residual_out.copy_(norm_input)
        return y, (rstd if with_rstd else None), norm_input

    plan_key = (x.dtype, x.ndim, weight is None, eps_arg, eps_arg.__class__, residual is None, out_scale_arg,
                out_scale_arg.__class__, out is None, residual_out is None, with_rstd)  # fmt: skip
    given_out, given_ro = out is not None, residual is not None and residual_out is not None
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if with_rstd else None
    _launch_forward(_FORWARD_KERNELS, x, weight, eps, residual, out_scale, out, residual_out, rstd)
    plan.bump(out if given_out else None, residual_out if given_ro else None)
    if x.numel():
        key = (FLOAT_FORMATS[x.dtype], weight is not None, residual is not None)
        plan.remember(
            _FORWARD_PLANS, plan_key, _norm_plans.forward_plan, _FORWARD_KERNELS[key], x.get_device(), x.dtype,
            x.dim(), *key[1:], eps, out_scale, given_out, given_ro, bool(with_rstd),
        )  # fmt: skip
    return out, rstd, (x if residual is None else residual_out)


# --- norm_forward_and_per_token_cast ---

CAST_NUM_PER_CHANNELS = (32, 128)


def _alloc_sf_rows(x: torch.Tensor, num_groups: int, packed: bool, col_major: bool) -> torch.Tensor:
    """SF for a 2-D or 3-D x, per (batch) matrix as per_token_cast lays them out."""
    if x.dim() == 2:
        return alloc_sf(x, x.shape[0], num_groups, packed, col_major)
    batch, num_tokens = x.shape[:2]
    dtype, cols = sf_layout(num_groups, packed)
    if col_major:
        padded = align(num_tokens, 4)
        return x.new_empty((batch, cols, padded), dtype=dtype).transpose(1, 2)[:, :num_tokens]
    return x.new_empty((batch, num_tokens, cols), dtype=dtype)


def _check_out(out, x: torch.Tensor, num_groups: int, packed: bool, col_major: bool):
    """out=: None or (data, sf), either part None (then allocated); the given parts checked."""
    data, sf = split_out(out)
    if data is not None:
        check_out_like(data, "out[0]", x, torch.float8_e4m3fn)
    if sf is not None:
        dtype, cols = sf_layout(num_groups, packed)
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
    if x.device.type == "npu" and npu_applies and all(t is None for t in (out, out_bf16, residual_out)):
        from tilebake.quant import _norm_forward_ascend  # the Ascend kernels where they apply

        result = _norm_forward_ascend.norm_forward_and_per_token_cast(
            x, weight, eps, residual, out_scale, round_sf, use_packed_ue8m0, with_out_bf16, with_rstd
        )
        if result is not None:
            return result
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
    _launch_forward(
        _CAST_KERNELS, x, weight, eps, residual, out_scale, data, residual_out, rstd,
        key_extra=(num_per_channels,),
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


# --- torch.library: lets torch.compile(fullgraph=True) trace both ops; eager calls skip it ---
#
# The ops are functional: outputs a caller passes (out=, residual_out=, out_bf16=) are filled
# by a copy after the op under torch.compile. Outputs a call does not produce (rstd without
# with_rstd, norm_input without residual, out_bf16 without with_out_bf16) are empty tensors in
# the schema; the Python functions return None or x for them, as in eager mode.


def _into(buffer: Optional[torch.Tensor], value: torch.Tensor) -> torch.Tensor:
    return value if buffer is None else buffer.copy_(value)


def _none_as_empty(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0) if t is None else t


def _norm_forward_impl(x, weight, eps, residual, out_scale, with_rstd):
    y, rstd, norm_input = norm_forward(x, weight, eps, residual, out_scale, with_rstd=with_rstd)
    return y, _none_as_empty(rstd, x), (norm_input if residual is not None else x.new_empty(0))


def _norm_forward_meta(x, weight, eps, residual, out_scale, with_rstd):
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if with_rstd else x.new_empty(0)
    dense = torch.contiguous_format  # as the eager path allocates
    norm_input = torch.empty_like(x, memory_format=dense) if residual is not None else x.new_empty(0)
    return torch.empty_like(x, memory_format=dense), rstd, norm_input


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
    "norm_forward(Tensor x, Tensor? weight, float eps, Tensor? residual, float out_scale, bool with_rstd)"
    " -> (Tensor, Tensor, Tensor)",
    _norm_forward_impl,
    _norm_forward_meta,
)
register(
    "norm_forward_and_per_token_cast(Tensor x, Tensor? weight, float eps, int num_per_channels, Tensor? residual,"
    " float out_scale, bool col_major_sf, bool round_sf, bool packed_ue8m0, bool with_out_bf16, bool with_rstd,"
    " Tensor(a!)? mega_moe_sf, int mega_moe_block_m) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _cast_impl,
    _cast_meta,
)
