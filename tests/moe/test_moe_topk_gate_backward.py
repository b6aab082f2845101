"""moe_topk_gate_backward: the float64 reference against float64 autograd of the forward formula,
argument checks and the CPU path (CI); the fp32 kernel against the float64 reference on a GPU.

Tolerance (../shared/spec/testing.md, the original's): rtol=1e-5, atol=1e-5 * max|ref|; rows of
masked tokens exactly zero.
"""

import pytest
import torch

import tilebake
from tests.helpers import poison_
from tilebake.torch import moe_topk_gate_backward_ref, stable_topk
from tilebake.torch.topk import score

RSF = 2.5  # routed_scaling_factor


def forward_inputs(num_tokens, num_experts, k, func, device, num_seqs=0, masked=0.0, duplicates=False):
    """(logits, u, idx, weights, grad_weights, mask, grad_scores_sum) as the forward makes them:
    u = score(logits), idx = stable top-k of u + bias, weights = RSF * u[idx] / (1e-20 + sum),
    masked tokens (a fraction `masked`) get idx -1 and weight 0; one slot in five of the other
    tokens is -1 too (a masked slot); `duplicates` repeats slot 0 in slot 1 (fixed routing)."""
    logits = torch.randn(num_tokens, num_experts, device=device) * 3
    u = score(logits, func)
    bias = torch.randn(num_experts, device=device) * 0.1
    idx = stable_topk(u + bias, k)
    mask = torch.rand(num_tokens, device=device) >= masked
    if k > 1:
        idx[torch.rand(num_tokens, k, device=device) < 0.2] = -1
        if duplicates:
            idx[:, 1] = idx[:, 0]
    idx[~mask] = -1
    valid = idx >= 0
    sel = torch.where(valid, u.gather(1, idx.clamp(min=0)), 0.0)
    den = 1e-20 + sel.sum(1, keepdim=True)
    weights = sel / den * RSF
    grad_w = torch.randn(num_tokens, k, device=device)
    h = torch.randn(num_seqs, num_experts, device=device) if num_seqs else None
    return logits, u, idx, weights, grad_w, (mask if num_seqs or masked else None), h


def autograd_grad(logits, idx, grad_w, func, mask, h):
    """d/dlogits of sum(grad_w * weights) + sum(h * per-sequence sums of u / sum(u)), float64."""
    x = logits.double().requires_grad_()
    if func == "sqrtsoftplus":
        u = torch.sqrt(torch.nn.functional.softplus(x))
    elif func == "sigmoid":
        u = torch.sigmoid(x)
    else:
        u = torch.softmax(x, dim=1)
    valid = idx >= 0
    sel = torch.where(valid, u.gather(1, idx.clamp(min=0)), 0.0)
    weights = sel / (1e-20 + sel.sum(1, keepdim=True)) * RSF
    loss = (weights * grad_w.double()).sum()
    if h is not None:
        normalized = torch.where(mask[:, None], u / u.sum(1, keepdim=True), 0.0)
        per_seq = normalized.view(h.shape[0], -1, u.shape[1]).sum(1)
        loss = loss + (per_seq * h.double()).sum()
    loss.backward()
    return x.grad


def assert_close_to_ref(got, ref, mask=None, term_scale=0.0):
    """rtol 1e-5, atol 1e-5 * max|ref| (the original's), floored at 1e-5 * term_scale: the size of
    the terms that cancel when the exact gradient vanishes (k = 1 without the aux term gives
    weights that do not depend on the scores, and fp32 leaves a residue ~1e-9 of the terms);
    masked rows exactly zero; the first bad (token, expert) named."""
    ref = ref.double().cpu()
    got = got.double().cpu()
    atol = 1e-5 * max(ref.abs().max().item(), term_scale)
    bad = ~((got - ref).abs() <= atol + 1e-5 * ref.abs())  # NaN is bad
    if bad.any():
        t, e = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{int(bad.sum())} of {bad.numel()} values off; first at token {t}, expert {e}: got {got[t, e].item()!r}, "
            f"expected {ref[t, e].item()!r} (atol {atol:.3g})"
        )
    if mask is not None:
        rows = (~mask.cpu()).nonzero().flatten()
        nonzero = got[rows] != 0
        assert not nonzero.any(), f"masked token {int(rows[nonzero.any(1).nonzero()[0]])} has a non-zero gradient"


# --- the reference against float64 autograd ---


