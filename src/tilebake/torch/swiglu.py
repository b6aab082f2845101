"""Plain-PyTorch reference of the fused SwiGLU forward and backward for MoE experts.

The bit-exact oracle for kernels_tl/quant/swiglu_forward.py and swiglu_backward.py, and the
CPU path of tilebake.quant.swiglu_*. The arithmetic is TileKernels 2.1.0's
(../shared/spec/numerics.md, "SwiGLU"): every fp32 operation is a separate eager torch op, in
this order, divisions tensor by tensor (true IEEE divisions). Do not "simplify" it. On CUDA
tensors torch.exp is CUDA's expf, the kernels' exp, so the results equal the kernels' bit for
bit; on CPU tensors torch.exp may differ from expf in the last bit.

All fp32, round to nearest even; l = x[:, :H], r = x[:, H:] as fp32 (e4m3 inputs are first
dequantized as data * sf), w the row's topk weight, s routed_scaling_factor, c clamp_value:
    clamp:    l = min(l, c), r = min(max(r, -c), c)   (NaN passes; none without c)
    forward:  t = 1 + exp(-l);  act = l / t * r;  out = act * e with e = w * s (e = w without s),
              out = act without topk weights (s is then not used). Every row is computed.
    backward: sig = 1 / t;  g = act_x_grad;  gws = (g * e) * sig with weights, g * sig without;
              l_grad = (gws * r) * fma(l, 1 - sig, 1);  r_grad = gws * l;
              0 where l was clamped (l > c) or r was (|r| > c);
              act_out = act * e with weights, act without;
              weight_grad = sum_h(g * act) * s   (a reduction: kernels sum in another order).
    With weights, e = 0 on the padding rows of the psum layout (so their gradients are +-0)
    and their weight_grad is 0; without weights no row is masked.
Quantized outputs cast the fp32 values (not values rounded to bf16) with tilebake.torch.cast.

The psum layout: `psum` int32 (num_experts,); expert e owns rows [align(psum[e-1], alignment),
psum[e]) (psum[-1] taken as 0); every other row is a padding row. It selects the rows counted
in clamped_count (forward) and the rows whose e is 0 (backward, with weights); nothing else.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

__all__ = ["get_mapping_from_psum", "swiglu_forward", "swiglu_backward"]

QuantTensor = Tuple[torch.Tensor, torch.Tensor]


def get_mapping_from_psum(
    psum_num_tokens_per_expert: torch.Tensor, num_expanded_tokens: int, alignment: int = 128
) -> torch.Tensor:
    """The expert of each of `num_expanded_tokens` rows, int64, -1 for padding rows."""
    psum = psum_num_tokens_per_expert.to(torch.int64).cpu()
    mapping = torch.full((num_expanded_tokens,), -1, dtype=torch.int64)
    start = 0
    for e, end in enumerate(psum.tolist()):
        begin = -(-start // alignment) * alignment
        mapping[begin:end] = e
        start = end
    return mapping.to(psum_num_tokens_per_expert.device)


def _valid_rows(num_rows: int, psum, alignment: int, device) -> torch.Tensor:
    if psum is None:
        return torch.ones(num_rows, dtype=torch.bool, device=device)
    return get_mapping_from_psum(psum, num_rows, alignment).to(device) >= 0


def _dequantize(x: Union[torch.Tensor, QuantTensor], num_per_channels: Optional[int]) -> torch.Tensor:
    """x as fp32: a bf16/fp32 tensor, or (e4m3 data, fp32 sf) with (1, num_per_channels) blocks."""
    if isinstance(x, torch.Tensor):
        return x.float()
    data, sf = x
    if sf.dtype != torch.float32:
        raise TypeError(f"x[1] (the SF) must be float32, got {sf.dtype}")
    if num_per_channels is None:
        raise ValueError("num_per_channels must be given for a quantized x")
    return data.float() * sf.float().repeat_interleave(num_per_channels, dim=1)[:, : data.shape[1]]


def _clamp(left: torch.Tensor, right: torch.Tensor, clamp_value):
    """(l', r', l > c, r > c, r < -c); comparisons with NaN are false, so NaN passes through."""
    if clamp_value is None:
        no = torch.zeros_like(left, dtype=torch.bool)
        return left, right, no, no, no
    c = torch.full_like(left, clamp_value)  # the fp32 rounding of clamp_value, like the kernel's argument
    l_hi, r_hi, r_lo = left > c, right > c, right < -c
    return torch.where(l_hi, c, left), torch.where(r_hi, c, torch.where(r_lo, -c, right)), l_hi, r_hi, r_lo


def _row_factor(topk_weights, routed_scaling_factor, like):
    """e = w * s per row as an fp32 (E, 1) column (s rounded to fp32 first, as the kernels get it)."""
    e = topk_weights.float()[:, None]
    if routed_scaling_factor is not None:
        e = e * torch.full_like(e, routed_scaling_factor)
    return e.to(like.device)


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 fma(a, b, c) = a * b + c rounded once (CUDA's __fmaf_rn), for fp32 tensors, exactly.

    In fp64 the product p = a * b is exact (24 + 24 bits <= 53), but p + c rounded to fp64 and
    then to fp32 can round twice wrongly (an fp64 sum landing on an fp32 midpoint; measured: 1.4%
    of adversarial cases). So the sum is rounded to odd instead: s = fl64(p + c), its error
    err = (p + c) - s from TwoSum (exact in round-to-nearest), and where err != 0 and s's last
    bit is even, s moves one fp64 ulp towards err. Rounding the round-to-odd value to fp32 is the
    correctly rounded result since 53 >= 24 + 2 (Boldo & Melquiond, IEEE Trans. Computers 57(4),
    2008). Checked against C's fmaf on 2^24 inputs (random bit patterns, near-midpoint cases,
    cancellation, +-0/inf/NaN). No overflow: |p| < 2^256 fits fp64."""
    a64, b64, c64 = a.double(), b.double(), c.double()
    p = a64 * b64
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    even = (s.view(torch.int64) & 1) == 0
    inf = torch.full_like(s, float("inf"))
    nudged = torch.nextafter(s, torch.where(err > 0, inf, -inf))
    s = torch.where((err != 0) & torch.isfinite(s) & even, nudged, s)
    return s.float()


