"""Call plans of the pre-norm projection's forward ops (tilebake.mhc._plans_norm), traced on the
CPU (tests/plan_helpers.py: every step but the launch): the kernel arguments the Python path
passes, the returned tensors' layouts, and NotImplemented (the Python path) for what a plan does
not take."""

import importlib

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace
from tilebake.mhc import _plans_norm

pytestmark = needs_plans

gemm = importlib.import_module("tilebake.mhc.mhc_pre_norm_gemm")
reduce = importlib.import_module("tilebake.mhc.mhc_reduce_partials_and_rmsnorm")
LEAD = (2, 3)  # two leading dims: 6 tokens
M, H, N = 4, 136, 24


def built(variant) -> ManifestKernel:
    from tilebake._runtime import loader

    if variant.id not in loader.op_kernels(variant.op):
        pytest.skip(f"{variant.id} is not in the installed kernel package")
    return ManifestKernel(variant)


@pytest.mark.parametrize("given", [False, True])
def test_pre_norm_gemm_fwd_plan(given):
    kernel = built(gemm.MhcPreNormGemmVariant("fwd", 4))
    residual, fn = torch.randn(*LEAD, M, H).bfloat16(), torch.randn(N, M * H)
    outs = (torch.empty(5, 6, 1, N), torch.empty(5, 6, 1)) if given else (None, None)
    p = _plans_norm.pre_norm_gemm_fwd(kernel, 0, 2, 5, given, given)
    (out_mul, sqrsum), launches = trace(p, residual, fn, *outs)
    if given:
        assert out_mul is outs[0] and sqrsum is outs[1]
    assert [(t.shape, t.dtype) for t in (out_mul, sqrsum)] == [((5, 6, 1, N), torch.float32), ((5, 6, 1), torch.float32)]
    assert [launch[0] for launch in launches] == [0]
    assert params_of(kernel, launches[0]) == dict(X=residual.data_ptr(), FN=fn.data_ptr(), OUT=out_mul.data_ptr(),
                                                  SQ=sqrsum.data_ptr(), num_tokens=6, num_cols=M * H, num_mixes=N,
                                                  n_splits=5)  # fmt: skip
    misaligned = torch.randn(N * M * H + 1)[1:].view(N, M * H)  # the kernel copies fn rows 16 bytes at a time
    for bad in [(residual, fn[:, :-8].contiguous()), (residual, torch.randn(25, M * H)), (residual.float(), fn),
                (residual, misaligned), (torch.randn(*LEAD, M, 132).bfloat16()[..., :130], fn[:, : M * 130])]:  # fmt: skip
        assert trace(p, *bad, *outs)[0] is NotImplemented
    if given:
        assert trace(p, residual, fn, torch.empty(4, 6, 1, N), outs[1])[0] is NotImplemented  # another n_splits


def test_reduce_partials_plans():
    fwd, bwd = (built(reduce.MhcReducePartialsAndRmsnormVariant(d)) for d in ("fwd", "bwd"))
    pm, ps = torch.randn(3, 6, 1, N), torch.rand(3, 6, 1)
    p = _plans_norm.reduce_partials_fwd(fwd, 0, (False, True, False), M * H, 1e-6, 3)
    sq = torch.empty(6, 1)
    (om, sq_out, out), launches = trace(p, pm, ps, None, sq, None)
    assert sq_out is sq and (om.shape, out.shape) == ((6, 1, N), (6, N))
    got = params_of(fwd, launches[0])
    assert (got["num_tokens"], got["num_mixes"], got["n_splits"], got["rms_group_size"]) == (6, N, 3, M * H)
    assert got["rms_eps"] == pytest.approx(1e-6) and got["OUT"] == out.data_ptr()
    assert trace(p, torch.randn(2, 6, 1, N), torch.rand(2, 6, 1), None, sq, None)[0] is NotImplemented  # n_splits 3
    og = torch.randn(6, N)
    pb = _plans_norm.reduce_partials_bwd(bwd, 0, (False, False), M * H, 1e-6)
    (omg, sqg), launches = trace(pb, og, om, sq, None, None)
    assert (omg.shape, sqg.shape) == ((6, 1, N), (6, 1))
    got = params_of(bwd, launches[0])
    assert (got["OMG"], got["OSG"], got["num_tokens"]) == (omg.data_ptr(), sqg.data_ptr(), 6)
    assert trace(pb, og[:, :8].contiguous(), om, sq, None, None)[0] is NotImplemented


