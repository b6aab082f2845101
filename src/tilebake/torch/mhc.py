"""mHC (manifold hyper-connections) references: the oracles of tilebake.mhc and its CPU path.

m is the stream count (any m >= 1). Sums over streams run in stream order, each product and sum
rounded to fp32 on its own, as the kernels do (post adds each term by a fused multiply-add, as
its kernel does: fma32): on the CPU the references give the kernels' bits.
The `*_like_original` forms compute as TileKernels' torch/mhc.py does (einsum, torch's own
reduction order), for tolerance checks against the original's arithmetic.
"""

from __future__ import annotations

import torch


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c of fp32 tensors with one rounding to fp32, as the GPU's fused multiply-add; of
    other dtypes (the float64 oracles) plainly. Differentiable as a * b + c."""
    if not a.dtype == b.dtype == c.dtype == torch.float32:
        return a * b + c
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or c.requires_grad):
        plain = a * b + c
        with torch.no_grad():
            correction = _fma32(a, b, c) - plain
        return plain + correction  # the exact value; the gradient of a * b + c
    return _fma32(a, b, c)


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    a, b, c = (t.double() for t in torch.broadcast_tensors(a, b, c))
    p = a * b  # exact: two 24-bit significands
    s = p + c  # rounded to double; the exact sum is s + err (Knuth's two-sum)
    v = s - p
    err = (p - (s - v)) + (c - v)
    r = s.float()
    # Rounding s to fp32 rounds the exact sum twice. That differs from one rounding only where s
    # lies exactly halfway between two floats and err moves the exact sum off that point: then
    # the neighbour on err's side is the answer.
    toward = torch.where(s > r.double(), float("inf"), float("-inf")).float()
    other = torch.nextafter(r, toward)
    tie = (s != r.double()) & ((r.double() + other.double()) * 0.5 == s) & (err != 0)
    return torch.where(tie, torch.where(err > 0, torch.maximum(r, other), torch.minimum(r, other)), r)


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
    (fp32, i in order, each term by fma32), in bf16. x (..., H) bf16, residual (..., m, H) bf16,
    post (..., m) or (..., m, 1) fp32, comb (..., m, m) fp32."""
    m = residual.shape[-2]
    post = post_layer_mix.reshape(*residual.shape[:-1])
    xf = x.float()
    outs = []
    for o in range(m):
        acc = post[..., o, None] * xf
        for i in range(m):
            acc = fma32(comb_res_mix[..., i, o, None], residual[..., i, :].float(), acc)
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


# --- the per-token mix math (references only so far: their kernels come next) ---


