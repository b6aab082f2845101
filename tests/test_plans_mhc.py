"""Call plans of the mhc ops, traced on the CPU (tests/plan_helpers.py: every step but the
launch): the kernel arguments the Python path passes for the same tensors, the returned tensors'
layouts, and NotImplemented (the Python path) for what a plan does not take."""

import importlib

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace
from tilebake.mhc import _plans

pytestmark = needs_plans

expand = importlib.import_module("tilebake.mhc.expand_to_mhc")
post = importlib.import_module("tilebake.mhc.mhc_post")
pre = importlib.import_module("tilebake.mhc.mhc_pre_apply_mix")
LEAD = (2, 3)  # two leading dims: 6 tokens
M, H = 4, 136
NARROW = f"H < {post.WIDE_ROWS}"  # the hidden sizes of the backward's warp-a-token kernel


def bf16(*shape):
    return torch.randn(*shape).bfloat16()


def one_launch(kernel, launches, tokens=6):
    assert [launch[0] for launch in launches] == [0]
    got = params_of(kernel, launches[0])
    assert (got["num_tokens"], got["mhc_mult"], got["hidden"]) == (tokens, M, H)
    return got


@pytest.mark.parametrize("given", [False, True])
def test_expand_plans(given):
    fwd, bwd = (ManifestKernel(expand.ExpandToMhcVariant(d)) for d in ("fwd", "bwd"))
    x, o = bf16(*LEAD, H), torch.empty(*LEAD, M, H).bfloat16()
    result, launches = trace(_plans.expand_fwd(fwd, 0, 2), x, o)
    assert result is o and one_launch(fwd, launches) == dict(X=x.data_ptr(), O=o.data_ptr(), num_tokens=6, mhc_mult=M, hidden=H)
    for bad in [(x, o[..., :8].contiguous()), (x[..., :128].contiguous(), o), (x.float(), o), (x, o.transpose(0, 1))]:
        assert trace(_plans.expand_fwd(fwd, 0, 2), *bad)[0] is NotImplemented
    og = bf16(*LEAD, M, H)
    xg = torch.empty(*LEAD, H).bfloat16() if given else None
    result, launches = trace(_plans.expand_bwd(bwd, 0, 2, given), og, xg)
    assert (result is xg) if given else (result.shape, result.dtype) == ((*LEAD, H), torch.bfloat16)
    assert one_launch(bwd, launches)["XG"] == result.data_ptr()
    assert trace(_plans.expand_bwd(bwd, 0, 2, given), bf16(*LEAD, 9, H), xg)[0] is NotImplemented  # m > 8


@pytest.mark.parametrize("flat_post", [False, True])
def test_post_plans(flat_post):
    fwd, bwd = (ManifestKernel(post.MhcPostVariant(d, 4)) for d in ("fwd", "bwd"))
    x, r, d_o = bf16(*LEAD, H), bf16(*LEAD, M, H), bf16(*LEAD, M, H)
    p = torch.rand(*LEAD, M, *(() if flat_post else (1,)))
    comb = torch.rand(*LEAD, M, M)
    out, launches = trace(_plans.post_fwd(fwd, 0, 2, flat_post, False), x, r, p, comb, None)
    assert (out.shape, out.dtype) == (r.shape, torch.bfloat16)
    assert one_launch(fwd, launches) == dict(X=x.data_ptr(), R=r.data_ptr(), POST=p.data_ptr(), COMB=comb.data_ptr(),
                                             OUT=out.data_ptr(), num_tokens=6, mhc_mult=M, hidden=H)  # fmt: skip
    given = torch.empty_like(r)
    assert trace(_plans.post_fwd(fwd, 0, 2, flat_post, True), x, r, p, comb, given)[0] is given
    grads, launches = trace(_plans.post_bwd(bwd, 0, 2, flat_post, NARROW), x, r, p, comb, d_o)
    assert [(g.shape, g.dtype) for g in grads] == [(t.shape, t.dtype) for t in (x, r, p, comb)]
    got = one_launch(bwd, launches)
    assert [got[n] for n in ("DX", "DR", "DPOST", "DCOMB")] == [g.data_ptr() for g in grads]
    assert trace(_plans.post_fwd(fwd, 0, 2, flat_post, False), x, r, p, comb[..., :3].contiguous(), None)[0] is NotImplemented
    assert trace(_plans.post_bwd(bwd, 0, 2, not flat_post, NARROW), x, r, p, comb, d_o)[0] is NotImplemented
    r8, c8, p8 = bf16(*LEAD, 8, H), torch.rand(*LEAD, 8, 8), torch.rand(*LEAD, 8, *(() if flat_post else (1,)))
    assert trace(_plans.post_bwd(bwd, 0, 2, flat_post, NARROW), x, r8, p8, c8, bf16(*LEAD, 8, H))[0] is NotImplemented  # m > 4


