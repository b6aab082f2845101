"""The general (more than 1024 experts) variants of topk_gate, moe_topk_gate_backward and
get_fused_mapping, their generated CUDA C++ run on the CPU by build_tools/block_emu.py (a fiber
per thread, warp-greedy random schedules, stuck barriers reported) against the references,
through each op's own launch code (_launch with the emulated kernels in its tables). Opt-in
(TILEBAKE_EMULATE=1: it lowers the variants and compiles them with g++, about a minute); needs
tilelang and g++. The GPU tests cover the same and more on a device."""

import importlib
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import EMULATED
from tests.moe.mapping_helpers import random_topk_idx
from tests.moe.test_get_fused_mapping import check_against
from tests.moe.test_moe_topk_gate_backward import RSF, assert_close_to_ref, forward_inputs
from tests.moe.test_topk_gate import assert_indices_equal, make_scores
from tilebake.torch import get_fused_mapping, moe_topk_gate_backward_ref, stable_topk

pytestmark = EMULATED

ROOT = Path(__file__).resolve().parents[2]
topk_op = importlib.import_module("tilebake.moe.topk_gate")
backward_op = importlib.import_module("tilebake.moe.moe_topk_gate_backward")
mapping_op = importlib.import_module("tilebake.moe.get_fused_mapping")


@pytest.fixture(scope="module")
def emulate(tmp_path_factory):
    """emulate(table, key, variant): the emulated kernel for `variant`, put in `table` for this module."""
    sys.path.insert(0, str(ROOT / "build_tools"))
    try:
        import aot
        import block_emu
    finally:
        sys.path.remove(str(ROOT / "build_tools"))
    out = tmp_path_factory.mktemp("block_emu")
    added = []

    def put(table, variant):
        key = tuple(getattr(variant, f) for f in variant.__dataclass_fields__ if f not in ("family", "op"))
        if key not in table:
            aot.lower_one(variant, "sm_90a", out)
            cu = out / "sm_90a" / f"{variant.id}.cu"
            table[key] = block_emu.EmulatedKernel(str(cu), str(out / f"{variant.id}.so"), variant.arg_names)
            added.append((table, key))
        return table[key]

    yield put
    for table, key in added:
        del table[key]


@pytest.fixture(scope="module")
def topk(emulate):
    for m in topk_op.MAX_EXPERTS:
        emulate(topk_op._KERNELS, topk_op.TopkGateVariant(m))
    return topk_op._KERNELS


@pytest.mark.parametrize("num_experts,k", [(1025, 1), (1025, 8), (4097, 32), (5000, 9), (8192, 32), (300, 6)])
@pytest.mark.parametrize("ties", [False, True])
def test_topk_gate(topk, num_experts, k, ties):
    scores = make_scores(5, num_experts, ties, "cpu")
    for seed in (1, 2):
        topk[(topk_op.experts_bucket(num_experts),)].seed = seed
        assert_indices_equal(topk_op._launch(scores, k), stable_topk(scores, k), scores)


def test_topk_gate_non_finite_strided_and_signed_zeros(topk):
    wide = make_scores(6, 6007, False, "cpu")
    scores = wide[:, 3 : 3 + 6000]
    scores[1, 5999] = float("nan")
    scores[4, 0] = -float("inf")
    got = topk_op._launch(scores, 8)
    assert (got[[1, 4]] == -1).all()
    keep = [0, 2, 3, 5]
    assert_indices_equal(got[keep], stable_topk(scores[keep], 8), scores[keep])
    zeros = torch.where(torch.arange(8192) % 3 == 0, -0.0, 0.0).expand(2, 8192).contiguous()
    assert torch.equal(topk_op._launch(zeros, 32), torch.arange(32).expand(2, 32))


@pytest.mark.parametrize(
    "num_experts,k,func,num_seqs,duplicates",
    [(1025, 8, "sqrtsoftplus", 1, False), (4097, 32, "softmax", 2, True), (5000, 9, "sigmoid", 0, False),
     (8192, 32, "softmax", 1, False), (8192, 1, "sqrtsoftplus", 0, False), (2000, 6, "sqrtsoftplus", 3, True)],
)  # fmt: skip
def test_moe_topk_gate_backward(emulate, num_experts, k, func, num_seqs, duplicates):
    emulate(backward_op._KERNELS, backward_op.MoeTopkGateBackwardVariant(8192))
    _, u, idx, w, g, mask, h = forward_inputs(6, num_experts, k, func, "cpu", num_seqs, 0.3 if num_seqs else 0.0,
                                              duplicates)  # fmt: skip
    got = backward_op._launch(u, idx, w, g, RSF, func, mask, h, None)
    chosen = idx >= 0
    sums = (u.double().gather(1, idx.clamp(min=0)) * chosen).sum(1)
    routed = chosen.any(1) & (sums > 0)
    term_scale = (RSF * g.double().abs().amax(1)[routed] / sums[routed]).max().item() if routed.any() else 0.0
    assert_close_to_ref(got, moe_topk_gate_backward_ref(u.double(), idx, w, g, RSF, func, mask, h), mask, term_scale)


@pytest.fixture(scope="module")
def mapping(emulate):
    for v in mapping_op.GetFusedMappingVariant.all():
        emulate(mapping_op._KERNELS, v)


@pytest.mark.parametrize(
    "num_tokens,num_topk,num_experts,alignment,size,force",
    [(300, 8, 1025, 1, 0, False), (500, 9, 8192, 16, 0, False), (200, 6, 5000, 128, 0, False),
     (64, 32, 4097, 4, 0, False), (1, 1, 8192, 1, 0, False), (900, 8, 2000, 8, 3000, False),
     (900, 8, 2000, 8, 0, True), (2000, 8, 8192, 16, 0, False), (37, 6, 72, 16, 0, False)],
)  # fmt: skip
def test_get_fused_mapping(mapping, num_tokens, num_topk, num_experts, alignment, size, force):
    """Wide stages (and, for 72 experts, the fast ones); 2000 x 8 at 8192 experts: 16 steps a segment."""
    topk_idx = random_topk_idx(num_tokens, num_topk, num_experts, drop=0.2)
    topk_idx[::3, 0] = 4321 % num_experts  # one expert owns a long run
    result = mapping_op._launch(topk_idx, num_experts, size, alignment, force)
    check_against(result, get_fused_mapping(topk_idx, num_experts, size, alignment, force))
