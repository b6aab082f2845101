"""tilebake.modeling.mhc.ops, op by op: gradcheck in float64 (the reference path); bf16 streams and
fp32 mixes (the kernel entry points: our kernels on CUDA, their references on the CPU) against
torch autograd of tilebake.torch.mhc's references in float64, m = 1, 2, 4, 8 and odd token
counts; caller-given outputs; Megatron main_grad; argument errors. Tolerances: as the original's
tests (sinkhorn 1e-5 / 1e-6, split mixes 1e-5 / 2e-5, head mix 1e-4 / 1e-5, pre-apply-mix
atol 1e-2 rtol 1e-3, post / expand 1e-4); bf16 gradients within BF16 below."""

import pytest
import torch

import tilebake.mhc
from tilebake.modeling.mhc import ops
from tilebake.torch import mhc as ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
MULTS = [1, 2, 4, 8]
# bf16 results against float64. Rounded once (an fp32 result to bf16): within half a bf16 ulp,
# at most 2^-8 of the value, plus the fp32 arithmetic's own error (atol, scaled to the largest
# reference value). Rounded twice or more (a bf16 buffer accumulated into, sums whose terms
# may cancel): BF16 relative, or BF16 of the largest reference magnitude.
ONCE = 2**-8 * 1.01
BF16 = 1e-2


def waits_on(*names):
    """Skip until the kernel entry points named have landed in tilebake.mhc."""
    missing = [n for n in names if not hasattr(tilebake.mhc, n)]
    return pytest.mark.skipif(bool(missing), reason=f"waits on tilebake.mhc.{', '.join(missing)}")


SPLIT = ("mhc_pre_split_mixes_fwd", "mhc_pre_split_mixes_bwd")
SINKHORN = ("mhc_sinkhorn_fwd", "mhc_sinkhorn_bwd")
HEAD_MIX = ("mhc_head_compute_mix_fwd", "mhc_head_compute_mix_bwd")
NORM_FN = ("mhc_pre_norm_gemm_fwd", "mhc_pre_norm_gemm_bwd", "mhc_reduce_partials_and_rmsnorm_fwd",
           "mhc_reduce_partials_and_rmsnorm_bwd", "mhc_fn_normw_merge_fwd", "mhc_fn_normw_merge_bwd")  # fmt: skip
ALL_ENTRY_POINTS = SPLIT + SINKHORN + HEAD_MIX + NORM_FN


def leaves(*tensors, dtype=None):
    return [t.detach().clone().to(dtype or t.dtype).requires_grad_() for t in tensors]


def finite(t, name):
    assert torch.isfinite(t).all(), f"{name}: non-finite values"


def assert_close(got, want, rtol, atol, name):
    """got against a float64 want (both finite: NaN never passes)."""
    got = got.detach().cpu().double()
    want = want.detach().cpu().double()
    finite(got, name)
    finite(want, f"{name} (reference)")
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def _largest(t):
    return float(t.detach().abs().max().clamp_min(1e-30)) if t.numel() else 0.0


def assert_close_bf16(got, want, name, tol=BF16):
    """Elementwise within tol relative, or tol times the largest reference magnitude."""
    assert_close(got, want, tol, tol * _largest(want), name)


def assert_rounded_once(got, want, name):
    """A bf16 result of fp32 arithmetic rounded once, against float64 (see ONCE)."""
    assert got.dtype == torch.bfloat16, f"{name}: dtype {got.dtype}"
    assert_close(got, want, ONCE, 1e-5 * _largest(want), name)


def streams(lead, m, hidden, device, dtype=torch.bfloat16):
    return torch.randn(*lead, m, hidden, device=device).to(dtype)


def mix_params(m, device, dtype=torch.float32):
    """scale (3,) and base (m3,) at a size that keeps the sigmoids off saturation."""
    m3 = m * (m + 2)
    return (torch.rand(3, device=device) * 0.5 + 0.1).to(dtype), (torch.randn(m3, device=device) * 0.3).to(dtype)


# --- gradcheck: the float64 reference path ---


