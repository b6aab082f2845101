"""The mhc ops' call plans (tilebake._runtime.plan): a call whose key was seen runs its checks,
allocations and launch in the native launcher. A plan takes one rank of the leading dims (the
key holds the ranks); anything else it does not describe (strides, dtypes, m, hidden) sends the
call to the Python path, which raises the typed errors."""

from __future__ import annotations

import torch

from tilebake._runtime import plan
from tilebake.mhc._common import MAX_MHC_MULT, VEC

BF16, FP32 = torch.bfloat16, torch.float32


def _lead(num_lead: int) -> list[str]:
    return [f"n{i}" for i in range(num_lead)]


def dense(b: plan.Builder, arg, dtype, dims: list, lists: bool = False) -> plan.Ref:
    """Argument `arg`: a contiguous tensor of shape `dims` (symbols bound on first use, else
    checked), 16-byte aligned (bf16) or 4-byte (fp32); lists: as plan.Builder.tensor's."""
    strides = [" * ".join(str(d) for d in dims[i + 1 :]) or 1 for i in range(len(dims))]
    return b.tensor(arg, dtype, tuple(dims), strides=tuple(strides), align=16 if dtype == BF16 else 4, lists=lists)


def sizes(b: plan.Builder, num_lead: int) -> None:
    """T = the product of the leading dims; M streams and H columns as the kernels take them."""
    b.let("T", " * ".join(_lead(num_lead)) or 1)
    b.check(f"T >= 1 and M >= 1 and M <= {MAX_MHC_MULT} and H >= {VEC} and H % {VEC} == 0 and T * M * H < 2147483648")


def expand_fwd(kernel, device, num_lead):
    """run(x (..., H), o (..., M, H)) -> o."""
    b = plan.Builder()
    lead = _lead(num_lead)
    x = dense(b, 0, BF16, lead + ["H"])
    o = dense(b, 1, BF16, lead + ["M", "H"])
    sizes(b, num_lead)
    b.launch(kernel, device, X=x, O=o, num_tokens="T", mhc_mult="M", hidden="H")
    b.bump(o)
    b.returns(o)
    return b.build()


def expand_bwd(kernel, device, num_lead, given):
    """run(o_grad (..., M, H), x_grad (..., H) or None) -> x_grad."""
    b = plan.Builder()
    lead = _lead(num_lead)
    og = dense(b, 0, BF16, lead + ["M", "H"])
    sizes(b, num_lead)
    xg = dense(b, 1, BF16, lead + ["H"]) if given else b.alloc(BF16, lead + ["H"])
    b.launch(kernel, device, OG=og, XG=xg, num_tokens="T", mhc_mult="M", hidden="H")
    if given:
        b.bump(xg)
    b.returns(xg)
    return b.build()


def _mix_dims(lead, flat):
    return lead + ["M"] if flat else lead + ["M", 1]


def _post_inputs(b, kernel, num_lead, flat_post):
    """mhc_post's x, residual, post and comb (arguments 0-3), M up to the kernel's max_mult."""
    lead = _lead(num_lead)
    x = dense(b, 0, BF16, lead + ["H"])
    r = dense(b, 1, BF16, lead + ["M", "H"])
    sizes(b, num_lead)
    b.check(f"M <= {kernel.variant.max_mult}")
    return lead, x, r, dense(b, 2, FP32, _mix_dims(lead, flat_post)), dense(b, 3, FP32, lead + ["M", "M"])


def post_fwd(kernel, device, num_lead, flat_post, given):
    """run(x, residual, post, comb, out or None) -> out."""
    b = plan.Builder()
    lead, x, r, post, comb = _post_inputs(b, kernel, num_lead, flat_post)
    out = dense(b, 4, BF16, lead + ["M", "H"]) if given else b.alloc(BF16, lead + ["M", "H"])
    b.launch(kernel, device, X=x, R=r, POST=post, COMB=comb, OUT=out, num_tokens="T", mhc_mult="M", hidden="H")
    if given:
        b.bump(out)
    b.returns(out)
    return b.build()


def post_bwd(kernel, device, num_lead, flat_post, rows: str):
    """run(x, residual, post, comb, d_o) -> (d_x, d_residual, d_post, d_comb); rows: the hidden
    sizes H the kernel is for (its warps a token: mhc_post.token_warps)."""
    b = plan.Builder()
    lead, x, r, post, comb = _post_inputs(b, kernel, num_lead, flat_post)
    d_o = dense(b, 4, BF16, lead + ["M", "H"])
    b.check(rows)
    d_x, d_r = b.alloc(BF16, lead + ["H"]), b.alloc(BF16, lead + ["M", "H"])
    d_post, d_comb = b.alloc(FP32, _mix_dims(lead, flat_post)), b.alloc(FP32, lead + ["M", "M"])
    b.launch(kernel, device, X=x, R=r, POST=post, COMB=comb, DO=d_o, DX=d_x, DR=d_r, DPOST=d_post, DCOMB=d_comb,
             num_tokens="T", mhc_mult="M", hidden="H")  # fmt: skip
    b.returns((d_x, d_r, d_post, d_comb))
    return b.build()


