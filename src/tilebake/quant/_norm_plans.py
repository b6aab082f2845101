"""Call plans (tilebake/_runtime/plan.py) of norm_forward, norm_forward_and_per_token_cast and
norm_backward: their CUDA Python paths' checks, allocations and kernel arguments, built once per
call key after that path's launch succeeded. Some checks are stricter than the Python path's
(a batch stride below the rows' span, an SF layout other than row- or column-major): those
calls take the Python path, which stays the one definition of what the ops accept.

Symbols: B, T, H of x (B = 1 for a 2-D x); for each tensor like x, `<p>_t` and `<p>_b` its row
and batch strides and `<p>_ks`, `<p>_kb` those the kernels take (0 over a dim of size 1, as
norm_forward.rows_strides gives them).
"""

from __future__ import annotations

import torch

from tilebake._runtime import plan
from tilebake.quant._common import FLOAT_FORMATS
from tilebake.utils import align






def _shape(ndim: int, last: str = "H") -> tuple:
    return ("B", "T", last) if ndim == 3 else ("T", last)


def _kernel_strides(b: plan.Builder, p: str, ndim: int) -> None:
    b.let(f"{p}_ks", f"(T > 1) * {p}_t")
    b.let(f"{p}_kb", f"(B > 1) * {p}_b" if ndim == 3 else 0)


def _x(b: plan.Builder, arg, dtype: torch.dtype, ndim: int, hidden_multiple: int) -> plan.Ref:
    """x as check_norm_rows takes it, at least one row (an empty x takes the Python path)."""
    from tilebake.quant.norm_forward import MAX_HIDDEN

    x = _like_x(b, arg, dtype, ndim, "x", written=False, first=True)
    b.check(f"B >= 1 and T >= 1 and H >= 1 and H <= {MAX_HIDDEN} and H % {hidden_multiple} == 0")
    return x


def _like_x(b, arg, dtype, ndim, p, written, first=False) -> plan.Ref:
    """A tensor of x's shape (check_like): last dim contiguous, the other strides multiples of
    16 bytes where their dim has more than one element, data 16-byte aligned (check_pointers);
    a written one (check_out_like) without two elements at one address: rows at least a row
    apart, batches at least their rows' span apart (stricter than check_no_overlap)."""
    strides = (f"{p}_b", f"{p}_t", 1) if ndim == 3 else (f"{p}_t", 1)
    ref = b.tensor(arg, dtype, _shape(ndim), strides=strides)
    if first and ndim == 2:
        b.let("B", 1)
    unit = 16 // dtype.itemsize
    b.check(f"T == 1 or {p}_t % {unit} == 0")
    if ndim == 3:
        b.check(f"B == 1 or {p}_b % {unit} == 0")
    if written:
        b.check(f"T == 1 or {p}_t >= H")
        if ndim == 3:
            b.check(f"B == 1 or {p}_b >= (T - 1) * {p}_t + H")
    _kernel_strides(b, p, ndim)
    return ref


def _alloc_like_x(b, dtype, ndim, p) -> plan.Ref:
    """torch.empty_like(x, memory_format=torch.contiguous_format) in `dtype`."""
    ref = b.alloc(dtype, _shape(ndim))
    b.let(f"{p}_t", "H")
    if ndim == 3:
        b.let(f"{p}_b", "T * H")
    _kernel_strides(b, p, ndim)
    return ref


def _forward_common(b, dtype, ndim, has_weight, has_residual, out_arg, residual_out_arg, out_dtype):
    """The inputs x (arg 0), weight (1) and residual (2), and where given (their run() argument
    not None) out and residual_out, checked. Returns (x, weight, residual, out, residual_out,
    the given outputs)."""
    x = _x(b, 0, dtype, ndim, 16)
    weight = b.tensor(1, dtype, ("H",), strides=(1,)) if has_weight else None
    residual = _like_x(b, 2, dtype, ndim, "r", written=False) if has_residual else None
    out = _like_x(b, out_arg, out_dtype, ndim, "o", written=True) if out_arg is not None else None
    residual_out = None
    if has_residual and residual_out_arg is not None:
        residual_out = _like_x(b, residual_out_arg, dtype, ndim, "ro", written=True)
    given = [t for t in (out, residual_out) if t is not None]
    return x, weight, residual, out, residual_out, given


