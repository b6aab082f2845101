"""Engram references (plain torch): the n-gram hash, the fused RMSNorm weight, the gate forward and
backward, the weight-gradient reduction and the Sinkhorn optimizer helpers. The correctness
oracles of tilebake.engram, and its path for CPU tensors.

Semantics (TileKernels 2.1.0's torch/engram.py and kernels):
- hash: h_1 = id_0 * mul_0, h_i = h_{i-1} XOR id_i * mul_i (int64, wrapping); the index of n-gram
  order i + 1 and table m is h_i mod vocab_sizes[layer, i-1, m] (Python's modulo: non-negative)
  plus offsets[layer, (i-1) * M + m]; image tokens (and tables of non-positive size) get -1.
- gate: with x = hidden_states[t, h], k = kv[t, h], v = kv[t, hc], all in fp32,
  rstd_x = rsqrt(mean(x^2) + eps), rstd_k likewise, dot = sum(x * k * w) (w = weight_hidden *
  weight_embed, the fused weight), d = dot * rstd_x * rstd_k / sqrt(H),
  gate = sigmoid(sign(d) * sqrt(max(|d|, clamp_value))), out = bf16(x + gate * v); image tokens
  pass through unchanged. `dot` is returned raw (before the rstd and 1/sqrt(H) factors).
"""

from __future__ import annotations

import torch


def make_offsets(vocab_sizes: torch.Tensor) -> torch.Tensor:
    """(L, N-1, M) int32 table sizes -> (L, (N-1) * M) int32 exclusive prefix sums per layer."""
    flat = vocab_sizes.reshape(vocab_sizes.shape[0], -1).to(torch.int64)
    return (flat.cumsum(1) - flat).to(torch.int32)


def engram_hash_ref(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask=None) -> torch.Tensor:
    """ids (T, N) int32, multipliers (L, N) int64, vocab_sizes (L, N-1, M) int32, offsets
    (L, (N-1) * M) int32 -> (L, T, (N-1) * M) int32 embedding indices."""
    products = ngram_token_ids.to(torch.int64)[None, :, :] * multipliers[:, None, :]  # (L, T, N), wrapping
    h = products[..., 0]
    orders = []
    for i in range(1, multipliers.shape[1]):
        h = h ^ products[..., i]
        sizes = vocab_sizes[:, i - 1, :].to(torch.int64)[:, None, :]  # (L, 1, M)
        orders.append(torch.remainder(h[..., None], sizes.clamp_min(1)))  # (L, T, M)
    sizes = vocab_sizes.reshape(vocab_sizes.shape[0], 1, -1)
    out = (torch.cat(orders, dim=-1) + offsets[:, None, :].to(torch.int64)).to(torch.int32)
    out = out.masked_fill(sizes <= 0, -1)  # a table without entries: -1, as an image token
    if image_token_mask is not None:
        out = out.masked_fill(image_token_mask.view(1, -1, 1), -1)
    return out


