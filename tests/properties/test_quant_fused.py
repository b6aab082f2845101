"""Properties of the fused quant ops: SwiGLU forward / backward (and with the FP8 cast) against a
float64 statement of the formula and its derivative, the clamp counts counted here; RMSNorm
forward / backward (and with the FP8 cast) against float64, the residual sum exactly."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tilebake
from tests.properties.strategies import (
    DEVICES,
    FLOATS,
    NONFINITE,
    PROPERTY,
    SEEDS,
    assert_bytes_equal,
    assert_within,
    normal,
    strided_rows,
)

# bf16 output: half an ulp (2^-9 relative) on top of fp32's few ulps
REL = {torch.float32: 2e-6, torch.bfloat16: 2.0**-8}
SWIGLU_SPECIALS = (0.0, -0.0, 1e-39, -1e-39, 60.0, -60.0)


def psum_layout(seed: int, rows: int, experts: int, alignment: int):
    """(psum int32 (experts,), valid rows bool): expert e owns [align(psum[e-1]), psum[e])."""
    g = torch.Generator().manual_seed(seed)
    psum, valid, start = [], torch.zeros(rows, dtype=torch.bool), 0
    for _ in range(experts):
        begin = min(-(-start // alignment) * alignment, rows)
        end = begin + int(torch.randint(0, max(1, rows - begin) + 1, (1,), generator=g)) // 2
        valid[begin:end] = True
        psum.append(end)
        start = end
    return torch.tensor(psum, dtype=torch.int32), valid


def swiglu64(x, weights, scale, clamp):
    """The forward in float64 (left clamped to <= c, r to [-c, c]; NaN passes the clamps)."""
    h = x.shape[1] // 2
    left, r = x[:, :h].double(), x[:, h:].double()
    if clamp is not None:
        left = torch.where(left > clamp, clamp, left)
        r = torch.where(r > clamp, clamp, torch.where(r < -clamp, -clamp, r))
    act = left * torch.sigmoid(left) * r
    e = None if weights is None else weights.double()[:, None] * (1.0 if scale is None else scale)
    return act, (act if e is None else act * e), left, r, e


def draw_swiglu(data, seed, nonfinite=False):
    rows, h = data.draw(st.integers(1, 48)), 64 * data.draw(st.integers(1, 3))
    dtype = data.draw(FLOATS)
    specials = SWIGLU_SPECIALS + (NONFINITE if nonfinite else ())
    x = normal(seed, (rows, 2 * h), dtype, data.draw(st.sampled_from([1.0, 4.0])), specials, 0.05)
    weights = data.draw(st.sampled_from([None, "w"]))
    weights = None if weights is None else torch.rand(rows, generator=torch.Generator().manual_seed(seed)) + 0.1
    scale = data.draw(st.sampled_from([None, 2.5]))
    clamp = data.draw(st.sampled_from([None, 0.5, 3.0]))
    alignment = data.draw(st.sampled_from([None, 1, 4, 16]))
    return x, weights, scale, clamp, alignment


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data())
def test_swiglu_forward(seed, data, device):
    """out = silu(clamp left) * clamp r [* w * s] within fp32's ulps (and bf16's rounding), NaN and
    infinities where float64 has them; clamped_count = the counts over the psum's valid rows."""
    x, weights, scale, clamp, alignment = draw_swiglu(data, seed, nonfinite=True)
    fmt = data.draw(st.sampled_from(["bf16", "fp32"]))
    psum, valid = None, torch.ones(x.shape[0], dtype=torch.bool)
    if alignment is not None:
        tilebake.config.set_token_alignment(alignment)
        psum, valid = psum_layout(seed, x.shape[0], data.draw(st.integers(1, 4)), alignment)
    count = torch.full((4,), 7, dtype=torch.int64, device=device) if clamp is not None else None
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    got = tilebake.quant.swiglu_forward(x.to(device), fmt, dev(psum), dev(weights), scale, clamp, count)
    _, want, *_ = swiglu64(x, weights, scale, clamp)
    out_dtype = torch.bfloat16 if fmt == "bf16" else torch.float32
    assert got.dtype == out_dtype
    assert_within(got, want, 1e-37, REL[out_dtype], "out", nonfinite=True)
    if clamp is not None:
        h = x.shape[1] // 2
        left, r = x[valid, :h].float(), x[valid, h:].float()
        expect = torch.tensor([(left > clamp).sum(), (r > clamp).sum(), (r < -clamp).sum(), left.numel()]) + 7
        assert torch.equal(count.cpu(), expect), f"clamped_count {count.tolist()} != {expect.tolist()}"
    if device == "cuda":  # the CPU's exp may differ from CUDA's expf in the last bit
        want_cpu = tilebake.quant.swiglu_forward(x, fmt, psum, weights, scale, clamp)
        assert_within(got, want_cpu.double(), 1e-37, REL[out_dtype], "against the CPU path", nonfinite=True)


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), npc=st.sampled_from([32, 128]), round_sf=st.booleans())
def test_swiglu_forward_and_per_token_cast(seed, data, npc, round_sf, device):
    """The per-token e4m3 cast of swiglu_forward's fp32 values (documented), the clamp counts too."""
    x, weights, scale, clamp, alignment = draw_swiglu(data, seed)
    psum = None
    if alignment is not None:
        tilebake.config.set_token_alignment(alignment)
        psum, _ = psum_layout(seed, x.shape[0], 3, alignment)
    counts = [None if clamp is None else torch.zeros(4, dtype=torch.int64, device=device) for _ in range(2)]
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    args = (dev(psum), dev(weights), scale)
    data_, sf = tilebake.quant.swiglu_forward_and_per_token_cast(
        x.to(device), "e4m3", npc, *args, round_sf=round_sf, clamp_value=clamp, clamped_count=counts[0]
    )
    y = tilebake.quant.swiglu_forward(x.to(device), "fp32", *args, clamp, counts[1])
    want = tilebake.quant.per_token_cast(y, "e4m3", npc, round_sf=round_sf)
    assert_bytes_equal(data_, want[0], "data")
    assert_bytes_equal(sf, want[1], "SF")
    if clamp is not None:
        assert torch.equal(counts[0].cpu(), counts[1].cpu()), "clamped_count"


