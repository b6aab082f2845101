"""The mhc ops' Ascend kernels run on the CPU (emulator.py), launched as the ops' NPU branches
launch them (tilebake.mhc._mhc_ascend.launch with the CUDA kernels' arguments), against the
references (tilebake.torch.mhc): expand_to_mhc both ways and the forwards of mhc_post (fmaf is
glibc's here) and mhc_pre_apply_mix bit-equal; the backwards within the float64 oracles'
tolerance (column sums in a fixed order of their own); Sinkhorn, the head mix and the split mixes
within the original's tolerances (the exponential is glibc's here, torch's in the references);
mhc_fn_normw_merge both ways bit-equal to the CPU path; mhc_reduce_partials_and_rmsnorm's sums
bit-equal to it and its scaling (both ways) bit-equal to IEEE fp32 in its order, within 2 ulp of it
(torch's CPU sqrt); the head mix's and the split mixes' backwards within 1e-5. m = 1 .. 8, hidden
sizes that are not a multiple of the 1024-column chunk, 1 token. mhc_multilayer_recompute on
tensors reporting an NPU (the chain of the apply-mix and post kernels) bit-equal to its CPU path;
mhc_pre_big_fuse_fwd on them (the chain of the reduction, split-mixes, Sinkhorn and apply-mix
kernels) each step as above on its own inputs, the whole within those tolerances of its CPU path.
A model, not an NPU: nothing here ran on one."""

import types

import numpy as np
import pytest
import torch

import tilebake.mhc
from tests.ascend.test_emulated import emulator  # noqa: F401 (the session's emulator fixture)
from tilebake.mhc import _mhc_ascend
from tilebake.mhc import mhc_pre_split_mixes as split_mixes
from tilebake.mhc.mhc_pre_norm_gemm import split_columns
from tilebake.torch.mhc import (
    expand_to_mhc_bwd_ref,
    expand_to_mhc_ref,
    mhc_head_compute_mix_bwd_ref,
    mhc_head_compute_mix_ref,
    mhc_post_bwd_ref,
    mhc_post_ref,
    mhc_pre_apply_mix_bwd_ref,
    mhc_pre_apply_mix_ref,
    mhc_pre_split_mixes_bwd_ref,
    mhc_pre_split_mixes_ref,
    sinkhorn_bwd_ordered_ref,
    sinkhorn_ordered_ref,
)

pytest.importorskip("tilelang")
SHAPES = [(1, 1, 8), (37, 4, 1000), (5, 8, 2304), (3, 2, 7168)]


@pytest.fixture
def emu(emulator, monkeypatch):  # noqa: F811
    emulator.install(monkeypatch, _mhc_ascend)
    return emulator


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


@pytest.mark.parametrize("tokens, m, hidden", SHAPES)
def test_expand_to_mhc(emu, tokens, m, hidden):
    x = bf16(tokens, hidden)
    o = torch.full((tokens, m, hidden), float("nan")).to(torch.bfloat16)
    _mhc_ascend.launch("expand_to_mhc", "fwd", x, x.data_ptr(), o.data_ptr(), tokens, m, hidden)
    assert torch.equal(o, expand_to_mhc_ref(x, m))
    g = bf16(tokens, m, hidden)
    xg = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    _mhc_ascend.launch("expand_to_mhc", "bwd", g, g.data_ptr(), xg.data_ptr(), tokens, m, hidden)
    assert torch.equal(xg, expand_to_mhc_bwd_ref(g))