big_fuse = importlib.import_module("tilebake.mhc.mhc_pre_big_fuse")


@pytest.mark.parametrize("given", [False, True])
def test_big_fuse_plan(given):
    kernel = built(big_fuse.MhcPreBigFuseVariant(4))
    pm, ps = torch.randn(3, 6, 1, N), torch.rand(3, 6, 1)
    scale, base, residual = torch.rand(3), torch.randn(N), torch.randn(*LEAD, M, H).bfloat16()
    outs = (torch.empty(*LEAD, M), torch.empty(*LEAD, M * M), torch.empty(*LEAD, H).bfloat16()) if given else (None,) * 3
    p = _plans_norm.big_fuse_fwd(kernel, 0, 2, tuple(None if t is None else t.ndim for t in outs), 3, 10,
                                 (1e-6, 2e-6, 3e-6, 2.0))  # fmt: skip
    (post, comb, out), launches = trace(p, pm, ps, scale, base, residual, *outs)
    if given:
        assert post is outs[0] and comb is outs[1] and out is outs[2]
    else:  # the Python path's shapes
        assert [(t.shape, t.dtype) for t in (post, comb, out)] == [((*LEAD, M, 1), torch.float32),
                                                                    ((*LEAD, M, M), torch.float32),
                                                                    ((*LEAD, H), torch.bfloat16)]  # fmt: skip
    assert [launch[0] for launch in launches] == [0]  # one kernel
    got = params_of(kernel, launches[0])
    want = dict(PM=pm.data_ptr(), PS=ps.data_ptr(), SCALE=scale.data_ptr(), BASE=base.data_ptr(), X=residual.data_ptr(),
                POST=post.data_ptr(), COMB=comb.data_ptr(), O=out.data_ptr(), num_tokens=6, mhc_mult=M, hidden=H,
                mix_cols=N, n_splits=3, rms_group_size=M * H, repeat=10)  # fmt: skip
    assert {k: got[k] for k in want} == want
    assert [got[k] for k in ("rms_eps", "pre_eps", "eps", "post_mult")] == pytest.approx([1e-6, 2e-6, 3e-6, 2.0])
    m8 = torch.randn(*LEAD, 8, H).bfloat16()  # m = 8: the chain (the Python path)
    for bad in [(torch.randn(2, 6, 1, N), torch.rand(2, 6, 1), scale, base, residual),  # another n_splits
                (pm, ps, scale, torch.randn(N + 1), residual), (pm, ps, scale, base, residual.float()),
                (torch.randn(3, 6, 1, 80), torch.rand(3, 6, 1), scale, torch.randn(80), m8)]:  # fmt: skip
        assert trace(p, *bad, *outs)[0] is NotImplemented
    if given:  # an output over an input
        assert trace(p, pm, ps, scale, base, residual, outs[0], outs[1], residual[..., 0, :])[0] is NotImplemented


merge = importlib.import_module("tilebake.mhc.mhc_fn_normw_merge")