def swiglu_grads64(x, g, weights, scale, clamp, valid):
    """float64 autograd of swiglu64 (the padding rows' e = 0 with weights)."""
    x64 = x.double().requires_grad_(True)
    w = None if weights is None else torch.where(valid, weights.double(), 0.0).requires_grad_(True)
    act, out, *_ = swiglu64(x64, w, scale, clamp)
    (out * g.double()).sum().backward()
    return act.detach(), out.detach(), x64.grad, None if w is None else w.grad * torch.where(valid, 1.0, 0.0)


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), recompute=st.booleans(), quantized=st.sampled_from([None, 32, 128]))
def test_swiglu_backward(seed, data, recompute, quantized, device):
    """x_grad = the float64 derivative within fp32's ulps (relative to the terms' size: silu's
    derivative cancels near left = -1.28), exactly 0 where clamped; weight_grad within 1e-5 of the
    sum's terms, 0 on padding rows; act_out the forward's. With an FP8 input
    (swiglu_backward_and_per_token_cast) the same from the dequantised x, and its x_grad_fp8 is
    per_token_cast of the fp32 gradient."""
    x, weights, scale, clamp, alignment = draw_swiglu(data, seed)
    rows, h = x.shape[0], x.shape[1] // 2
    g = normal(seed + 1, (rows, h), x.dtype)
    psum, valid = None, torch.ones(rows, dtype=torch.bool)
    if alignment is not None and weights is not None:
        tilebake.config.set_token_alignment(alignment)
        psum, valid = psum_layout(seed, rows, 3, alignment)
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    rest = (dev(psum), dev(weights), scale)
    if quantized:
        q = tilebake.quant.per_token_cast(x.to(device), "e4m3", quantized)
        res = tilebake.quant.swiglu_backward_and_per_token_cast(q, g.to(device), "e4m3", quantized, *rest,
                                                                clamp_value=clamp, do_recompute=recompute)  # fmt: skip
        x = tilebake.quant.cast_back(q, "fp32", (1, quantized)).cpu()
        x_grad, (fp8, fp8_sf), res = res[0], res[1], res[2:]
        grad32 = tilebake.quant.swiglu_backward(x.to(device), g.float().to(device), "fp32", *rest, clamp)[0]
        want = tilebake.quant.per_token_cast(grad32, "e4m3", quantized)
        assert_bytes_equal(fp8, want[0], "x_grad_fp8")
        assert_bytes_equal(fp8_sf, want[1], "x_grad_fp8's SF")
        out_dtype = torch.bfloat16
    else:
        fmt = data.draw(st.sampled_from(["bf16", "fp32"]))
        res = tilebake.quant.swiglu_backward(x.to(device), g.to(device), fmt, *rest, clamp, recompute)
        x_grad, res = res[0], res[1:]
        out_dtype = torch.bfloat16 if fmt == "bf16" else torch.float32
    act, out, want_xg, want_wg = swiglu_grads64(x, g, weights, scale, clamp, valid)
    _, _, left, r, e = swiglu64(x, weights, scale, clamp)
    ge = g.double().abs() * (1.0 if e is None else e.abs())
    size = torch.cat((ge * (r.abs() * (1 + left.abs())), ge * left.abs()), 1)
    assert x_grad.dtype == out_dtype
    assert_within(x_grad, want_xg, 4e-7 * size + 1e-37, REL[out_dtype], "x_grad")
    if clamp is not None:
        xl, xr = x[:, :h].float(), x[:, h:].float()
        assert bool((x_grad.cpu()[:, :h][xl > clamp] == 0).all()), "a clamped left's gradient"
        assert bool((x_grad.cpu()[:, h:][xr.abs() > clamp] == 0).all()), "a clamped r's gradient"
    if weights is not None:
        wg = res[0]
        terms = (g.double() * act).abs().sum(1) * (1.0 if scale is None else scale)
        assert_within(wg, want_wg, 1e-5 * terms + 1e-37, 0, "weight_grad")
        assert bool((wg.cpu()[~valid] == 0).all()), "a padding row's weight_grad"
    if recompute:
        assert_within(res[-1], out, 1e-37, REL[g.dtype], "act_out")