@pytest.mark.parametrize("tokens, m, hidden", SHAPES)
def test_mhc_post(emu, tokens, m, hidden):
    x, res = bf16(tokens, hidden), bf16(tokens, m, hidden)
    post, comb = torch.rand(tokens, m, 1) * 2, torch.rand(tokens, m, m)
    out = torch.empty(tokens, m, hidden, dtype=torch.bfloat16)
    ptrs = (x.data_ptr(), res.data_ptr(), post.data_ptr(), comb.data_ptr())
    _mhc_ascend.launch("mhc_post", "fwd", x, *ptrs, out.data_ptr(), tokens, m, hidden)
    assert torch.equal(out, mhc_post_ref(x, res, post, comb))
    d_o = bf16(tokens, m, hidden)
    grads = (torch.empty_like(x), torch.empty_like(res), torch.empty_like(post), torch.empty_like(comb))
    _mhc_ascend.launch("mhc_post", "bwd", x, *ptrs, d_o.data_ptr(), *(t.data_ptr() for t in grads), tokens, m, hidden)
    for got, ref in zip(grads, mhc_post_bwd_ref(x, res, post, comb, d_o)):
        # bf16 gradients: one rounding of an fp32 sum; fp32 column sums: 1e-5 of their scale
        tol = {"rtol": 8e-3, "atol": 1e-2} if got.dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-4}
        torch.testing.assert_close(got, ref.to(got.dtype), **tol)


@pytest.mark.parametrize("tokens, m, hidden", SHAPES)
@pytest.mark.parametrize("with_x_grad", [False, True])
def test_mhc_pre_apply_mix(emu, tokens, m, hidden, with_x_grad):
    x, mix = bf16(tokens, m, hidden), torch.rand(tokens, m)
    o = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    _mhc_ascend.launch("mhc_pre_apply_mix", "fwd", x, x.data_ptr(), mix.data_ptr(), o.data_ptr(), tokens, m, hidden)
    assert torch.equal(o, mhc_pre_apply_mix_ref(x, mix))
    og = bf16(tokens, hidden)
    x_grad = bf16(tokens, m, hidden) if with_x_grad else None
    want_x_grad, want_mix_grad = mhc_pre_apply_mix_bwd_ref(og, x, mix, x_grad)
    mix_grad = torch.empty_like(mix)
    target = x_grad if with_x_grad else x  # an absent x_grad: x's address, never written
    before = x.clone()
    _mhc_ascend.launch("mhc_pre_apply_mix", "bwd", x, og.data_ptr(), x.data_ptr(), mix.data_ptr(), target.data_ptr(),
                       mix_grad.data_ptr(), tokens, m, hidden, int(with_x_grad))  # fmt: skip
    torch.testing.assert_close(mix_grad, want_mix_grad, rtol=1e-5, atol=1e-4)
    if with_x_grad:
        assert torch.equal(x_grad, want_x_grad)
    assert torch.equal(x, before)


