"""Call plans of the pre-norm projection's ops (mhc_fn_normw_merge_fwd / _bwd,
mhc_pre_norm_gemm_fwd / _bwd, mhc_reduce_partials_and_rmsnorm_fwd / _bwd, the big fuse):
tilebake.mhc._plans' conventions (a plan takes one rank of the leading dims; anything it does not
describe sends the call to the Python path, which raises the typed errors). Scalars (n_splits,
rms_group_size, rms_eps) are in the key, so baked in; so is the projection backward's partial-row
count (a function of the token count)."""

from __future__ import annotations

import torch

from tilebake._runtime import plan
from tilebake.mhc._plans import _lead, dense

BF16, FP32 = torch.bfloat16, torch.float32
_INT_LIMIT = 2147483648


def _out(b: plan.Builder, arg: int, given: bool, dims: list):
    return dense(b, arg, FP32, dims) if given else b.alloc(FP32, dims)


def _fn(b: plan.Builder, arg: int):
    """fn-like (N, K) fp32, K % 4 == 0, 16-byte aligned (the merge's 4-column vectors)."""
    return b.tensor(arg, FP32, ("N", "K"), strides=("K", 1), align=16)


def fn_merge_fwd(kernel, device, given):
    """run(fn (N, K), normw (K,), out_fn or None) -> out_fn."""
    b = plan.Builder()
    fn = _fn(b, 0)
    w = b.tensor(1, FP32, ("K",), strides=(1,), align=16)
    b.check(f"N >= 1 and K >= 4 and K % 4 == 0 and N * K < {_INT_LIMIT}")
    out = _fn(b, 2) if given else b.alloc(FP32, ["N", "K"])
    b.launch(kernel, device, FN=fn, W=w, OUT=out, num_mixes="N", num_cols="K")
    if given:
        b.bump(out)
    b.returns(out)
    return b.build()


def fn_merge_bwd(kernel, device, given):
    """run(fn (N, K), normw (K,), out_fn_grad (N, K), fn_grad, normw_grad (each or None)) ->
    (fn_grad, normw_grad); given: which of the two are."""
    b = plan.Builder()
    fn = _fn(b, 0)
    w = b.tensor(1, FP32, ("K",), strides=(1,), align=16)
    og = _fn(b, 2)
    b.check(f"N >= 1 and K >= 4 and K % 4 == 0 and N * K < {_INT_LIMIT}")
    fg = _fn(b, 3) if given[0] else b.alloc(FP32, ["N", "K"])
    wg = b.tensor(4, FP32, ("K",), strides=(1,), align=16) if given[1] else b.alloc(FP32, ["K"])
    b.launch(kernel, device, FN=fn, W=w, OG=og, FG=fg, WG=wg, num_mixes="N", num_cols="K")
    for ref, flag in zip((fg, wg), given):
        if flag:
            b.bump(ref)
    b.returns((fg, wg))
    return b.build()


def pre_norm_gemm_fwd(kernel, device, num_lead, n_splits, given_mul, given_sq):
    """run(residual (..., M, H), fn (N, M * H), out_mul_splitted or None, sqrsum_splitted or None)
    -> (out_mul_splitted (S, T, 1, N), sqrsum_splitted (S, T, 1))."""
    b = plan.Builder()
    lead = _lead(num_lead)
    x = dense(b, 0, BF16, lead + ["M", "H"])
    b.let("T", " * ".join(lead) or 1)
    b.let("K", "M * H")
    fn = b.tensor(1, FP32, ("N", "K"), strides=("K", 1), align=16)  # 16-byte cp.async rows
    max_mixes = kernel.variant.max_mult * (kernel.variant.max_mult + 2)
    b.check(f"T >= 1 and K >= 8 and K % 8 == 0 and N >= 1 and N <= {max_mixes} and T * K < {_INT_LIMIT} "
            f"and N * K < {_INT_LIMIT} and T * N * {n_splits} < {_INT_LIMIT}")  # fmt: skip
    out_mul = _out(b, 2, given_mul, [n_splits, "T", 1, "N"])
    sqrsum = _out(b, 3, given_sq, [n_splits, "T", 1])
    b.launch(kernel, device, X=x, FN=fn, OUT=out_mul, SQ=sqrsum, num_tokens="T", num_cols="K", num_mixes="N",
             n_splits=n_splits)  # fmt: skip
    for t, given in ((out_mul, given_mul), (sqrsum, given_sq)):
        if given:
            b.bump(t)
    b.returns((out_mul, sqrsum))
    return b.build()


