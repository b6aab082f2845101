"""Call plans of the engram ops, traced on the CPU (tests/plan_helpers.py: every step but the
launch): the kernel arguments the Python path passes for the same tensors, the returned layouts,
and NotImplemented (the Python path) for what a plan does not take."""

import importlib

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace
from tilebake.torch.engram import make_offsets

pytestmark = needs_plans

hash_mod = importlib.import_module("tilebake.engram.engram_hash")
sinkhorn = importlib.import_module("tilebake.engram.engram_sinkhorn")
fused = importlib.import_module("tilebake.engram.fused_weight")
gwr = importlib.import_module("tilebake.engram.grad_w_reduce")


def launched(kernel, launches):
    """The one launch's parameters; its grid the manifest's expression of them."""
    assert [launch[0] for launch in launches] == [0]
    got = params_of(kernel, launches[0])
    grid = eval(kernel.spec[2][0], {"min": min, "max": max}, dict(got))
    assert launches[0][1] == (grid, 1, 1) and grid >= 1
    return got


def misaligned(t):
    buf = torch.empty(t.numel() + 1, dtype=t.dtype)[1:]
    return buf.view(t.shape).copy_(t)


@pytest.mark.parametrize("with_mask", [False, True])
def test_engram_hash_plan(with_mask):
    kernel = ManifestKernel(hash_mod.EngramHashVariant("int32"))
    p = hash_mod._plan(kernel, 0, with_mask)
    ids = torch.randint(0, 1000, (9, 4), dtype=torch.int32)
    mul = torch.randint(1, 1000, (2, 4), dtype=torch.int64)
    voc = torch.randint(1, 100, (2, 3, 5), dtype=torch.int32)
    off = make_offsets(voc)
    mask = torch.zeros(9, dtype=torch.bool) if with_mask else None
    out, launches = trace(p, ids, mul, voc, off, mask)
    assert out.shape == (2, 9, 15) and out.dtype == torch.int32 and out.is_contiguous()
    got = launched(kernel, launches)
    assert got == dict(IDS=ids.data_ptr(), MUL=mul.data_ptr(), VOC=voc.data_ptr(), OFF=off.data_ptr(),
                       MASK=(mask if with_mask else ids).data_ptr(), OUT=out.data_ptr(), has_mask=int(with_mask),
                       num_tokens=9, max_ngram_size=4, num_layers=2, num_tables=5)  # fmt: skip
    for bad in [(ids[:, :3], mul), (ids, mul[:1]), (ids.t().contiguous().t(), mul), (ids[:0], mul)]:
        assert trace(p, *bad, voc, off, mask)[0] is NotImplemented
    if with_mask:
        assert trace(p, ids, mul, voc, off, mask[:5])[0] is NotImplemented


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.float32, torch.bfloat16)])  # fmt: skip
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_plan(dtypes, nesterov):
    names = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    kernel = ManifestKernel(sinkhorn.EngramSinkhornVariant("momentum", *(names[d] for d in dtypes)))
    p = sinkhorn._momentum_plan(kernel, 0, *dtypes, 0.9, nesterov)
    g, m = torch.randn(8001).to(dtypes[0]), torch.randn(8001).to(dtypes[1])
    out, launches = trace(p, g, m)
    assert out.shape == (8001,) and out.dtype == torch.float32
    got = launched(kernel, launches)
    assert got.pop("beta1") == pytest.approx(0.9) and got.pop("one_minus_beta1") == pytest.approx(0.1, rel=1e-6)
    assert got == dict(G=g.data_ptr(), MB=m.data_ptr(), OUT=out.data_ptr(), nesterov=int(nesterov), numel=8001)
    for bad in [(g[:7], m), (misaligned(g), m), (g, m.double()), (g.view(1, -1), m)]:
        assert trace(p, *bad)[0] is NotImplemented