@pytest.mark.parametrize("tokens, m", [(1, 1), (37, 4), (130, 8), (5, 3)])
@pytest.mark.parametrize("repeat", [1, 10])
def test_mhc_sinkhorn(emu, tokens, m, repeat):
    x = torch.randn(tokens, m, m) * 2
    out = torch.empty_like(x)
    _mhc_ascend.launch("mhc_sinkhorn", "fwd", x, x.data_ptr(), out.data_ptr(), tokens, m, repeat, 1e-6)
    torch.testing.assert_close(out, sinkhorn_ordered_ref(x, repeat, 1e-6), rtol=1e-5, atol=1e-6)  # the original's
    g = torch.randn(tokens, m, m)
    gi = torch.empty_like(x)
    _mhc_ascend.launch("mhc_sinkhorn", "bwd", x, g.data_ptr(), x.data_ptr(), gi.data_ptr(), tokens, m, repeat, 1e-6)
    torch.testing.assert_close(gi, sinkhorn_bwd_ordered_ref(g, x, repeat, 1e-6), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tokens, m", [(1, 1), (333, 4), (9, 8)])
def test_mhc_head_compute_mix_and_split_mixes(emu, tokens, m):
    x, scale, base = torch.randn(tokens, m), torch.rand(1) + 0.5, torch.randn(m)
    out = torch.empty_like(x)
    _mhc_ascend.launch("mhc_head_compute_mix", "fwd", x, x.data_ptr(), scale.data_ptr(), base.data_ptr(),
                       out.data_ptr(), tokens, m, 1e-2)  # fmt: skip
    torch.testing.assert_close(out, mhc_head_compute_mix_ref(x, scale, base, 1e-2), rtol=1e-4, atol=1e-5)
    cols = m * (m + 2)
    mixes, scale3, base3 = torch.randn(tokens, cols), torch.rand(3) + 0.5, torch.randn(cols)
    pre, post, comb = torch.empty(tokens, m), torch.empty(tokens, m), torch.empty(tokens, m * m)
    _mhc_ascend.launch("mhc_pre_split_mixes", "fwd", mixes, mixes.data_ptr(), scale3.data_ptr(), base3.data_ptr(),
                       pre.data_ptr(), post.data_ptr(), comb.data_ptr(), tokens, m, cols, 2.0, 1e-2)  # fmt: skip
    want = mhc_pre_split_mixes_ref(mixes, scale3, base3, m, 2.0, 1e-2)
    torch.testing.assert_close(pre, want[0].reshape(pre.shape), rtol=1e-5, atol=2e-5)  # the original's
    torch.testing.assert_close(post, want[1].reshape(post.shape), rtol=1e-5, atol=2e-5)
    assert torch.equal(comb, want[2].reshape(comb.shape))


@pytest.mark.parametrize("rows, cols", [(1, 8), (24, 28672), (80, 2056), (3, 1024)])
def test_mhc_fn_normw_merge(emu, rows, cols):
    """Both directions bit-equal to the CPU path (a product; the weight gradient's rows in order)."""
    fn, w, og = torch.randn(rows, cols), torch.rand(cols) + 0.5, torch.randn(rows, cols)
    out = torch.full_like(fn, float("nan"))
    _mhc_ascend.launch("mhc_fn_normw_merge", "fwd", fn, fn.data_ptr(), w.data_ptr(), out.data_ptr(), rows, cols)
    assert torch.equal(out, tilebake.mhc.mhc_fn_normw_merge_fwd(fn, w))
    fg, wg = torch.full_like(fn, float("nan")), torch.full_like(w, float("nan"))
    _mhc_ascend.launch("mhc_fn_normw_merge", "bwd", fn, fn.data_ptr(), w.data_ptr(), og.data_ptr(), fg.data_ptr(),
                       wg.data_ptr(), rows, cols)  # fmt: skip
    want_fg, want_wg = tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, og)
    assert torch.equal(fg, want_fg)
    assert torch.equal(wg, want_wg)


