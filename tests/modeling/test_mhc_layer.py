"""tilebake.modeling.mhc's functional layer (mhc_pre, mhc_head): gradcheck in float64 (the
reference path); bf16 streams against torch autograd of tilebake.torch.mhc's references composed
in float64, m = 1, 2, 4, 8 and odd token counts; the fused Function against the composition of the
separate ops; the residual's gradient in one buffer; the no-grad path; Megatron main_grad."""

import pytest
import torch

import tilebake.mhc
from tests.modeling.test_mhc_ops import (
    DEVICES, MULTS, _largest, assert_close, assert_close_bf16, leaves, mix_params, streams,
)  # fmt: skip
from tilebake.modeling import mhc
from tilebake.modeling.mhc import ops
from tilebake.torch import mhc as ref

NORM_EPS, PRE_EPS, SINKHORN_EPS, REPEAT, POST_MULT = 1e-6, 1e-6, 1e-6, 10, 2.0
TOKENS = [(1,), (7,), (3, 11)]


def params(m, hidden, device, dtype=torch.float32):
    """fn (m3, m H), norm weight (m H,), scale (3,), base (m3,) and the head's fn (m, m H), scale
    (1,), base (m,): sizes that keep the sigmoids and the Sinkhorn softmax off saturation."""
    m3, k = m * (m + 2), m * hidden
    fn = torch.randn(m3, k, device=device) / k**0.5
    nw = 1 + 0.1 * torch.randn(k, device=device)
    scale, base = mix_params(m, device)
    head = (torch.randn(m, k, device=device) / k**0.5, torch.rand(1, device=device) + 0.5,
            0.3 * torch.randn(m, device=device))
    return [t.to(dtype) for t in (fn, nw, scale, base)], [t.to(dtype) for t in head]


def pre(residual, fn, nw, scale, base, **kw):
    layer_input, (post, comb) = mhc.mhc_pre(residual, fn, scale, base, norm_weight=nw, norm_eps=NORM_EPS,
                                            mhc_mult=residual.shape[-2], post_mult_value=POST_MULT, pre_eps=PRE_EPS,
                                            sinkhorn_eps=SINKHORN_EPS, sinkhorn_repeat=REPEAT, **kw)  # fmt: skip
    return layer_input, post, comb


def head(residual, fn, nw, scale, base):
    return mhc.mhc_head(residual, fn, scale, base, norm_weight=nw, norm_eps=NORM_EPS, mhc_mult=residual.shape[-2],
                        pre_eps=PRE_EPS)  # fmt: skip


def pre_oracle(residual, fn, nw, scale, base):
    """mhc_pre from tilebake.torch.mhc's references (with autograd in the caller's dtype)."""
    m = residual.shape[-2]
    mixes = ref.mhc_pre_norm_fn_ref(residual, fn, nw, NORM_EPS)
    p, post, comb = ref.mhc_pre_split_mixes_ref(mixes, scale, base, m, POST_MULT, PRE_EPS)
    return ref.mhc_pre_apply_mix_ref(residual, p), post, ref.sinkhorn_normalize_ref(comb, REPEAT, SINKHORN_EPS)


def head_oracle(residual, fn, nw, scale, base):
    mixes = ref.mhc_pre_norm_fn_ref(residual, fn, nw, NORM_EPS)
    return ref.mhc_pre_apply_mix_ref(residual, ref.mhc_head_compute_mix_ref(mixes, scale, base, PRE_EPS))


def _run(f, inputs, grads):
    a = leaves(*inputs)
    outs = f(*a)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(outs, grads)
    return outs, [t.grad for t in a]


# --- gradcheck: the float64 reference path ---