@pytest.mark.parametrize("wide", [False, True])
def test_post_bwd_plan_takes_its_kernels_rows(wide):
    """The backward's two kernels (a warp or a CTA a token): a plan takes only the hidden sizes its
    kernel is for (the op's key tells them apart), as token_warps picks them."""
    rows = f"H >= {post.WIDE_ROWS}" if wide else NARROW
    bwd = ManifestKernel(post.MhcPostVariant("bwd", 4, 4 if wide else 1))
    p = _plans.post_bwd(bwd, 0, 1, False, rows)
    for hidden in (8, 1280, post.WIDE_ROWS - 8, post.WIDE_ROWS, 7168):
        x, r = bf16(2, hidden), bf16(2, M, hidden)
        result, launches = trace(p, x, r, torch.rand(2, M, 1), torch.rand(2, M, M), bf16(2, M, hidden))
        takes = (post.token_warps(hidden) == 4) == wide
        assert (result is not NotImplemented) == takes, hidden
        if takes:
            assert params_of(bwd, launches[0])["hidden"] == hidden
    assert [post.token_warps(h) for h in (1280, post.WIDE_ROWS - 8, post.WIDE_ROWS, 16384)] == [1, 1, 4, 4]


@pytest.mark.parametrize("given", [False, True])
def test_pre_apply_mix_plans(given):
    fwd = built(pre.MhcPreApplyMixVariant(*pre.forward_key(M)))
    bwd = built(pre.MhcPreApplyMixVariant(*pre.backward_key(M, H)))
    x, mix, og = bf16(*LEAD, M, H), torch.rand(*LEAD, M, 1), bf16(*LEAD, H)
    o = torch.empty(*LEAD, H).bfloat16() if given else None
    result, launches = trace(_plans.pre_apply_mix_fwd(fwd, 0, 2, False, given), x, mix, o)
    assert (result is o) if given else (result.shape, result.dtype) == ((*LEAD, H), torch.bfloat16)
    assert one_launch(fwd, launches)["O"] == result.data_ptr()
    xg = bf16(*LEAD, M, H) if given else None
    bwd_plan = _plans.pre_apply_mix_bwd(bwd, 0, 2, False, given, H)
    mix_grad, launches = trace(bwd_plan, og, x, mix, xg)
    assert (mix_grad.shape, mix_grad.dtype) == (mix.shape, torch.float32)
    got = one_launch(bwd, launches)
    assert got["has_x_grad"] == int(given) and got["XG"] == (xg.data_ptr() if given else 0)
    # another hidden size or more streams than the variant's registers hold: another variant's call
    x2, og2 = bf16(*LEAD, M, H + 8), bf16(*LEAD, H + 8)
    assert trace(bwd_plan, og2, x2, mix, bf16(*LEAD, M, H + 8) if given else None)[0] is NotImplemented
    x5, mix5 = bf16(*LEAD, 5, H), torch.rand(*LEAD, 5, 1)
    assert trace(bwd_plan, og, x5, mix5, bf16(*LEAD, 5, H) if given else None)[0] is NotImplemented
    assert trace(_plans.pre_apply_mix_fwd(fwd, 0, 2, True, given), x, mix, o)[0] is NotImplemented  # mix (..., M, 1)
    fwd_plan = _plans.pre_apply_mix_fwd(fwd, 0, 2, False, given)  # m = 5: the 8-stream variant's call
    assert trace(fwd_plan, x5, mix5, o)[0] is NotImplemented


def built(variant) -> ManifestKernel:
    """The variant's launch spec from the installed kernel package; a skip where that package
    predates the op (the plans are traced once the wheel holds it)."""
    from tilebake._runtime import loader

    if variant.id not in loader.op_kernels(variant.op):
        pytest.skip(f"{variant.id} is not in the installed kernel package")
    return ManifestKernel(variant)