def pre_norm_gemm_bwd(kernel, reduce, device, num_lead, grad_ndims, given, parts):
    """run(residual (..., M, H), fn (N, M * H), out_mul_grad (any T x N shape, last dim N),
    sqrsum_grad (any shape of T elements), residual_grad, fn_grad (each or None)) ->
    (residual_grad, fn_grad). grad_ndims: the two gradients' ranks; parts: the partial rows
    (the Python path's count for this call's T, K and N: in the key)."""
    b = plan.Builder()
    lead = _lead(num_lead)
    x = dense(b, 0, BF16, lead + ["M", "H"])
    b.let("T", " * ".join(lead) or 1)
    b.let("K", "M * H")
    fn = b.tensor(1, FP32, ("N", "K"), strides=("K", 1), align=4)
    max_mixes = kernel.variant.max_mult * (kernel.variant.max_mult + 2)
    b.check(f"T >= 1 and K >= 8 and K % 8 == 0 and N >= 1 and N <= {max_mixes} and T * K < {_INT_LIMIT} "
            f"and N * K < {_INT_LIMIT}")  # fmt: skip
    if kernel.variant.max_mult > 4:  # the other variant's mixes sum in another order: its own key
        b.check("N > 24")
    g_dims = [f"g{i}" for i in range(grad_ndims[0] - 1)]
    omg = dense(b, 2, FP32, g_dims + ["N"])
    b.check(f"{' * '.join(g_dims) or 1} == T")
    s_dims = [f"s{i}" for i in range(grad_ndims[1])]
    sqg = dense(b, 3, FP32, s_dims)
    b.check(f"{' * '.join(s_dims) or 1} == T")
    rg = dense(b, 4, BF16, lead + ["M", "H"]) if given[0] else b.alloc(BF16, lead + ["M", "H"])
    fg = b.tensor(5, FP32, ("N", "K"), strides=("K", 1), align=4) if given[1] else b.alloc(FP32, ["N", "K"])
    part = fg if parts == 1 else b.alloc(FP32, [parts, "N", "K"])  # one share: its row is fn_grad
    b.launch(kernel, device, X=x, FN=fn, DOM=omg, DSQ=sqg, XG=rg, P=part, num_tokens="T", num_cols="K",
             num_mixes="N", num_parts=parts, has_x_grad=int(given[0]))  # fmt: skip
    if parts > 1:
        b.launch(reduce, device, P=part, OUT=fg, num_partials=parts, num_cols="N * K", accumulate=0)
    for ref, flag in zip((rg, fg), given):
        if flag:
            b.bump(ref)
    b.returns((rg, fg))
    return b.build()


def reduce_partials_fwd(kernel, device, given, rms_group_size, rms_eps, n_splits):
    """run(out_mul_splitted (S, T, 1, N), sqrsum_splitted (S, T, 1), out_mul, sqrsum, out (each or
    None)) -> (out_mul (T, 1, N), sqrsum (T, 1), out (T, N)); given: which of the three are."""
    b = plan.Builder()
    pm = dense(b, 0, FP32, ["S", "T", 1, "N"])
    ps = dense(b, 1, FP32, ["S", "T", 1])
    b.check(f"S >= 1 and T >= 1 and N >= 1 and S * T * N < {_INT_LIMIT}")
    if n_splits is not None:  # the caller's n_splits must be the partials' count
        b.check(f"S == {n_splits}")
    om = _out(b, 2, given[0], ["T", 1, "N"])
    sq = _out(b, 3, given[1], ["T", 1])
    out = _out(b, 4, given[2], ["T", "N"])
    b.launch(kernel, device, PM=pm, PS=ps, OM=om, OS=sq, OUT=out, num_tokens="T", num_mixes="N", n_splits="S",
             rms_group_size=rms_group_size, rms_eps=rms_eps)  # fmt: skip
    for t, g in zip((om, sq, out), given):
        if g:
            b.bump(t)
    b.returns((om, sq, out))
    return b.build()