def test_step_and_finalize_plans():
    m, rs, cs = torch.randn(300, 1028), torch.rand(300), torch.rand(1028)
    kernel = ManifestKernel(sinkhorn.EngramSinkhornVariant("step"))
    (norm, partial), launches = trace(sinkhorn._step_plan(kernel, 0, 1e-20, 132), m, rs, cs)
    assert norm.shape == (300,) and partial.shape == (264, 1028)
    got = launched(kernel, launches)
    assert got.pop("eps") == pytest.approx(1e-20)
    assert got == dict(M=m.data_ptr(), RS=rs.data_ptr(), CS=cs.data_ptr(), NORM=norm.data_ptr(), P=partial.data_ptr(),
                       num_rows=300, num_cols=1028, num_ctas=264)  # fmt: skip
    (_, partial), _ = trace(sinkhorn._step_plan(kernel, 0, 1e-20, 132), m[:5], rs[:5], cs)
    assert partial.shape == (5, 1028)  # min(R, 2 x SMs)
    for bad in [(m[:, :1026], rs, cs[:1026]), (m, rs[:7], cs), (torch.randn(3, 8196), rs[:3], torch.rand(8196))]:
        assert trace(sinkhorn._step_plan(kernel, 0, 1e-20, 132), *bad)[0] is NotImplemented
    kernel = ManifestKernel(sinkhorn.EngramSinkhornVariant("finalize"))
    out, launches = trace(sinkhorn._finalize_plan(kernel, 0, 1e-20, 0.5, False), m, rs, cs, None)
    assert out.shape == (300, 1028) and launched(kernel, launches)["OUT"] == out.data_ptr()
    given = torch.empty_like(m)
    out, launches = trace(sinkhorn._finalize_plan(kernel, 0, 1e-20, 0.5, True), m, rs, cs, given)
    assert out is given and launched(kernel, launches)["alpha"] == pytest.approx(0.5)
    assert trace(sinkhorn._finalize_plan(kernel, 0, 1e-20, 0.5, True), m, rs, cs, given[:7])[0] is NotImplemented


def test_reduce_plans():
    kernel = ManifestKernel(sinkhorn.EngramSinkhornVariant("step_reduce"))
    p = sinkhorn._step_reduce_plan(kernel, 0)
    partial, out = torch.randn(396, 5120), torch.empty(5120)
    result, launches = trace(p, partial, out)
    assert result is None
    assert launched(kernel, launches) == dict(P=partial.data_ptr(), OUT=out.data_ptr(), num_partials=396, num_cols=5120)
    assert trace(p, partial[:, :5118], out[:5118])[0] is NotImplemented
    kernel = ManifestKernel(gwr.GradWReduceVariant("bf16"))
    p = gwr._plan(kernel, 0)
    part = torch.randn(7, 4, 256)
    wh, we = torch.randn(4, 256).bfloat16(), torch.randn(4, 256).bfloat16()
    gh, ge = torch.zeros(4, 256), torch.zeros(4, 256)
    result, launches = trace(p, part, wh, we, gh, ge)
    assert result is None
    assert launched(kernel, launches) == dict(P=part.data_ptr(), WH=wh.data_ptr(), WE=we.data_ptr(), GWH=gh.data_ptr(),
                                              GWE=ge.data_ptr(), num_partials=7, num_cols=1024)  # fmt: skip
    assert trace(p, part, wh, we, gh, gh)[0] is NotImplemented  # the two buffers overlap
    assert trace(p, part[:, :3], wh, we, gh, ge)[0] is NotImplemented  # partials of another hc


def test_fused_weight_plan():
    kernel = ManifestKernel(fused.FusedWeightVariant("bf16"))
    p = fused._plan(kernel, 0)
    wh, we = torch.randn(4, 7168).bfloat16(), torch.randn(4, 7168).bfloat16()
    out, launches = trace(p, wh, we)
    assert out.shape == (4, 7168) and out.dtype == torch.float32
    assert launched(kernel, launches) == dict(WH=wh.data_ptr(), WE=we.data_ptr(), W=out.data_ptr(), numel=4 * 7168)
    assert trace(p, wh, we[:, :128])[0] is NotImplemented


gate_fwd = importlib.import_module("tilebake.engram.engram_gate_fwd")
gate_bwd = importlib.import_module("tilebake.engram.engram_gate_bwd")


def gate_tensors(num_tokens=5, hc=3, hidden=5120):
    x = torch.randn(num_tokens, hc, hidden).bfloat16()
    kv = torch.randn(num_tokens, hc + 1, hidden).bfloat16()
    return x, kv, torch.rand(hc, hidden) + 0.5


@pytest.mark.parametrize("save,with_mask,inplace", [(True, False, False), (True, True, False), (False, False, True),
                                                    (False, True, False)])  # fmt: skip