def pre_apply_mix_fwd(kernel, device, num_lead, flat_mix, given):
    """run(x (..., M, H), mix, o or None) -> o, m up to the kernel's max_mult."""
    b = plan.Builder()
    lead = _lead(num_lead)
    x = dense(b, 0, BF16, lead + ["M", "H"])
    sizes(b, num_lead)
    b.check(f"M <= {kernel.variant.max_mult}")
    mix = dense(b, 1, FP32, _mix_dims(lead, flat_mix))
    o = dense(b, 2, BF16, lead + ["H"]) if given else b.alloc(BF16, lead + ["H"])
    b.launch(kernel, device, X=x, MIX=mix, O=o, num_tokens="T", mhc_mult="M", hidden="H")
    if given:
        b.bump(o)
    b.returns(o)
    return b.build()


def pre_apply_mix_bwd(kernel, device, num_lead, flat_mix, given, hidden):
    """run(o_grad, x, mix, x_grad or None) -> mix_grad (x_grad accumulated in place), for the
    kernel's variant: `hidden` columns, m up to the variant's max_mult (more than 4 for 128 threads)."""
    b = plan.Builder()
    lead = _lead(num_lead)
    og = dense(b, 0, BF16, lead + ["H"])
    x = dense(b, 1, BF16, lead + ["M", "H"])
    sizes(b, num_lead)
    from tilebake.mhc.mhc_pre_apply_mix import BWD_MULT

    v = kernel.variant
    b.check(f"H == {hidden} and M <= {v.max_mult}" + (f" and M > {BWD_MULT}" if v.max_mult > BWD_MULT else ""))
    mix = dense(b, 2, FP32, _mix_dims(lead, flat_mix))
    xg = dense(b, 3, BF16, lead + ["M", "H"]) if given else None
    mix_grad = b.alloc(FP32, _mix_dims(lead, flat_mix))
    b.launch(kernel, device, OG=og, X=x, MIX=mix, XG=xg, MG=mix_grad, num_tokens="T", mhc_mult="M", hidden="H",
             has_x_grad=int(given))  # fmt: skip
    if given:
        b.bump(xg)
    b.returns(mix_grad)
    return b.build()


def multilayer(kernel, device, num_lead, m, pre_nds, post_nds):
    """run(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list,
    layer_input_list, residual_list) -> None, for L = len(pre_nds) layers, the first
    len(post_nds) with a post step, m streams (the kernel's class); pre_nds / post_nds: each mix's
    rank ((..., M) or (..., M, 1)). One launch: L <= LMAX (the op's Python path launches a chunk of
    LMAX layers at a time beyond)."""
    from tilebake.mhc.mhc_multilayer_recompute import LAYER_PARAMS, LMAX

    b = plan.Builder()
    lead = _lead(num_lead)
    r0 = dense(b, 0, BF16, lead + ["M", "H"])
    sizes(b, num_lead)
    b.check(f"M == {m}")

    def mix(arg, i, nd):
        return dense(b, (arg, i), FP32, lead + ["M"] if nd == num_lead + 1 else lead + ["M", 1], lists=True)

    layers, posts = len(pre_nds), len(post_nds)
    pre = [mix(1, i, nd) for i, nd in enumerate(pre_nds)]
    outs = [dense(b, (2, i), BF16, lead + ["H"], lists=True) for i in range(posts)]
    post = [mix(3, i, nd) for i, nd in enumerate(post_nds)]
    comb = [dense(b, (4, i), FP32, lead + ["M", "M"], lists=True) for i in range(posts)]
    inputs = [dense(b, (5, i), BF16, lead + ["H"], lists=True) for i in range(layers)]
    residuals = [dense(b, (6, i), BF16, lead + ["M", "H"], lists=True) for i in range(posts)]
    b.disjoint_set([r0, *pre, *outs, *post, *comb], [*inputs, *residuals])
    if layers > LMAX:
        raise ValueError(f"call plan: {layers} layers, more than a launch's {LMAX}")
    params = dict(R0=r0, num_tokens="T", mhc_mult="M", hidden="H", num_layers=layers, num_post=posts)
    for i in range(LMAX):  # unused layers' pointers are never read: null
        has_pre, has_post = i < layers, i < posts
        per_layer = (pre[i] if has_pre else None, outs[i] if has_post else None, post[i] if has_post else None,
                     comb[i] if has_post else None, inputs[i] if has_pre else None, residuals[i] if has_post else None)
        params.update({f"{name}{i}": ref for name, ref in zip(LAYER_PARAMS, per_layer)})
    b.launch(kernel, device, **params)
    for ref in (*inputs, *residuals):
        b.bump(ref)
    b.returns(None)
    return b.build()