@pytest.mark.parametrize("tokens, m, parts", [(1, 1, 1), (333, 4, 64), (9, 8, 4), (130, 3, 7)])
def test_mhc_head_compute_mix_bwd(emu, tokens, m, parts):
    """x_grad within 1e-5 of the reference (the exponential is glibc's here); the partial rows, of
    the CUDA kernel's token split, within 1e-5 of their float64 sums."""
    g, x, scale, base = torch.randn(tokens, m), torch.randn(tokens, m), torch.rand(1) + 0.5, torch.randn(m)
    xg, sp, bp = (torch.full(s, float("nan")) for s in ((tokens, m), (parts, 1), (parts, m)))
    _mhc_ascend.launch("mhc_head_compute_mix", "bwd", x, *(t.data_ptr() for t in (g, x, scale, base, xg, sp, bp)),
                       tokens, m, parts)  # fmt: skip
    want = mhc_head_compute_mix_bwd_ref(g, x, scale, base, parts)
    torch.testing.assert_close(xg, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sp, want[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bp, want[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens, m, parts", [(1, 1, 1), (333, 4, 64), (9, 8, 9), (130, 3, 7)])
def test_mhc_pre_split_mixes_bwd(emu, tokens, m, parts):
    """mixes_grad within 1e-5 of the reference (the exponential is glibc's here); the scale and base
    gradients, partial rows then their sum, within 1e-5 of the float64 sums; the rows' padding 0."""
    cols, width = m * (m + 2), split_mixes.partial_cols(m)
    mixes, scale, base = torch.randn(tokens, cols), torch.rand(3) + 0.5, torch.randn(cols)
    grads = torch.randn(tokens, m), torch.randn(tokens, m), torch.randn(tokens, m * m)
    mixes_grad, part = torch.full_like(mixes, float("nan")), torch.full((parts, width), float("nan"))
    scale_grad, base_grad = torch.full((3,), float("nan")), torch.full((cols,), float("nan"))
    _mhc_ascend.launch("mhc_pre_split_mixes", "bwd", mixes, *(t.data_ptr() for t in (*grads, mixes, scale, base,
                                                                                     mixes_grad, part)),
                       tokens, m, cols, parts, width, 2.0)  # fmt: skip
    _mhc_ascend.launch("mhc_pre_split_mixes", "bwd_reduce", mixes, part.data_ptr(), scale_grad.data_ptr(),
                       base_grad.data_ptr(), parts, width, cols)  # fmt: skip
    want = mhc_pre_split_mixes_bwd_ref(*grads, mixes, scale, base, 2.0)
    torch.testing.assert_close(mixes_grad, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scale_grad, want[1], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(base_grad, want[2], rtol=1e-5, atol=1e-5)
    assert torch.equal(part[:, 3 + cols :], torch.zeros(parts, width - 3 - cols))


def _name_the_npu_device():
    """torch.device("npu") in this process: torch's private-use backend named "npu" (for good: torch
    has no undo), with a torch.npu module saying no NPU is available, as torch_npu would on a host
    without one (torch.compile looks the backend's module up: without one, every later compile in
    the process fails)."""
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    if not hasattr(torch, "npu"):
        stub = types.ModuleType("torch.npu")
        stub.is_available = lambda: False
        stub.device_count = lambda: 0
        torch._register_device_module("npu", stub)


class _FakeNPU(torch.Tensor):
    """A CPU tensor reporting npu:0, so a public op takes its NPU branch (the emulated kernels)."""

    @property
    def device(self):
        return torch.device("npu", 0)


# (L, posts, tokens, m, hidden): L or L - 1 post steps, m = 4 and others, a partial last chunk
@pytest.mark.parametrize("layers, posts, tokens, m, hidden", [(3, 3, 37, 4, 1000), (2, 1, 5, 8, 2304), (1, 0, 1, 1, 8)])
def test_mhc_multilayer_recompute(emu, layers, posts, tokens, m, hidden):
    """The op on NPU tensors is the chain of the Ascend apply-mix and post kernels, a launch each
    per layer: bit-equal to the CPU path (the chain of the references)."""
    _name_the_npu_device()
    r0 = bf16(tokens, m, hidden)
    pre = [torch.rand(tokens, m, 1) for _ in range(layers)]
    out = [bf16(tokens, hidden) for _ in range(posts)]
    post = [torch.rand(tokens, m) * 2 for _ in range(posts)]
    comb = [torch.rand(tokens, m, m) for _ in range(posts)]
    want_in = [torch.empty(tokens, hidden, dtype=torch.bfloat16) for _ in range(layers)]
    want_res = [torch.empty(tokens, m, hidden, dtype=torch.bfloat16) for _ in range(posts)]
    tilebake.mhc.mhc_multilayer_recompute(r0, pre, out, post, comb, want_in, want_res)
    got_in = [torch.full((tokens, hidden), float("nan")).to(torch.bfloat16) for _ in range(layers)]
    got_res = [torch.full((tokens, m, hidden), float("nan")).to(torch.bfloat16) for _ in range(posts)]

    def npu(items):
        return [t.as_subclass(_FakeNPU) for t in items]

    emu.launches.clear()
    tilebake.mhc.mhc_multilayer_recompute(r0.as_subclass(_FakeNPU), npu(pre), npu(out), npu(post), npu(comb),
                                          npu(got_in), npu(got_res))  # fmt: skip
    assert len(emu.launches) == layers + posts  # apply-mix, then post, a layer
    for i in range(layers):
        assert emu.launches[i + min(i, posts)].args["O"] == got_in[i].data_ptr()
        assert torch.equal(got_in[i], want_in[i]), f"layer_input {i}"
    for i in range(posts):
        assert emu.launches[2 * i + 1].args["OUT"] == got_res[i].data_ptr()
        assert torch.equal(got_res[i], want_res[i]), f"residual {i}"


def _ieee_rstd(sq: torch.Tensor, group: int, eps: float) -> np.ndarray:
    """1 / sqrt(sq / K + eps), each operation IEEE fp32 (numpy's sqrt is correctly rounded, torch's CPU one is not)."""
    return np.float32(1) / np.sqrt(sq.numpy() / np.float32(group) + np.float32(eps))


@pytest.mark.parametrize(
    "splits, tokens, mixes, group", [(1, 1, 1, 8), (16, 333, 24, 16384), (3, 130, 80, 7168), (2, 901, 24, 4096)]
)
def test_mhc_reduce_partials_and_rmsnorm(emu, splits, tokens, mixes, group):
    """The sums (the splits in order) bit-equal to the CPU path; the scaling bit-equal to IEEE fp32 in the
    CPU path's order of operations, and within the CUDA kernel's tolerance of the CPU path (2 ulp: torch's
    CPU sqrt is not correctly rounded); the backward likewise (its dot over the mixes in order)."""
    eps = 1e-6
    pm, ps = torch.randn(splits, tokens, 1, mixes), torch.rand(splits, tokens, 1) * 100 + 1
    om, os_, out = (torch.full(s, float("nan")) for s in ((tokens, 1, mixes), (tokens, 1), (tokens, mixes)))
    _mhc_ascend.launch("mhc_reduce_partials_and_rmsnorm", "fwd", pm, *(t.data_ptr() for t in (pm, ps, om, os_, out)),
                       tokens, mixes, splits, group, eps)  # fmt: skip
    want = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=group, rms_eps=eps)
    assert torch.equal(om, want[0]) and torch.equal(os_, want[1])
    assert np.array_equal(out.numpy(), om[:, 0].numpy() * _ieee_rstd(os_, group, eps))
    torch.testing.assert_close(out, want[2], rtol=2.5e-7, atol=0)
    r64 = (os_.double() / group + eps).rsqrt()
    torch.testing.assert_close(out.double(), om[:, 0].double() * r64, rtol=1e-6, atol=0)
    og = torch.randn(tokens, mixes)
    omg, osg = torch.full((tokens, 1, mixes), float("nan")), torch.full((tokens, 1), float("nan"))
    _mhc_ascend.launch("mhc_reduce_partials_and_rmsnorm", "bwd", om, *(t.data_ptr() for t in (og, om, os_, omg, osg)),
                       tokens, mixes, group, eps)  # fmt: skip
    r = _ieee_rstd(os_, group, eps)
    assert np.array_equal(omg[:, 0].numpy(), og.numpy() * r)
    dot = np.zeros((tokens, 1), np.float32)
    for n in range(mixes):
        dot = dot + og.numpy()[:, n : n + 1] * om.numpy()[:, 0, n : n + 1]
    assert np.array_equal(osg.numpy(), -(dot * (r * r * r / np.float32(2 * group))))
    want = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(og, om, os_, rms_group_size=group, rms_eps=eps)
    torch.testing.assert_close(omg, want[0], rtol=2.5e-7, atol=0)
    torch.testing.assert_close(osg, want[1], rtol=1e-6, atol=0)
    torch.testing.assert_close(omg[:, 0].double(), og.double() * r64, rtol=1e-6, atol=0)


def _split_ref64(x, fn, n_splits):
    """float64 split-K partials over the kernels' splits, (S, T, N) and (S, T)."""
    c = split_columns(fn.shape[1], n_splits)
    f = fn.double()
    out = torch.stack([x[:, s * c : (s + 1) * c] @ f[:, s * c : (s + 1) * c].t() for s in range(n_splits)])
    return out, torch.stack([x[:, s * c : (s + 1) * c].square().sum(-1) for s in range(n_splits)])


def _within_a_bf16_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Every element of bf16 a next to or equal to b's (one rounding of a differently ordered fp32 sum)."""
    steps = (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()
    return bool(((steps <= 1) | ((a.float() - b.float()).abs() <= 1e-3)).all())


@pytest.mark.parametrize(
    "lead, m, hidden, mixes, n_splits",
    [((1,), 4, 128, 24, 16), ((2, 33), 4, 1032, 24, 16), ((130,), 2, 192, 8, 5), ((3,), 8, 520, 80, 3),
     ((70,), 4, 256, 4, 40), ((9,), 3, 136, 15, 2), ((17,), 1, 8, 3, 1)],
)  # fmt: skip
def test_mhc_pre_norm_gemm(emu, lead, m, hidden, mixes, n_splits):
    """fp32 products and sums in fixed orders of our own (the CPU path's fp32 arithmetic, fn not
    split, torch's matmul order not reproduced): the partials within 1e-5 of float64 over the same
    splits (a split past K zeros), the square sums likewise; residual_grad one bf16 rounding of
    float64 (and within a bf16 ulp of the CPU path), in place or not; fn_grad (tokens in order)
    within 1e-5 of float64."""
    residual = torch.randn(*lead, m, hidden).bfloat16()
    cols = m * hidden
    fn = torch.randn(mixes, cols) / cols**0.5
    tokens = residual.numel() // cols
    om, sq = torch.full((n_splits, tokens, 1, mixes), float("nan")), torch.full((n_splits, tokens, 1), float("nan"))
    _mhc_ascend.launch("mhc_pre_norm_gemm", "fwd", residual, residual.data_ptr(), fn.data_ptr(), om.data_ptr(),
                       sq.data_ptr(), tokens, cols, mixes, n_splits)  # fmt: skip
    x = residual.double().reshape(tokens, cols)
    want_om, want_sq = _split_ref64(x, fn, n_splits)
    torch.testing.assert_close(om[:, :, 0].double(), want_om, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sq[:, :, 0].double(), want_sq, rtol=1e-5, atol=1e-5)
    cpu = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn, n_splits)
    torch.testing.assert_close(om, cpu[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sq, cpu[1], rtol=1e-5, atol=1e-5)
    dom, dsq = torch.randn(tokens, 1, mixes), torch.randn(tokens, 1) / hidden
    start = torch.randn(residual.shape).bfloat16()
    d = dom.double().reshape(tokens, mixes)
    want_g = d @ fn.double() + 2 * dsq.double() * x
    want_fg = d.t() @ x
    for given in (True, False):
        rg = start.clone() if given else torch.full_like(residual, float("nan"))
        fg = torch.full_like(fn, float("nan"))
        ptrs = (t.data_ptr() for t in (residual, fn, dom, dsq, rg, fg))
        _mhc_ascend.launch("mhc_pre_norm_gemm", "bwd", residual, *ptrs, tokens, cols, mixes, int(given))
        want = want_g + (start.double().reshape(tokens, cols) if given else 0)
        torch.testing.assert_close(rg.double().reshape(tokens, cols), want, rtol=8e-3, atol=1e-2)
        cpu = tilebake.mhc.mhc_pre_norm_gemm_bwd(residual, fn, dom, dsq, start.clone() if given else None)
        assert _within_a_bf16_ulp(rg, cpu[0])
        torch.testing.assert_close(fg.double(), want_fg, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fg, cpu[1], rtol=1e-5, atol=1e-5)


_CHAIN = ("mhc_reduce_partials_and_rmsnorm_fwd", "mhc_pre_split_mixes_fwd", "mhc_sinkhorn_fwd", "mhc_pre_apply_mix_fwd")


def _spy_on_the_chain(monkeypatch) -> list:
    """Wraps the four single-step ops mhc_pre_big_fuse_fwd chains (it looks them up on tilebake.mhc
    at each call): each call's (name, tensor arguments before, keyword arguments, results after),
    the tensors as plain CPU copies, in call order."""
    calls = []

    def plain(v):
        return v.as_subclass(torch.Tensor).clone() if isinstance(v, torch.Tensor) else v

    for name in _CHAIN:

        def spy(*args, _op=getattr(tilebake.mhc, name), _name=name, **kwargs):
            before = [plain(a) for a in args]
            result = _op(*args, **kwargs)
            results = result if isinstance(result, tuple) else (result,)
            calls.append((_name, before, kwargs, [plain(r) for r in results]))
            return result

        monkeypatch.setattr(tilebake.mhc, name, spy)
    return calls


# (lead, m, hidden, n_splits, given): m = 4 (one kernel on CUDA) and m = 5 to 8 (the chain there
# too), hidden sizes not a multiple of the 1024-column chunk, 1 token, two leading dims; the outputs
# allocated, or given (NaN-filled, in the accepted (..., m) and (..., m * m) shapes)
@pytest.mark.parametrize(
    "lead, m, hidden, n_splits, given",
    [((37,), 4, 1000, 16, False), ((2, 3), 8, 520, 3, True), ((1,), 1, 8, 1, True), ((5,), 6, 2304, 2, False)],
)
def test_mhc_pre_big_fuse_fwd(emu, monkeypatch, lead, m, hidden, n_splits, given):
    """The op on NPU tensors is the chain of the Ascend kernels of the partials' reduction and RMSNorm,
    the split mixes, the Sinkhorn and the apply-mix, a launch each, wired output to input. Each step
    against its CPU path on the same inputs: the reduction's sums bit-equal, its scaling bit-equal to
    IEEE fp32 in the CPU path's order; the split's comb bit-equal, pre and post within the original's
    tolerance; the Sinkhorn within the original's; the apply-mix bit-equal. The whole against the
    op's CPU path (torch's sqrt and exp there): post and comb within those tolerances, layer_input
    within a bf16 ulp (one rounding of an fp32 sum whose weights differ within them)."""
    _name_the_npu_device()
    m3, tokens = m * (m + 2), int(np.prod(lead))
    residual = bf16(*lead, m, hidden)
    fn = torch.randn(m3, m * hidden) / (m * hidden) ** 0.5
    pm, ps = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn, n_splits)  # realistic partials, on the CPU
    scale, base = torch.rand(3) + 0.5, torch.randn(m3)
    scalars = {"rms_eps": 1e-6, "mhc_pre_eps": 1e-2, "mhc_sinkhorn_eps": 1e-6, "mhc_post_mult_value": 2.0,
               "sinkhorn_repeat": 7, "n_splits": n_splits}  # fmt: skip
    want_post, want_comb, want_in = tilebake.mhc.mhc_pre_big_fuse_fwd(pm, ps, scale, base, residual, **scalars)
    cpu_reduced = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=m * hidden, rms_eps=1e-6)

    def npu(t):
        return t.as_subclass(_FakeNPU)

    outs = [None] * 3
    if given:
        shapes = (((*lead, m), torch.float32), ((*lead, m * m), torch.float32), ((*lead, hidden), torch.bfloat16))
        outs = [npu(torch.full(s, float("nan"), dtype=d)) for s, d in shapes]
    calls = _spy_on_the_chain(monkeypatch)
    emu.launches.clear()
    got = tilebake.mhc.mhc_pre_big_fuse_fwd(*map(npu, (pm, ps, scale, base, residual)), *outs, **scalars)
    post, comb, layer_input = got
    assert [type(t) for t in got] == [_FakeNPU] * 3
    if given:
        assert [t.data_ptr() for t in got] == [t.data_ptr() for t in outs]
    assert [tuple(t.shape) for t in got] == [
        (*lead, m) if given else (*lead, m, 1), (*lead, m * m) if given else (*lead, m, m), (*lead, hidden)
    ]  # fmt: skip

    # the launches: one a step, in order, each reading the last one's output
    reduce, split, sinkhorn, apply = emu.launches
    assert [tuple(k for k in launch.args if k.isupper()) for launch in emu.launches] == [
        ("PM", "PS", "OM", "OS", "OUT"),
        ("MIX", "SCALE", "BASE", "PRE", "POST", "COMB"),
        ("X", "OUT"),
        ("X", "MIX", "O"),
    ]  # the pointer parameters: reduction, split, Sinkhorn, apply-mix
    assert (reduce.args["PM"], reduce.args["PS"]) == (pm.data_ptr(), ps.data_ptr())
    sizes = ("num_tokens", "num_mixes", "n_splits", "rms_group_size", "rms_eps")
    assert [reduce.args[k] for k in sizes] == [tokens, m3, n_splits, m * hidden, 1e-6]
    assert (split.args["MIX"], split.args["SCALE"], split.args["BASE"]) == (reduce.args["OUT"], scale.data_ptr(),
                                                                           base.data_ptr())  # fmt: skip
    assert split.args["POST"] == post.data_ptr()
    assert (sinkhorn.args["X"], sinkhorn.args["OUT"]) == (split.args["COMB"], comb.data_ptr())
    assert (sinkhorn.args["repeat"], sinkhorn.args["mhc_mult"], split.args["mhc_mult"]) == (7, m, m)
    assert (apply.args["X"], apply.args["MIX"], apply.args["O"]) == (residual.data_ptr(), split.args["PRE"],
                                                                     layer_input.data_ptr())  # fmt: skip

    # each step against its CPU path on the inputs it was given
    assert [c[0] for c in calls] == list(_CHAIN)
    (_, (cpm, cps), kw, (om, os_, mixes)), (_, split_in, _, split_out) = calls[:2]
    (_, sk_in, _, (sk_out,)), (_, ap_in, _, (ap_out,)) = calls[2:]
    assert torch.equal(cpm, pm) and torch.equal(cps, ps) and kw["rms_group_size"] == m * hidden
    assert torch.equal(om, cpu_reduced[0]) and torch.equal(os_, cpu_reduced[1])
    assert np.array_equal(mixes.numpy(), om[:, 0].numpy() * _ieee_rstd(os_, m * hidden, 1e-6))
    assert torch.equal(split_in[0].reshape(tokens, m3), mixes)
    ref = mhc_pre_split_mixes_ref(split_in[0], scale, base, m, 2.0, 1e-2)
    for i in (0, 1):  # pre, post
        torch.testing.assert_close(split_out[i], ref[i].reshape(split_out[i].shape), rtol=1e-5, atol=2e-5)
    assert torch.equal(split_out[2], ref[2].reshape(split_out[2].shape))
    assert torch.equal(sk_in[0], split_out[2]) and sk_in[2:] == [7, 1e-6]
    torch.testing.assert_close(sk_out, sinkhorn_ordered_ref(sk_in[0], 7, 1e-6), rtol=1e-5, atol=1e-6)
    assert torch.equal(ap_in[0], residual) and torch.equal(ap_in[1], split_out[0])
    assert torch.equal(ap_out, mhc_pre_apply_mix_ref(residual, split_out[0]))

    # the whole against the op's CPU path
    plain = [t.as_subclass(torch.Tensor) for t in got]
    torch.testing.assert_close(plain[0].reshape(want_post.shape), want_post, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(plain[1].reshape(want_comb.shape), want_comb, rtol=1e-5, atol=1e-6)
    assert _within_a_bf16_ulp(plain[2], want_in)
