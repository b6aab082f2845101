"""Properties of the mHC mix-computation ops: the split of the mixes, the head mix, the RMSNorm
weight merge, the pre-norm projection's split-K partials and their reduction, each with its
backward, against fp32 operations stated here (where the docstring fixes them) or float64."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import tilebake
from tests.properties.strategies import DEVICES, PROPERTY, SEEDS, assert_bytes_equal, assert_within, normal

LEADS = st.sampled_from([(1,), (5,), (2, 3), (37,)])


def segments(scale: torch.Tensor, m: int) -> torch.Tensor:
    return torch.cat([scale[0].expand(m), scale[1].expand(m), scale[2].expand(m * m)])


def split64(mixes, scale, base, m, mult, eps):
    y = mixes.double() * segments(scale.double(), m) + base.double()
    return y[..., :m].sigmoid() + eps, y[..., m : 2 * m].sigmoid() * mult, y[..., 2 * m :]


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, lead=LEADS, m=st.integers(1, 8), mult=st.sampled_from([1.0, 2.0]),
       eps=st.sampled_from([1e-6, 0.0]), flat=st.booleans())  # fmt: skip
def test_mhc_pre_split_mixes_fwd_bwd(seed, lead, m, mult, eps, flat, device):
    """comb = fp32(fp32(mixes * scale[segment]) + base) byte for byte; pre, post within 1e-6 of
    float64; the backward within 1e-6 (input grads) and 1e-5 of the |terms| (scale and base
    grads, summed over the tokens) of float64 autograd, the same bits twice."""
    m3 = m * (m + 2)
    mixes = normal(seed, (*lead, m3), torch.float32, 3.0, (0.0, -0.0, 1e-39), 0.05)
    g = torch.Generator().manual_seed(seed)
    scale, base = torch.rand(3, generator=g) + 0.5, torch.randn(m3, generator=g)
    d = lambda t: t.to(device)  # noqa: E731
    outs = None
    if flat:
        outs = tuple(torch.empty(*lead, w, device=device) for w in (m, m, m * m))
    pre, post, comb = tilebake.mhc.mhc_pre_split_mixes_fwd(d(mixes), d(scale), d(base), *(outs or (None,) * 3), mult,
                                                           eps)  # fmt: skip
    if flat:
        assert all(a is b for a, b in zip((pre, post, comb), outs))
    wpre, wpost, wcomb = split64(mixes, scale, base, m, mult, eps)
    fp32_comb = mixes[..., 2 * m :] * scale[2] + base[2 * m :]
    assert_bytes_equal(comb.reshape(fp32_comb.shape), fp32_comb, "comb")
    assert_within(pre.reshape(wpre.shape), wpre, 1e-6, 0, "pre")
    assert_within(post.reshape(wpost.shape), wpost, 1e-6 * mult, 0, "post")
    grads = [normal(seed + i, t.shape) for i, t in enumerate((pre, post, comb))]
    res = tilebake.mhc.mhc_pre_split_mixes_bwd(*(d(t) for t in grads), d(mixes), post, d(scale), d(base),
                                               mhc_post_mult_value=mult)  # fmt: skip
    m64, s64, b64 = (t.double().requires_grad_(True) for t in (mixes, scale, base))
    outs64 = split64(m64, s64, b64, m, mult, eps)
    sum(((o.reshape(t.shape) * t.double()).sum() for o, t in zip(outs64, grads))).backward()
    gm, gs, gb = res
    gy = torch.cat([t.double().reshape(*lead, -1) for t in grads], -1).abs()  # |dL/dy| <= |grad| (sigmoid' <= 1/4)
    # fp32's 1 - s carries an absolute error ~2^-24: a bound in |g| scale besides the relative one
    small = 1e-7 * gy * segments(scale.double(), m) * max(mult, 1.0)
    assert_within(gm, m64.grad, small + 1e-30, 1e-5, "input_mixes_grad")
    size_b = gy.reshape(-1, m3).sum(0) * max(mult, 1.0)
    size_s = (gy * mixes.double().abs()).reshape(-1, m3).sum(0) * max(mult, 1.0)
    size_s = torch.stack([size_s[:m].sum(), size_s[m : 2 * m].sum(), size_s[2 * m :].sum()])
    assert_within(gb, b64.grad, 1e-5 * size_b + 1e-30, 0, "mhc_base_grad")
    assert_within(gs, s64.grad, 1e-5 * size_s + 1e-30, 0, "mhc_scale_grad")
    again = tilebake.mhc.mhc_pre_split_mixes_bwd(*(d(t) for t in grads), d(mixes), post, d(scale), d(base),
                                                 mhc_post_mult_value=mult)  # fmt: skip
    for a, b, what in zip(again, res, ("input_mixes_grad", "scale_grad", "base_grad")):
        assert_bytes_equal(a, b, what + " again")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, lead=LEADS, m=st.integers(1, 8), parts=st.integers(1, 9), eps=st.sampled_from([1e-6, 0.0]))
def test_mhc_head_compute_mix_fwd_bwd(seed, lead, m, parts, eps, device):
    """sigmoid(x scale + base) + eps within 1e-6; the backward: input_mix_grad within 1e-6 of
    float64 autograd, partial row b the float64 sums over tokens [b ceil(T / P), ...) within 1e-5
    of their |terms|."""
    x = normal(seed, (*lead, m), torch.float32, 3.0)
    g = torch.Generator().manual_seed(seed)
    scale, base = torch.rand(1, generator=g) + 0.5, torch.randn(m, generator=g)
    d = lambda t: t.to(device)  # noqa: E731
    got = tilebake.mhc.mhc_head_compute_mix_fwd(d(x), d(scale), d(base), None, eps)
    x64, s64, b64 = (t.double().requires_grad_(True) for t in (x, scale, base))
    y64 = torch.sigmoid(x64 * s64 + b64) + eps
    assert_within(got, y64.detach(), 1e-6, 0, "output_mix")
    og = normal(seed + 1, x.shape)
    gx, ps, pb = tilebake.mhc.mhc_head_compute_mix_bwd(d(og), d(x), d(scale), d(base), num_sms=parts)
    (y64 * og.double()).sum().backward()
    # fp32's 1 - s carries an absolute error ~2^-24: a bound in |g| scale besides the relative one
    assert_within(gx, x64.grad, 1e-7 * og.double().abs() * scale.double() + 1e-30, 1e-5, "input_mix_grad")
    assert ps.shape == (parts, 1) and pb.shape == (parts, m)
    tokens = x.numel() // m
    per = -(-tokens // parts)
    s = torch.sigmoid(x.double() * scale.double() + base.double()).reshape(tokens, m)
    gy = og.double().reshape(tokens, m) * s * (1 - s)
    for b in range(parts):
        rows = slice(b * per, (b + 1) * per)
        # fp32's 1 - s has an absolute error ~2^-24: a bound in |g| besides the relative one
        gabs = og.double().reshape(tokens, m)[rows].abs()
        size = gy[rows].abs().sum(0) + 0.1 * gabs.sum(0)
        assert_within(pb[b], gy[rows].sum(0), 1e-5 * size + 1e-30, 0, f"base partial {b}")
        xr = x.double().reshape(tokens, m)[rows]
        prod = gy[rows] * xr
        size = prod.abs().sum() + 0.1 * (gabs * xr.abs()).sum()
        assert_within(ps[b], prod.sum().reshape(1), 1e-5 * size + 1e-30, 0, f"scale partial {b}")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, n=st.integers(1, 30), k=st.integers(1, 40).map(lambda k: 16 * k), given=st.booleans())
def test_mhc_fn_normw_merge_fwd_bwd(seed, n, k, given, device):
    """out_fn = fn * normw and fn_grad = out_fn_grad * normw, each one fp32 rounding of the exact
    product (bytes); normw_grad = the column sums of out_fn_grad * fn within 1e-6 of their |terms|."""
    fn, w = normal(seed, (n, k), torch.float32, 1.0, (0.0, -0.0, 1e-39), 0.05), normal(seed + 1, (k,))
    d = lambda t: t.to(device)  # noqa: E731
    out = torch.empty(n, k, device=device) if given else None
    got = tilebake.mhc.mhc_fn_normw_merge_fwd(d(fn), d(w), out)
    assert_bytes_equal(got, (fn.double() * w.double()).float(), "out_fn")
    og = normal(seed + 2, (n, k))
    fg, wg = tilebake.mhc.mhc_fn_normw_merge_bwd(d(fn), d(w), d(og))
    assert_bytes_equal(fg, (og.double() * w.double()).float(), "fn_grad")
    terms = og.double() * fn.double()
    assert_within(wg, terms.sum(0), 1e-6 * terms.abs().sum(0) + 1e-38, 0, "normw_grad")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, lead=LEADS, m=st.integers(1, 4), hidden=st.integers(1, 12).map(lambda h: 16 * h),
       n_out=st.sampled_from([3, 8, 24]), n_splits=st.sampled_from([1, 2, 4, 16]),
       accumulate=st.booleans())  # fmt: skip
def test_mhc_pre_norm_gemm_fwd_bwd(seed, lead, m, hidden, n_out, n_splits, accumulate, device):
    """out_mul_splitted[s] = x_s fn_s^T (split s: columns [s c, (s + 1) c), c = ceil(K / (64 n_splits))
    * 64, the module's docstring) within 2^-15 of |x||fn|
    (fn as bf16 hi + lo: 16 mantissa bits) and sqrsum_splitted[s] = sum x_s^2 within c fp32 roundings; the
    backward: residual_grad (+)= og fn + 2 sg x within bf16's rounding and 2^-15 of its |terms|,
    fn_grad = og^T x within 1e-5 of its |terms|."""
    kdim = m * hidden
    res = normal(seed, (*lead, m, hidden), torch.bfloat16)
    fn = normal(seed + 1, (n_out, kdim), torch.float32, kdim**-0.5)
    d = lambda t: t.to(device)  # noqa: E731
    mul, sq = tilebake.mhc.mhc_pre_norm_gemm_fwd(d(res), d(fn), n_splits)
    tokens = res.numel() // kdim
    c = -(-kdim // (64 * n_splits)) * 64  # the module's split width: splits past K are zeros
    x = F.pad(res.double().reshape(tokens, kdim), (0, c * n_splits - kdim)).reshape(tokens, n_splits, c)
    f = F.pad(fn.double(), (0, c * n_splits - kdim)).reshape(n_out, n_splits, c)
    want = torch.einsum("tsk,nsk->stn", x, f)[:, :, None]
    size = torch.einsum("tsk,nsk->stn", x.abs(), f.abs())[:, :, None]
    assert_within(mul, want, 2.0**-15 * size + 1e-30, 0, "out_mul_splitted")
    # c squares (>= 0) summed in fp32 in the kernel's order: within c fp32 roundings of the sum
    assert_within(sq, x.square().sum(-1).t()[..., None], 0, max(1e-6, c * 2.0**-24), "sqrsum_splitted")
    og, sg = normal(seed + 2, (tokens, 1, n_out)), normal(seed + 3, (tokens, 1))
    rg0 = normal(seed + 4, res.shape, torch.bfloat16) if accumulate else None
    buf = None if rg0 is None else d(rg0.clone())
    rg, fg = tilebake.mhc.mhc_pre_norm_gemm_bwd(d(res), d(fn), d(og), d(sg), buf)
    if accumulate:
        assert rg is buf
    xf = res.double().reshape(tokens, kdim)
    want_rg = og.double()[:, 0] @ fn.double() + 2 * sg.double() * xf
    size_rg = og.double()[:, 0].abs() @ fn.double().abs() + 2 * (sg.double() * xf).abs()
    if rg0 is not None:
        want_rg, size_rg = (
            want_rg + rg0.double().reshape(tokens, kdim),
            size_rg + rg0.double().abs().reshape(tokens, -1),
        )
    assert_within(rg.reshape(tokens, kdim), want_rg, 2.0**-15 * size_rg + 1e-30, 2.0**-8, "residual_grad")
    want_fg = og.double()[:, 0].t() @ xf
    assert_within(fg, want_fg, 1e-5 * (og.double()[:, 0].abs().t() @ xf.abs()) + 1e-30, 0, "fn_grad")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, splits=st.integers(1, 17), tokens=st.integers(1, 60), n=st.sampled_from([3, 8, 24, 32]),
       group=st.sampled_from([16, 1280]), eps=st.sampled_from([1e-6, 1e-2]))  # fmt: skip
def test_mhc_reduce_partials_and_rmsnorm_fwd_bwd(seed, splits, tokens, n, group, eps, device):
    """out_mul and sqrsum = the partials added over S in order (fp32, stated here: bytes); out =
    out_mul rsqrt(sqrsum / G + eps) within 1e-6; the backward within 1e-5 of float64 autograd
    (relative to the size of the row sum's terms)."""
    om_s = normal(seed, (splits, tokens, 1, n))
    sq_s = normal(seed + 1, (splits, tokens, 1)).abs() * group / splits
    d = lambda t: t.to(device)  # noqa: E731
    om, sq, out = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(d(om_s), d(sq_s), rms_group_size=group,
                                                                   rms_eps=eps, n_splits=splits)  # fmt: skip
    acc_om, acc_sq = om_s[0].clone(), sq_s[0].clone()
    for s in range(1, splits):
        acc_om, acc_sq = acc_om + om_s[s], acc_sq + sq_s[s]
    assert_bytes_equal(om, acc_om, "out_mul")
    assert_bytes_equal(sq, acc_sq, "sqrsum")
    r = (acc_sq.double() / group + eps).rsqrt()
    assert_within(out, acc_om.double()[:, 0] * r, 0, 1e-6, "out")
    og = normal(seed + 2, (tokens, n))
    omg, sqg = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(d(og), om, sq, rms_group_size=group, rms_eps=eps)
    om64, sq64 = acc_om.double().requires_grad_(True), acc_sq.double().requires_grad_(True)
    ((om64[:, 0] * (sq64 / group + eps).rsqrt()) * og.double()).sum().backward()
    assert_within(omg, om64.grad, 0, 1e-6, "out_mul_grad")
    size = (og.double() * acc_om.double()[:, 0]).abs().sum(-1, keepdim=True) * r**3 / (2 * group)
    assert_within(sqg, sq64.grad, 1e-5 * size + 1e-38, 0, "sqrsum_grad")
