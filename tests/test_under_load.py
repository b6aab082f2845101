"""The cases whose results changed when 14 test processes shared the H200 (issue 18: the router's
backward at 512 tokens, 256 experts, top-8, 2 shared experts, with and without the image bias and
the aux term, and 72 experts, top-6, 2 sequences; apply_rotary on 3-D and 4-D inputs of 128 heads
of dim 128, NeoX, int64 positions, conjugate), run REPEATS times each while LOADERS other
processes keep the GPU busy (copies and matmuls on their own contexts). Every run must equal the
reference and be bit-identical to the first (each of these ops is deterministic by contract).

GPU only. TILEBAKE_LOAD_REPEATS raises the count for a long run on the device.
"""

import os
import subprocess
import sys

import pytest
import torch

import tilebake
from tests.moe.gate_forward_helpers import assert_gate_equal, call_both, make_options, separated_logits
from tests.moe.test_moe_topk_gate_backward import RSF, assert_close_to_ref, forward_inputs
from tests.transform.test_apply_rotary import assert_same, make_cache, wide_binades
from tilebake.torch import moe_topk_gate_backward_ref, rotary_embedding_ref

pytestmark = pytest.mark.gpu

LOADERS = 3
REPEATS = int(os.environ.get("TILEBAKE_LOAD_REPEATS", "30"))
# A loader: 512 MiB copies and 4096^3 matmuls back to back until killed (or 10 minutes).
LOAD = """
import sys, time, torch
a, b = torch.empty(2**27, device="cuda"), torch.empty(2**27, device="cuda")
x = torch.randn(4096, 4096, device="cuda")
print("ready", flush=True)
end = time.time() + 600
while time.time() < end:
    for _ in range(8):
        b.copy_(a)
        x = torch.mm(x, x).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


@pytest.fixture(scope="module")
def gpu_load():
    procs = [subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True) for _ in range(LOADERS)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", "a GPU loader did not start"
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def assert_repeats_identical(run, name: str):
    """run() REPEATS times; every result's tensors bit-equal to the first run's (NaN pattern too)."""
    first = [t.clone() for t in run()]
    for i in range(REPEATS):
        for j, (got, want) in enumerate(zip(run(), first)):
            same = torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
            where = (got != want).nonzero()[:3].tolist()
            assert same, f"{name}: run {i + 1}, result {j} differs from the first run's at {where}"
    return first


def term_scale(u, idx, g) -> float:
    """The largest route term, RSF |g| / (a token's selected scores' sum): the tolerance's floor
    (tests/moe/test_moe_topk_gate_backward.py's _check_kernel)."""
    chosen = idx >= 0
    sums = (u.double().gather(1, idx.clamp(min=0)) * chosen).sum(1)
    routed = chosen.any(1) & (sums > 0)
    return (RSF * g.double().abs().amax(1)[routed] / sums[routed]).max().item() if routed.any() else 0.0


OPTIONS = {"plain": set(), "image": {"image"}, "image-bias-mask": {"image", "bias", "mask"}}


@pytest.mark.parametrize("which", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("aux", [False, True])
def test_router_forward_and_backward_under_load(gpu_load, which, aux):
    num_tokens, num_experts, k, num_shared = 512, 256, 8, 2
    opts = make_options(num_tokens, num_experts, k, num_shared, which, device="cuda")
    logits = separated_logits(num_tokens, num_experts, k, "sqrtsoftplus", opts.get("bias"))
    if "image_bias" in opts:
        img = separated_logits(num_tokens, num_experts, k, "sqrtsoftplus", opts["image_bias"])
        logits = torch.where(opts["image_token_mask"].cpu()[:, None], img, logits)
    logits = logits.cuda()
    got, ref = call_both(tilebake.moe.moe_topk_gate_forward, logits, k, True, num_shared, RSF, 3, "sqrtsoftplus", opts)
    assert_gate_equal(got, ref)

    def forward():
        scores = torch.empty(logits.shape, device="cuda")
        idx, w = tilebake.moe.moe_topk_gate_forward(logits, k, True, num_shared, RSF, 3, "sqrtsoftplus", scores=scores,
                                                    **opts)  # fmt: skip
        return idx, w, scores

    idx, w, scores = assert_repeats_identical(forward, "moe_topk_gate_forward")
    # The backward of the routed slots (the shared slots carry no score gradient).
    routed_idx, routed_w = idx[:, :k].contiguous(), w[:, :k].contiguous()
    grad = torch.randn(num_tokens, k, device="cuda")
    mask = opts.get("mask")
    h = torch.randn(1, num_experts, device="cuda") if aux else None
    if aux and mask is None:
        mask = torch.ones(num_tokens, dtype=torch.bool, device="cuda")
    ref = moe_topk_gate_backward_ref(scores.double(), routed_idx, routed_w, grad, RSF, "sqrtsoftplus", mask, h)

    def backward():
        return (tilebake.moe.moe_topk_gate_backward(scores, routed_idx, routed_w, grad, RSF, "sqrtsoftplus", mask=mask,
                                                    grad_scores_sum=h),)  # fmt: skip

    (dx,) = assert_repeats_identical(backward, "moe_topk_gate_backward")
    assert_close_to_ref(dx, ref, mask, term_scale(scores, routed_idx, grad))


def test_router_backward_72_experts_two_sequences_under_load(gpu_load):
    _, u, idx, w, g, mask, h = forward_inputs(512, 72, 6, "sqrtsoftplus", "cuda", num_seqs=2, masked=0.1)
    ref = moe_topk_gate_backward_ref(u.double(), idx, w, g, RSF, "sqrtsoftplus", mask, h)

    def run():
        return (tilebake.moe.moe_topk_gate_backward(u, idx, w, g, RSF, "sqrtsoftplus", mask=mask, grad_scores_sum=h),)

    (dx,) = assert_repeats_identical(run, "moe_topk_gate_backward")
    assert_close_to_ref(dx, ref, mask, term_scale(u, idx, g))


@pytest.mark.parametrize("lead", [(1000,), (2, 500)], ids=["3d", "4d"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_apply_rotary_128_heads_under_load(gpu_load, lead, dtype):
    cache = make_cache(4096, 128, "cuda")
    q0 = wide_binades((*lead, 128, 128), dtype, "cuda")
    k0 = wide_binades((*lead, 8, 128), dtype, "cuda")
    positions = torch.randint(0, 4096, lead, device="cuda", dtype=torch.int64)
    want_q, want_k = rotary_embedding_ref(q0.clone(), cache, k0.clone(), positions, False, True, 0)

    def run():
        q, k = q0.clone(), k0.clone()
        tilebake.transform.apply_rotary(q, cache, k, positions, False, True, 0)
        return q, k

    q, k = assert_repeats_identical(run, "apply_rotary")
    assert_same(q, want_q, "query")
    assert_same(k, want_k, "key")