def _forward_params(b, ndim, x, out_dtype, weight, residual, out, residual_out, with_rstd, eps, out_scale):
    """Allocate out and residual_out where not given and rstd where asked for; the kernel
    parameters forward_params declares, but the cast's."""
    if out is None:
        out = _alloc_like_x(b, out_dtype, ndim, "o")
    if residual is not None and residual_out is None:
        residual_out = _alloc_like_x(b, x.dtype, ndim, "ro")
    rstd = b.alloc(torch.float32, _shape(ndim)[:-1]) if with_rstd else None
    params = dict(
        X=x, Y=out, RSTD=rstd if rstd is not None else x, eps=eps, out_scale=out_scale,
        with_rstd=int(rstd is not None), batch="B", num_tokens="T", hidden="H",
        x_batch_stride="x_kb", x_stride="x_ks", out_batch_stride="o_kb", out_stride="o_ks",
    )  # fmt: skip
    if weight is not None:
        params["W"] = weight
    if residual is not None:
        params.update(
            R=residual, RO=residual_out, residual_batch_stride="r_kb", residual_stride="r_ks",
            residual_out_batch_stride="ro_kb", residual_out_stride="ro_ks",
        )  # fmt: skip
    return params, out, residual_out, rstd


def forward_plan(kernel, device, dtype, ndim, has_weight, has_residual, eps, out_scale, given_out, given_ro, with_rstd):
    """norm_forward: run(plan, x, weight, residual, out, residual_out)."""
    b = plan.Builder()
    x, weight, residual, out, ro, given = _forward_common(
        b, dtype, ndim, has_weight, has_residual, 3 if given_out else None, 4 if given_ro else None, dtype
    )
    params, out, ro, rstd = _forward_params(b, ndim, x, dtype, weight, residual, out, ro, with_rstd, eps, out_scale)
    b.launch(kernel, device, **params)
    for ref in given:
        b.bump(ref)
    b.returns((out, rstd, ro if has_residual else x))
    return b.build()


def _sf(b, ndim, cols: str, sf_dtype, given: bool, col_major: bool) -> plan.Ref:
    """The SF as the cast's Python path takes (check_out_sf_layout; stricter: the last two dims
    row- or column-major, batch outermost) or allocates it (_alloc_sf_rows); binds s_b, s_t, s_g
    (elements; s_b 0 for a 2-D SF, as _sf_strides3)."""
    shape = _shape(ndim, cols)
    if given:
        if col_major:  # TMA-aligned column-major
            strides = ("s_b", 1, "s_g") if ndim == 3 else (1, "s_g")
            sf = b.tensor((3, 1), sf_dtype, shape, strides=strides, align=16)
            b.let("s_t", 1)
            b.check(f"{cols} == 1 or (s_g % 4 == 0 and s_g >= T)")
        else:
            strides = ("s_b", "s_t", "s_g") if ndim == 3 else ("s_t", "s_g")
            sf = b.tensor((3, 1), sf_dtype, shape, strides=strides, align=4)
            b.check(f"(s_g == 1 and (T == 1 or s_t >= {cols})) or (s_t == 1 and ({cols} == 1 or s_g >= T))")
        if ndim == 3:
            b.check(f"B == 1 or s_b > (T - 1) * s_t + ({cols} - 1) * s_g")
    elif col_major:  # a (B, cols, padded T) buffer, handed out as its (B, T, cols) transposed view
        b.let("s_g", "(T + 3) // 4 * 4")
        b.let("s_t", 1)
        if ndim == 3:
            b.let("s_b", f"{cols} * s_g")
            sf = b.alloc(sf_dtype, ("B", cols, "s_g"), view=(shape, ("s_b", 1, "s_g")))
        else:
            sf = b.alloc(sf_dtype, (cols, "s_g"), view=(shape, (1, "s_g")))
    else:
        sf = b.alloc(sf_dtype, shape)
        b.let("s_t", cols)
        b.let("s_g", 1)
        if ndim == 3:
            b.let("s_b", f"T * {cols}")
    if ndim == 2:
        b.let("s_b", 0)
    return sf