# --- RMSNorm ---


def draw_norm(data, seed):
    dtype = data.draw(FLOATS)
    batch = data.draw(st.sampled_from([None, 1, 3]))
    tokens, hidden = data.draw(st.integers(1, 40)), 16 * data.draw(st.integers(1, 20))
    shape = (tokens, hidden) if batch is None else (batch, tokens, hidden)
    g = torch.Generator().manual_seed(seed)
    row_scale = torch.exp2(torch.randint(-12, 13, (*shape[:-1], 1), generator=g).float())
    x = (normal(seed, shape) * row_scale).to(dtype)
    x.view(-1, hidden)[:: max(1, tokens // 2)][:, ::7] = 0.0  # zeros, and some all-zero columns
    residual = data.draw(st.sampled_from([None, "r"]))
    residual = None if residual is None else (normal(seed + 1, shape) * row_scale).to(dtype)
    weight = data.draw(st.sampled_from([None, "w"]))
    weight = None if weight is None else normal(seed + 2, (hidden,), dtype)
    pad = data.draw(st.sampled_from([0, 16]))
    return x, residual, weight, data.draw(st.sampled_from([1e-6, 1e-2])), data.draw(st.sampled_from([1.0, 0.5])), pad


def rms64(v, weight, eps, out_scale):
    rstd = (v.double().square().mean(-1) + eps).rsqrt()
    w = 1.0 if weight is None else weight.double()
    return v.double() * rstd[..., None] * w * out_scale, rstd


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), cast=st.sampled_from([None, 32, 128]))
def test_norm_forward(seed, data, cast, device):
    """norm_input = x + residual rounded once to x's dtype (exactly); rstd and out within a few fp32
    ulps of float64 (and out's rounding to bf16); strided rows. With the FP8 cast
    (norm_forward_and_per_token_cast): per_token_cast of norm_forward's out, byte for byte."""
    x, residual, weight, eps, out_scale, pad = draw_norm(data, seed)
    xs = strided_rows(x, pad).to(device)
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    out, rstd, norm_input = tilebake.quant.norm_forward(xs, dev(weight), eps, dev(residual), out_scale,
                                                        with_rstd=True)  # fmt: skip
    want_in = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    assert_bytes_equal(norm_input, want_in, "norm_input")
    if residual is None:
        assert norm_input.data_ptr() == xs.data_ptr(), "norm_input is x without residual"
    want, want_rstd = rms64(want_in, weight, eps, out_scale)
    assert_within(rstd, want_rstd, 0, 1e-6, "rstd")
    assert_within(out, want, 1e-37, REL[x.dtype] * 2, "out")
    if cast:
        if x.shape[-1] % cast:
            return
        round_sf = data.draw(st.booleans())
        (q, sf), out_bf16, rstd2, norm_input2 = tilebake.quant.norm_forward_and_per_token_cast(
            xs, dev(weight), eps, "e4m3", cast, dev(residual), out_scale, round_sf=round_sf, with_out_bf16=True,
            with_rstd=True)  # fmt: skip
        want_q = [tilebake.quant.per_token_cast(m, "e4m3", cast, round_sf=round_sf) for m in out.view(-1, out.shape[-1])
                  .split(out.shape[-2])]  # fmt: skip
        assert_bytes_equal(q, torch.cat([w[0] for w in want_q]).view(q.shape), "FP8 data")
        assert_bytes_equal(sf, torch.cat([w[1] for w in want_q]).view(sf.shape), "FP8 SF")
        assert_bytes_equal(out_bf16, out.bfloat16(), "out_bf16")
        assert_bytes_equal(rstd2, rstd, "rstd")
        assert_bytes_equal(norm_input2, norm_input, "norm_input")
    if device == "cuda":
        want_out, want_rstd, _ = tilebake.quant.norm_forward(x, weight, eps, residual, out_scale, with_rstd=True)
        assert_within(out, want_out.double(), 1e-37, REL[x.dtype] * 2, "out against the CPU path")
        assert_within(rstd, want_rstd.double(), 0, 2e-6, "rstd against the CPU path")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), with_residual_grad=st.booleans(), accumulate=st.booleans())
