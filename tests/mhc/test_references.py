"""The mix-math references of tilebake.torch.mhc (the oracles of the kernels to come), each
against float64 arithmetic written out another way; and the original's names in tilebake.torch."""

import math

import torch

import tilebake
from tilebake.torch import mhc as ref


def test_sinkhorn_is_near_doubly_stochastic():
    x = torch.randn(64, 4, 4)
    y = ref.sinkhorn_normalize_ref(x, repeat=30, eps=1e-6)
    assert (y > 0).all() and not y.isnan().any()
    torch.testing.assert_close(y.sum(-2), torch.ones(64, 4), atol=1e-5, rtol=0)  # the last step: columns
    torch.testing.assert_close(y.sum(-1), torch.ones(64, 4), atol=1e-3, rtol=0)
    one = ref.sinkhorn_normalize_ref(x, repeat=1, eps=0.0)  # softmax rows, then the columns once
    soft = x.double().exp() / x.double().exp().sum(-1, keepdim=True)
    torch.testing.assert_close(one.double(), soft / soft.sum(-2, keepdim=True))


def test_head_compute_mix_and_split_mixes():
    m = 4
    mix, scale, base = torch.randn(9, 5, m), torch.tensor([0.7]), torch.randn(m)
    want = 1 / (1 + (-(mix.double() * 0.7 + base.double())).exp()) + 1e-6
    torch.testing.assert_close(ref.mhc_head_compute_mix_ref(mix, scale, base, 1e-6).double(), want, rtol=1e-6, atol=1e-6)
    mixes, scale3, base3 = torch.randn(9, 5, m * (m + 2)), torch.tensor([0.5, 2.0, 3.0]), torch.randn(m * (m + 2))
    pre, post, comb = ref.mhc_pre_split_mixes_ref(mixes, scale3, base3, m, 2.0, 1e-6)
    assert pre.shape == post.shape == (9, 5, m, 1) and comb.shape == (9, 5, m, m)
    y = mixes.double() * torch.tensor([0.5] * m + [2.0] * m + [3.0] * m * m, dtype=torch.float64) + base3.double()
    fp32 = dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pre[..., 0].double(), torch.sigmoid(y[..., :m]) + 1e-6, **fp32)
    torch.testing.assert_close(post[..., 0].double(), 2.0 * torch.sigmoid(y[..., m : 2 * m]), **fp32)
    torch.testing.assert_close(comb.double().flatten(-2), y[..., 2 * m :], **fp32)


def test_pre_norm_fn_and_its_partials():
    m, hidden = 4, 64
    residual = torch.randn(3, 5, m, hidden).bfloat16()
    fn, weight = torch.randn(m * (m + 2), m * hidden), torch.rand(m * hidden) + 0.5
    got = ref.mhc_pre_norm_fn_ref(residual, fn, weight, 1e-6)
    x = residual.double().reshape(15, m * hidden)
    want = torch.stack([(fn.double() * weight.double()) @ row / math.sqrt(row.square().mean() + 1e-6) for row in x])
    torch.testing.assert_close(got.double().reshape(15, -1), want, rtol=1e-4, atol=1e-4)  # fp32 sums of 256 terms
    out_mul, sqrsum = ref.mhc_pre_norm_fn_partials_ref(residual, fn, 4)
    assert out_mul.shape == (4, 15, 1, m * (m + 2)) and sqrsum.shape == (4, 15, 1)
    rstd = (sqrsum.sum(0) / (m * hidden) + 1e-6).rsqrt()
    torch.testing.assert_close((out_mul.sum(0) * rstd.unsqueeze(-1))[:, 0], ref.mhc_pre_norm_fn_ref(residual, fn, None, 1e-6).reshape(15, -1),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_original_names_in_tilebake_torch():
    for name in ("expand_to_mhc_ref", "mhc_head_compute_mix_ref", "mhc_post_ref", "mhc_pre_apply_mix_ref",
                 "mhc_pre_norm_fn_partials_ref", "mhc_pre_norm_fn_ref", "mhc_pre_split_mixes_ref", "sinkhorn_normalize_ref"):  # fmt: skip
        assert getattr(tilebake.torch, name) is getattr(ref, name)
