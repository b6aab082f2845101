"""Properties of the Engram ops: the n-gram hash against Python integer arithmetic (int32 extremes
among the ids), the fused weight exactly, the gate forward / backward against float64 (autograd),
the weight-gradient reduction and the Sinkhorn helpers against float64 sums and their formulas."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tilebake
from tests.properties.strategies import (
    DEVICES,
    FLOATS,
    PROPERTY,
    SEEDS,
    assert_bytes_equal,
    assert_within,
    normal,
)


def wrap64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 20), n=st.integers(2, 4), layers=st.integers(1, 3), m=st.integers(1, 3),
       image=st.booleans())  # fmt: skip
def test_engram_hash_python_ints(seed, tokens, n, layers, m, image, device):
    """index = (XOR_j<=i id_j * mul_j, wrapping int64) mod size (Python's non-negative modulo) +
    offset, per order and table; -1 for image tokens and tables of size <= 0; any int32 id."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-(2**31), 2**31, (tokens, n), generator=g, dtype=torch.int64)
    ids.view(-1)[:4] = torch.tensor([-(2**31), 2**31 - 1, 0, -1])[: ids.numel()]
    ids = ids.int()
    mul = torch.randint(-(2**62), 2**62, (layers, n), generator=g, dtype=torch.int64) * 2 + 1
    sizes = torch.randint(1, 2**27, (layers, n - 1, m), generator=g, dtype=torch.int64)  # offsets < 2^31
    sizes[..., 0] = torch.randint(1, 1000, sizes[..., 0].shape, generator=g)
    sizes.view(-1)[-1] = torch.tensor([0, -3, 5])[seed % 3]  # a table of no entries, sometimes
    sizes = sizes.int()
    offsets = tilebake.torch.make_offsets(sizes.clamp_min(0))
    mask = torch.rand(tokens, generator=g) < 0.3 if image else None
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    got = tilebake.engram.engram_hash(dev(ids), dev(mul), dev(sizes), dev(offsets), dev(mask)).cpu()
    want = torch.empty(layers, tokens, (n - 1) * m, dtype=torch.int32)
    for layer in range(layers):
        for t in range(tokens):
            h = wrap64(int(ids[t, 0]) * int(mul[layer, 0]))
            for i in range(1, n):
                h = wrap64(h ^ wrap64(int(ids[t, i]) * int(mul[layer, i])))
                for j in range(m):
                    size, col = int(sizes[layer, i - 1, j]), (i - 1) * m + j
                    bad = size <= 0 or (mask is not None and bool(mask[t]))
                    want[layer, t, col] = -1 if bad else h % size + int(offsets[layer, col])
    assert_bytes_equal(got, want, "indices")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, hc=st.integers(1, 8), hidden=st.integers(1, 8).map(lambda h: 256 * h))
def test_fused_weight_is_exact(seed, hc, hidden, device):
    """bf16 x bf16 is exact in fp32: the float64 product's bytes (zeros, denormals and infinities
    included); NaN where the product is NaN (its payload is the device's: CUDA's canonical NaN)."""
    a = normal(seed, (hc, hidden), torch.bfloat16, 1e3, (0.0, -0.0, 1e-39, float("inf"), float("nan")), 0.05)
    b = normal(seed + 1, (hc, hidden), torch.bfloat16, 1e-3, (0.0, -0.0, 1e-39), 0.05)
    got = tilebake.engram.fused_weight(a.to(device), b.to(device))
    want = (a.double() * b.double()).float()
    got = got.cpu()
    assert torch.equal(got.isnan(), want.isnan()), "NaN pattern"
    assert_bytes_equal(got[~want.isnan()], want[~want.isnan()], "product")


def gate64(x, kv, w, eps, clamp):
    hc, hidden = x.shape[-2:]
    x, k, v = x.double(), kv[:, :hc].double(), kv[:, hc].double()
    rx = (x.square().mean(-1) + eps).rsqrt()
    rk = (k.square().mean(-1) + eps).rsqrt()
    dot = (x * k * w.double()).sum(-1)
    d = dot * rx * rk * hidden**-0.5
    gate = torch.sigmoid(d.sign() * d.abs().clamp_min(clamp).sqrt())
    return x + gate[..., None] * v[:, None], dot, gate, rx, rk, d


