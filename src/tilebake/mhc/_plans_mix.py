"""Call plans of the mhc per-token mix ops (Sinkhorn, split mixes, head mix): tilebake.mhc._plans'
conventions (a plan takes one rank of the leading dims; anything else sends the call to the Python
path, which raises the typed errors). Scalars (repeat, eps, ...) are baked in: they are in the key."""

from __future__ import annotations

import torch

from tilebake._runtime import plan
from tilebake.mhc._plans import _lead, dense

FP32 = torch.float32


def _tokens(b: plan.Builder, num_lead: int, per_token: str) -> None:
    b.let("T", " * ".join(_lead(num_lead)) or 1)
    b.check(f"T >= 1 and T * {per_token} < 2147483648")


def _out(b: plan.Builder, arg: int, given: bool, dims: list):
    return dense(b, arg, FP32, dims) if given else b.alloc(FP32, dims)


def sinkhorn(kernel, device, num_lead, given, repeat, eps):
    """run(comb_res_mix (..., M, M), out or None) -> out."""
    b = plan.Builder()
    dims = _lead(num_lead) + ["M", "M"]
    x = dense(b, 0, FP32, dims)
    _tokens(b, num_lead, "M * M")
    b.check(f"M >= 1 and M <= {kernel.variant.max_mult}")
    out = _out(b, 1, given, dims)
    b.launch(kernel, device, X=x, OUT=out, num_tokens="T", mhc_mult="M", repeat=repeat, eps=eps)
    if given:
        b.bump(out)
    b.returns(out)
    return b.build()


def sinkhorn_bwd(kernel, device, num_lead, given, repeat, eps):
    """run(grad_output, x (..., M, M), grad_input or None) -> grad_input."""
    b = plan.Builder()
    dims = _lead(num_lead) + ["M", "M"]
    g = dense(b, 0, FP32, dims)
    x = dense(b, 1, FP32, dims)
    _tokens(b, num_lead, "M * M")
    b.check(f"M >= 1 and M <= {kernel.variant.max_mult}")
    out = _out(b, 2, given, dims)
    b.launch(kernel, device, G=g, X=x, GI=out, num_tokens="T", mhc_mult="M", repeat=repeat, eps=eps)
    if given:
        b.bump(out)
    b.returns(out)
    return b.build()


def _vec(lead: list, m: int, nd, num_lead: int, square: bool) -> list:
    """The dims of a pre / post vector or comb matrix: (..., m, 1 or m) or flat (..., m or m * m)."""
    if nd is None or nd == num_lead + 2:
        return lead + [m, m if square else 1]
    return lead + [m * m if square else m]


def split_fwd(kernel, device, num_lead, m, nds, post_mult, eps):
    """run(input_mixes, scale, base, pre, post, comb (each given or None)) -> (pre, post, comb);
    nds: the given outputs' ranks (None: allocated)."""
    b = plan.Builder()
    lead, m3 = _lead(num_lead), m * (m + 2)
    x = dense(b, 0, FP32, lead + [m3])
    _tokens(b, num_lead, m3)
    scale, base = dense(b, 1, FP32, [3]), dense(b, 2, FP32, [m3])
    outs = [dense(b, 3 + i, FP32, _vec(lead, m, nd, num_lead, i == 2)) if nd is not None
            else b.alloc(FP32, _vec(lead, m, None, num_lead, i == 2)) for i, nd in enumerate(nds)]  # fmt: skip
    b.launch(kernel, device, MIX=x, SCALE=scale, BASE=base, PRE=outs[0], POST=outs[1], COMB=outs[2], num_tokens="T",
             mhc_mult=m, mix_cols=m3, post_mult=post_mult, pre_eps=eps)  # fmt: skip
    for out, nd in zip(outs, nds):
        if nd is not None:
            b.bump(out)
    b.returns(tuple(outs))
    return b.build()


