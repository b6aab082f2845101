"""Properties of the mHC stream-mixing ops (mhc_pre_apply_mix_fwd and expand_to_mhc are in
tests/test_properties.py): post and its backward, the pre-mix backward, Sinkhorn and its
backward against float64 (autograd); the multi-layer recompute and the big fuse against the chain
of the public single-step ops."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tilebake
from tests.properties.strategies import DEVICES, PROPERTY, SEEDS, assert_bytes_equal, assert_within, normal

BF16 = torch.bfloat16


def draw_streams(data, seed, max_m=8):
    lead = data.draw(st.sampled_from([(), (1,), (2,)])) + (data.draw(st.integers(1, 24)),)
    m, hidden = data.draw(st.integers(1, max_m)), 8 * data.draw(st.integers(1, 40))
    scale = data.draw(st.sampled_from([1e-3, 1.0, 1e3]))
    specials = (0.0, -0.0, 1e-39)
    return lead, m, hidden, normal(seed, (*lead, m, hidden), BF16, scale, specials, 0.05)


def post64(x, res, post, comb):
    """out[o] = post[o] x + sum_i comb[i, o] res[i] and the size of its terms, in float64."""
    m = res.shape[-2]
    post = post.reshape(*res.shape[:-1], 1).double()
    terms = torch.einsum("...io,...ic->...oc", comb.double(), res.double())
    size = torch.einsum("...io,...ic->...oc", comb.double().abs(), res.double().abs())
    out = post * x.double()[..., None, :] + terms
    assert out.shape[-2] == m
    return out, size + (post * x.double()[..., None, :]).abs()


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), flat_post=st.booleans(), given_out=st.booleans())
def test_mhc_post_fwd_bwd(seed, data, flat_post, given_out, device):
    """out within bf16's rounding (and fp32's of the sum of |terms|) of float64; the gradients
    d_x, d_residual (bf16), d_post, d_comb (fp32 sums over the hidden dim) within 1e-5 of float64's
    |terms|, the same bits twice."""
    lead, m, hidden, res = draw_streams(data, seed)
    x = normal(seed + 1, (*lead, hidden), BF16)
    g = torch.Generator().manual_seed(seed)
    post = torch.rand(*lead, m, *(() if flat_post else (1,)), generator=g) * 2
    comb = torch.rand(*lead, m, m, generator=g)
    d = lambda t: t.to(device)  # noqa: E731
    out = torch.empty(*lead, m, hidden, dtype=BF16, device=device) if given_out else None
    got = tilebake.mhc.mhc_post_fwd(d(x), d(res), d(post), d(comb), out)
    if given_out:
        assert got is out
    want, size = post64(x, res, post, comb)
    assert_within(got, want, 1e-6 * size + 1e-38, 2.0**-8, "out")
    do = normal(seed + 2, (*lead, m, hidden), BF16)
    dx, dres, dpost, dcomb = tilebake.mhc.mhc_post_bwd(d(x), d(res), d(post), d(comb), d(do))
    x64, r64, p64, c64 = (t.double().requires_grad_(True) for t in (x, res, post, comb))
    (post64(x64, r64, p64, c64)[0] * do.double()).sum().backward()
    ab = do.double().abs()
    size_x = (post.reshape(*lead, m, 1).double().abs() * ab).sum(-2)
    size_r = torch.einsum("...io,...oc->...ic", comb.double(), ab)
    assert_within(dx, x64.grad, 1e-6 * size_x + 1e-38, 2.0**-8, "d_x")
    assert_within(dres, r64.grad, 1e-6 * size_r + 1e-38, 2.0**-8, "d_residual")
    size_p = (ab * x.double().abs()[..., None, :]).sum(-1).reshape(post.shape)
    assert_within(dpost, p64.grad, 1e-5 * size_p + 1e-38, 0, "d_post")
    size_c = torch.einsum("...ic,...oc->...io", res.double().abs(), ab)
    assert_within(dcomb, c64.grad, 1e-5 * size_c + 1e-38, 0, "d_comb")
    again = tilebake.mhc.mhc_post_bwd(d(x), d(res), d(post), d(comb), d(do))
    for a, b, what in zip(again, (dx, dres, dpost, dcomb), ("d_x", "d_residual", "d_post", "d_comb")):
        assert_bytes_equal(a, b, what + " again")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), with_x_grad=st.booleans(), flat_mix=st.booleans())
def test_mhc_pre_apply_mix_bwd(seed, data, with_x_grad, flat_mix, device):
    """x_grad[i] += mix[i] o_grad in place (fp32, rounded to bf16 once: within bf16's rounding of
    float64); mix_grad[i] = sum_h o_grad x[i] within 1e-5 of its |terms|, shaped as mix."""
    lead, m, hidden, x = draw_streams(data, seed)
    og = normal(seed + 1, (*lead, hidden), BF16)
    mix = torch.rand(*lead, m, *(() if flat_mix else (1,)), generator=torch.Generator().manual_seed(seed))
    xg0 = normal(seed + 2, x.shape, BF16) if with_x_grad else None
    buf = None if xg0 is None else xg0.clone().to(device)
    mix_grad = tilebake.mhc.mhc_pre_apply_mix_bwd(og.to(device), x.to(device), mix.to(device), buf)
    mcol = mix.reshape(*lead, m, 1).double()
    if buf is not None:
        want = xg0.double() + mcol * og.double()[..., None, :]
        size = xg0.double().abs() + (mcol * og.double()[..., None, :]).abs()
        assert_within(buf, want, 1e-7 * size + 1e-38, 2.0**-8, "x_grad")
    want_mg = (og.double()[..., None, :] * x.double()).sum(-1).reshape(mix.shape)
    size = (og.double()[..., None, :] * x.double()).abs().sum(-1).reshape(mix.shape)
    assert mix_grad.shape == mix.shape and mix_grad.dtype == torch.float32
    assert_within(mix_grad, want_mg, 1e-5 * size + 1e-38, 0, "mix_grad")


def sinkhorn64(x, repeat, eps):
    """Row softmax + eps, then a column normalisation, then repeat - 1 times a row and a column one
    (each x / (sum + eps)), in float64."""
    p = torch.softmax(x.double(), -1) + eps
    p = p / (p.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        p = p / (p.sum(-1, keepdim=True) + eps)
        p = p / (p.sum(-2, keepdim=True) + eps)
    return p


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, lead=st.sampled_from([(1,), (7,), (2, 5), (33,)]), m=st.integers(1, 8),
       repeat=st.sampled_from([1, 2, 10, 20]), eps=st.sampled_from([1e-6, 1e-2]),
       scale=st.sampled_from([0.1, 1.0, 10.0]), given=st.booleans())  # fmt: skip
def test_mhc_sinkhorn_fwd_bwd(seed, lead, m, repeat, eps, scale, given, device):
    """The forward within 1e-5 (rtol) + 1e-6 of float64; the backward within 1e-4 (rtol) + 1e-5
    max|grad| of float64 autograd."""
    x = normal(seed, (*lead, m, m), torch.float32, scale)
    out = torch.empty_like(x, device=device) if given else None
    got = tilebake.mhc.mhc_sinkhorn_fwd(x.to(device), out, repeat, eps)
    if given:
        assert got is out
    want = sinkhorn64(x, repeat, eps)
    assert_within(got, want, 1e-6, 1e-5, "forward")
    g = normal(seed + 1, x.shape)
    x64 = x.double().requires_grad_(True)
    (sinkhorn64(x64, repeat, eps) * g.double()).sum().backward()
    grad = tilebake.mhc.mhc_sinkhorn_bwd(g.to(device), x.to(device), None, repeat, eps)
    assert_within(grad, x64.grad, 1e-5 * x64.grad.abs().max() + 1e-7, 1e-4, "backward")


# --- compositions: the multi-layer recompute and the big fuse ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), layers=st.integers(1, 4), last_post=st.booleans())
def test_mhc_multilayer_recompute_is_the_chain(seed, data, layers, last_post, device):
    """layer_input[i] = mhc_pre_apply_mix_fwd(residual_i, pre[i]) and residual_{i+1} = mhc_post_fwd(
    layer_output[i], residual_i, post[i], comb[i]): the single-step ops' bytes, for L or L - 1 post
    steps; nothing else written."""
    lead, m, hidden, res0 = draw_streams(data, seed)
    posts = layers if last_post else layers - 1
    g = torch.Generator().manual_seed(seed)
    pre = [torch.rand(*lead, m, generator=g) for _ in range(layers)]
    outs = [normal(seed + 10 + i, (*lead, hidden), BF16) for i in range(posts)]  # one a post step
    post = [torch.rand(*lead, m, 1, generator=g) * 2 for _ in range(posts)]
    comb = [torch.rand(*lead, m, m, generator=g) for _ in range(posts)]
    li = [torch.full((*lead, hidden), float("nan"), dtype=BF16, device=device) for _ in range(layers)]
    rl = [torch.full((*lead, m, hidden), float("nan"), dtype=BF16, device=device) for _ in range(posts)]
    d = lambda ts: [t.to(device) for t in ts]  # noqa: E731
    tilebake.mhc.mhc_multilayer_recompute(res0.to(device), d(pre), d(outs), d(post), d(comb), li, rl)
    cur = res0.to(device)
    for i in range(layers):
        assert_bytes_equal(li[i], tilebake.mhc.mhc_pre_apply_mix_fwd(cur, pre[i].to(device)), f"layer_input {i}")
        if i < posts:
            cur = tilebake.mhc.mhc_post_fwd(outs[i].to(device), cur, post[i].to(device), comb[i].to(device))
            assert_bytes_equal(rl[i], cur, f"residual {i}")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 40), m=st.sampled_from([1, 2, 4]), hidden=st.integers(1, 16).map(
       lambda h: 16 * h), n_splits=st.sampled_from([1, 2, 16]), repeat=st.sampled_from([1, 10]),
       post_mult=st.sampled_from([1.0, 2.0]), flat=st.booleans())  # fmt: skip
def test_mhc_pre_big_fuse_is_the_chain(seed, tokens, m, hidden, n_splits, repeat, post_mult, flat, device):
    """(post_mix, comb_mix, layer_input) = reduce_partials_and_rmsnorm -> pre_split_mixes ->
    sinkhorn -> pre_apply_mix of the single-step ops, within 1e-5 (the fused exp / rsqrt may round
    differently) and bf16's rounding for layer_input."""
    m3 = m * (m + 2)
    res = normal(seed, (tokens, m, hidden), BF16)
    fn = normal(seed + 1, (m3, m * hidden), torch.float32, (m * hidden) ** -0.5)
    if (m * hidden) % n_splits:
        n_splits = 1
    mul, sq = tilebake.mhc.mhc_pre_norm_gemm_fwd(res, fn, n_splits)
    g = torch.Generator().manual_seed(seed)
    scale, base = torch.rand(3, generator=g) + 0.5, torch.randn(m3, generator=g) * 0.3
    d = lambda t: t.to(device)  # noqa: E731
    eps = (1e-6, 1e-6, 1e-6)
    post_out = torch.empty(tokens, m, dtype=torch.float32, device=device) if flat else None
    post, comb, li = tilebake.mhc.mhc_pre_big_fuse_fwd(d(mul), d(sq), d(scale), d(base), d(res), post_out, None, None,
                                                       *eps, post_mult, repeat, n_splits)  # fmt: skip
    _, _, mixes = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(mul, sq, rms_group_size=m * hidden, rms_eps=eps[0])
    w_pre, w_post, w_comb = tilebake.mhc.mhc_pre_split_mixes_fwd(mixes, scale, base, mhc_post_mult_value=post_mult,
                                                                  mhc_pre_eps=eps[1])  # fmt: skip
    w_comb = tilebake.mhc.mhc_sinkhorn_fwd(w_comb.reshape(tokens, m, m), None, repeat, eps[2])
    w_li = tilebake.mhc.mhc_pre_apply_mix_fwd(res, w_pre)
    assert_within(post, w_post.reshape(post.shape).double(), 1e-6, 1e-5, "post_mix")
    assert_within(comb, w_comb.reshape(comb.shape).double(), 1e-6, 1e-5, "comb_mix")
    size = (w_pre.reshape(tokens, m, 1).double().abs() * res.double().abs()).sum(1)
    assert_within(li, w_li.double(), 1e-4 * size + 1e-38, 2.0**-7, "layer_input")