def draw_gate(seed, data):
    tokens, hc, hidden = data.draw(st.integers(1, 12)), data.draw(st.sampled_from([1, 2, 4])), 256 * data.draw(
        st.integers(1, 3))  # fmt: skip
    x = normal(seed, (tokens, hc, hidden), torch.bfloat16, data.draw(st.sampled_from([0.1, 1.0, 30.0])))
    x[0, 0] = 0.0  # a zero row: rstd = 1 / sqrt(eps), dot 0
    kv = normal(seed + 1, (tokens, hc + 1, hidden), torch.bfloat16)
    w = normal(seed + 2, (hc, hidden), torch.float32, 0.5) + 1
    mask = torch.rand(tokens, generator=torch.Generator().manual_seed(seed)) < 0.3 if data.draw(st.booleans()) else None
    return x, kv, w, data.draw(st.sampled_from([1e-6, 1e-3])), data.draw(st.sampled_from([1e-8, 0.1])), mask


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data())
def test_engram_gate_fwd(seed, data, device):
    """out = bf16(x + gate v) within bf16's rounding, dot within 1e-5 of sum |x k w|, gate within
    2e-5 (away from the sign flip at d = 0), rstd within 1e-5; image tokens pass through; the
    no-save and in-place outputs the same bytes."""
    x, kv, w, eps, clamp, mask = draw_gate(seed, data)
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    out, dot, gate, rx, rk = tilebake.engram.engram_gate_fwd(dev(x), dev(kv), dev(w), eps, clamp, True, dev(mask))
    want, wdot, wgate, wrx, wrk, d = gate64(x, kv, w, eps, clamp)
    keep = torch.ones(x.shape[:2], dtype=torch.bool) if mask is None else ~mask[:, None].expand(x.shape[:2])
    vmag = kv[:, -1:].double().abs()
    assert_within(out.cpu()[keep], want[keep], (1e-4 * vmag.expand_as(want))[keep], 2.0**-8, "out")
    if mask is not None:
        assert_bytes_equal(out.cpu()[mask], x[mask], "image tokens")
    size = (x.double() * kv[:, :-1].double() * w.double()).abs().sum(-1)
    assert_within(dot, wdot, 1e-5 * size, 0, "dot")
    away = d.abs() > 1e-4
    assert_within(gate.cpu()[away & keep], wgate[away & keep], 2e-5, 0, "gate_score")
    assert_within(rx, wrx, 0, 1e-5, "rstd_x")
    assert_within(rk, wrk, 0, 1e-5, "rstd_k")
    alone = tilebake.engram.engram_gate_fwd(dev(x), dev(kv), dev(w), eps, clamp, False, dev(mask))
    assert alone[1:] == (None, None, None, None)
    assert_bytes_equal(alone[0], out, "without save_for_backward")
    buf = dev(x.clone())
    got = tilebake.engram.engram_gate_fwd(buf, dev(kv), dev(w), eps, clamp, False, dev(mask), inplace=True)[0]
    assert_bytes_equal(buf, out, "in place")
    assert got.data_ptr() == buf.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data())
def test_engram_gate_bwd_and_grad_w_reduce(seed, data, device):
    """grad_x, grad_kv (bf16) and the weight gradient (the partials summed, then grad_w_reduce's
    products added to given buffers) within tolerances of float64 autograd of the gate."""
    x, kv, w, eps, clamp, mask = draw_gate(seed, data)
    wh = normal(seed + 3, w.shape, torch.bfloat16, 0.3) + 1
    we = normal(seed + 4, w.shape, torch.bfloat16, 0.3) + 1
    w = tilebake.engram.fused_weight(wh, we)
    g = normal(seed + 5, x.shape, torch.bfloat16)
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    saved = tilebake.engram.engram_gate_fwd(dev(x), dev(kv), dev(w), eps, clamp, True, dev(mask))
    gx, gkv, partial = tilebake.engram.engram_gate_bwd(dev(g), dev(x), dev(kv), dev(w), *saved[1:], clamp, dev(mask))
    x64, kv64, w64 = (t.double().requires_grad_(True) for t in (x, kv, w))
    out, *_, d = gate64(x64, kv64, w64, eps, clamp)
    if mask is not None:
        out = torch.where(mask[:, None, None], x64, out)
    (out * g.double()).sum().backward()
    near = (d.detach().abs() - clamp).abs() < 1e-3 * clamp + 1e-6  # the clamp's kink: either side is right
    near = near | (d.detach().abs() < 1e-6)
    rows = ~near[..., None].expand(x.shape)
    scale = x64.grad.abs().amax(-1, keepdim=True).expand(x.shape)
    assert_within(gx.cpu()[rows], x64.grad[rows], (2e-3 * scale)[rows], 2.0**-8, "grad_hidden_states")
    if near.any():
        return  # the rest sums over the heads and tokens
    kscale = kv64.grad.abs().amax(-1, keepdim=True).expand(kv.shape)
    assert_within(gkv, kv64.grad, 2e-3 * kscale, 2.0**-8, "grad_kv")
    gh = normal(seed + 6, w.shape, torch.float32)
    ge = normal(seed + 7, w.shape, torch.float32)
    buf_h, buf_e = dev(gh.clone()), dev(ge.clone())
    assert tilebake.engram.grad_w_reduce(partial, dev(wh), dev(we), buf_h, buf_e) is None
    wscale = w64.grad.abs().amax(-1, keepdim=True)
    assert_within(buf_h, gh.double() + w64.grad * we.double(), 2e-3 * wscale * we.double().abs() + 1e-6, 1e-5, "wh")
    assert_within(buf_e, ge.double() + w64.grad * wh.double(), 2e-3 * wscale * wh.double().abs() + 1e-6, 1e-5, "we")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, parts=st.integers(1, 40), hc=st.integers(1, 4), hidden=st.integers(1, 3).map(lambda h: 256 * h))