def cast_plan(kernel, device, dtype, ndim, has_weight, has_residual, eps, out_scale, npc, col_major, round_sf,
              packed, with_out_bf16, given_out, given_out_bf16, given_ro, mega_block_m, with_rstd, amax_clamp,
              num_sms):  # fmt: skip
    """norm_forward_and_per_token_cast: run(plan, x, weight, residual, out, out_bf16,
    residual_out, mega_moe_sf), out a (data, sf) tuple (both given) or None. The persistent
    launch takes min(rows, CAST_CTAS_PER_SM x num_sms) CTAs (num_sms: config.get_num_sms() at
    build; config setters empty the plans)."""
    from tilebake.quant.norm_forward_and_per_token_cast import CAST_CTAS_PER_SM

    b = plan.Builder()
    fp8 = torch.float8_e4m3fn
    x, weight, residual, data, ro, given = _forward_common(
        b, dtype, ndim, has_weight, has_residual, (3, 0) if given_out else None, 5 if given_ro else None, fp8
    )
    b.check(f"H % {npc} == 0")
    b.let("C", f"(H // {npc} + 3) // 4" if packed else f"H // {npc}")
    sf = _sf(b, ndim, "C", torch.int32 if packed else torch.float32, given_out, col_major)
    given += [sf] if given_out else []
    out_bf16 = None
    if with_out_bf16 and given_out_bf16:
        out_bf16 = _like_x(b, 4, torch.bfloat16, ndim, "yb", written=True)
        given.append(out_bf16)
    mm = None
    if mega_block_m:  # the mega MoE SF view, as _check_mega_moe_sf takes it (x is 2-D)
        b.check("H % 128 == 0")
        mm = b.tensor(6, torch.int32, ("T", "H // 128"), strides=("mm_t", "mm_rows"), align=4)
        b.check("T == 1 or mm_t == 1")
        b.check(f"mm_rows >= (T + {mega_block_m - 1}) // {mega_block_m} * {align(mega_block_m, 128)}")
        given.append(mm)
    params, data, ro, rstd = _forward_params(b, ndim, x, fp8, weight, residual, data, ro, with_rstd, eps, out_scale)
    if with_out_bf16 and out_bf16 is None:
        out_bf16 = _alloc_like_x(b, torch.bfloat16, ndim, "yb")
    per_sm = CAST_CTAS_PER_SM[FLOAT_FORMATS[dtype], has_residual]
    unit = 4 if packed else 1  # packed UE8M0 SF strides are in bytes
    params.update(
        num_ctas="B * T" if per_sm is None else f"min(B * T, {per_sm * num_sms})",
        YB=out_bf16 if out_bf16 is not None else x, S=sf, SP=sf, amax_clamp=amax_clamp,
        round_sf=int(bool(round_sf)), packed=int(bool(packed)), with_out_bf16=int(out_bf16 is not None),
        out_bf16_batch_stride="yb_kb" if out_bf16 is not None else 0,
        out_bf16_stride="yb_ks" if out_bf16 is not None else 0,
        sf_batch_stride=f"s_b * {unit}", sf_stride_t=f"s_t * {unit}", sf_stride_g=f"s_g * {unit}",
        MM=mm if mm is not None else sf, mm_rows="mm_rows" if mm is not None else 0,
        mega_block_m=mega_block_m, mega_aligned_block_m=align(mega_block_m, 128),
    )  # fmt: skip
    b.launch(kernel, device, **params)
    for ref in given:
        b.bump(ref)
    b.returns(((data, sf), out_bf16, rstd, ro if has_residual else x))
    return b.build()


def backward_plan(kernel, reduce, device, dtype, has_weight, has_rog, out_scale, weight_grad_dtype, num_sms):
    """norm_backward: run(plan, out_grad, x, weight, rstd, residual_out_grad, weight_grad) ->
    (x_grad, weight_grad: the given contiguous buffer (weight_grad_dtype) after the addition, or
    a new one in the weight's dtype; None without weight). min(CTAS_PER_SM x num_sms, T)
    persistent CTAs write fp32 partial rows that `reduce` sums (num_sms as in cast_plan)."""
    from tilebake.quant.norm_backward import CTAS_PER_SM

    b = plan.Builder()
    x = _x(b, 1, dtype, 2, 32)
    out_grad = _like_x(b, 0, dtype, 2, "g", written=False)
    weight = b.tensor(2, dtype, ("H",), strides=(1,)) if has_weight else None
    rstd = b.tensor(3, torch.float32, ("T",), strides=("rs",), align=4)
    b.check("T == 1 or rs == 1")
    rog = _like_x(b, 4, dtype, 2, "rog", written=False) if has_rog else None
    given = None
    if weight_grad_dtype is not None:  # read and written as 4-element vectors
        given = b.tensor(5, weight_grad_dtype, ("H",), strides=(1,), align=4 * weight_grad_dtype.itemsize)
    x_grad = _alloc_like_x(b, dtype, 2, "dx")
    b.let("num_ctas", f"min({CTAS_PER_SM[dtype] * num_sms}, T)")
    partials = b.alloc(torch.float32, ("num_ctas", "H")) if has_weight else None
    dw = given
    if has_weight and given is None:
        dw = b.alloc(dtype, ("H",))
    params = dict(
        G=out_grad, X=x, RSTD=rstd, DX=x_grad, out_scale=out_scale, num_tokens="T", hidden="H",
        num_ctas="num_ctas", out_grad_stride="g_ks", x_stride="x_ks", x_grad_stride="dx_ks",
    )  # fmt: skip
    if has_weight:
        params.update(W=weight, P=partials)
    if has_rog:
        params.update(ROG=rog, residual_out_grad_stride="rog_ks")
    b.launch(kernel, device, **params)
    if has_weight:
        b.launch(reduce, device, P=partials, OUT=dw, num_partials="num_ctas", num_cols="H",
                 accumulate=int(given is not None))  # fmt: skip
    if given is not None:
        b.bump(given)
    b.returns((x_grad, dw))
    return b.build()