@pytest.mark.parametrize("given", [False, True])
def test_fn_merge_plans(given):
    fwd, bwd = (built(merge.MhcFnNormwMergeVariant(d)) for d in ("fwd", "bwd"))
    fn, w, og = torch.randn(N, M * H), torch.rand(M * H), torch.randn(N, M * H)
    out = torch.empty(N, M * H) if given else None
    p = _plans_norm.fn_merge_fwd(fwd, 0, given)
    got, launches = trace(p, fn, w, out)
    assert got is out if given else (got.shape, got.dtype) == ((N, M * H), torch.float32)
    assert params_of(fwd, launches[0]) == dict(FN=fn.data_ptr(), W=w.data_ptr(), OUT=got.data_ptr(), num_mixes=N,
                                               num_cols=M * H)  # fmt: skip
    misaligned = torch.randn(N * M * H + 1)[1:].view(N, M * H)  # 4-column vectors: 16-byte rows
    for bad in [(fn, torch.rand(M * H + 4)), (fn[:, :-2].contiguous(), w[:-2]), (misaligned, w), (fn.double(), w),
                (fn.t().contiguous().t(), w)]:  # fmt: skip
        assert trace(p, *bad, out)[0] is NotImplemented
    outs = (torch.empty(N, M * H), torch.empty(M * H)) if given else (None, None)
    pb = _plans_norm.fn_merge_bwd(bwd, 0, (given, given))
    (fg, wg), launches = trace(pb, fn, w, og, *outs)
    if given:
        assert fg is outs[0] and wg is outs[1]
    assert [(t.shape, t.dtype) for t in (fg, wg)] == [((N, M * H), torch.float32), ((M * H,), torch.float32)]
    assert params_of(bwd, launches[0]) == dict(FN=fn.data_ptr(), W=w.data_ptr(), OG=og.data_ptr(), FG=fg.data_ptr(),
                                               WG=wg.data_ptr(), num_mixes=N, num_cols=M * H)  # fmt: skip
    assert trace(pb, fn, w, og[:-1].contiguous(), *outs)[0] is NotImplemented


@pytest.mark.parametrize("given", [False, True])
def test_pre_norm_gemm_bwd_plan(given):
    """Two launches: the per-share partials, then their sum in row order into fn_grad; the
    partial-row count baked in (the op's key holds it)."""
    from tilebake.quant.norm_backward import NormBackwardReduceVariant

    kernel = built(gemm.MhcPreNormGemmVariant("bwd", 4))
    reduce_rows = built(NormBackwardReduceVariant("fp32"))
    residual, fn = torch.randn(*LEAD, M, H).bfloat16(), torch.randn(N, M * H)
    omg, sqg = torch.randn(6, 1, N), torch.randn(*LEAD)  # any shapes of T x N and T values
    outs = (torch.randn(*LEAD, M, H).bfloat16(), torch.empty(N, M * H)) if given else (None, None)
    p = _plans_norm.pre_norm_gemm_bwd(kernel, reduce_rows, 0, 2, (3, 2), (given, given), 3)
    (rg, fg), launches = trace(p, residual, fn, omg, sqg, *outs)
    if given:
        assert rg is outs[0] and fg is outs[1]
    assert [(t.shape, t.dtype) for t in (rg, fg)] == [(residual.shape, torch.bfloat16), ((N, M * H), torch.float32)]
    assert [launch[0] for launch in launches] == [0, 1]
    got, summed = params_of(kernel, launches[0]), params_of(reduce_rows, launches[1])
    want = dict(X=residual.data_ptr(), FN=fn.data_ptr(), DOM=omg.data_ptr(), DSQ=sqg.data_ptr(), XG=rg.data_ptr(),
                num_tokens=6, num_cols=M * H, num_mixes=N, num_parts=3, has_x_grad=int(given))  # fmt: skip
    assert {k: got[k] for k in want} == want
    assert summed == dict(P=got["P"], OUT=fg.data_ptr(), num_partials=3, num_cols=N * M * H, accumulate=0)
    one, launches = trace(_plans_norm.pre_norm_gemm_bwd(kernel, reduce_rows, 0, 2, (3, 2), (given, given), 1),
                          residual, fn, omg, sqg, *outs)  # fmt: skip
    assert [launch[0] for launch in launches] == [0]  # one share: its row written straight into fn_grad
    assert params_of(kernel, launches[0])["P"] == one[1].data_ptr() and params_of(kernel, launches[0])["num_parts"] == 1
    for bad in [(residual, fn, torch.randn(6, 1, N + 1), sqg),  # another N than fn's
                (residual, fn, torch.randn(5, 1, N), sqg), (residual, fn, omg, torch.randn(2, 2)),  # not T
                (residual, torch.randn(80, M * H), torch.randn(6, 1, 80), sqg)]:  # the m <= 8 variant's mixes
        assert trace(p, *bad, *outs)[0] is NotImplemented