@pytest.mark.parametrize("m", MULTS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gradcheck_pre_and_head(m, weighted):
    hidden = 3
    (fn, nw, scale, base), (hfn, hscale, hbase) = params(m, hidden, "cpu", torch.float64)
    r = streams((2,), m, hidden, "cpu", torch.float64)
    nw = nw if weighted else None
    check = dict(eps=1e-6, atol=1e-6, rtol=1e-5)
    if weighted:
        assert torch.autograd.gradcheck(pre, leaves(r, fn, nw, scale, base), **check)
        assert torch.autograd.gradcheck(head, leaves(r, hfn, nw, hscale, hbase), **check)
    else:
        assert torch.autograd.gradcheck(lambda a, b, c, d: pre(a, b, None, c, d), leaves(r, fn, scale, base), **check)
        # a scalar scale
        assert torch.autograd.gradcheck(lambda a, b, c, d: head(a, b, None, c, d), leaves(r, hfn, hscale[0], hbase),
                                        **check)  # fmt: skip


# --- the kernel path against float64 ---


def _pre_case(lead, m, device):
    hidden = 64 if device == "cpu" else 1024
    (fn, nw, scale, base), head_params = params(m, hidden, device)
    r = streams(lead, m, hidden, device)
    grads = [torch.randn(*lead, hidden, device=device).bfloat16(), torch.randn(*lead, m, 1, device=device),
             torch.randn(*lead, m, m, device=device)]  # fmt: skip
    return r, (fn, nw, scale, base), head_params, grads


def _check_grads(got, want, names, stream_tol=2e-2):
    """The residual's bf16 gradient (rounded twice: the mix's part, then the projection's added;
    measured on the CPU within 5.2e-3 of the largest value) and the fp32 parameter gradients,
    whose error is that of the mixes (on CUDA fn is read with 16 mantissa bits, 2^-17 relative)
    carried through sums over the tokens: 1e-3 of the largest (1e-6 measured on the CPU)."""
    assert got[0].dtype == torch.bfloat16
    assert_close_bf16(got[0], want[0], f"grad {names[0]}", tol=stream_tol)
    for name, g, w in zip(names[1:], got[1:], want[1:]):
        assert g.dtype == torch.float32 and g.shape == w.shape, name
        assert_close(g, w, 1e-3, 1e-3 * _largest(w), f"grad {name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", MULTS)
@pytest.mark.parametrize("lead", TOKENS)
def test_pre_against_float64(device, m, lead):
    r, p, _, grads = _pre_case(lead, m, device)
    got, ggrads = _run(pre, [r, *p], grads)
    want, wgrads = _run(pre_oracle, [t.cpu().double() for t in (r, *p)], [g.cpu().double() for g in grads])
    layer_input, post, comb = got
    assert layer_input.dtype == torch.bfloat16 and layer_input.shape == (*lead, r.shape[-1])
    assert post.shape == (*lead, m, 1) and comb.shape == (*lead, m, m) and post.dtype == comb.dtype == torch.float32
    # the mixes differ by the projection's rounding (on CUDA fn with 16 mantissa bits, 2^-17
    # relative; then the sigmoids and Sinkhorn, whose slopes are below 1 here)
    assert_close_bf16(layer_input, want[0], "layer_input")
    assert_close(post, want[1], 1e-4, 1e-5, "post")
    assert_close(comb, want[2], 1e-4, 1e-5, "comb")
    _check_grads(ggrads, wgrads, ("residual", "fn", "norm_weight", "scale", "base"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", MULTS)
@pytest.mark.parametrize("lead", TOKENS)
def test_head_against_float64(device, m, lead):
    r, (_, nw, _, _), (hfn, hscale, hbase), grads = _pre_case(lead, m, device)
    (out,), ggrads = _run(head, [r, hfn, nw, hscale, hbase], grads[:1])
    inputs64 = [t.cpu().double() for t in (r, hfn, nw, hscale, hbase)]
    (want,), wgrads = _run(head_oracle, inputs64, [grads[0].cpu().double()])
    assert out.dtype == torch.bfloat16 and out.shape == (*lead, r.shape[-1])
    assert_close_bf16(out, want, "head")
    _check_grads(ggrads, wgrads, ("residual", "fn", "norm_weight", "scale", "base"))
    # an (m3, m H) fn is taken as given: the same result, the padded rows' gradient zero
    padded = torch.cat([hfn, hfn.new_zeros(m * (m + 1), hfn.shape[1])])
    (out_p,), pgrads = _run(head, [r, padded, nw, hscale, hbase], grads[:1])
    assert torch.equal(out_p, out) and torch.equal(pgrads[1][:m], ggrads[1]) and not pgrads[1][m:].any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 4, 8])
def test_pre_equals_the_separate_ops(device, m):
    """The fused Function against mhc_pre_norm_fn -> mhc_pre_split_mixes -> sinkhorn_normalize ->
    mhc_pre_apply_mix: the same forward bits and parameter gradients; the residual's gradient
    is rounded at a different point (one buffer accumulated, against autograd's bf16 sum)."""
    r, p, _, grads = _pre_case((9,), m, device)

    def separate(residual, fn, nw, scale, base):
        mixes = ops.mhc_pre_norm_fn(residual, fn, nw, NORM_EPS)
        p_, post, comb = ops.mhc_pre_split_mixes(mixes, scale, base, m, POST_MULT, PRE_EPS)
        comb = ops.sinkhorn_normalize(comb, REPEAT, SINKHORN_EPS)
        return ops.mhc_pre_apply_mix(residual, p_), post, comb

    got, ggrads = _run(pre, [r, *p], grads)
    want, wgrads = _run(separate, [r, *p], grads)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    for g, w in zip(ggrads[1:], wgrads[1:]):
        assert torch.equal(g, w)
    assert_close_bf16(ggrads[0], wgrads[0].double(), "grad residual", tol=2e-2)


def test_residual_gradient_takes_one_buffer(monkeypatch):
    """mhc_pre's backward hands the same buffer to mhc_pre_apply_mix_bwd (x_grad) and to
    mhc_pre_norm_gemm_bwd (residual_grad), and that buffer becomes residual.grad."""
    seen = {}
    for name, key in (("mhc_pre_apply_mix_bwd", "x_grad"), ("mhc_pre_norm_gemm_bwd", "residual_grad")):
        original = getattr(tilebake.mhc, name)

        def spy(*args, _original=original, _key=key, **kw):
            # the address only: a kept reference would stop autograd from taking the buffer as .grad
            seen[_key] = None if kw.get(_key) is None else kw[_key].data_ptr()
            return _original(*args, **kw)

        monkeypatch.setattr(tilebake.mhc, name, spy)
    r, p, _, grads = _pre_case((5,), 4, "cpu")
    a = leaves(r, *p)
    torch.autograd.backward(pre(*a), grads)
    assert seen["x_grad"] is not None and seen["x_grad"] == seen["residual_grad"]
    assert a[0].grad.data_ptr() == seen["x_grad"]


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_equals_the_grad_path(device, monkeypatch):
    r, p, (hfn, hscale, hbase), _ = _pre_case((2, 13), 4, device)
    with_grad = pre(r, *p)
    with torch.no_grad():
        without = pre(r, *p)
    for name, g, w in zip(("layer_input", "post", "comb"), without, with_grad):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        if g.dtype == torch.bfloat16:
            assert_close_bf16(g, w.double(), name)
        else:
            assert_close(g, w, 1e-5, 1e-6, name)  # the fused kernel sums in its own order
    with torch.no_grad():
        torch.testing.assert_close(head(r, hfn, p[1], hscale, hbase), head(r, hfn, p[1], hscale, hbase), rtol=0, atol=0)

    # where ops.mhc_pre_big_fuse exists, the no-grad path is that one call, its results reshaped
    calls = []

    def big_fuse(residual, fn, scale, base, **kw):
        calls.append((fn, kw))
        return (with_grad[1].detach().reshape(-1, 4), with_grad[2].detach().reshape(-1, 16),
                with_grad[0].detach().reshape(-1, residual.shape[-1]))  # fmt: skip

    monkeypatch.setattr(ops, "mhc_pre_big_fuse", big_fuse, raising=False)
    with torch.no_grad():
        fused = pre(r, *p, n_splits=1)
    assert len(calls) == 1
    fn_passed, kw = calls[0]
    torch.testing.assert_close(fn_passed, p[0] * p[1], rtol=0, atol=0)  # the norm weight folded in
    assert kw == dict(rms_eps=NORM_EPS, mhc_pre_eps=PRE_EPS, mhc_sinkhorn_eps=SINKHORN_EPS,
                      mhc_post_mult_value=POST_MULT, sinkhorn_repeat=REPEAT, n_splits=1)  # fmt: skip
    for g, w in zip(fused, with_grad):
        assert g.shape == w.shape and torch.equal(g, w.detach())


PATHS = [pytest.param(torch.float64, id="reference"), pytest.param(torch.float32, id="kernels")]


@pytest.mark.parametrize("dtype", PATHS)
def test_main_grad_accumulates(dtype):
    """fn, norm_weight, scale and base with main_grad (Megatron): gradients added in fp32, None
    returned; the same values as a plain run's .grad."""
    m = 4
    r, (fn, nw, scale, base), (hfn, hscale, hbase), grads = _pre_case((6,), m, "cpu")
    if dtype == torch.float64:
        r, grads = r.double(), [g.double() for g in grads]
    cases = ((pre, [r, fn, nw, scale, base], grads), (head, [r, hfn, nw, hscale, hbase], grads[:1]))
    for f, inputs, outs_grads in cases:
        inputs = [t.to(dtype) if t.dtype != torch.bfloat16 else t for t in inputs]
        _, plain = _run(f, inputs, outs_grads)
        a = leaves(*inputs)
        starts = [torch.randn(t.shape) for t in a[1:]]
        for t, s in zip(a[1:], starts):
            t.main_grad = s.clone()
        torch.autograd.backward(f(*a), outs_grads)
        assert torch.equal(a[0].grad, plain[0])
        for t, s, g in zip(a[1:], starts, plain[1:]):
            assert t.grad is None and t.main_grad.dtype == torch.float32
            torch.testing.assert_close(t.main_grad, s + g.float(), rtol=1e-6, atol=1e-6)


def test_rejects_bad_arguments():
    r, (fn, nw, scale, base), (hfn, hscale, hbase), _ = _pre_case((3,), 4, "cpu")
    with pytest.raises(ValueError, match="mhc_mult = 2 streams"):
        mhc.mhc_pre(r, fn, scale, base, mhc_mult=2)
    with pytest.raises(ValueError, match=r"fn must have shape \(24, 256\)"):
        mhc.mhc_pre(r, fn[:, :-8], scale, base)
    with pytest.raises(ValueError, match=r"scale \(3,\) and base \(24,\)"):
        mhc.mhc_pre(r, fn, scale[:2], base)
    with pytest.raises(ValueError, match=r"fn must have 4 \(or 24\) rows"):
        mhc.mhc_head(r, hfn[:3], hscale, hbase)
    with pytest.raises(ValueError, match="scale of one element"):
        mhc.mhc_head(r, hfn, scale, hbase)
