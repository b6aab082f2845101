"""Plain-PyTorch reference of the fused SwiGLU forward and backward for MoE experts.

The bit-exact oracle for kernels_tl/quant/swiglu_forward.py and swiglu_backward.py, and the
CPU path of tilebake.quant.swiglu_*. Every fp32 operation is a separate eager torch op in the
kernels' order (the kernels use __fadd_rn/__fmul_rn/__fdiv_rn, which nvcc never fuses into
FMAs); divisions are tensor by tensor (true IEEE divisions). Do not "simplify" the arithmetic.

Arithmetic (all fp32, round to nearest even), per element of a valid row, with
l = x[:, :H], r = x[:, H:] (e4m3 inputs are first dequantized as data * sf):
    l' = c if l > c else l;  r' = c if r > c else (-c if r < -c else r)   (no clamp: l' = l, r' = r)
    e = exp(-l');  den = 1 + e;  silu = l' / den;  t = silu * r'
    forward output y = (t * w) * s     (w: the row's topk weight, s: routed_scaling_factor;
                                        each factor applied only when given)
backward, with g = act_x_grad (as fp32):
    sig = 1 / den;  gw = (g * w) * s
    dr = gw * silu                              (0 where r was clamped)
    dl = (gw * r') * (sig * (1 + l' * (1 - sig)))   (0 where l was clamped)
    weight_grad[row] = sum_h(t * g) * s         (a reduction: kernels sum in another order)
    act_out = y
Quantized outputs cast the fp32 values (not values rounded to bf16) with tilebake.torch.cast.

The psum layout: `psum` int32 (num_experts,); expert e owns rows [align(psum[e-1], alignment),
psum[e]) (psum[-1] taken as 0). Every other row (the padding between experts and rows from
psum[-1] on) is a padding row: its outputs are +0 (a zero row's scale in quantized outputs),
it is not counted in clamped_count, and its weight_grad is 0.
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


def _factors(x32, topk_weights, routed_scaling_factor):
    w = None if topk_weights is None else topk_weights.float()[:, None]
    s = None if routed_scaling_factor is None else torch.full_like(x32[:, :1], routed_scaling_factor)
    return w, s


def _scaled(v, w, s):
    if w is not None:
        v = v * w
    if s is not None:
        v = v * s
    return v


def swiglu_forward(
    x: torch.Tensor,
    psum_num_tokens_per_expert: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    routed_scaling_factor: Optional[float] = None,
    clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
    alignment: int = 128,
) -> torch.Tensor:
    """y = silu(clamp(x_left)) * clamp(x_right) [* topk_weights] [* routed_scaling_factor], fp32 (E, H).

    x: (E, 2H) bf16/fp32. Padding rows of the psum layout are +0. clamped_count (int64 (4,)),
    if given, is incremented in place by [#(l > c), #(r > c), #(r < -c), #elements of x_left]
    over the valid rows.
    """
    x32 = x.float()
    hidden = x32.shape[1] // 2
    valid = _valid_rows(x32.shape[0], psum_num_tokens_per_expert, alignment, x32.device)[:, None]
    zero = torch.zeros((), dtype=torch.float32, device=x32.device)
    left = torch.where(valid, x32[:, :hidden], zero)
    right = torch.where(valid, x32[:, hidden:], zero)
    lc, rc, l_hi, r_hi, r_lo = _clamp(left, right, clamp_value)
    den = 1 + torch.exp(-lc)
    silu = lc / den
    w, s = _factors(x32, topk_weights, routed_scaling_factor)
    y = _scaled(silu * rc, w, s)
    if clamped_count is not None:
        counts = torch.stack(
            [
                (l_hi & valid).sum(),
                (r_hi & valid).sum(),
                (r_lo & valid).sum(),
                valid.sum() * hidden,
            ]
        ).to(clamped_count.device)
        clamped_count += counts
    return torch.where(valid, y, zero)


def swiglu_backward(
    x: Union[torch.Tensor, QuantTensor],
    act_x_grad: torch.Tensor,
    psum_num_tokens_per_expert: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    routed_scaling_factor: Optional[float] = None,
    clamp_value: Optional[float] = None,
    alignment: int = 128,
    num_per_channels: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of swiglu_forward, all fp32: (x_grad (E, 2H), weight_grad (E,), act_out (E, H)).

    x: bf16/fp32 (E, 2H), or (e4m3 data, fp32 sf) with (1, num_per_channels) blocks. weight_grad
    is summed in fp64 here (the kernels sum in fp32 in their own order). Padding rows are +0.
    """
    x32 = _dequantize(x, num_per_channels)
    hidden = x32.shape[1] // 2
    valid = _valid_rows(x32.shape[0], psum_num_tokens_per_expert, alignment, x32.device)[:, None]
    zero = torch.zeros((), dtype=torch.float32, device=x32.device)
    left = torch.where(valid, x32[:, :hidden], zero)
    right = torch.where(valid, x32[:, hidden:], zero)
    g = torch.where(valid, act_x_grad.float(), zero)
    lc, rc, l_hi, r_hi, r_lo = _clamp(left, right, clamp_value)
    den = 1 + torch.exp(-lc)
    one = torch.ones_like(den)
    sig = one / den
    silu = lc / den
    t = silu * rc
    w, s = _factors(x32, topk_weights, routed_scaling_factor)
    act_out = _scaled(t, w, s)
    gw = _scaled(g, w, s)
    dr = gw * silu
    dsilu = sig * (1 + lc * (one - sig))
    dl = (gw * rc) * dsilu
    dl = torch.where(l_hi, zero, dl)
    dr = torch.where(r_hi | r_lo, zero, dr)
    x_grad = torch.where(valid, torch.cat([dl, dr], dim=1), zero)
    weight_grad = (t.double() * g.double()).sum(dim=1).float()
    if s is not None:
        weight_grad = weight_grad * s[:, 0]
    weight_grad = torch.where(valid[:, 0], weight_grad, zero)
    return x_grad, weight_grad, torch.where(valid, act_out, zero)
