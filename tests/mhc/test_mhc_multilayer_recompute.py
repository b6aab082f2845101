"""mhc_multilayer_recompute: bit-equal to the chain of single-layer mhc_pre_apply_mix_fwd and
mhc_post_fwd calls (the original's own test), L layers with L or L - 1 post steps, m 1 to 8, on
the CPU and the GPU; argument errors."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def layers(num_layers, num_post, tokens, m, hidden, device):
    r0 = torch.randn(tokens, m, hidden, device=device).bfloat16()
    pre = [torch.rand(tokens, m, 1, device=device) for _ in range(num_layers)]
    out = [torch.randn(tokens, hidden, device=device).bfloat16() for _ in range(num_post)]
    post = [torch.rand(tokens, m, device=device) for _ in range(num_post)]
    comb = [torch.rand(tokens, m, m, device=device) for _ in range(num_post)]
    return r0, pre, out, post, comb


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers,num_post,tokens,m,hidden", [(3, 3, 8001, 4, 256), (4, 3, 65, 8, 128),
                                                                  (1, 0, 1, 1, 8), (2, 2, 33, 2, 7168)])  # fmt: skip
def test_equals_the_chain(device, num_layers, num_post, tokens, m, hidden):
    r0, pre, out, post, comb = layers(num_layers, num_post, tokens, m, hidden, device)
    inputs = [poison_(torch.empty(tokens, hidden, dtype=torch.bfloat16, device=device)) for _ in range(num_layers)]
    residuals = [poison_(torch.empty_like(r0)) for _ in range(num_post)]
    assert tilebake.mhc.mhc_multilayer_recompute(r0, pre, out, post, comb, inputs, residuals) is None
    residual = r0
    for i in range(num_layers):
        assert_bytes_equal(inputs[i].cpu(), tilebake.mhc.mhc_pre_apply_mix_fwd(residual, pre[i]).cpu(), f"layer_input {i}")
        if i < num_post:
            residual = tilebake.mhc.mhc_post_fwd(out[i], residual, post[i], comb[i])
            assert_bytes_equal(residuals[i].cpu(), residual.cpu(), f"residual {i}")


def test_rejects_bad_arguments():
    r0, pre, out, post, comb = layers(3, 3, 5, 4, 64, "cpu")
    inputs = [torch.empty(5, 64, dtype=torch.bfloat16) for _ in range(3)]
    residuals = [torch.empty_like(r0) for _ in range(3)]
    recompute = tilebake.mhc.mhc_multilayer_recompute
    with pytest.raises(ValueError, match="post_mix_list must hold L or L - 1 mixes"):
        recompute(r0, pre, out, post[:1], comb, inputs, residuals)
    with pytest.raises(ValueError, match="comb_mix_list must hold 3 tensors"):
        recompute(r0, pre, out, post, comb[:2], inputs, residuals)
    with pytest.raises(ValueError, match="residual_list\\[0\\] must not share storage"):
        recompute(r0, pre, out, post, comb, inputs, [r0, *residuals[1:]])
    with pytest.raises(ValueError, match="mix must have shape"):
        recompute(r0, [p[:, :3].contiguous() for p in pre], out, post, comb, inputs, residuals)
