"""The engram ops on NPU tensors with Ascend 950 kernels: engram_hash (the same indices as the
reference), fused_weight and grad_w_reduce (the same bits), engram_gate_fwd and _bwd (the
reference's arithmetic, sums in another order; the backward's rows up to ASCEND_MAX_HIDDEN), the
Sinkhorn helpers' momentum, step_reduce (the same bits), step (rows up to MAX_COLS columns; its
sums of squares in another order) and finalize (the row norm's sum in another order). Never run
on an NPU here: the kernels are run on the CPU by tests/ascend/test_emulated_engram.py, their
launches checked against a stand-in libascendcl."""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.engram.engram_gate_bwd import ASCEND_MAX_HIDDEN, EngramGateBwdAscendVariant
from tilebake.engram.engram_gate_fwd import MAX_HIDDEN, EngramGateFwdAscendVariant
from tilebake.engram.engram_hash import EngramHashAscendVariant
from tilebake.engram.engram_sinkhorn import EngramSinkhornAscendVariant
from tilebake.engram.fused_weight import FusedWeightAscendVariant
from tilebake.engram.grad_w_reduce import GradWReduceAscendVariant

_HASH = ascend.AscendKernelTable(EngramHashAscendVariant)
_FUSED = ascend.AscendKernelTable(FusedWeightAscendVariant)
_GATE = ascend.AscendKernelTable(EngramGateFwdAscendVariant)
_GATE_BWD = ascend.AscendKernelTable(EngramGateBwdAscendVariant)
_REDUCE = ascend.AscendKernelTable(GradWReduceAscendVariant)
_SINKHORN = ascend.AscendKernelTable(EngramSinkhornAscendVariant)
_FORMATS = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def engram_hash_npu(ids, multipliers, vocab_sizes, offsets, image_token_mask):
    """engram_hash of checked NPU tensors."""
    num_tokens, ngram = ids.shape
    layers, tables = multipliers.shape[0], vocab_sizes.shape[2]
    out = ids.new_empty((layers, num_tokens, (ngram - 1) * tables))
    if num_tokens == 0:
        return out
    ids, mul, voc, off = (t.contiguous() for t in (ids, multipliers, vocab_sizes, offsets))
    mask = image_token_mask.contiguous() if image_token_mask is not None else None
    index, kernel = _HASH.on(ids)
    kernel(index, ids.data_ptr(), mul.data_ptr(), voc.data_ptr(), off.data_ptr(),
           (mask if mask is not None else ids).data_ptr(), out.data_ptr(), int(mask is not None), num_tokens, ngram,
           layers, tables)  # fmt: skip
    return out


def fused_weight_npu(weight_hidden, weight_embed):
    """weight_hidden * weight_embed in fp32 of checked NPU tensors."""
    weight_hidden, weight_embed = weight_hidden.contiguous(), weight_embed.contiguous()
    out = weight_hidden.new_empty(weight_hidden.shape, dtype=torch.float32)
    index, kernel = _FUSED.on(weight_hidden)
    kernel(index, weight_hidden.data_ptr(), weight_embed.data_ptr(), out.data_ptr(), out.numel())
    return out


def gate_forward_npu(hidden_states, k, v, weight_fused, eps, clamp_value, image_token_mask, save, inplace):
    """(output, saved (4, T, hc) fp32 or None) of checked NPU tensors (engram_gate_fwd's _forward):
    output is hidden_states itself when inplace."""
    num_tokens, hc, hidden = hidden_states.shape
    if hidden > 1 and any(t.stride(-1) != 1 for t in (hidden_states, k, v)):
        hidden_states, k, v = (t.contiguous() for t in (hidden_states, k, v))  # rows the DMA reads whole
    out = hidden_states if inplace else torch.empty_like(hidden_states, memory_format=torch.contiguous_format)
    saved = hidden_states.new_empty((4, num_tokens, hc), dtype=torch.float32) if save else None
    w = weight_fused.contiguous()
    mask = image_token_mask.contiguous() if image_token_mask is not None else None
    unused = hidden_states.data_ptr()  # an absent tensor's pointer: never read or written
    planes = list(saved.unbind(0)) if save else [None] * 4
    index, kernel = _GATE.on(hidden_states, MAX_HIDDEN)
    kernel(
        index, hidden_states.data_ptr(), k.data_ptr(), v.data_ptr(), w.data_ptr(),
        (mask if mask is not None else hidden_states).data_ptr(), out.data_ptr(),
        *[p.data_ptr() if p is not None else unused for p in planes], eps, clamp_value, num_tokens, hc, hidden,
        int(mask is not None), int(save), hidden_states.stride(0), hidden_states.stride(1), k.stride(0), k.stride(1),
        out.stride(0), out.stride(1), v.stride(0),
    )  # fmt: skip
    return out, saved  # (the caller bumps hidden_states' version when out is it)


