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
    grads, launches = trace(_plans.post_bwd(bwd, 0, 2, flat_post), x, r, p, comb, d_o)
    assert [(g.shape, g.dtype) for g in grads] == [(t.shape, t.dtype) for t in (x, r, p, comb)]
    got = one_launch(bwd, launches)
    assert [got[n] for n in ("DX", "DR", "DPOST", "DCOMB")] == [g.data_ptr() for g in grads]
    assert trace(_plans.post_fwd(fwd, 0, 2, flat_post, False), x, r, p, comb[..., :3].contiguous(), None)[0] is NotImplemented
    assert trace(_plans.post_bwd(bwd, 0, 2, not flat_post), x, r, p, comb, d_o)[0] is NotImplemented
    r8, c8, p8 = bf16(*LEAD, 8, H), torch.rand(*LEAD, 8, 8), torch.rand(*LEAD, 8, *(() if flat_post else (1,)))
    assert trace(_plans.post_bwd(bwd, 0, 2, flat_post), x, r8, p8, c8, bf16(*LEAD, 8, H))[0] is NotImplemented  # m > 4


@pytest.mark.parametrize("given", [False, True])
def test_pre_apply_mix_plans(given):
    fwd, bwd = (ManifestKernel(pre.MhcPreApplyMixVariant(d)) for d in ("fwd", "bwd"))
    x, mix, og = bf16(*LEAD, M, H), torch.rand(*LEAD, M, 1), bf16(*LEAD, H)
    o = torch.empty(*LEAD, H).bfloat16() if given else None
    result, launches = trace(_plans.pre_apply_mix_fwd(fwd, 0, 2, False, given), x, mix, o)
    assert (result is o) if given else (result.shape, result.dtype) == ((*LEAD, H), torch.bfloat16)
    assert one_launch(fwd, launches)["O"] == result.data_ptr()
    xg = bf16(*LEAD, M, H) if given else None
    mix_grad, launches = trace(_plans.pre_apply_mix_bwd(bwd, 0, 2, False, given), og, x, mix, xg)
    assert (mix_grad.shape, mix_grad.dtype) == (mix.shape, torch.float32)
    got = one_launch(bwd, launches)
    assert got["has_x_grad"] == int(given) and got["XG"] == (xg.data_ptr() if given else 0)
    assert trace(_plans.pre_apply_mix_fwd(fwd, 0, 2, True, given), x, mix, o)[0] is NotImplemented  # mix (..., M, 1)
