"""A two-block mHC model trained with tilebake.modeling.mhc, step by step against the same model
written in plain torch from tilebake.torch.mhc's references (float64, with autograd).

    ids -> embedding -> expand_from_embedding -> [mhc_pre -> MLP -> mhc_post] x 2 -> mhc_head -> linear -> loss

The model holds its streams in bf16 (the embedding's output, each layer input and output, the
residual streams, the head's output), its parameters in fp32. The reference holds the same
values in float64, rounded to bf16 where the model stores bf16 (so its gradients of those
tensors are bf16 values too), and computes everything else in float64: what remains between the
two is the kernels' fp32 arithmetic (and on CUDA fn read with 16 mantissa bits). Both train
with plain SGD from the same initial weights, each on its own gradients.
"""

import pytest
import torch
import torch.nn.functional as F

from tilebake.modeling import mhc
from tilebake.torch import mhc as ref

POST_MULT, EPS, REPEAT = 2.0, 1e-6, 10
STEPS = 4
# Gradient tolerances: the norm of the difference over the norm of the reference gradient, per
# weight. The structural difference is where bf16 gradients are rounded (the model rounds each
# kernel's output and autograd's bf16 sums; the reference once per stored tensor): about 2^-9 of
# each stream gradient element. Weight matrices average that noise (measured <= 7e-3 over 20
# seeds, m = 1 to 8). The scale and base vectors hold sums over every token and mix that largely
# cancel (a softmax's gradient sums to zero over each row), so the same noise is a larger part
# of them (measured <= 5e-2).
MATRIX_TOL, VECTOR_TOL = 2e-2, 1e-1
VECTORS = ("scale", "base", "head_scale", "head_base")


def init(m, hidden, vocab, device):
    """The weights: every block's fn, norm weight, scale, base and MLP; the head's fn, scale, base;
    the embedding and the output layer. fp32."""
    m3, k, ffn = m * (m + 2), m * hidden, 2 * hidden
    # the head sums m streams: the output layer scaled by 1 / m keeps the first logits O(1)
    g = {"embed": torch.randn(vocab, hidden), "out": torch.randn(vocab, hidden) / (m * hidden**0.5),
         "head_fn": torch.randn(m, k) / k**0.5, "head_scale": torch.rand(1) + 0.5,
         "head_base": 0.3 * torch.randn(m)}  # fmt: skip
    for b in range(2):
        g[f"fn{b}"] = torch.randn(m3, k) / k**0.5
        g[f"nw{b}"] = 1 + 0.1 * torch.randn(k)
        g[f"scale{b}"] = torch.rand(3) * 0.5 + 0.1
        g[f"base{b}"] = 0.3 * torch.randn(m3)
        g[f"w1_{b}"] = torch.randn(ffn, hidden) / hidden**0.5
        g[f"w2_{b}"] = 0.5 * torch.randn(hidden, ffn) / ffn**0.5
    return {name: t.to(device).requires_grad_() for name, t in g.items()}


def mlp(x, w1, w2):
    return F.silu(x @ w1.t()) @ w2.t()


def tilebake_loss(w, ids, targets, m):
    streams = mhc.expand_from_embedding(w["embed"][ids].bfloat16(), mhc_mult=m)
    for b in range(2):
        layer_input, (post, comb) = mhc.mhc_pre(streams, w[f"fn{b}"], w[f"scale{b}"], w[f"base{b}"],
                                                norm_weight=w[f"nw{b}"], norm_eps=EPS, mhc_mult=m,
                                                post_mult_value=POST_MULT, pre_eps=EPS, sinkhorn_eps=EPS,
                                                sinkhorn_repeat=REPEAT)  # fmt: skip
        out = mlp(layer_input.float(), w[f"w1_{b}"], w[f"w2_{b}"]).bfloat16()
        streams = mhc.mhc_post(out, streams, post, comb)
    hidden = mhc.mhc_head(streams, w["head_fn"], w["head_scale"], w["head_base"], norm_eps=EPS, mhc_mult=m, pre_eps=EPS)
    logits = hidden.float() @ w["out"].t()
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def bf16(t):
    """t's value rounded to bf16, kept in float64 (its gradient rounded to bf16 as well)."""
    return t.bfloat16().double()