def gate_backward_npu(grad_out, x, k, v, w, saved, clamp_value, mask, dk, dv):
    """(grad_x, grad_w_partial (num_vec_cores, hc, H)) of checked NPU tensors (engram_gate_bwd's
    _backward), k's and v's gradients written into dk and dv."""
    num_tokens, hc, hidden = x.shape
    if hidden > 1 and any(t.stride(-1) != 1 for t in (grad_out, x, k, v)):
        grad_out, x, k, v = (t.contiguous() for t in (grad_out, x, k, v))  # rows the DMA reads whole
    dk_out = dk if dk.stride(-1) == 1 or hidden == 1 else torch.empty_like(dk, memory_format=torch.contiguous_format)
    dv_out = dv if dv.stride(-1) == 1 or hidden == 1 else torch.empty_like(dv, memory_format=torch.contiguous_format)
    index, kernel = _GATE_BWD.on(x, ASCEND_MAX_HIDDEN)
    dx = x.new_empty(x.shape)
    partial = x.new_zeros((kernel.variant.num_vec_cores, hc, hidden), dtype=torch.float32)
    w = w.contiguous()
    saved = {name: t.contiguous() for name, t in saved.items()}
    kernel(
        index, grad_out.data_ptr(), x.data_ptr(), k.data_ptr(), v.data_ptr(), w.data_ptr(),
        *[saved[n].data_ptr() for n in ("dot", "gate_score", "rstd_x", "rstd_k")],
        (mask.contiguous() if mask is not None else x).data_ptr(), dx.data_ptr(), dk_out.data_ptr(),
        dv_out.data_ptr(), partial.data_ptr(), clamp_value, num_tokens, hc, hidden, int(mask is not None),
        grad_out.stride(0), grad_out.stride(1), x.stride(0), x.stride(1), k.stride(0), k.stride(1), dx.stride(0),
        dx.stride(1), dk_out.stride(0), dk_out.stride(1), v.stride(0), dv_out.stride(0),
    )  # fmt: skip
    if dk_out is not dk:
        dk.copy_(dk_out)
    if dv_out is not dv:
        dv.copy_(dv_out)
    return dx, partial


def grad_w_reduce_npu(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    """grad_w_reduce of checked NPU tensors, in place."""
    p, wh, we = (t.contiguous() for t in (grad_w_partial, weight_hidden, weight_embed))
    index, kernel = _REDUCE.on(wh)
    kernel(index, p.data_ptr(), wh.data_ptr(), we.data_ptr(), grad_weight_hidden.data_ptr(),
           grad_weight_embed.data_ptr(), p.shape[0], wh.numel())  # fmt: skip
    torch.autograd.graph.increment_version([grad_weight_hidden, grad_weight_embed])


def sinkhorn_momentum_npu(grad, momentum_buffer, beta1, one_minus_beta1, nesterov):
    """engram_sinkhorn_momentum_update of checked NPU tensors (momentum_buffer contiguous)."""
    g = grad.contiguous()
    out = g.new_empty(g.shape, dtype=torch.float32)
    if g.numel():
        index, kernel = _SINKHORN.on(g, "momentum", _FORMATS[g.dtype], _FORMATS[momentum_buffer.dtype])
        kernel(index, g.data_ptr(), momentum_buffer.data_ptr(), out.data_ptr(), beta1, one_minus_beta1, int(nesterov),
               g.numel())  # fmt: skip
        torch.autograd.graph.increment_version(momentum_buffer)
    return out


def sinkhorn_step_npu(matrix, row_scale, col_scale, eps):
    """engram_sinkhorn_step of checked NPU tensors (R >= 1 rows of at most MAX_COLS columns,
    row_scale contiguous, updated in place): (row_norm (R,), partials (min(vector cores, R), D))."""
    m, cs = matrix.contiguous(), col_scale.contiguous()
    rows, cols = m.shape
    index, kernel = _SINKHORN.on(m, "step", "fp32", "fp32")
    num_ctas = min(kernel.variant.num_vec_cores, rows)
    norm = m.new_empty((rows,))
    partial = m.new_empty((num_ctas, cols))
    kernel(index, m.data_ptr(), row_scale.data_ptr(), cs.data_ptr(), norm.data_ptr(), partial.data_ptr(), eps, rows,
           cols, num_ctas)  # fmt: skip
    torch.autograd.graph.increment_version(row_scale)
    return norm, partial


def sinkhorn_step_reduce_npu(col_sumsq_partial, col_sumsq):
    """engram_sinkhorn_step_reduce of checked NPU tensors (col_sumsq contiguous, >= 1 partial), in place."""
    p = col_sumsq_partial.contiguous()
    index, kernel = _SINKHORN.on(p, "step_reduce", "fp32", "fp32")
    kernel(index, p.data_ptr(), col_sumsq.data_ptr(), p.shape[0], p.shape[1])
    torch.autograd.graph.increment_version(col_sumsq)


def sinkhorn_finalize_npu(matrix, row_scale, col_scale, eps, alpha, out):
    """engram_sinkhorn_finalize of checked NPU tensors, into `out` when given (returned)."""
    m, rs, cs = matrix.contiguous(), row_scale.contiguous(), col_scale.contiguous()
    rows, cols = m.shape
    target = out if out is not None and out.is_contiguous() else m.new_empty((rows, cols))
    if rows:
        index, kernel = _SINKHORN.on(m, "finalize", "fp32", "fp32")
        kernel(index, m.data_ptr(), rs.data_ptr(), cs.data_ptr(), target.data_ptr(), eps, alpha, rows, cols)
    if out is None or target is out:
        return target
    return out.copy_(target)