def test_grad_w_reduce_sums_partials(seed, parts, hc, hidden, device):
    """grad_wh += S we, grad_we += S wh (fp32), S = the partials' sum within 1e-6 of sum |partials|;
    two runs the same bits."""
    p = normal(seed, (parts, hc, hidden))
    wh, we = normal(seed + 1, (hc, hidden), torch.bfloat16), normal(seed + 2, (hc, hidden), torch.bfloat16)
    bh, be = normal(seed + 3, (hc, hidden)), normal(seed + 4, (hc, hidden))
    outs = []
    for _ in range(2):
        gh, ge = bh.clone().to(device), be.clone().to(device)
        tilebake.engram.grad_w_reduce(p.to(device), wh.to(device), we.to(device), gh, ge)
        outs.append((gh, ge))
    s, size = p.double().sum(0), p.double().abs().sum(0)
    assert_within(outs[0][0], bh.double() + s * we.double(), 2e-6 * (size * we.double().abs() + bh.abs()), 0, "wh")
    assert_within(outs[0][1], be.double() + s * wh.double(), 2e-6 * (size * wh.double().abs() + be.abs()), 0, "we")
    assert_bytes_equal(outs[1][0], outs[0][0], "a second run")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, shape=st.lists(st.integers(1, 300), min_size=1, max_size=2), dtype=FLOATS,
       beta1=st.sampled_from([0.0, 0.9, 0.95, 0.999]), nesterov=st.booleans())  # fmt: skip
def test_engram_sinkhorn_momentum_update(seed, shape, dtype, beta1, nesterov, device):
    """m = (1 - b) g + b m stored in the buffer's dtype; returns b m + (1 - b) g (nesterov) or m,
    each product and sum rounded to fp32 on its own: those fp32 operations, byte for byte."""
    grad = normal(seed, tuple(shape), dtype, 1.0, (0.0, -0.0, 1e-39), 0.05)
    mom = normal(seed + 1, tuple(shape), dtype)
    buf = mom.clone().to(device)
    got = tilebake.engram.engram_sinkhorn_momentum_update(grad.to(device), buf, beta1, nesterov)
    b = torch.tensor(beta1, dtype=torch.float32)
    scaled = grad.float() * torch.tensor(1 - beta1, dtype=torch.float32)  # the constant 1 - beta1 in fp32
    m = scaled + mom.float() * b
    assert_bytes_equal(buf, m.to(dtype), "momentum buffer")
    assert_bytes_equal(got, m * b + scaled if nesterov else m, "Sinkhorn input")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, rows=st.integers(1, 200), cols=st.integers(1, 5).map(lambda d: 256 * d),
       eps=st.sampled_from([1e-8, 1e-3]), alpha=st.sampled_from([1.0, 0.2]))  # fmt: skip
def test_engram_sinkhorn_step_reduce_finalize(seed, rows, cols, eps, alpha, device):
    """step: row_norm = the rows' L2 norms of diag(r) M diag(c), r /= norm + eps in place, the
    partials sum to the column sums of squares after it (float64 within 1e-5); step_reduce sums
    the partials (within 1e-6 of their |sum|, two runs the same bits); finalize = alpha diag(r /
    (norm + eps)) M diag(c) within 1e-5; a zero row stays zero."""
    mat = normal(seed, (rows, cols))
    mat[0] = 0.0
    r = torch.rand(rows, generator=torch.Generator().manual_seed(seed)) + 0.5
    c = torch.rand(cols, generator=torch.Generator().manual_seed(seed + 1)) + 0.5
    rd = r.clone().to(device)
    norm, partial = tilebake.engram.engram_sinkhorn_step(mat.to(device), rd, c.to(device), eps)
    it = r.double()[:, None] * mat.double() * c.double()
    want_norm = it.norm(dim=1)
    assert_within(norm, want_norm, 1e-30, 1e-5, "row_norm")
    new_r = r.double() / (want_norm + eps)
    assert_within(rd, new_r, 0, 1e-5, "row_scale")
    after = (new_r[:, None] * mat.double() * c.double()).square().sum(0)
    assert_within(partial.double().sum(0), after, 0, 1e-5, "column sums of squares")
    total = torch.full((cols,), float("nan"), device=device)
    tilebake.engram.engram_sinkhorn_step_reduce(partial, total)
    assert_within(total, partial.double().cpu().sum(0), 0, 1e-6, "step_reduce")
    again = torch.empty_like(total)
    tilebake.engram.engram_sinkhorn_step_reduce(partial, again)
    assert_bytes_equal(again, total, "step_reduce again")
    out = torch.full((rows, cols), float("nan"), device=device)
    got = tilebake.engram.engram_sinkhorn_finalize(mat.to(device), rd, c.to(device), eps, alpha, out=out)
    assert got is out
    rd64 = rd.cpu().double()
    fin_norm = (rd64[:, None] * mat.double() * c.double()).norm(dim=1)
    want = alpha * (rd64 / (fin_norm + eps))[:, None] * mat.double() * c.double()
    assert_within(got, want, 1e-30, 1e-5, "finalize")
    assert bool((got.cpu()[0] == 0).all()), "a zero row"