def reduce_partials_bwd(kernel, device, given, rms_group_size, rms_eps):
    """run(out_grad (T, N), out_mul (T, 1, N), sqrsum (T, 1), out_mul_grad, sqrsum_grad (each or
    None)) -> (out_mul_grad (T, 1, N), sqrsum_grad (T, 1))."""
    b = plan.Builder()
    og = dense(b, 0, FP32, ["T", "N"])
    om = dense(b, 1, FP32, ["T", 1, "N"])
    sq = dense(b, 2, FP32, ["T", 1])
    b.check(f"T >= 1 and N >= 1 and T * N < {_INT_LIMIT}")
    omg = _out(b, 3, given[0], ["T", 1, "N"])
    sqg = _out(b, 4, given[1], ["T", 1])
    b.launch(kernel, device, OG=og, OM=om, OS=sq, OMG=omg, OSG=sqg, num_tokens="T", num_mixes="N",
             rms_group_size=rms_group_size, rms_eps=rms_eps)  # fmt: skip
    for t, g in zip((omg, sqg), given):
        if g:
            b.bump(t)
    b.returns((omg, sqg))
    return b.build()


def big_fuse_fwd(kernel, device, num_lead, nds, n_splits, repeat, scalars):
    """run(gemm_out_mul (S, T, 1, N), gemm_out_sqrsum (S, T, 1), scale (3,), base (N,), residual
    (..., M, H), post_mix, comb_mix, layer_input (each given or None)) -> (post_mix, comb_mix,
    layer_input); nds: the given outputs' ranks (None: allocated); scalars: rms_eps, pre_eps,
    sinkhorn_eps, post_mult. One launch."""
    b = plan.Builder()
    lead = _lead(num_lead)
    x = dense(b, 4, BF16, lead + ["M", "H"])
    b.let("T", " * ".join(lead) or 1)
    b.let("N", "M * (M + 2)")
    b.check(f"T >= 1 and M >= 1 and M <= {kernel.variant.max_mult} and H >= 8 and H % 8 == 0 "
            f"and T * M * H < {_INT_LIMIT} and T * N * {n_splits} < {_INT_LIMIT}")  # fmt: skip
    inputs = [dense(b, 0, FP32, [n_splits, "T", 1, "N"]), dense(b, 1, FP32, [n_splits, "T", 1]),
              dense(b, 2, FP32, [3]), dense(b, 3, FP32, ["N"]), x]  # fmt: skip
    # a given output's accepted shapes: post (..., M, 1) or (..., M), comb (..., M, M) or (..., M * M)
    shapes = ((lead + ["M", 1], lead + ["M"]), (lead + ["M", "M"], lead + ["M * M"]), (lead + ["H"],))
    outs = []
    for i, (nd, dtype) in enumerate(zip(nds, (FP32, FP32, BF16))):
        if nd is None:
            outs.append(b.alloc(dtype, shapes[i][0]))
            continue
        outs.append(dense(b, 5 + i, dtype, next(s for s in shapes[i] if len(s) == nd)))
        for other in inputs + outs[:-1]:
            b.disjoint(outs[-1], other)
    post, comb, out = outs
    rms_eps, pre_eps, sinkhorn_eps, post_mult = scalars
    b.launch(kernel, device, PM=inputs[0], PS=inputs[1], SCALE=inputs[2], BASE=inputs[3], X=x, POST=post, COMB=comb,
             O=out, num_tokens="T", mhc_mult="M", hidden="H", mix_cols="N", n_splits=n_splits, rms_group_size="M * H",
             repeat=repeat, rms_eps=rms_eps, pre_eps=pre_eps, eps=sinkhorn_eps, post_mult=post_mult)  # fmt: skip
    for ref, nd in zip(outs, nds):
        if nd is not None:
            b.bump(ref)
    b.returns((post, comb, out))
    return b.build()
