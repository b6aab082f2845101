"""mhc_pre_split_mixes_fwd (comb bit-exact with mhc_pre_split_mixes_ref, pre and post within the
original's tolerance, rtol 1e-5 / atol 2e-5) and _bwd (against float64 autograd of the reference;
the fixed-order sums give the same bits twice), m = 1 to 8, on the CPU and the GPU; argument
errors on the CPU."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.mhc import mhc_pre_split_mixes_ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [((1,), 4), ((8001,), 4), ((2, 517), 2), ((65,), 8), ((7,), 1), ((1, 3), 3)]
TOL = dict(rtol=1e-5, atol=2e-5)  # the original's (tests/mhc/test_pre_split_mixes.py)


def inputs(lead, m, device):
    m3 = m * (m + 2)
    return (torch.randn(*lead, m3, device=device), torch.rand(3, device=device) + 0.5,
            torch.randn(m3, device=device))  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m", SHAPES)
def test_forward(device, lead, m):
    x, scale, base = inputs(lead, m, device)
    got = tilebake.mhc.mhc_pre_split_mixes_fwd(x, scale, base, mhc_post_mult_value=2.0, mhc_pre_eps=1e-4)
    want = mhc_pre_split_mixes_ref(x.cpu(), scale.cpu(), base.cpu(), m, 2.0, 1e-4)
    for name, g, w in zip(("pre", "post", "comb"), got, want):
        assert g.shape == w.shape and g.dtype == torch.float32, name
        torch.testing.assert_close(g.cpu(), w, **TOL, msg=name)
    assert_bytes_equal(got[2].cpu(), want[2], "comb")  # one product and one sum: the same bits
    given = [poison_(torch.empty(*lead, k, device=device)) for k in (m, m, m * m)]  # the flat forms
    again = tilebake.mhc.mhc_pre_split_mixes_fwd(x, scale, base, *given, 2.0, 1e-4)
    for name, a, g, b in zip(("pre", "post", "comb"), again, given, got):
        assert a is g, name
        assert_bytes_equal(a.cpu(), b.reshape(a.shape).cpu(), f"given {name}")


def autograd(args, grads, m, post_mult):
    leaves = [a.cpu().double().requires_grad_() for a in args]
    outs = mhc_pre_split_mixes_ref(*leaves, m, post_mult, 1e-6)
    torch.autograd.backward(outs, [g.cpu().double().reshape(o.shape) for g, o in zip(grads, outs)])
    return [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m", SHAPES)
def test_backward(device, lead, m):
    args = inputs(lead, m, device)
    post = tilebake.mhc.mhc_pre_split_mixes_fwd(*args, mhc_post_mult_value=2.0)[1]
    flat = m % 2 == 1  # odd m: the gradients in their flat forms
    grads = [torch.randn(*lead, *((k,) if flat else (m, k // m)), device=device) for k in (m, m, m * m)]
    got = tilebake.mhc.mhc_pre_split_mixes_bwd(*grads, args[0], post, args[1], args[2], mhc_post_mult_value=2.0)
    want = autograd(args, grads, m, 2.0)
    for name, g, w, like in zip(("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"), got, want, args):
        assert g.shape == like.shape and g.dtype == torch.float32, name
        torch.testing.assert_close(g.cpu().double(), w, **TOL, msg=name)
    given = [poison_(torch.empty_like(a)) for a in args]
    again = tilebake.mhc.mhc_pre_split_mixes_bwd(*grads, args[0], post, args[1], args[2], *given, 2.0)
    for name, a, g, b in zip(("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"), again, given, got):
        assert a is g, name
        assert_bytes_equal(a.cpu(), b.cpu(), f"given {name} (a second run)")


@pytest.mark.gpu
@pytest.mark.parametrize("num_sms", [1, 3])
def test_backward_any_partial_count(num_sms):
    """Fewer CTAs than tokens (set_num_sms): still the full sums."""
    lead, m = (517,), 4
    args = inputs(lead, m, "cuda")
    grads = [torch.randn(*lead, k, device="cuda") for k in (m, m, m * m)]
    post = torch.empty(*lead, m, device="cuda")
    tilebake.config.set_num_sms(num_sms)
    got = tilebake.mhc.mhc_pre_split_mixes_bwd(*grads, args[0], post, args[1], args[2])
    for name, g, w in zip(("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"), got, autograd(args, grads, m, 1.0)):
        torch.testing.assert_close(g.cpu().double(), w, **TOL, msg=name)


@pytest.mark.gpu
def test_backward_on_two_streams_at_once():
    """Calls in flight on two streams at once: each call's partial rows are its own (allocated on
    its stream), so each gives the bits of a lone call."""
    lead, m = (8001,), 4
    args = inputs(lead, m, "cuda")
    grads = [torch.randn(*lead, k, device="cuda") for k in (m, m, m * m)]
    post = torch.empty(*lead, m, device="cuda")
    want = tilebake.mhc.mhc_pre_split_mixes_bwd(*grads, args[0], post, args[1], args[2])
    streams = [torch.cuda.Stream() for _ in range(2)]
    got = []
    torch.cuda.synchronize()
    for _ in range(20):
        for stream in streams:
            with torch.cuda.stream(stream):
                got.append(tilebake.mhc.mhc_pre_split_mixes_bwd(*grads, args[0], post, args[1], args[2]))
    torch.cuda.synchronize()
    for outs in got:
        for name, g, w in zip(("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"), outs, want):
            assert_bytes_equal(g, w, name)


BAD = [
    (lambda x, s, b: (x.double(), s, b), TypeError, "input_mixes must be float32"),
    (lambda x, s, b: (x[:, :23].contiguous(), s, b[:23]), ValueError, r"m \(m \+ 2\) for m = 1 to 8 .*got 23"),
    (lambda x, s, b: (x, s[:1], b), ValueError, r"mhc_scale must have shape \(3,\)"),
    (lambda x, s, b: (x, s, b[:20]), ValueError, r"mhc_base must have shape \(24,\)"),
    (lambda x, s, b: (x.t(), s, b), ValueError, "input_mixes must be contiguous"),
]


@pytest.mark.parametrize("make,error,match", BAD)
def test_rejects_bad_arguments(make, error, match):
    x, s, b = inputs((5,), 4, "cpu")
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_pre_split_mixes_fwd(*make(x, s, b))
    grads = [torch.zeros(x.shape[0], k) for k in (4, 4, 16)]
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_pre_split_mixes_bwd(*grads, make(x, s, b)[0], grads[0], *make(x, s, b)[1:])


def test_rejects_bad_outputs_and_gradients():
    x, s, b = inputs((5,), 4, "cpu")
    with pytest.raises(ValueError, match=r"comb_res_mix must have shape \(5, 4, 4\) or \(5, 16\)"):
        tilebake.mhc.mhc_pre_split_mixes_fwd(x, s, b, comb_res_mix=torch.empty(5, 4, 3))
    with pytest.raises(TypeError, match="mhc_post_mult_value must be a Python float"):
        tilebake.mhc.mhc_pre_split_mixes_fwd(x, s, b, mhc_post_mult_value=None)
    g = [torch.zeros(5, k) for k in (4, 4, 16)]
    with pytest.raises(ValueError, match=r"pre_layer_mix_grad must have shape \(5, 4, 1\) or \(5, 4\)"):
        tilebake.mhc.mhc_pre_split_mixes_bwd(torch.zeros(5, 3), g[1], g[2], x, g[0], s, b)
    with pytest.raises(ValueError, match=r"mhc_base_grad must have shape \(24,\)"):
        tilebake.mhc.mhc_pre_split_mixes_bwd(*g, x, g[0], s, b, mhc_base_grad=torch.empty(23))
