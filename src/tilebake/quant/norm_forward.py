"""norm_forward: RMSNorm with an optional residual add (and the checks and launch it shares
with norm_forward_and_per_token_cast and norm_backward).

Validate, allocate, launch (kernels_tl/quant/norm_forward.py); the reference (and the CPU path)
is tilebake.torch.norm_forward_ref. A CUDA call whose key was seen before runs as one call plan
(validate, allocate, launch in C; quant/_norm_plans.py builds them).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

import torch

from tilebake._checks import check_device
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.quant import _norm_plans
from tilebake.quant._common import (
    FLOAT_FORMATS,
    check_aligned,
    check_no_overlap,
)


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
    check_device(t, name)
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
# Call plans by call key (_norm_plans.py builds them; plan.remember keeps at most plan.MAX_PLANS an op).
_FORWARD_PLANS = plan.cache()


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
    """Launch over batch * num_tokens rows (norm_forward: one CTA per row; the cast: the num_ctas
    its quant_args hold); nothing to do for an empty x."""
    batch, num_tokens = (1, *x.shape[:1]) if x.dim() == 2 else x.shape[:2]
    if batch * num_tokens == 0:
        return
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


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it ---
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


# Meta kernels rather than register_fake: free at import (see per_token_cast.py).
register(
    "norm_forward(Tensor x, Tensor? weight, float eps, Tensor? residual, float out_scale, bool with_rstd)"
    " -> (Tensor, Tensor, Tensor)",
    _norm_forward_impl,
    _norm_forward_meta,
)
