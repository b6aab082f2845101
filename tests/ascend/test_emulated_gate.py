"""The router's Ascend kernels run on the CPU (emulator.py) through their NPU wrappers, against
the references. Forward (tilebake.torch.gate): every scoring function, every option, grouped
routing, non-finite rows, 1 token, expert counts up to the kernel's bound; indices and
unmapped_topk_idx bit-exact, weights and scores within the GPU tests' tolerances (the logits are
those tests' separated ones, so that last-bit differences of the math functions cannot reorder
experts). Backward (the float64 tilebake.torch.moe reference): within the original's tolerance
(rtol 1e-5, atol 1e-5 * max|ref|), with sequences, masks, duplicates, strided rows and
out-of-range indices. A model, not an NPU: nothing here ran on one."""

import math

import pytest
import torch

from tests.ascend.test_emulated import emulator  # noqa: F401 (the session's emulator fixture)
from tests.moe.gate_forward_helpers import (
    ALL,
    FUNCS,
    assert_gate_equal,
    call_both,
    make_options,
    separated_logits,
    unscored_rows,
)
from tests.moe.test_moe_topk_gate_backward import RSF, assert_close_to_ref, forward_inputs
from tilebake.moe import _moe_topk_gate_ascend
from tilebake.moe._router import check_gate_args
from tilebake.moe.moe_topk_gate_backward import check_arguments
from tilebake.torch.moe import moe_topk_gate_backward_ref

pytest.importorskip("tilelang")


@pytest.fixture
def emu(emulator, monkeypatch):  # noqa: F811
    emulator.install(monkeypatch, _moe_topk_gate_ascend)
    return emulator


def npu_gate(logits, num_topk, use_shared, num_shared, rsf, ep_rank, func, out=None, scores=None, num_groups=1,
             num_topk_groups=1, **opts):  # fmt: skip
    """moe_topk_gate_forward's NPU path (checked arguments, then the wrapper) on CPU tensors."""
    names = ("mask", "bias", "image_bias", "image_token_mask", "fix_routing_mask", "to_physical_map",
             "logical_count", "unmapped_topk_idx", "force_random")  # fmt: skip
    o = [opts.get(n) for n in names]
    _, _, k, shared = check_gate_args(
        logits, num_topk, use_shared, num_shared, rsf, ep_rank, func, *o, out, scores, num_groups, num_topk_groups
    )
    return _moe_topk_gate_ascend.forward_npu(logits, k, shared, rsf, ep_rank, func, *o, out, scores, num_groups,
                                             num_topk_groups)  # fmt: skip


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize(
    "num_tokens, num_experts, k, shared, which",
    [(1, 8, 1, 0, set()), (67, 256, 8, 1, {"bias", "mask"}), (70, 72, 6, 2, ALL), (5, 1000, 9, 0, {"map", "fix"}),
     (3, 8192, 16, 2, {"bias", "unmapped"})],
)  # fmt: skip
def test_forward_matches_the_reference(emu, func, num_tokens, num_experts, k, shared, which):
    opts = make_options(num_tokens, num_experts, k, shared, which)
    logits = separated_logits(num_tokens, num_experts, k, func, opts.get("bias"))
    got, ref = call_both(npu_gate, logits, k, shared > 0, shared, 2.5, 3, func, opts)
    assert_gate_equal(got, ref, zero_rows=unscored_rows(opts, num_tokens))


@pytest.mark.parametrize("num_experts, groups, topk_groups, k", [(256, 8, 4, 8), (72, 6, 2, 5), (96, 32, 3, 4)])
def test_grouped_routing(emu, num_experts, groups, topk_groups, k):
    opts = make_options(40, num_experts, k, 0, {"bias", "image"})
    logits = separated_logits(40, num_experts, k, "sqrtsoftplus", opts.get("bias"), groups, topk_groups)
    kw = {"num_groups": groups, "num_topk_groups": topk_groups}
    got, ref = call_both(npu_gate, logits, k, False, 0, 1.0, 0, "sqrtsoftplus", opts, **kw)
    assert_gate_equal(got, ref)