sinkhorn = importlib.import_module("tilebake.mhc.mhc_sinkhorn")


@pytest.mark.parametrize("given", [False, True])
def test_sinkhorn_plans(given):
    from tilebake.mhc import _plans_mix

    fwd, bwd = (built(sinkhorn.MhcSinkhornVariant(d, 4)) for d in ("fwd", "bwd"))
    x, g = torch.randn(*LEAD, M, M), torch.randn(*LEAD, M, M)
    out = torch.empty_like(x) if given else None
    result, launches = trace(_plans_mix.sinkhorn(fwd, 0, 2, given, 7, 1e-3), x, out)
    assert (result is out) if given else (result.shape, result.dtype) == (x.shape, torch.float32)
    assert [launch[0] for launch in launches] == [0]
    assert params_of(fwd, launches[0]) == dict(X=x.data_ptr(), OUT=result.data_ptr(), num_tokens=6, mhc_mult=M,
                                               repeat=7, eps=pytest.approx(1e-3))  # fmt: skip
    result, launches = trace(_plans_mix.sinkhorn_bwd(bwd, 0, 2, given, 7, 1e-3), g, x, out)
    got = params_of(bwd, launches[0])
    assert (got["G"], got["X"], got["GI"], got["num_tokens"], got["repeat"]) == (g.data_ptr(), x.data_ptr(),
                                                                                 result.data_ptr(), 6, 7)  # fmt: skip
    for bad in [(x[..., :3].contiguous(), out), (torch.randn(*LEAD, 8, 8), None), (x.transpose(-1, -2), out)]:
        assert trace(_plans_mix.sinkhorn(fwd, 0, 2, given, 7, 1e-3), *bad)[0] is NotImplemented  # m > 4 too


split = importlib.import_module("tilebake.mhc.mhc_pre_split_mixes")
head = importlib.import_module("tilebake.mhc.mhc_head_compute_mix")


def test_split_mixes_plans():
    from tilebake.mhc import _plans_mix

    fwd, bwd, red = (built(split.MhcPreSplitMixesVariant(d)) for d in ("fwd", "bwd", "bwd_reduce"))
    x, s, b = torch.randn(*LEAD, 24), torch.rand(3), torch.randn(24)
    outs, launches = trace(_plans_mix.split_fwd(fwd, 0, 2, M, (None, None, None), 2.0, 1e-6), x, s, b, None, None, None)
    assert [(o.shape, o.dtype) for o in outs] == [((*LEAD, M, 1), torch.float32)] * 2 + [((*LEAD, M, M), torch.float32)]
    got = params_of(fwd, launches[0])
    assert (got["num_tokens"], got["mhc_mult"], got["mix_cols"], got["COMB"]) == (6, M, 24, outs[2].data_ptr())
    pg, qg, cg, post = torch.randn(*LEAD, M), torch.randn(*LEAD, M), torch.randn(*LEAD, M * M), torch.randn(*LEAD, M)
    nds = (3, 3, 3, 3, None, None, None)
    grads, launches = trace(_plans_mix.split_bwd(bwd, red, 0, 2, M, nds, 1.0, 132), pg, qg, cg, x, post, s, b, None, None, None)
    assert [g.shape for g in grads] == [x.shape, s.shape, b.shape]
    assert [launch[0] for launch in launches] == [0, 1]
    first, second = params_of(bwd, launches[0]), params_of(red, launches[1])
    assert (first["num_partials"], first["num_cols"], first["PART"]) == (6, 28, second["PART"])  # min(T, SMs) rows
    assert (second["SG"], second["BG"]) == (grads[1].data_ptr(), grads[2].data_ptr())
    assert trace(_plans_mix.split_fwd(fwd, 0, 2, M, (None, None, None), 2.0, 1e-6), x[..., :15].contiguous(), s, b,
                 None, None, None)[0] is NotImplemented  # fmt: skip


