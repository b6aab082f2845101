"""mhc_pre_big_fuse_fwd: the same bytes as the training path's chain of kernels (reduce and
RMSNorm, split, Sinkhorn, mix), and within tolerance of the float64 math, for any m, token count
and n_splits, on the CPU and the GPU; argument errors."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.mhc import mhc_pre_norm_fn_ref, mhc_pre_split_mixes_ref, sinkhorn_normalize_ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# m <= 4 takes the fused kernel (T = 1, 8001, 65536; hidden 1032 and 7168 leave the last column
# block partial; any n_splits), m = 8 the chain of single-step kernels
SHAPES = [((1,), 4, 128, 16), ((8001,), 4, 512, 16), ((2, 33), 2, 256, 3), ((5,), 8, 128, 1), ((17,), 1, 128, 2),
          ((65536,), 4, 128, 4), ((3,), 3, 1032, 5), ((2,), 4, 7168, 1), ((9,), 6, 136, 2)]


def inputs(lead, m, hidden, n_splits, device):
    m3 = m * (m + 2)
    residual = torch.randn(*lead, m, hidden, device=device).bfloat16()
    fn = torch.randn(m3, m * hidden, device=device) / (m * hidden) ** 0.5
    scale, base = torch.rand(3, device=device) + 0.5, torch.randn(m3, device=device) * 0.1
    gemm = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn, n_splits)
    return residual, fn, scale, base, gemm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m,hidden,n_splits", SHAPES)
def test_equals_the_chain_and_the_math(device, lead, m, hidden, n_splits):
    residual, fn, scale, base, (pm, ps) = inputs(lead, m, hidden, n_splits, device)
    post, comb, layer_input = tilebake.mhc.mhc_pre_big_fuse_fwd(pm, ps, scale, base, residual, rms_eps=1e-6,
                                                                 mhc_post_mult_value=2.0, sinkhorn_repeat=10, n_splits=n_splits)  # fmt: skip
    # the chain, call by call
    _, _, mixes = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=m * hidden, rms_eps=1e-6)
    pre2, post2, comb2 = tilebake.mhc.mhc_pre_split_mixes_fwd(mixes.view(*lead, -1), scale, base, None, None, None, 2.0, 1e-6)
    comb2 = tilebake.mhc.mhc_sinkhorn_fwd(comb2, None, 10, 1e-6)
    assert_bytes_equal(post.cpu(), post2.cpu(), "post_mix")
    assert_bytes_equal(comb.cpu(), comb2.cpu(), "comb_mix")
    assert_bytes_equal(layer_input.cpu(), tilebake.mhc.mhc_pre_apply_mix_fwd(residual, pre2).cpu(), "layer_input")
    # the math, in float64
    r64, fn64 = residual.cpu().double(), fn.cpu().double()
    mixes64 = mhc_pre_norm_fn_ref(r64, fn64, None, 1e-6)
    pre64, post64, comb64 = mhc_pre_split_mixes_ref(mixes64, scale.cpu().double(), base.cpu().double(), m, 2.0, 1e-6)
    torch.testing.assert_close(post.cpu().double(), post64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(comb.cpu().double(), sinkhorn_normalize_ref(comb64, 10, 1e-6), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer_input.cpu().double(), (pre64 * r64).sum(-2), rtol=1e-2, atol=2e-2)
    given = (poison_(torch.empty(*lead, m, device=device)), poison_(torch.empty(*lead, m * m, device=device)),
             poison_(torch.empty_like(layer_input)))  # fmt: skip
    got = tilebake.mhc.mhc_pre_big_fuse_fwd(pm, ps, scale, base, residual, *given, 1e-6, 1e-6, 1e-6, 2.0, 10, n_splits)
    assert all(a is b for a, b in zip(got, given))
    assert_bytes_equal(given[0].cpu(), post.cpu().reshape(*lead, m), "given post_mix (flat)")
    assert_bytes_equal(given[1].cpu(), comb.cpu().reshape(*lead, m * m), "given comb_mix (flat)")
    assert_bytes_equal(given[2].cpu(), layer_input.cpu(), "given layer_input")


def test_rejects_bad_arguments():
    residual, fn, scale, base, (pm, ps) = inputs((6,), 4, 128, 2, "cpu")
    fuse = tilebake.mhc.mhc_pre_big_fuse_fwd
    with pytest.raises(ValueError, match=r"gemm_out_mul must have shape \(n_splits, 6, 1, m3\)"):
        fuse(pm[:, :5].contiguous(), ps, scale, base, residual)
    with pytest.raises(ValueError, match="last dim must be m"):
        fuse(pm[..., :15].contiguous(), ps, scale, base, residual)
    with pytest.raises(ValueError, match=r"n_splits \(16\) must equal"):
        fuse(pm, ps, scale, base, residual, n_splits=16)
    with pytest.raises(TypeError, match="residual must be bfloat16"):
        fuse(pm, ps, scale, base, residual.float())


def test_rejects_outputs_over_inputs():
    residual, fn, scale, base, (pm, ps) = inputs((6,), 4, 128, 2, "cpu")
    with pytest.raises(ValueError, match=r"layer_input must not share storage with the inputs .*\(residual\)"):
        tilebake.mhc.mhc_pre_big_fuse_fwd(pm, ps, scale, base, residual, layer_input=residual.view(-1)[: 6 * 128].view(6, 128),
                                          n_splits=2)  # fmt: skip
    with pytest.raises(ValueError, match="post_mix and comb_mix must not overlap"):
        mixes = torch.empty(6 * 4 + 6 * 16)  # comb's first entries are post's last
        tilebake.mhc.mhc_pre_big_fuse_fwd(pm, ps, scale, base, residual, mixes[:24].view(6, 4), mixes[20:116].view(6, 16),
                                          n_splits=2)  # fmt: skip
    with pytest.raises(ValueError, match="comb_mix must have shape"):
        tilebake.mhc.mhc_pre_big_fuse_fwd(pm, ps, scale, base, residual, comb_mix=torch.empty(6, 4, 5), n_splits=2)
