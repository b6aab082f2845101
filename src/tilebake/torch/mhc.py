"""mHC (manifold hyper-connections) references: the oracles of tilebake.mhc and its CPU path.

m is the stream count (any m >= 1). Sums over streams run in stream order, each product and sum
rounded to fp32 on its own, as the kernels do: on the CPU the references give the kernels' bits.
The `*_like_original` forms compute as TileKernels' torch/mhc.py does (einsum, torch's own
reduction order), for tolerance checks against the original's arithmetic.
"""

from __future__ import annotations

import torch


def expand_to_mhc_ref(hidden: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    """(..., H) -> (..., m, H): each stream a copy of hidden."""
    return hidden.unsqueeze(-2).expand(*hidden.shape[:-1], mhc_mult, hidden.shape[-1]).contiguous()


def expand_to_mhc_bwd_ref(o_grad: torch.Tensor) -> torch.Tensor:
    """(..., m, H) -> (..., H): the streams' gradients summed in fp32 in stream order, rounded once."""
    acc = o_grad[..., 0, :].float()
    for i in range(1, o_grad.shape[-2]):
        acc = acc + o_grad[..., i, :].float()
    return acc.to(o_grad.dtype)


def mhc_post_ref(x, residual, post_layer_mix, comb_res_mix) -> torch.Tensor:
    """out[..., o, :] = post[..., o] * x + sum over i of comb[..., i, o] * residual[..., i, :]
    (fp32, i in order), in bf16. x (..., H) bf16, residual (..., m, H) bf16, post (..., m) or
    (..., m, 1) fp32, comb (..., m, m) fp32."""
    m = residual.shape[-2]
    post = post_layer_mix.reshape(*residual.shape[:-1])
    xf = x.float()
    outs = []
    for o in range(m):
        acc = post[..., o, None] * xf
        for i in range(m):
            acc = acc + comb_res_mix[..., i, o, None] * residual[..., i, :].float()
        outs.append(acc)
    return torch.stack(outs, dim=-2).to(residual.dtype)


def mhc_post_ref_like_original(x, residual, post_layer_mix, comb_res_mix) -> torch.Tensor:
    """mhc_post_ref through einsum, as the original's reference computes it."""
    post = post_layer_mix.reshape(*residual.shape[:-1], 1)
    term2 = torch.einsum("...io,...ic->...oc", comb_res_mix, residual.float())
    return (x.float().unsqueeze(-2) * post + term2).to(residual.dtype)


def mhc_post_bwd_ref(x, residual, post_layer_mix, comb_res_mix, d_o):
    """(d_x, d_residual, d_post (as post_layer_mix), d_comb) of mhc_post_ref, in float64 from the
    inputs (an oracle for tolerances, not for bits)."""
    m = residual.shape[-2]
    post = post_layer_mix.reshape(*residual.shape[:-1]).double()
    comb, g = comb_res_mix.double(), d_o.double()
    xd, rd = x.double(), residual.double()
    d_x = (post[..., None] * g).sum(-2)
    d_res = torch.einsum("...io,...oc->...ic", comb, g)
    d_post = (g * xd[..., None, :]).sum(-1)
    d_comb = torch.einsum("...ic,...oc->...io", rd, g)
    assert d_comb.shape[-2:] == (m, m)
    return d_x, d_res, d_post.reshape(post_layer_mix.shape), d_comb


def mhc_pre_apply_mix_ref(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """sum over i in order of mix[..., i] * x[..., i, :] (fp32, each product and sum rounded),
    in bf16. x (..., m, H) bf16, mix (..., m) or (..., m, 1) fp32."""
    m = x.shape[-2]
    mix = mix.reshape(*x.shape[:-1], 1)
    acc = mix[..., 0, :] * x[..., 0, :].float()
    for i in range(1, m):
        acc = acc + mix[..., i, :] * x[..., i, :].float()
    return acc.to(x.dtype)


def mhc_pre_apply_mix_bwd_ref(o_grad, x, mix, x_grad=None):
    """(x_grad + mix[..., i] * o_grad per stream, in fp32 rounded once to x_grad's dtype (no x_grad:
    the products alone), mix_grad[..., i] = sum over the hidden dim of o_grad * x[..., i, :] in
    float64, shaped as mix)."""
    m = x.shape[-2]
    mixf = mix.reshape(*x.shape[:-1], 1)
    grad = mixf * o_grad.float().unsqueeze(-2)
    new_x_grad = (grad if x_grad is None else x_grad.float() + grad).to(x.dtype)
    mix_grad = (o_grad.double().unsqueeze(-2) * x.double()).sum(-1)
    assert mix_grad.shape[-1] == m
    return new_x_grad, mix_grad.to(mix.dtype).reshape(mix.shape)