def split_bwd(first, second, device, num_lead, m, nds, post_mult, num_sms):
    """run(pre_grad, post_grad, comb_grad, input_mixes, post, scale, base, input_mixes_grad,
    scale_grad, base_grad (the last three given or None)) -> the last three; nds: the ranks of
    arguments 0-2, 4 and 7-9 (None: allocated). The partial rows: min(T, num_sms)."""
    from tilebake.mhc.mhc_pre_split_mixes import partial_cols

    b = plan.Builder()
    lead, m3 = _lead(num_lead), m * (m + 2)
    pre_g = dense(b, 0, FP32, _vec(lead, m, nds[0], num_lead, False))
    post_g = dense(b, 1, FP32, _vec(lead, m, nds[1], num_lead, False))
    comb_g = dense(b, 2, FP32, _vec(lead, m, nds[2], num_lead, True))
    x = dense(b, 3, FP32, lead + [m3])
    _tokens(b, num_lead, m3)
    dense(b, 4, FP32, _vec(lead, m, nds[3], num_lead, False))  # post_layer_mix: checked, not read
    scale, base = dense(b, 5, FP32, [3]), dense(b, 6, FP32, [m3])
    outs = [dense(b, 7 + i, FP32, dims) if nd is not None else b.alloc(FP32, dims)
            for i, (nd, dims) in enumerate(zip(nds[4:], (lead + [m3], [3], [m3])))]  # fmt: skip
    b.let("P", f"min(T, {num_sms})")
    cols = partial_cols(m)
    part = b.alloc(FP32, ["P", cols])
    b.launch(first, device, PREG=pre_g, POSTG=post_g, COMBG=comb_g, MIX=x, SCALE=scale, BASE=base, MIXG=outs[0],
             PART=part, num_tokens="T", mhc_mult=m, mix_cols=m3, num_partials="P", num_cols=cols, post_mult=post_mult)  # fmt: skip
    b.launch(second, device, PART=part, SG=outs[1], BG=outs[2], num_partials="P", num_cols=cols, mix_cols=m3)
    for out, nd in zip(outs, nds[4:]):
        if nd is not None:
            b.bump(out)
    b.returns(tuple(outs))
    return b.build()


def head_fwd(kernel, device, num_lead, given, eps):
    """run(input_mix (..., M), scale, base, output_mix or None) -> output_mix."""
    b = plan.Builder()
    dims = _lead(num_lead) + ["M"]
    x = dense(b, 0, FP32, dims)
    _tokens(b, num_lead, "M")
    b.check("M >= 1 and M <= 8")
    scale, base = dense(b, 1, FP32, [1]), dense(b, 2, FP32, ["M"])
    out = _out(b, 3, given, dims)
    b.launch(kernel, device, X=x, SCALE=scale, BASE=base, OUT=out, num_tokens="T", mhc_mult="M", pre_eps=eps)
    if given:
        b.bump(out)
    b.returns(out)
    return b.build()


def head_bwd(kernel, device, num_lead, given, parts):
    """run(output_mix_grad, input_mix, scale, base, input_mix_grad, scale partials, base partials
    (the last three given or None, as `given` says)) -> the last three. parts: the partial rows
    (None: the given partials' dim 0, else the config's SM count at build)."""
    b = plan.Builder()
    dims = _lead(num_lead) + ["M"]
    g = dense(b, 0, FP32, dims)
    x = dense(b, 1, FP32, dims)
    _tokens(b, num_lead, "M")
    b.check("M >= 1 and M <= 8")
    scale, base = dense(b, 2, FP32, [1]), dense(b, 3, FP32, ["M"])
    if parts is None and not (given[1] or given[2]):
        from tilebake import config

        parts = config.get_num_sms()
    if parts is not None:
        b.let("P", parts)
    xg = _out(b, 4, given[0], dims)
    shapes = (["P", 1], ["P", "M"])
    parts_refs = {i: dense(b, 5 + i, FP32, shapes[i]) for i in (0, 1) if given[1 + i]}  # these bind P first
    sp, bp = (parts_refs[i] if i in parts_refs else b.alloc(FP32, shapes[i]) for i in (0, 1))
    b.check("P >= 1")
    b.launch(kernel, device, G=g, X=x, SCALE=scale, BASE=base, XG=xg, SP=sp, BP=bp, num_tokens="T", mhc_mult="M",
             num_partials="P")  # fmt: skip
    for out, flag in zip((xg, sp, bp), given):
        if flag:
            b.bump(out)
    b.returns((xg, sp, bp))
    return b.build()