def fused_weight_ref(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """(hc, H) bf16 x (hc, H) bf16 -> their fp32 product."""
    return weight_hidden.float() * weight_embed.float()


def _acc(t: torch.Tensor) -> torch.Tensor:
    """t in the gate's arithmetic dtype: fp32, or fp64 for fp64 inputs (the gradient checks)."""
    return t.double() if t.dtype == torch.float64 else t.float()


def _gate_terms(hidden_states, kv, weight_fused, eps):
    hc, hidden = hidden_states.shape[-2:]
    x = _acc(hidden_states)
    k = _acc(kv[..., :hc, :])
    rstd_x = torch.rsqrt(x.square().mean(-1) + eps)
    rstd_k = torch.rsqrt(k.square().mean(-1) + eps)
    dot = (x * k * _acc(weight_fused)).sum(-1)
    return x, k, _acc(kv[..., hc, :]), rstd_x, rstd_k, dot, hidden**-0.5


def _signed_sqrt(d, clamp_value):
    return torch.sign(d) * torch.sqrt(torch.clamp_min(d.abs(), clamp_value))


def engram_gate_fwd_ref(hidden_states, kv, weight_fused, eps, clamp_value, image_token_mask=None):
    """(output bf16 (T, hc, H), dot, gate_score, rstd_x, rstd_k fp32 (T, hc)) from the fused weight."""
    x, k, v, rstd_x, rstd_k, dot, scale = _gate_terms(hidden_states, kv, weight_fused, eps)
    gate = torch.sigmoid(_signed_sqrt(dot * rstd_x * rstd_k * scale, clamp_value))
    out = (x + gate[..., None] * v[..., None, :]).to(hidden_states.dtype)
    if image_token_mask is not None:
        out = torch.where(image_token_mask[:, None, None], hidden_states, out)
    return out, dot, gate, rstd_x, rstd_k


def engram_gate_ref(hidden_states, kv, weight_hidden, weight_embed, clamp_value, eps, save_for_backward=False,
                    image_token_mask=None):  # fmt: skip
    """The gate from the two RMSNorm weights, differentiable (autograd through torch ops): output,
    or (output, dot, gate_score, rstd_x, rstd_k) with save_for_backward."""
    hc = hidden_states.shape[-2]
    x, k, v = _acc(hidden_states), _acc(kv[..., :hc, :]), _acc(kv[..., hc, :])
    rstd_x = torch.rsqrt(x.square().mean(-1) + eps)
    rstd_k = torch.rsqrt(k.square().mean(-1) + eps)
    dot = ((x * _acc(weight_hidden)) * (k * _acc(weight_embed))).sum(-1)
    gate = torch.sigmoid(_signed_sqrt(dot * rstd_x * rstd_k * hidden_states.shape[-1] ** -0.5, clamp_value))
    out = (x + gate[..., None] * v[..., None, :]).to(hidden_states.dtype)
    if image_token_mask is not None:
        out = torch.where(image_token_mask[:, None, None], hidden_states, out)
    return (out, dot, gate, rstd_x, rstd_k) if save_for_backward else out


def engram_gate_bwd_ref(grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value,
                        image_token_mask=None):  # fmt: skip
    """(grad_hidden_states (T, hc, H), grad_kv (T, hc + 1, H) in the inputs' dtype, grad_w_partial
    (1, hc, H) fp32: the fused weight's gradient summed over tokens), from the saved tensors.

    With G = dL/dd = sum_j(g_j * v_j) * gate (1 - gate) * [|d| >= clamp] / (2 sqrt(|d|)) and
    c = rstd_x rstd_k / sqrt(H): dx = g + G (c k w - dot rstd_k / sqrt(H) rstd_x^3 x / H),
    dk = G (c x w - dot rstd_x / sqrt(H) rstd_k^3 k / H), dv = sum_h gate_h g_h, dw = sum_t G c x k.
    Image tokens: dx = g, dk = dv = 0, nothing to dw."""
    hc, hidden = hidden_states.shape[-2:]
    scale = hidden**-0.5
    x, k, v = _acc(hidden_states), _acc(kv[..., :hc, :]), _acc(kv[..., hc, :])
    g = _acc(grad_out)
    w = _acc(weight_fused)
    d = dot * rstd_x * rstd_k * scale
    passes = (d.abs() >= clamp_value) & (d != 0)
    dsdd = torch.where(passes, 0.5 / torch.sqrt(torch.clamp_min(d.abs(), clamp_value)), torch.zeros_like(d))
    grad_d = (g * v[..., None, :]).sum(-1) * gate_score * (1 - gate_score) * dsdd
    if image_token_mask is not None:
        grad_d = grad_d.masked_fill(image_token_mask[:, None], 0)
    c = (rstd_x * rstd_k * scale)[..., None]
    gd = grad_d[..., None]
    dx = g + gd * (c * k * w - (dot * rstd_k * scale)[..., None] * rstd_x[..., None] ** 3 * x / hidden)
    dk = gd * (c * x * w - (dot * rstd_x * scale)[..., None] * rstd_k[..., None] ** 3 * k / hidden)
    gate = gate_score if image_token_mask is None else gate_score.masked_fill(image_token_mask[:, None], 0)
    dv = (gate[..., None] * g).sum(-2)
    dw = (gd * c * x * k).sum(0, keepdim=True)
    grad_kv = torch.cat([dk, dv[..., None, :]], dim=-2).to(kv.dtype)
    return dx.to(hidden_states.dtype), grad_kv, dw


PARTIAL_GROUPS = 8  # the kernels' warps a CTA (kernels_tl/common.py sum_partial_rows)


def sum_partials(partials: torch.Tensor) -> torch.Tensor:
    """The fp32 sum over dim 0 in the kernels' fixed order: group g adds rows g, g + 8, ... in row
    order (from 0), then the groups' sums are added in group order."""
    groups = [torch.zeros_like(partials[0], dtype=torch.float32) for _ in range(PARTIAL_GROUPS)]
    for i in range(partials.shape[0]):
        groups[i % PARTIAL_GROUPS] = groups[i % PARTIAL_GROUPS] + partials[i].float()
    total = groups[0]
    for g in groups[1:]:
        total = total + g
    return total


def grad_w_reduce_ref(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """grad_weight_hidden += S * weight_embed and grad_weight_embed += S * weight_hidden, in place
    (fp32 buffers), S = sum_partials(grad_w_partial)."""
    total = sum_partials(grad_w_partial)
    grad_weight_hidden.add_(total * weight_embed.float())
    grad_weight_embed.add_(total * weight_hidden.float())


def engram_sinkhorn_momentum_update_ref(grad, momentum_buffer, beta1: float, nesterov: bool = True) -> torch.Tensor:
    """m = (1 - beta1) g + beta1 m (stored back in the buffer's dtype); returns fp32 beta1 m + (1 - beta1) g
    (Nesterov's look-ahead) or m. Each product and sum is rounded to fp32 on its own (the
    original's add(alpha=) may fuse a product into the sum, and does on some CPUs)."""
    scaled = grad.float() * (1 - beta1)  # separate products and sums, each rounded once (no add(alpha=))
    m = scaled + momentum_buffer.float() * beta1
    momentum_buffer.copy_(m)
    if nesterov:
        return m * beta1 + scaled
    return m


def engram_sinkhorn_step_ref(matrix, row_scale, col_scale, eps: float):
    """One row normalisation of diag(row_scale) M diag(col_scale): returns (row_norm before it,
    (1, D) column sums of squares after it); row_scale /= row_norm + eps in place."""
    iterate = row_scale[:, None] * matrix * col_scale[None, :]
    row_norm = torch.linalg.vector_norm(iterate, dim=1)
    row_scale.div_(row_norm + eps)
    col_sumsq = (row_scale[:, None] * matrix * col_scale[None, :]).square().sum(0, keepdim=True)
    return row_norm, col_sumsq


def engram_sinkhorn_step_reduce_ref(col_sumsq_partial, col_sumsq) -> None:
    """col_sumsq = sum_partials(col_sumsq_partial) (in place)."""
    col_sumsq.copy_(sum_partials(col_sumsq_partial))


def engram_sinkhorn_finalize_ref(matrix, row_scale, col_scale, eps: float, alpha: float, out=None) -> torch.Tensor:
    """alpha * diag(row_scale / (row_norm + eps)) M diag(col_scale), row_norm the rows' L2 norms of
    diag(row_scale) M diag(col_scale)."""
    iterate = row_scale[:, None] * matrix * col_scale[None, :]
    scale = row_scale / (torch.linalg.vector_norm(iterate, dim=1) + eps)
    result = alpha * scale[:, None] * matrix * col_scale[None, :]
    return result if out is None else out.copy_(result)