def reference_loss(w, ids, targets, m):
    streams = bf16(ref.expand_to_mhc_ref(bf16(w["embed"][ids]), m))
    for b in range(2):
        mixes = ref.mhc_pre_norm_fn_ref(streams, w[f"fn{b}"], w[f"nw{b}"], EPS)
        pre, post, comb = ref.mhc_pre_split_mixes_ref(mixes, w[f"scale{b}"], w[f"base{b}"], m, POST_MULT, EPS)
        comb = ref.sinkhorn_normalize_ref(comb, REPEAT, EPS)
        layer_input = bf16((pre * streams).sum(-2))
        out = bf16(mlp(layer_input, w[f"w1_{b}"], w[f"w2_{b}"]))
        streams = bf16(post * out.unsqueeze(-2) + torch.einsum("...io,...ic->...oc", comb, streams))
    mixes = ref.mhc_pre_norm_fn_ref(streams, w["head_fn"], None, EPS)
    mix = ref.mhc_head_compute_mix_ref(mixes, w["head_scale"], w["head_base"], EPS)
    hidden = bf16((mix.unsqueeze(-1) * streams).sum(-2))
    logits = hidden @ w["out"].t()
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def assert_close_norm(got, want, tol, name):
    """||got - want|| <= tol ||want||, both finite (NaN never passes)."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    assert torch.isfinite(got).all() and torch.isfinite(want).all(), f"{name}: non-finite values"
    err = float((got - want).norm() / want.norm().clamp_min(1e-30))
    assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


def train_and_compare(m, hidden, vocab, lead, device):
    """STEPS of SGD of both models from the same weights, compared before every update. The
    step size falls with m (the gradients grow with the streams) so that the runs descend
    smoothly: a chaotic run would amplify the models' rounding differences step by step."""
    lr = 0.2 / m**2
    ids = torch.randint(0, vocab, lead, device=device)
    targets = torch.randint(0, vocab, lead, device=device)
    w = init(m, hidden, vocab, device)
    w64 = {name: t.detach().cpu().double().requires_grad_() for name, t in w.items()}
    losses = []
    for step in range(STEPS):
        loss = tilebake_loss(w, ids, targets, m)
        loss.backward()
        want = reference_loss(w64, ids.cpu(), targets.cpu(), m)
        want.backward()
        assert torch.isfinite(loss) and torch.isfinite(want), f"step {step}: loss {loss}, reference {want}"
        # measured <= 2e-4
        assert abs(loss.item() - want.item()) <= 1e-3 * abs(want.item()), f"step {step}: {loss.item()} vs {want.item()}"
        for name, p in w.items():
            assert p.grad is not None and p.grad.dtype == torch.float32 and p.grad.shape == p.shape, name
            tol = VECTOR_TOL if name.startswith(VECTORS) else MATRIX_TOL
            assert_close_norm(p.grad, w64[name].grad, tol, f"step {step}: grad {name}")
        with torch.no_grad():
            for name in w:
                w[name] -= lr * w[name].grad
                w64[name] -= lr * w64[name].grad
                w[name].grad = None
                w64[name].grad = None
        losses.append(want.item())
    assert losses[-1] < losses[0], f"the loss should fall: {losses}"


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_two_blocks_train_like_the_reference_cpu(m):
    train_and_compare(m, hidden=128, vocab=64, lead=(2, 37), device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_two_blocks_train_like_the_reference_gpu(m):
    train_and_compare(m, hidden=512, vocab=256, lead=(3, 129), device="cuda")