@pytest.mark.parametrize("given", [False, True])
def test_head_compute_mix_plans(given):
    from tilebake.mhc import _plans_mix

    fwd, bwd = (built(head.MhcHeadComputeMixVariant(d)) for d in ("fwd", "bwd"))
    x, s, b, g = torch.randn(*LEAD, M), torch.rand(1), torch.randn(M), torch.randn(*LEAD, M)
    out = torch.empty_like(x) if given else None
    result, launches = trace(_plans_mix.head_fwd(fwd, 0, 2, given, 1e-6), x, s, b, out)
    assert (result is out) if given else result.shape == x.shape
    assert params_of(fwd, launches[0])["OUT"] == result.data_ptr()
    sp, bp = (torch.empty(5, 1), torch.empty(5, M)) if given else (None, None)
    flags = (given, given, given)
    grads, launches = trace(_plans_mix.head_bwd(bwd, 0, 2, flags, None if given else 9), g, x, s, b, out, sp, bp)
    assert (grads[1].shape, grads[2].shape) == (((5, 1), (5, M)) if given else ((9, 1), (9, M)))
    assert params_of(bwd, launches[0])["num_partials"] == (5 if given else 9)


multilayer = importlib.import_module("tilebake.mhc.mhc_multilayer_recompute")


@pytest.mark.parametrize("layers,posts", [(1, 0), (3, 3), (3, 2), (multilayer.LMAX, multilayer.LMAX)])
def test_multilayer_plan(layers, posts):
    kernel = ManifestKernel(multilayer.MhcMultilayerRecomputeVariant(4, True))
    r0 = bf16(*LEAD, M, H)
    pre_mix = [torch.rand(*LEAD, M, *((1,) if i % 2 else ())) for i in range(layers)]  # (..., M) and (..., M, 1)
    outs, post_mix = [bf16(*LEAD, H) for _ in range(posts)], [torch.rand(*LEAD, M, 1) for _ in range(posts)]
    comb = [torch.rand(*LEAD, M, M) for _ in range(posts)]
    inputs, residuals = [bf16(*LEAD, H) for _ in range(layers)], [bf16(*LEAD, M, H) for _ in range(posts)]
    args = [r0, pre_mix, outs, post_mix, comb, inputs, residuals]
    p = _plans.multilayer(kernel, 0, 2, M, tuple(t.ndim for t in pre_mix), tuple(t.ndim for t in post_mix))
    result, launches = trace(p, *args)
    assert result is None
    lmax, residual = multilayer.LMAX, r0
    assert len(launches) == 1  # (more than LMAX layers: the Python path's launches)
    for chunk, launch in enumerate(launches):  # the Python path's arguments, chunk by chunk
        got, start = params_of(kernel, launch), chunk * lmax
        chunk_layers, chunk_posts = min(lmax, layers - start), max(0, min(posts - start, lmax))
        want = dict(R0=residual.data_ptr(), num_tokens=6, mhc_mult=M, hidden=H, num_layers=chunk_layers,
                    num_post=chunk_posts)  # fmt: skip
        for k in range(lmax):
            i, has_pre, has_post = start + k, k < chunk_layers, k < chunk_posts
            for name, items, here in (("PRE", pre_mix, has_pre), ("LO", outs, has_post), ("POST", post_mix, has_post),
                                      ("COMB", comb, has_post), ("LI", inputs, has_pre), ("RL", residuals, has_post)):  # fmt: skip
                want[f"{name}{k}"] = items[i].data_ptr() if here else 0
        assert got == want
        if chunk_posts:
            residual = residuals[start + chunk_posts - 1]
    assert trace(p, *(tuple(a) if isinstance(a, list) else a for a in args))[0] is None  # tuples too
    bad = [
        (0, bf16(*LEAD, 8, H)),  # another m
        (1, [t.double() for t in pre_mix]),
        (5, [t.float() for t in inputs]),
        (5, [r0[..., 0, :]] + inputs[1:]),  # not contiguous
        (5, [r0.view(-1)[: 6 * H].view(*LEAD, H)] + inputs[1:]),  # an output over an input
        (6, residuals[:-1] + [inputs[0].view(-1).repeat(M).view(*LEAD, M, H)[:]] if posts else residuals),
    ]
    for index, value in bad:
        changed = list(args)
        changed[index] = value
        if index == 6 and not posts:
            continue
        if index == 6:  # two outputs over each other: the last residual over the first layer input
            both = torch.empty(6 * M * H + 6 * H, dtype=torch.bfloat16)
            changed[5] = [both[: 6 * H].view(*LEAD, H)] + inputs[1:]
            changed[6] = residuals[:-1] + [both[6 * H - 8 : 6 * H - 8 + 6 * M * H].view(*LEAD, M, H)]
        assert trace(p, *changed)[0] is NotImplemented, index