def test_non_finite_rows_and_random_routing_with_full_draws(emu):
    """A NaN / inf logit unroutes its token (its scores row NaN unless masked out or random: 0);
    k == experts == 32 makes the random draws collide (the smallest-free fallback)."""
    logits = torch.randn(9, 32)
    logits[1, 3], logits[2, 0], logits[4, 31] = math.nan, math.inf, -math.inf
    mask = torch.tensor([1, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    force = torch.tensor([0, 0, 1, 0, 0, 1, 1, 1, 0], dtype=torch.bool)
    opts = {"mask": mask, "force_random": force, "unmapped_topk_idx": torch.zeros(9, 32, dtype=torch.int64)}
    got, ref = call_both(npu_gate, logits, 32, False, 0, 1.0, 5, "sqrtsoftplus", opts)
    assert_gate_equal(got, ref, bad_rows=torch.tensor([0, 1, 1, 0, 1, 0, 0, 0, 0], dtype=torch.bool),
                      zero_rows=unscored_rows(opts, 9))  # fmt: skip


def test_given_outputs_and_strided_logits(emu):
    wide = torch.randn(33, 300)
    logits = wide[:, :256]
    out = (torch.empty(33, 9, dtype=torch.int64), torch.empty(33, 9))
    idx, w = npu_gate(logits, 8, True, 1, 1.0, 0, "sigmoid", out=out)
    want = call_both(npu_gate, logits.contiguous(), 8, True, 1, 1.0, 0, "sigmoid", {})[1]
    assert idx is out[0] and w is out[1] and torch.equal(idx, want[0])
    torch.testing.assert_close(w, want[1], rtol=1e-5, atol=1e-7)


def npu_backward(scores, idx, w, g, rsf, func, mask=None, grad_scores_sum=None, out=None):
    check_arguments(scores, idx, w, g, rsf, func, mask, grad_scores_sum, out)
    return _moe_topk_gate_ascend.backward_npu(scores, idx, w, g, rsf, func, mask, grad_scores_sum, out)


@pytest.mark.parametrize(
    "num_tokens, num_experts, k, func, num_seqs, masked, duplicates",
    [(1, 8, 1, "sqrtsoftplus", 0, 0.0, False), (67, 256, 8, "sqrtsoftplus", 1, 0.1, False),
     (70, 72, 6, "sqrtsoftplus", 7, 0.3, True), (40, 300, 9, "softmax", 4, 0.1, False),
     (33, 1025, 8, "sigmoid", 0, 0.5, False), (3, 8192, 32, "softmax", 3, 0.0, True)],
)  # fmt: skip
def test_backward_matches_the_reference(emu, num_tokens, num_experts, k, func, num_seqs, masked, duplicates):
    _, u, idx, w, g, mask, h = forward_inputs(num_tokens, num_experts, k, func, "cpu", num_seqs, masked, duplicates)
    u = torch.cat([u, u[:, :3]], 1)[:, :num_experts]  # strided rows
    idx, w, g = (torch.cat([t, t[:, :1]], 1)[:, :k] for t in (idx, w, g))
    ref = moe_topk_gate_backward_ref(u.double(), idx, w, g, RSF, func, mask, h)
    out = torch.full((num_tokens, num_experts + 5), math.nan)[:, :num_experts]
    got = npu_backward(u, idx, w, g, RSF, func, mask, h, out)
    assert got is out
    chosen = idx >= 0
    sums = (u.double().gather(1, idx.clamp(min=0)) * chosen).sum(1)
    routed = chosen.any(1) & (sums > 0)
    term_scale = (RSF * g.double().abs().amax(1)[routed] / sums[routed]).max().item() if routed.any() else 0.0
    assert_close_to_ref(got, ref, mask, term_scale)


def test_backward_ignores_out_of_range_indices(emu):
    """As on a GPU: an index outside [0, E) counts as -1 (no check, no sync)."""
    _, u, idx, w, g, _, _ = forward_inputs(50, 72, 6, "sqrtsoftplus", "cpu")
    bad = idx.clone()
    bad[::3, 0] = 72
    bad[1::3, 1] = -5
    clean = torch.where((bad >= 0) & (bad < 72), bad, -1)
    assert torch.equal(npu_backward(u, bad, w, g, RSF, "sqrtsoftplus"), npu_backward(u, clean, w, g, RSF, "sqrtsoftplus"))