def sinkhorn_normalize_ref(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """(..., m, m) -> a near doubly stochastic matrix: a row softmax plus eps, then `repeat`
    column normalisations, each but the first preceded by a row normalisation (x / (sum + eps))."""
    x = x.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def mhc_head_compute_mix_ref(input_mix, mhc_scale, mhc_base, mhc_pre_eps: float) -> torch.Tensor:
    """sigmoid(input_mix * scale + base) + eps: input_mix (..., m), scale (1,) or a scalar, base (m,)."""
    return torch.sigmoid(input_mix * mhc_scale + mhc_base) + mhc_pre_eps


def mhc_pre_split_mixes_ref(input_mixes, mhc_scale, mhc_base, mhc_mult: int, mhc_post_mult_value: float,
                            mhc_pre_eps: float):  # fmt: skip
    """input_mixes (..., m (m + 2)) -> (pre (..., m, 1), post (..., m, 1), comb (..., m, m)):
    y = mixes * scale[segment] + base (scale (3,): one value each for the pre, post and comb
    segments); pre = sigmoid(y[:m]) + eps, post = sigmoid(y[m:2m]) * post_mult, comb = y[2m:]."""
    m = mhc_mult
    scale = torch.cat([mhc_scale[0].expand(m), mhc_scale[1].expand(m), mhc_scale[2].expand(m * m)])
    y = input_mixes * scale + mhc_base
    pre = y[..., :m].sigmoid().unsqueeze(-1) + mhc_pre_eps
    post = (y[..., m : 2 * m].sigmoid() * mhc_post_mult_value).unsqueeze(-1)
    return pre, post, y[..., 2 * m :].unflatten(-1, (m, m))


def mhc_pre_norm_fn_ref(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps: float) -> torch.Tensor:
    """The pre-norm projection: residual (..., m, H) flattened to K = m H per token, mixes =
    (x @ fn'^T) * rsqrt(mean(x^2) + eps) in fp32, fn' = fn * norm_weight where a weight is given;
    fn (m3, K) fp32 -> (..., m3)."""
    fn = mhc_fn if mhc_norm_weight is None else mhc_fn * mhc_norm_weight
    x = residual.flatten(-2).float()
    rstd = (x.square().mean(-1, keepdim=True) + mhc_norm_eps).rsqrt()
    return (x @ fn.float().t()) * rstd


def mhc_pre_norm_fn_partials_ref(residual, fn, n_splits: int):
    """Split-K partials of the projection, as a split GEMM leaves them: (out_mul (n_splits, T, 1,
    m3), sqrsum (n_splits, T, 1)) over K = m H cut into n_splits equal pieces (T tokens flattened)."""
    x = residual.flatten(-2).float().reshape(-1, fn.shape[1])
    pieces_x, pieces_fn = x.chunk(n_splits, dim=-1), fn.float().chunk(n_splits, dim=-1)
    out_mul = torch.stack([(xs @ fs.t()).unsqueeze(1) for xs, fs in zip(pieces_x, pieces_fn)])
    sqrsum = torch.stack([xs.square().sum(-1, keepdim=True) for xs in pieces_x])
    return out_mul, sqrsum


# --- the mix math as the kernels compute it (their CPU path): sums in index order, each sum,
# product and quotient rounded on its own; the exponential is the one thing not bit-exact ---


def _ordered_sum(x: torch.Tensor, dim: int, start_at_zero: bool = False) -> torch.Tensor:
    """x summed over dim in index order (kept as a size-1 dim); from 0.0 if start_at_zero."""
    parts = x.unbind(dim)
    acc = torch.zeros_like(parts[0]) + parts[0] if start_at_zero else parts[0]
    for part in parts[1:]:
        acc = acc + part
    return acc.unsqueeze(dim)


def _sinkhorn_softmax(x: torch.Tensor, eps: float):
    """(p, p + eps): the rows' softmax as the kernels compute it (max subtracted, true division)."""
    e = (x - x.amax(-1, keepdim=True)).exp()
    p = e / _ordered_sum(e, -1)
    return p, p + eps


def sinkhorn_ordered_ref(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """sinkhorn_normalize_ref with the kernels' sums (index order) and IEEE divisions (x / (sum +
    eps)): the CPU path's arithmetic. The CUDA kernels' steps divide by div.approx (2 ulp), so the
    two devices agree within the original's tolerance, not bit for bit. Step s normalises the
    columns (s even) or the rows (s odd), 2 * repeat - 1 steps."""
    _, x = _sinkhorn_softmax(x, eps)
    for s in range(2 * repeat - 1):
        x = x / (_ordered_sum(x, -2 if s % 2 == 0 else -1) + eps)
    return x


def sinkhorn_bwd_ordered_ref(grad_output: torch.Tensor, x: torch.Tensor, repeat: int = 10, eps: float = 1e-6):
    """The gradient of sinkhorn_ordered_ref(x) for grad_output, as the kernel computes it (IEEE
    divisions where the CUDA kernel's steps use div.approx, as in the forward): per step
    in reverse, g = (g - sum(g * y)) / d for y = x_in / d, d = sum(x_in) + eps along the step's
    axis; then the softmax's p * (g - sum over the row of g * p). Each sum of products from 0."""
    p, cur = _sinkhorn_softmax(x, eps)
    inputs = []
    for s in range(2 * repeat - 1):
        inputs.append(cur)
        cur = cur / (_ordered_sum(cur, -2 if s % 2 == 0 else -1) + eps)
    g = grad_output
    for s in reversed(range(2 * repeat - 1)):
        dim = -2 if s % 2 == 0 else -1
        d = _ordered_sum(inputs[s], dim) + eps
        g = (g - _ordered_sum(g * (inputs[s] / d), dim, start_at_zero=True)) / d
    return p * (g - _ordered_sum(g * p, -1, start_at_zero=True))


def _segment_scale(mhc_scale: torch.Tensor, m: int) -> torch.Tensor:
    return torch.cat([mhc_scale[0].expand(m), mhc_scale[1].expand(m), mhc_scale[2].expand(m * m)])


def mhc_pre_split_mixes_bwd_ref(pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, mhc_scale,
                                mhc_base, mhc_post_mult_value: float):  # fmt: skip
    """(input_mixes_grad, mhc_scale_grad (3,), mhc_base_grad) of mhc_pre_split_mixes_ref, the
    sigmoids recomputed from input_mixes as the kernel does (1 / (1 + exp(-y)), s (1 - s), the
    post gradient times post_mult first, each operation rounded on its own); the scale and base
    gradients summed over the tokens in float64 (an oracle for tolerances, not for bits)."""
    m3 = input_mixes.shape[-1]
    m = next(k for k in range(1, m3 + 1) if k * (k + 2) == m3)
    mixes = input_mixes.reshape(-1, m3)
    scale = _segment_scale(mhc_scale, m)
    y = mixes * scale + mhc_base
    s = 1 / (1 + (-y[:, : 2 * m]).exp())
    ds = s * (1 - s)
    g_pre = pre_layer_mix_grad.reshape(-1, m) * ds[:, :m]
    g_post = post_layer_mix_grad.reshape(-1, m) * mhc_post_mult_value * ds[:, m:]
    gy = torch.cat([g_pre, g_post, comb_res_mix_grad.reshape(-1, m * m)], dim=-1)
    prods = (gy.double() * mixes.double()).sum(0)
    scale_grad = torch.stack([prods[:m].sum(), prods[m : 2 * m].sum(), prods[2 * m :].sum()])
    return (gy * scale).reshape(input_mixes.shape), scale_grad.to(mhc_scale.dtype), gy.double().sum(0).to(mhc_base.dtype)


def mhc_head_compute_mix_bwd_ref(output_mix_grad, input_mix, mhc_scale, mhc_base, num_partials: int):
    """(input_mix_grad, scale partials (P, 1), base partials (P, m)) of mhc_head_compute_mix_ref:
    gy = g * s (1 - s) with s = 1 / (1 + exp(-y)) recomputed (each operation rounded on its own),
    input_mix_grad = gy * scale; partial row b sums the tokens [b * ceil(T / P), ...) as the
    kernel's CTA b does, in float64 (summing the rows gives the full gradients)."""
    m = input_mix.shape[-1]
    x = input_mix.reshape(-1, m)
    s = 1 / (1 + (-(x * mhc_scale + mhc_base)).exp())
    gy = output_mix_grad.reshape(-1, m) * (s * (1 - s))
    per = -(-x.shape[0] // num_partials)
    scale_p = torch.zeros(num_partials, 1, dtype=torch.float64)
    base_p = torch.zeros(num_partials, m, dtype=torch.float64)
    for b in range(min(num_partials, -(-x.shape[0] // per) if per else 0)):
        rows = slice(b * per, (b + 1) * per)
        base_p[b] = gy[rows].double().sum(0)
        scale_p[b, 0] = (gy[rows].double() * x[rows].double()).sum()
    return (gy * mhc_scale).reshape(input_mix.shape), scale_p.float(), base_p.float()