def _gradcheck(f, *inputs):
    assert torch.autograd.gradcheck(f, leaves(*inputs), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("m", MULTS)
def test_gradcheck_stream_ops(m):
    x = torch.randn(3, 5, dtype=torch.float64)
    r = torch.randn(3, m, 5, dtype=torch.float64)
    post, comb = torch.rand(3, m, 1, dtype=torch.float64), torch.rand(3, m, m, dtype=torch.float64)
    _gradcheck(lambda h: ops.expand_to_mhc(h, m), x)
    _gradcheck(lambda a, b, c, d: ops.mhc_post(a, b, c, d), x, r, post, comb)
    _gradcheck(lambda a, b, c, d: ops.mhc_post(a, b, c, d), x, r, post[..., 0], comb)  # post (..., m)
    _gradcheck(lambda a, b: ops.mhc_pre_apply_mix(a, b), r, post)


@pytest.mark.parametrize("m", MULTS)
def test_gradcheck_mix_ops(m):
    m3 = m * (m + 2)
    scale, base = mix_params(m, "cpu", torch.float64)
    mixes = torch.randn(2, 3, m3, dtype=torch.float64)
    _gradcheck(lambda x, s, b: ops.mhc_pre_split_mixes(x, s, b, m, 2.0, 1e-6), mixes, scale, base)
    _gradcheck(lambda x: ops.sinkhorn_normalize(x, repeat=10, eps=1e-6), torch.randn(5, m, m, dtype=torch.float64))
    _gradcheck(lambda x, s, b: ops.mhc_head_compute_mix(x, s, b, 1e-6), mixes[..., :m], scale[:1], base[:m])
    _gradcheck(lambda x, s, b: ops.mhc_head_compute_mix(x, s, b, 1e-6), mixes[..., :m], scale[0], base[:m])


@pytest.mark.parametrize("m", MULTS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gradcheck_pre_norm_fn(m, weighted):
    m3, hidden = m * (m + 2), 4
    r = torch.randn(3, m, hidden, dtype=torch.float64)
    fn = torch.randn(m3, m * hidden, dtype=torch.float64) * 0.1
    nw = 1 + 0.1 * torch.randn(m * hidden, dtype=torch.float64)
    if weighted:
        _gradcheck(lambda a, b, c: ops.mhc_pre_norm_fn(a, b, c, 1e-6), r, fn, nw)
    else:
        _gradcheck(lambda a, b: ops.mhc_pre_norm_fn(a, b, None, 1e-6, fuse_grad_acc=False), r, fn)


# --- the kernel path against float64 autograd of the references ---


def _run(f, inputs, grads):
    """(outputs, input gradients) of f on fresh leaves, the outputs given `grads`."""
    a = leaves(*inputs)
    outs = f(*a)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(outs, grads)
    return outs, [t.grad for t in a]


def _run64(f, inputs, grads):
    return _run(f, [t.cpu().double() for t in inputs], [g.cpu().double() for g in grads])


TOKENS = [(1,), (7,), (2, 33)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", MULTS)
@pytest.mark.parametrize("lead", TOKENS)
def test_stream_ops_against_float64(device, m, lead):
    hidden = 96 if device == "cpu" else 1024
    x, r = torch.randn(*lead, hidden, device=device).bfloat16(), streams(lead, m, hidden, device)
    post, comb = torch.rand(*lead, m, 1, device=device) * 2, torch.rand(*lead, m, m, device=device)
    g_streams, g_hidden = streams(lead, m, hidden, device), torch.randn(*lead, hidden, device=device).bfloat16()

    (out,), (gx,) = _run(lambda h: ops.expand_to_mhc(h, m), [x], [g_streams])
    (want,), (wx,) = _run64(lambda h: ref.expand_to_mhc_ref(h, m), [x], [g_streams])
    assert out.dtype == torch.bfloat16 and out.shape == (*lead, m, hidden) and torch.equal(out.double().cpu(), want)
    assert_rounded_once(gx, wx, "expand: grad")  # a sum of m bf16 values

    # the forwards: within the original's tolerances of the stream-ordered fp32 references (the
    # kernels are bit-exact with them), and one bf16 rounding of the float64 value
    (out,), got = _run(ops.mhc_post, [x, r, post, comb], [g_streams])
    (want,), wgrads = _run64(ref.mhc_post_ref, [x, r, post, comb], [g_streams])
    assert out.shape == r.shape
    assert_close(out, ref.mhc_post_ref(x.cpu(), r.cpu(), post.cpu(), comb.cpu()), 1e-4, 1e-4, "post")
    assert_rounded_once(out, want, "post")
    for name, g, w in zip(("x", "residual"), got[:2], wgrads[:2]):
        assert_rounded_once(g, w, f"post: grad {name}")
    for name, g, w in zip(("post", "comb"), got[2:], wgrads[2:]):
        assert g.dtype == torch.float32 and g.shape == w.shape
        assert_close(g, w, 1e-4, 1e-4 * _largest(w), f"post: grad {name}")  # fp32 sums over the hidden dim

    for mix in (post, post[..., 0]):
        (out,), (gr, gm) = _run(ops.mhc_pre_apply_mix, [r, mix], [g_hidden])
        (want,), (wr, wm) = _run64(ref.mhc_pre_apply_mix_ref, [r, mix], [g_hidden])
        assert out.shape == (*lead, hidden)
        assert_close(out, ref.mhc_pre_apply_mix_ref(r.cpu(), mix.cpu()), 1e-3, 1e-2, "pre_apply_mix")
        assert_rounded_once(out, want, "pre_apply_mix")
        assert gm.shape == mix.shape and gm.dtype == torch.float32
        assert_rounded_once(gr, wr, "pre_apply_mix: grad x")
        assert_close(gm, wm, 1e-4, 1e-4 * _largest(wm), "pre_apply_mix: grad mix")


@pytest.mark.parametrize("device", DEVICES)
def test_stream_ops_into_given_outputs(device):
    lead, m, hidden = (5,), 4, 64
    x, r = torch.randn(*lead, hidden, device=device).bfloat16(), streams(lead, m, hidden, device)
    post, comb = torch.rand(*lead, m, 1, device=device), torch.rand(*lead, m, m, device=device)
    for f, args, shape in ((lambda *a, out: ops.expand_to_mhc(*a, m, out=out), (x,), r.shape),
                           (lambda *a, out: ops.mhc_post(*a, out=out), (x, r, post, comb), r.shape),
                           (lambda *a, out: ops.mhc_pre_apply_mix(*a, out=out), (r, post), x.shape)):  # fmt: skip
        a = leaves(*args)
        given = torch.full(shape, float("nan"), device=device, dtype=torch.bfloat16)
        out = f(*a, out=given)
        assert out is given
        out.float().square().sum().backward()
        b = leaves(*args)
        want = f(*b, out=None)
        want.float().square().sum().backward()
        assert torch.equal(out, want)
        for ga, gb in zip(a, b):
            assert torch.equal(ga.grad, gb.grad)


def _mix_case(device, m, lead):
    scale, base = mix_params(m, device)
    mixes = torch.randn(*lead, m * (m + 2), device=device)
    gs = [torch.randn(*lead, m, 1, device=device), torch.randn(*lead, m, 1, device=device),
          torch.randn(*lead, m, m, device=device)]  # fmt: skip
    return scale, base, mixes, gs


MIX_CASES = [pytest.param(d, m, lead, id=f"{d}-m{m}-{'x'.join(map(str, lead))}", marks=marks)
             for d, marks in (("cpu", ()), ("cuda", pytest.mark.gpu)) for m in MULTS for lead in TOKENS]  # fmt: skip


@pytest.mark.parametrize("device,m,lead", MIX_CASES)
@waits_on(*SPLIT)
def test_split_mixes_against_float64(device, m, lead):
    scale, base, mixes, gs = _mix_case(device, m, lead)
    got, ggrads = _run(lambda x, s, b: ops.mhc_pre_split_mixes(x, s, b, m, 2.0, 1e-6), [mixes, scale, base], gs)
    want, wgrads = _run64(lambda x, s, b: ref.mhc_pre_split_mixes_ref(x, s, b, m, 2.0, 1e-6), [mixes, scale, base], gs)
    for name, g, w in zip(("pre", "post", "comb"), got, want):
        assert g.dtype == torch.float32 and g.shape == w.shape
        assert_close(g, w, 1e-5, 2e-5, f"split_mixes: {name}")
    for name, g, w in zip(("mixes", "scale", "base"), ggrads, wgrads):
        assert g.dtype == torch.float32 and g.shape == w.shape
        # scale and base: fp32 sums over the tokens
        assert_close(g, w, 1e-5, 2e-5 * max(1.0, _largest(w)), f"split_mixes: grad {name}")


@pytest.mark.parametrize("device,m,lead", MIX_CASES)
@waits_on(*SINKHORN)
def test_sinkhorn_against_float64(device, m, lead):
    comb, g = torch.randn(*lead, m, m, device=device), torch.randn(*lead, m, m, device=device)
    (got,), (gg,) = _run(lambda x: ops.sinkhorn_normalize(x, repeat=10, eps=1e-6), [comb], [g])
    (want,), (wg,) = _run64(lambda x: ref.sinkhorn_normalize_ref(x, 10, 1e-6), [comb], [g])
    assert got.dtype == torch.float32 and got.shape == comb.shape and gg.shape == comb.shape
    assert_close(got, want, 1e-5, 1e-6, "sinkhorn")
    assert_close(gg, wg, 1e-5, 1e-6 * max(1.0, _largest(wg)), "sinkhorn: grad")


@pytest.mark.parametrize("device,m,lead", MIX_CASES)
@waits_on(*HEAD_MIX)
def test_head_compute_mix_against_float64(device, m, lead):
    scale, base, mixes, gs = _mix_case(device, m, lead)
    mix, g = mixes[..., :m].contiguous(), gs[0][..., 0]
    for s in (scale[:1], scale[0]):  # (1,) or a scalar
        (got,), ggrads = _run(lambda x, a, b: ops.mhc_head_compute_mix(x, a, b, 1e-6), [mix, s, base[:m]], [g])
        (want,), wgrads = _run64(lambda x, a, b: ref.mhc_head_compute_mix_ref(x, a, b, 1e-6), [mix, s, base[:m]], [g])
        assert_close(got, want, 1e-4, 1e-5, "head mix")
        for name, gg, w in zip(("mix", "scale", "base"), ggrads, wgrads):
            assert gg.shape == w.shape and gg.dtype == torch.float32
            assert_close(gg, w, 1e-4, 1e-5 * max(1.0, _largest(w)), f"head mix: grad {name}")


def _pre_norm_inputs(lead, m, hidden, device):
    m3 = m * (m + 2)
    r = streams(lead, m, hidden, device)
    fn = torch.randn(m3, m * hidden, device=device) / (m * hidden) ** 0.5
    nw = 1 + 0.1 * torch.randn(m * hidden, device=device)
    return r, fn, nw, torch.randn(*lead, m3, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", MULTS)
@pytest.mark.parametrize("lead", TOKENS)
@waits_on(*NORM_FN)
def test_pre_norm_fn_against_float64(device, m, lead):
    hidden = 64 if device == "cpu" else 1024
    r, fn, nw, g = _pre_norm_inputs(lead, m, hidden, device)
    (got,), ggrads = _run(lambda a, b, c: ops.mhc_pre_norm_fn(a, b, c, 1e-6), [r, fn, nw], [g])
    (want,), wgrads = _run64(lambda a, b, c: ref.mhc_pre_norm_fn_ref(a, b, c, 1e-6), [r, fn, nw], [g])
    assert got.dtype == torch.float32 and got.shape == (*lead, m * (m + 2))
    assert_close(got, want, 1e-3, 1e-3, "pre_norm_fn")  # fn rounded to TF32 (the original's mixes tolerance)
    assert ggrads[0].dtype == torch.bfloat16
    assert_close_bf16(ggrads[0], wgrads[0], "pre_norm_fn: grad residual")
    for name, gg, w in zip(("fn", "norm_weight"), ggrads[1:], wgrads[1:]):
        assert gg.dtype == torch.float32 and gg.shape == w.shape
        assert_close(gg, w, 1e-3, 1e-3 * _largest(w), f"pre_norm_fn: grad {name}")  # fp32 sums over tokens


# --- Megatron main_grad ---


def _with_main_grad(t, start):
    p = t.detach().clone().requires_grad_()
    p.main_grad = start.clone()
    return p


def _main_grad_cases(dtype):
    """(name, f, inputs, output grads, indices of the parameters) at fp64 (the reference path) or
    fp32 with bf16 streams (the kernels)."""
    m, lead, hidden = 4, (9,), 32
    r, fn, nw, g = _pre_norm_inputs(lead, m, hidden, "cpu")
    r, fn, nw, g = r.to(torch.bfloat16 if dtype == torch.float32 else dtype), fn.to(dtype), nw.to(dtype), g.to(dtype)
    scale, base = mix_params(m, "cpu", dtype)
    mixes = torch.randn(*lead, m * (m + 2), dtype=dtype)
    g3 = [torch.randn(*lead, m, 1, dtype=dtype), torch.randn(*lead, m, 1, dtype=dtype),
          torch.randn(*lead, m, m, dtype=dtype)]  # fmt: skip
    return {
        "split_mixes": (lambda x, a, b: ops.mhc_pre_split_mixes(x, a, b, m, 1.0, 1e-6), [mixes, scale, base], g3,
                        (1, 2)),
        "head_mix": (lambda x, a, b: ops.mhc_head_compute_mix(x, a, b, 1e-6), [mixes[..., :m], scale[:1], base[:m]],
                     [g3[0][..., 0]], (1, 2)),
        "pre_norm_fn_weighted": (lambda a, b, c: ops.mhc_pre_norm_fn(a, b, c, 1e-6), [r, fn, nw], [g], (1, 2)),
        "pre_norm_fn": (lambda a, b: ops.mhc_pre_norm_fn(a, b, None, 1e-6), [r, fn], [g], (1,)),
    }  # fmt: skip


_NEEDS = {"split_mixes": SPLIT, "head_mix": HEAD_MIX, "pre_norm_fn_weighted": NORM_FN, "pre_norm_fn": NORM_FN}
MAIN_GRAD_CASES = [
    pytest.param(dtype, case, id=f"{case}-{path}", marks=() if path == "reference" else waits_on(*_NEEDS[case]))
    for case in _NEEDS for dtype, path in ((torch.float64, "reference"), (torch.float32, "kernels"))
]  # fmt: skip


@pytest.mark.parametrize("dtype,case", MAIN_GRAD_CASES)
def test_main_grad_accumulates(dtype, case):
    """Each parameter with main_grad gets its gradient added in fp32 (and .grad stays None); the
    others get theirs returned as usual, equal to the plain run's."""
    f, inputs, grads, params = _main_grad_cases(dtype)[case]
    _, plain_grads = _run(f, inputs, grads)
    a = leaves(*inputs)
    starts = {}
    for i in params:
        starts[i] = torch.randn(inputs[i].shape, dtype=torch.float32)
        a[i] = _with_main_grad(inputs[i], starts[i])
    outs = f(*a)
    torch.autograd.backward(outs if isinstance(outs, tuple) else (outs,), grads)
    for i, t in enumerate(a):
        if i in params:
            assert t.grad is None and t.main_grad.dtype == torch.float32
            assert not torch.equal(t.main_grad, starts[i])
            torch.testing.assert_close(t.main_grad, starts[i] + plain_grads[i].float(), rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(t.grad, plain_grads[i])


# --- arguments ---


def test_the_original_import_paths_and_keywords():
    from tilebake.modeling.mhc.ops import mhc_post_bwd, mhc_post_fwd, sinkhorn_normalize

    assert mhc_post_fwd is tilebake.mhc.mhc_post_fwd and mhc_post_bwd is tilebake.mhc.mhc_post_bwd
    x = torch.randn(3, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(sinkhorn_normalize(x, repeat=5, eps=1e-4), ref.sinkhorn_normalize_ref(x, 5, 1e-4))


def test_rejects_bad_arguments():
    m = 4
    scale, base = mix_params(m, "cpu", torch.float64)
    with pytest.raises(ValueError, match=r"needs input_mixes \(\.\.\., 24\)"):
        ops.mhc_pre_split_mixes(torch.randn(3, 20, dtype=torch.float64), scale, base, m, 1.0, 1e-6)
    with pytest.raises(ValueError, match="mhc_scale of one element"):
        ops.mhc_head_compute_mix(torch.randn(3, m, dtype=torch.float64), scale, base[:m], 1e-6)
    with pytest.raises(ValueError, match=r"\(\.\.\., m, m\)"):
        ops.sinkhorn_normalize(torch.randn(3, 4, 5, dtype=torch.float64))
    r = torch.randn(2, m, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"fn must have shape \(24, 32\)"):
        ops.mhc_pre_norm_fn(r, torch.randn(24, 31, dtype=torch.float64), None, 1e-6)
    with pytest.raises(ValueError, match="mhc_norm_weight must have shape"):
        ops.mhc_pre_norm_fn(r, torch.randn(24, 32, dtype=torch.float64), torch.ones(31, dtype=torch.float64), 1e-6)
    with pytest.raises(TypeError, match="x must be bfloat16"):  # the kernels' own checks come through
        ops.mhc_pre_apply_mix(torch.randn(2, m, 8).half(), torch.rand(2, m))
