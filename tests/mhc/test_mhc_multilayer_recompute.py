"""mhc_multilayer_recompute: bit-equal to the chain of single-layer mhc_pre_apply_mix_fwd and
mhc_post_fwd calls (the original's own test), L layers with L or L - 1 post steps (more than a
launch's LMAX too), m 1 to 8, on the CPU and the GPU; argument errors."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.mhc.mhc_multilayer_recompute import LMAX

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def layers(num_layers, num_post, tokens, m, hidden, device):
    lead = tokens if isinstance(tokens, tuple) else (tokens,)
    r0 = torch.randn(*lead, m, hidden, device=device).bfloat16()
    pre = [torch.rand(*lead, m, 1, device=device) for _ in range(num_layers)]
    out = [torch.randn(*lead, hidden, device=device).bfloat16() for _ in range(num_post)]
    post = [torch.rand(*lead, m, device=device) for _ in range(num_post)]
    comb = [torch.rand(*lead, m, m, device=device) for _ in range(num_post)]
    return r0, pre, out, post, comb


def outputs(r0, num_layers, num_post):
    inputs = [poison_(torch.empty(*r0.shape[:-2], r0.shape[-1], dtype=torch.bfloat16, device=r0.device))
              for _ in range(num_layers)]  # fmt: skip
    return inputs, [poison_(torch.empty_like(r0)) for _ in range(num_post)]


# (L, posts, tokens, m, hidden): hidden 7168, 1032 and 136 leave the last column block partial;
# L > LMAX takes several launches, the last one of L = LMAX + 1 with L - 1 posts a pre step only;
# m = 4 takes the exact variant, the others a max_mult class
CASES = [(3, 3, 8001, 4, 256), (4, 3, 65, 8, 128), (1, 0, 1, 1, 8), (2, 2, 33, 2, 7168),
         (LMAX + 2, LMAX + 1, 5, 3, 1032), (LMAX + 1, LMAX, 3, 4, 136), (2 * LMAX + 1, 2 * LMAX + 1, 2, 1, 8),
         (LMAX, LMAX, 3, 8, 1040), (LMAX, LMAX - 1, 7, 5, 24), (2, 1, (2, 3), 4, 64),
         (5, 4, 257, 4, 1032)]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers,num_post,tokens,m,hidden", CASES)
def test_equals_the_chain(device, num_layers, num_post, tokens, m, hidden):
    r0, pre, out, post, comb = layers(num_layers, num_post, tokens, m, hidden, device)
    inputs, residuals = outputs(r0, num_layers, num_post)
    assert tilebake.mhc.mhc_multilayer_recompute(r0, pre, out, post, comb, inputs, residuals) is None
    residual = r0
    for i in range(num_layers):
        want = tilebake.mhc.mhc_pre_apply_mix_fwd(residual, pre[i])
        assert_bytes_equal(inputs[i].cpu(), want.cpu(), f"layer_input {i}")
        if i < num_post:
            residual = tilebake.mhc.mhc_post_fwd(out[i], residual, post[i], comb[i])
            assert_bytes_equal(residuals[i].cpu(), residual.cpu(), f"residual {i}")


@pytest.mark.parametrize("device", DEVICES)
def test_no_tokens(device):
    r0, pre, out, post, comb = layers(2, 2, 0, 4, 64, device)
    inputs, residuals = outputs(r0, 2, 2)
    tilebake.mhc.mhc_multilayer_recompute(r0, pre, out, post, comb, inputs, residuals)


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
    with pytest.raises(ValueError, match="pre_mix_list\\[0\\] must have shape"):
        recompute(r0, [p[:, :3].contiguous() for p in pre], out, post, comb, inputs, residuals)
    with pytest.raises(TypeError, match="layer_output_list\\[1\\] must be bfloat16"):
        recompute(r0, pre, [out[0], out[1].float(), out[2]], post, comb, inputs, residuals)
    with pytest.raises(ValueError, match="comb_mix_list\\[2\\] must have shape"):
        recompute(r0, pre, out, post, [*comb[:2], comb[2][:4]], inputs, residuals)
    with pytest.raises(ValueError, match="post_mix_list\\[1\\] must be contiguous"):
        recompute(r0, pre, out, [post[0], post[1].t().contiguous().t(), post[2]], comb, inputs, residuals)
    with pytest.raises(TypeError, match="layer_input_list\\[2\\] must be a torch.Tensor"):
        recompute(r0, pre, out, post, comb, [*inputs[:2], None], residuals)
    shared = torch.empty_like(r0)  # comb_mix_list[0] on residual_list[1]'s bytes
    with pytest.raises(ValueError, match="residual_list\\[1\\] must not share storage .* \\(comb_mix_list\\[0\\]\\)"):
        recompute(r0, pre, out, post, [shared.view(-1).view(torch.float32)[:80].view(5, 4, 4), *comb[1:]], inputs,
                  [residuals[0], shared, residuals[2]])  # fmt: skip
    with pytest.raises(ValueError, match="layer_input_list\\[1\\] and residual_list\\[0\\] must not overlap"):
        recompute(r0, pre, out, post, comb, [inputs[0], residuals[0].view(-1)[:320].view(5, 64), inputs[2]], residuals)
    recompute(r0, post, out, post, comb, inputs, residuals)  # inputs may share storage


@pytest.mark.gpu
def test_rejects_unaligned_cuda_tensors():
    r0, pre, out, post, comb = layers(2, 2, 3, 4, 64, "cuda")
    inputs, residuals = outputs(r0, 2, 2)
    shifted = torch.empty(3 * 64 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(3, 64)
    with pytest.raises(ValueError, match="layer_output_list\\[1\\]'s data must be 16-byte aligned"):
        tilebake.mhc.mhc_multilayer_recompute(r0, pre, [out[0], shifted], post, comb, inputs, residuals)


@pytest.mark.gpu
@pytest.mark.parametrize("num_layers,num_post,lists", [(3, 2, True), (LMAX, LMAX, False)])
def test_the_call_plan_gives_the_same_bytes(num_layers, num_post, lists):
    """A second call with the same key takes the native call plan (built by the first)."""
    import importlib

    from tilebake._runtime import plan

    op = importlib.import_module("tilebake.mhc.mhc_multilayer_recompute")
    r0, pre, out, post, comb = layers(num_layers, num_post, 33, 4, 1032, "cuda")
    args = [r0, pre, out, post, comb] if lists else [r0, tuple(pre), tuple(out), tuple(post), tuple(comb)]
    first, second = outputs(r0, num_layers, num_post), outputs(r0, num_layers, num_post)
    tilebake.mhc.mhc_multilayer_recompute(*args, *first)
    if plan.available():
        assert op._key(*args, *first) in op._PLANS
    tilebake.mhc.mhc_multilayer_recompute(*args, *second)
    for name, a, b in zip(("layer_input", "residual"), first, second):
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bytes_equal(y.cpu(), x.cpu(), f"{name} {i}")