def test_gate_fwd_plan(save, with_mask, inplace):
    kernel = ManifestKernel(gate_fwd.EngramGateFwdVariant("bf16", 8192))
    p = gate_fwd._plan(kernel, 0, 5120, 1e-6, 1e-4, save, with_mask, inplace, 132)
    x, kv, w = gate_tensors()
    mask = torch.zeros(5, dtype=torch.bool) if with_mask else None
    out, launches = trace(p, x, kv, w, mask)
    assert len(out) == 5 and (out[0] is x if inplace else out[0].shape == x.shape and out[0].is_contiguous())
    assert all((t is None) != save for t in out[1:]) and all(t.shape == (5, 3) for t in out[1:] if t is not None)
    got = launched(kernel, launches)
    saved = [t.data_ptr() if t is not None else 0 for t in out[1:]]
    assert got == dict(
        X=x.data_ptr(), K=kv.data_ptr(), V=kv.data_ptr() + 3 * 5120 * 2, W=w.data_ptr(),
        MASK=mask.data_ptr() if with_mask else 0, OUT=out[0].data_ptr(), DOT=saved[0], GATE=saved[1], RSTD_X=saved[2],
        RSTD_K=saved[3], eps=pytest.approx(1e-6), clamp_value=pytest.approx(1e-4), num_tokens=5, hc=3, hidden=5120,
        num_ctas_per_head=5, has_mask=int(with_mask), save=int(save), x_token_stride=3 * 5120, x_head_stride=5120,
        k_token_stride=4 * 5120, k_head_stride=5120, out_token_stride=3 * 5120, out_head_stride=5120,
        v_token_stride=4 * 5120,
    )  # fmt: skip
    for bad in [(x[..., :4096], kv, w), (x, kv[:, :3], w), (x, kv, w[:2]), (misaligned(x), kv, w), (x[:0], kv[:0], w),
                (x, kv, w.double())]:  # fmt: skip
        assert trace(p, *bad, mask)[0] is NotImplemented
    heads_major = x.transpose(0, 1).contiguous().transpose(0, 1)  # other strides the kernel takes
    assert trace(p, heads_major, kv, w, mask)[0] is not NotImplemented


@pytest.mark.parametrize("with_mask", [False, True])
def test_gate_bwd_plan(with_mask):
    kernel = ManifestKernel(gate_bwd.EngramGateBwdVariant("bf16", 8192))
    p = gate_bwd._plan(kernel, 0, 5120, 1e-4, with_mask, 132)
    x, kv, w = gate_tensors(num_tokens=200)
    g = torch.randn(200, 3, 5120).bfloat16()
    saved = [torch.rand(200, 3) for _ in range(4)]
    mask = torch.zeros(200, dtype=torch.bool) if with_mask else None
    (dx, dkv, partial), launches = trace(p, g, x, kv, w, *saved, mask)
    assert dx.shape == x.shape and dkv.shape == kv.shape and partial.shape == (gate_bwd.CTAS_PER_SM[8192] * 132 // 3, 3, 5120)
    got = launched(kernel, launches)
    assert got == dict(
        G=g.data_ptr(), X=x.data_ptr(), K=kv.data_ptr(), V=kv.data_ptr() + 3 * 5120 * 2, W=w.data_ptr(),
        DOT=saved[0].data_ptr(), GATE=saved[1].data_ptr(), RSTD_X=saved[2].data_ptr(), RSTD_K=saved[3].data_ptr(),
        MASK=mask.data_ptr() if with_mask else 0, DX=dx.data_ptr(), DK=dkv.data_ptr(), DV=dkv.data_ptr() + 3 * 5120 * 2,
        P=partial.data_ptr(), clamp_value=pytest.approx(1e-4), num_tokens=200, hc=3, hidden=5120,
        num_ctas_per_head=gate_bwd.CTAS_PER_SM[8192] * 132 // 3, has_mask=int(with_mask), g_token_stride=3 * 5120, g_head_stride=5120,
        x_token_stride=3 * 5120, x_head_stride=5120, k_token_stride=4 * 5120, k_head_stride=5120,
        dx_token_stride=3 * 5120, dx_head_stride=5120, dk_token_stride=4 * 5120, dk_head_stride=5120,
        v_token_stride=4 * 5120, dv_token_stride=4 * 5120,
    )  # fmt: skip
    assert trace(p, g[:, :2], x, kv, w, *saved, mask)[0] is NotImplemented
    assert trace(p, g, x, kv, w, saved[0][:, :2], *saved[1:], mask)[0] is NotImplemented
    assert trace(p, g, x, kv, w, saved[0].t().contiguous().t(), *saved[1:], mask)[0] is NotImplemented