@pytest.mark.parametrize("func", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize("aux", [False, True])
def test_reference_is_the_gradient(func, aux):
    num_seqs = 3 if aux else 0
    logits, u, idx, w, g, mask, h = forward_inputs(
        24, 40, 6, func, "cpu", num_seqs=num_seqs, masked=0.25, duplicates=True
    )
    expected = autograd_grad(logits, idx, g, func, mask if mask is not None else torch.ones(24, dtype=bool), h)
    got = moe_topk_gate_backward_ref(u, idx, w, g, RSF, func, mask, h)
    assert got.dtype == torch.float32
    assert_close_to_ref(got, expected, mask)
    got64 = moe_topk_gate_backward_ref(u.double(), idx, w, g, RSF, func, mask, h)
    assert got64.dtype == torch.float64


def test_reference_sqrtsoftplus_derivative_edges():
    """u = 0 (softplus underflow) gives 0; tiny u is accurate (expm1, no cancellation); large logits."""
    logits = torch.tensor([[-200.0, -30.0, -10.0, 0.0, 25.0, 90.0]])
    u = score(logits, "sqrtsoftplus")
    assert u[0, 0] == 0
    idx = torch.tensor([[0, 1, 2, 3, 4, 5]])
    g = torch.tensor([[1.0, -2.0, 3.0, 0.5, 1.5, -1.0]])
    w = u / (1e-20 + u.sum()) * RSF
    got = moe_topk_gate_backward_ref(u, idx, w, g, RSF)
    expected = autograd_grad(logits, idx, g, "sqrtsoftplus", None, None)
    assert got[0, 0] == 0
    torch.testing.assert_close(got[0, 1:].double(), expected[0, 1:], rtol=1e-5, atol=0)


def test_reference_rejects_bad_indices_and_scoring():
    u = torch.rand(2, 8)
    ones = torch.ones(2, 2)
    with pytest.raises(ValueError, match=r"topk_idx must hold expert indices in \[0, 8\) or -1 \(masked\), got 8"):
        moe_topk_gate_backward_ref(u, torch.tensor([[0, 8], [1, 2]]), ones, ones, 1.0)
    with pytest.raises(ValueError, match="got -2"):
        moe_topk_gate_backward_ref(u, torch.tensor([[0, -2], [1, 2]]), ones, ones, 1.0)
    with pytest.raises(ValueError, match="scoring_func must be one of"):
        moe_topk_gate_backward_ref(u, torch.tensor([[0, 1], [1, 2]]), ones, ones, 1.0, "relu")


# --- CPU: argument checks and the reference path ---


def _args(**overrides):
    args = dict(
        scores=torch.rand(4, 16),
        topk_idx=torch.zeros(4, 2, dtype=torch.int64),
        topk_weights=torch.zeros(4, 2),
        grad_topk_weights=torch.zeros(4, 2),
        routed_scaling_factor=1.0,
    )
    args.update(overrides)
    return args


BAD_CALLS = [
    (dict(scoring_func="relu"), NotImplementedError, r"one of \('sqrtsoftplus', 'sigmoid', 'softmax'\), got 'relu'"),
    (dict(scores=torch.rand(4, 16).double()), TypeError, "scores must be torch.float32, got torch.float64"),
    (dict(scores=torch.rand(4, 8193)), ValueError, r"num_experts\) must be in \[1, 8192\], got 8193"),
    (dict(scores=torch.rand(16, 4).t()), ValueError, "scores must be contiguous in its last dim"),
    (dict(topk_idx=torch.zeros(4, dtype=torch.int64)), ValueError, r"topk_idx must be a 2-D \(num_tokens, num_topk\)"),
    (dict(topk_idx=torch.zeros(4, 2, dtype=torch.int32)), TypeError, "topk_idx must be torch.int64, got torch.int32"),
    (dict(topk_idx=torch.zeros(3, 2, dtype=torch.int64)), ValueError, r"topk_idx must have shape \(4, 2\), got \(3,"),
    (dict(topk_idx=torch.zeros(4, 17, dtype=torch.int64)), ValueError, r"min\(num_experts=16, 32\)\], got 17"),
    (dict(topk_weights=torch.zeros(4, 3)), ValueError, r"topk_weights must have shape \(4, 2\), got \(4, 3\)"),
    (dict(grad_topk_weights=torch.zeros(4, 2).half()), TypeError, "grad_topk_weights must be torch.float32"),
    (dict(grad_topk_weights=torch.zeros(2, 4).t()), ValueError, "grad_topk_weights must be contiguous in its last dim"),
    (dict(routed_scaling_factor="2"), TypeError, "routed_scaling_factor must be a float, got str"),
    (dict(mask=torch.ones(4, dtype=torch.int8)), TypeError, "mask must be torch.bool, got torch.int8"),
    (dict(mask=torch.ones(5, dtype=torch.bool)), ValueError, r"mask must have shape \(4,\) \(num_tokens\), got \(5,\)"),
    (dict(grad_scores_sum=torch.zeros(2, 16)), ValueError, "grad_scores_sum needs mask"),
    (dict(mask=torch.ones(4, dtype=torch.bool), grad_scores_sum=torch.zeros(3, 16)), ValueError,
     r"num_seqs\) must be >= 1 and divide num_tokens=4, got 3"),
    (dict(mask=torch.ones(4, dtype=torch.bool), grad_scores_sum=torch.zeros(2, 8)), ValueError,
     r"grad_scores_sum must have shape \(2, 16\), got \(2, 8\)"),
    (dict(out=torch.zeros(4, 15)), ValueError, r"out must have shape \(4, 16\), got \(4, 15\)"),
    (dict(topk_idx=torch.tensor([[0, 16]] * 4)), ValueError, r"expert indices in \[0, 16\) or -1 \(masked\), got 16"),
]  # fmt: skip


@pytest.mark.parametrize("overrides,error,match", BAD_CALLS)
def test_bad_arguments(overrides, error, match):
    with pytest.raises(error, match=match):
        tilebake.moe.moe_topk_gate_backward(**_args(**overrides))


@pytest.mark.parametrize("func", ["sqrtsoftplus", "softmax"])
def test_cpu_path_is_the_reference(func):
    _, u, idx, w, g, mask, h = forward_inputs(20, 72, 8, func, "cpu", num_seqs=4, masked=0.2)
    expected = moe_topk_gate_backward_ref(u, idx, w, g, RSF, func, mask, h)
    got = tilebake.moe.moe_topk_gate_backward(u, idx, w, g, RSF, func, mask=mask, grad_scores_sum=h)
    assert torch.equal(got, expected)
    out = torch.full_like(u, float("nan"))
    assert tilebake.moe.moe_topk_gate_backward(u, idx, w, g, RSF, func, mask, h, out=out) is out
    assert torch.equal(out, expected)
    assert (got[~mask] == 0).all()


def test_cpu_path_takes_the_general_counts():
    """1025..8192 experts are accepted (the general variant on a GPU); the CPU path is the reference."""
    from tilebake.moe.moe_topk_gate_backward import MAX_EXPERTS, MoeTopkGateBackwardVariant

    assert MAX_EXPERTS[-1] == 8192 and {v.max_experts for v in MoeTopkGateBackwardVariant.all()} == set(MAX_EXPERTS)
    for num_experts in (1025, 8192):
        _, u, idx, w, g, mask, h = forward_inputs(3, num_experts, 32, "softmax", "cpu", num_seqs=1, masked=0.3)
        got = tilebake.moe.moe_topk_gate_backward(u, idx, w, g, RSF, "softmax", mask=mask, grad_scores_sum=h)
        assert torch.equal(got, moe_topk_gate_backward_ref(u, idx, w, g, RSF, "softmax", mask, h))


def test_cpu_mask_without_aux_zeroes_rows():
    """Beyond the original: mask alone (no grad_scores_sum) zeroes the masked tokens' rows."""
    _, u, idx, w, g, _, _ = forward_inputs(12, 16, 2, "sqrtsoftplus", "cpu")
    mask = torch.arange(12) % 3 != 0
    got = tilebake.moe.moe_topk_gate_backward(u, idx, w, g, RSF, mask=mask)
    full = tilebake.moe.moe_topk_gate_backward(u, idx, w, g, RSF)
    assert (got[~mask] == 0).all() and torch.equal(got[mask], full[mask])


# --- GPU: the kernel against the float64 reference ---


def _check_kernel(num_tokens, num_experts, k, func, num_seqs, masked=0.1, duplicates=False, strided=False):
    _, u, idx, w, g, mask, h = forward_inputs(num_tokens, num_experts, k, func, "cuda", num_seqs, masked, duplicates)
    if strided:  # rows of odd strides for every 2-D argument
        u = torch.cat([u, u[:, :3]], 1)[:, :num_experts]
        idx, w, g = (torch.cat([t, t[:, :1]], 1)[:, :k] for t in (idx, w, g))
    ref = moe_topk_gate_backward_ref(u.double(), idx, w, g, RSF, func, mask, h)
    out = poison_(torch.empty(num_tokens, num_experts + 5, device="cuda"))[:, :num_experts] if strided else None
    got = tilebake.moe.moe_topk_gate_backward(u, idx, w, g, RSF, func, mask=mask, grad_scores_sum=h, out=out)
    assert got.dtype == torch.float32 and got.shape == (num_tokens, num_experts)
    # The route terms' size: RSF * |g| / (sum of a token's selected scores), over routed tokens.
    chosen = idx >= 0
    sums = (u.double().gather(1, idx.clamp(min=0)) * chosen).sum(1)
    routed = chosen.any(1) & (sums > 0)
    term_scale = (RSF * g.double().abs().amax(1)[routed] / sums[routed]).max().item() if routed.any() else 0.0
    assert_close_to_ref(got, ref, mask, term_scale)


# Fast variants (a warp per token) to 1024 experts, then the general one (a CTA per token).
SQRTSOFTPLUS_CASES = [(1, 1), (8, 1), (8, 8), (31, 6), (72, 6), (72, 9), (256, 2), (256, 8), (512, 32), (1024, 8),
                      (1025, 8), (4097, 32), (5000, 9), (8192, 1), (8192, 32)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,k", SQRTSOFTPLUS_CASES)
@pytest.mark.parametrize("num_tokens", [1, 8001])
@pytest.mark.parametrize("aux", [False, True])
def test_kernel_sqrtsoftplus(num_tokens, num_experts, k, aux):
    _check_kernel(num_tokens, num_experts, k, "sqrtsoftplus", num_seqs=1 if aux else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("func", ["sigmoid", "softmax"])
@pytest.mark.parametrize("num_experts,k", [(8, 2), (72, 6), (256, 8), (1024, 32), (1025, 6), (5000, 9), (8192, 32)])
@pytest.mark.parametrize("aux", [False, True])
def test_kernel_other_scoring(func, num_experts, k, aux):
    _check_kernel(8001, num_experts, k, func, num_seqs=3 if aux else 0)


@pytest.mark.gpu
def test_kernel_many_tokens_sequences_duplicates_strides():
    _check_kernel(65536, 256, 8, "sqrtsoftplus", num_seqs=16, masked=0.05)
    _check_kernel(4000, 72, 6, "sqrtsoftplus", num_seqs=8, duplicates=True)  # fixed routing repeats an expert
    _check_kernel(999, 256, 8, "softmax", num_seqs=3, strided=True)
    _check_kernel(1001, 300, 9, "sqrtsoftplus", num_seqs=0, masked=0.5, strided=True)
    # The general variant: sequences, duplicates, strides.
    _check_kernel(4000, 2048, 8, "sqrtsoftplus", num_seqs=16, masked=0.05, duplicates=True)
    _check_kernel(999, 6000, 8, "softmax", num_seqs=3, strided=True)
    _check_kernel(501, 8192, 32, "sigmoid", num_seqs=0, masked=0.5, strided=True)


@pytest.mark.gpu
def test_kernel_all_masked_and_empty():
    _check_kernel(64, 256, 8, "sqrtsoftplus", num_seqs=2, masked=1.0)
    _check_kernel(64, 3000, 8, "softmax", num_seqs=2, masked=1.0)
    empty = torch.zeros(0, 16, device="cuda")
    idx = torch.zeros(0, 2, dtype=torch.int64, device="cuda")
    w = torch.zeros(0, 2, device="cuda")
    assert tilebake.moe.moe_topk_gate_backward(empty, idx, w, w, 1.0).shape == (0, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts", [72, 1500])
def test_kernel_ignores_out_of_range_indices(num_experts):
    """On a GPU an index outside [0, E) counts as -1 (no check, no sync; the CPU path raises)."""
    _, u, idx, w, g, _, _ = forward_inputs(100, num_experts, 6, "sqrtsoftplus", "cuda")
    bad = idx.clone()
    bad[::3, 0] = num_experts
    bad[1::3, 1] = -5
    clean = torch.where((bad >= 0) & (bad < num_experts), bad, -1)
    got = tilebake.moe.moe_topk_gate_backward(u, bad, w, g, RSF)
    assert torch.equal(got, tilebake.moe.moe_topk_gate_backward(u, clean, w, g, RSF))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_torch_compile_fullgraph_traces_the_routing_ops(device):
    """topk_gate -> normalize_weight -> moe_topk_gate_backward traced through their torch.library
    schemas with no graph break; the results equal the eager calls."""
    u = score(torch.randn(32, 72, device=device), "sqrtsoftplus")
    grad_w = torch.randn(32, 6, device=device)
    mask = torch.arange(32, device=device) % 5 != 0
    h = torch.randn(2, 72, device=device)

    def routing(u, g, m, hh):
        idx = tilebake.moe.topk_gate(u, 6)
        _, weights = tilebake.moe.normalize_weight(u.gather(1, idx))
        return idx, weights, tilebake.moe.moe_topk_gate_backward(u, idx, weights, g, 1.0, mask=m, grad_scores_sum=hh)

    expected = routing(u, grad_w, mask, h)
    got = torch.compile(routing, fullgraph=True, backend="aot_eager")(u, grad_w, mask, h)
    for a, e in zip(got, expected, strict=True):
        assert torch.equal(a, e)
