"""The RMSNorm ops' smoke cases (python -m tilebake doctor): each against its reference on the CPU."""

import math

import torch

import tilebake
from tilebake._smoke import EPS, H, T, _close, _cpu, _gen, _on, _randn, _same, _same_quantized, smoke_case


def _norm_inputs():
    g = _gen()
    x = _randn(g, T, H, spread=8).bfloat16()
    weight = (torch.rand(H, generator=g) * 2 - 0.5).bfloat16()
    return x, weight, _randn(g, T, H, spread=8).bfloat16()


@smoke_case("norm_forward")
def _norm_forward(d):
    x, weight, residual = _norm_inputs()
    y, rstd, norm_input = tilebake.quant.norm_forward(
        _on(x, d), _on(weight, d), EPS, residual=_on(residual, d), with_rstd=True
    )
    want_y, want_rstd, want_input = tilebake.torch.norm_forward_ref(x, weight, EPS, residual)
    _close("out", y, want_y)
    _close("rstd", rstd, want_rstd, rtol=2e-6, atol=1e-7)
    _same("norm_input", norm_input, want_input)


@smoke_case("norm_forward_and_per_token_cast")
def _norm_forward_and_per_token_cast(d):
    x, weight, residual = _norm_inputs()
    (data, sf), y, rstd, norm_input = tilebake.quant.norm_forward_and_per_token_cast(
        _on(x, d), _on(weight, d), EPS, "e4m3", 128, residual=_on(residual, d), with_out_bf16=True, with_rstd=True
    )
    want_y, want_rstd, want_input = tilebake.torch.norm_forward_ref(x, weight, EPS, residual)
    _close("out_bf16", y, want_y)
    _close("rstd", rstd, want_rstd, rtol=2e-6, atol=1e-7)
    _same("norm_input", norm_input, want_input)
    want = tilebake.torch.cast(_cpu(y), "e4m3", (1, 128))  # the cast of the op's own normalised output
    _same_quantized((data, sf), want)


def _norm_backward_inputs():
    """(generator, (out_grad, x, weight, rstd)) on the CPU."""
    g = _gen()
    x = _randn(g, T, H, spread=2).bfloat16()
    out_grad = _randn(g, T, H).bfloat16()
    weight = (torch.rand(H, generator=g) * 2 - 0.5).bfloat16()
    return g, (out_grad, x, weight, tilebake.torch.norm_forward_ref(x, weight, EPS)[1])


@smoke_case("norm_backward")
def _norm_backward(d):
    _, inputs = _norm_backward_inputs()
    x_grad, weight_grad = tilebake.quant.norm_backward(*(_on(t, d) for t in inputs))
    want_dx, want_dw = tilebake.torch.norm_backward_ref(*inputs)
    _close("x_grad", x_grad, want_dx)
    num_sms = tilebake.get_num_sms() if d.type == "cuda" else 1
    _close("weight_grad", weight_grad, want_dw.bfloat16(), rtol=8e-3, atol=2e-3 / math.sqrt(num_sms))


@smoke_case("norm_backward_reduce")
def _norm_backward_into_weight_grad(d):
    """norm_backward's weight gradient added into a given fp32 buffer (its second kernel, in place)."""
    g, inputs = _norm_backward_inputs()
    start = _randn(g, H)
    buf = _on(start, d)
    _, result = tilebake.quant.norm_backward(*(_on(t, d) for t in inputs), weight_grad=buf)
    assert result is buf, "norm_backward must return the given weight_grad"
    want_dw = tilebake.torch.norm_backward_ref(*inputs)[1]
    num_sms = tilebake.get_num_sms() if d.type == "cuda" else 1
    _close("weight_grad", buf, start + want_dw, rtol=1e-4, atol=2e-3 / math.sqrt(num_sms))