def test_norm_backward(seed, data, with_residual_grad, accumulate, device):
    """x_grad and weight_grad within 1e-5 of the float64 derivative, relative to the size of the
    terms (the row sum cancels), plus residual_out_grad; weight_grad added to a given buffer."""
    x, _, weight, eps, out_scale, pad = draw_norm(data, seed)
    x = x.view(-1, x.shape[-1])
    if x.shape[-1] % 32:
        x = torch.cat((x, x[:, :16]), 1)
        weight = None if weight is None else torch.cat((weight, weight[:16]))
    tokens, hidden = x.shape
    g = normal(seed + 3, (tokens, hidden), x.dtype)
    res_g = normal(seed + 4, (tokens, hidden), x.dtype) if with_residual_grad else None
    _, rstd, _ = tilebake.quant.norm_forward(x, weight, eps, with_rstd=True)
    buf = normal(seed + 5, (hidden,), x.dtype) if accumulate and weight is not None else None
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    given_buf = dev(None if buf is None else buf.clone())
    x_grad, w_grad = tilebake.quant.norm_backward(dev(g), strided_rows(x, pad).to(device), dev(weight), dev(rstd),
                                                  dev(res_g), out_scale, given_buf)  # fmt: skip
    x64 = x.double().requires_grad_(True)
    w64 = None if weight is None else weight.double().requires_grad_(True)
    out, _ = rms64(x64, w64, eps, out_scale)
    (out * g.double()).sum().backward()
    r = rstd.double()[:, None]
    gw = g.double().abs() * (1.0 if weight is None else weight.double().abs()) * out_scale
    size = r * (gw + gw.sum(1, keepdim=True) / hidden)  # x_grad's terms (x rstd is O(1))
    want_xg = x64.grad + (0 if res_g is None else res_g.double())
    assert_within(x_grad, want_xg, 1e-5 * size + 1e-37, REL[x.dtype], "x_grad")
    if weight is None:
        assert w_grad is None
        return
    terms = (g.double() * x.double() * r).abs().sum(0) * out_scale
    want_wg = w64.grad + (0 if buf is None else buf.double())
    assert_within(w_grad, want_wg, 1e-5 * terms + 1e-37, REL[x.dtype], "weight_grad")
    if buf is not None:
        assert w_grad is given_buf, "the given weight_grad buffer returned"