def swiglu_forward(
    x: torch.Tensor,
    psum_num_tokens_per_expert: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    routed_scaling_factor: Optional[float] = None,
    clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
    alignment: int = 128,
) -> torch.Tensor:
    """out = l / (1 + exp(-l)) * r [* (topk_weights * routed_scaling_factor)], fp32 (E, H).

    x: (E, 2H) bf16/fp32, l and r clamped as the module docstring says. Every row is computed
    (padding rows of the psum layout too, from whatever x holds there); routed_scaling_factor
    only enters through the weights. clamped_count (int64 (4,)), if given, is incremented in
    place by [#(l > c), #(r > c), #(r < -c), #elements of x_left] over the valid (non-padding)
    rows, comparing the unclamped values.
    """
    x32 = x.float()
    hidden = x32.shape[1] // 2
    lc, rc, l_hi, r_hi, r_lo = _clamp(x32[:, :hidden], x32[:, hidden:], clamp_value)
    t = 1 + torch.exp(-lc)
    out = lc / t * rc
    if topk_weights is not None:
        out = out * _row_factor(topk_weights, routed_scaling_factor, x32)
    if clamped_count is not None:
        valid = _valid_rows(x32.shape[0], psum_num_tokens_per_expert, alignment, x32.device)[:, None]
        counts = torch.stack(
            [(l_hi & valid).sum(), (r_hi & valid).sum(), (r_lo & valid).sum(), valid.sum() * hidden]
        ).to(clamped_count.device)
        clamped_count += counts
    return out


def swiglu_backward(
    x: Union[torch.Tensor, QuantTensor],
    act_x_grad: torch.Tensor,
    psum_num_tokens_per_expert: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    routed_scaling_factor: Optional[float] = None,
    clamp_value: Optional[float] = None,
    alignment: int = 128,
    num_per_channels: Optional[int] = None,
) -> tuple:
    """Gradients of swiglu_forward, all fp32, in 2.1.0's reference order: (x_grad (E, 2H),
    act_out (E, H)) without topk_weights, (x_grad, weight_grad (E,), act_out) with them.

    x: bf16/fp32 (E, 2H), or (e4m3 data, fp32 sf) with (1, num_per_channels) blocks. act_out is
    the forward's output (act * e with weights). weight_grad sums the fp32 products g * act in
    fp64 (the kernels sum in fp32 in their own order), rounds to fp32, then multiplies by s; it is
    0 on padding rows. psum matters only with topk_weights (their rows' e = 0).
    """
    x32 = _dequantize(x, num_per_channels)
    hidden = x32.shape[1] // 2
    lc, rc, l_hi, r_hi, r_lo = _clamp(x32[:, :hidden], x32[:, hidden:], clamp_value)
    g = act_x_grad.float()
    t = 1 + torch.exp(-lc)
    one = torch.ones_like(t)
    sig = one / t
    act = lc / t * rc
    zero = torch.zeros((), dtype=torch.float32, device=x32.device)
    if topk_weights is not None:
        valid = _valid_rows(x32.shape[0], psum_num_tokens_per_expert, alignment, x32.device)[:, None]
        e = torch.where(valid, _row_factor(topk_weights, routed_scaling_factor, x32), zero)
        gws = (g * e) * sig
    else:
        gws = g * sig
    l_grad = torch.where(l_hi, zero, (gws * rc) * fma32(lc, one - sig, one))
    r_grad = torch.where(r_hi | r_lo, zero, gws * lc)
    x_grad = torch.cat([l_grad, r_grad], dim=1)
    if topk_weights is None:
        return x_grad, act
    weight_grad = (g * act).double().sum(dim=1).float()
    if routed_scaling_factor is not None:
        weight_grad = weight_grad * torch.full_like(weight_grad, routed_scaling_factor)
    weight_grad = torch.where(valid[:, 0], weight_grad, zero)
    return x_grad, weight_grad, act * e
