"""topk_gate: argument checks and the CPU path (CI); the kernel against tilebake.torch.stable_topk
on a GPU (bit-exact indices: the kernel compares the scores themselves, no arithmetic)."""

import math

import pytest
import torch

import tilebake
from tilebake.torch import stable_topk


def assert_indices_equal(got: torch.Tensor, expected: torch.Tensor, scores: torch.Tensor) -> None:
    """Same int64 (T, k); on a mismatch name the first differing token, both rows and the scores there."""
    assert got.dtype == torch.int64, got.dtype
    assert got.shape == expected.shape, (tuple(got.shape), tuple(expected.shape))
    bad = (got.cpu() != expected.cpu()).any(dim=1).nonzero().flatten()
    if bad.numel():
        t = int(bad[0])
        g, e = got[t].tolist(), expected[t].tolist()
        row = scores[t].cpu()
        detail = [(i, row[i].item() if 0 <= i < row.numel() else None) for i in g]
        raise AssertionError(
            f"{bad.numel()} of {got.shape[0]} tokens differ; first token {t}: got {g}, expected {e}; "
            f"scores at the got indices {detail}, at the expected {[row[i].item() for i in e]}"
        )


def make_scores(num_tokens, num_experts, ties, device):
    """Continuous normal scores over several binades, or few distinct values (exact ties)."""
    if ties:
        return torch.randint(-3, 4, (num_tokens, num_experts), device=device).float() / 4
    scale = torch.exp2(torch.randint(-8, 9, (num_tokens, 1), device=device).float())
    return torch.randn(num_tokens, num_experts, device=device) * scale


# --- CPU: argument checks and the reference path ---

BAD_CALLS = [
    (([[1.0]], 1), TypeError, "scores must be a torch.Tensor, got list"),
    ((torch.zeros(4, 8).half(), 1), TypeError, "scores must be torch.float32"),
    ((torch.zeros(8), 1), ValueError, r"scores must be 2-D \(num_tokens, num_experts\)"),
    ((torch.zeros(4, 0), 1), ValueError, r"num_experts\) must be in \[1, 8192\], got 0"),
    ((torch.zeros(4, 8193), 1), ValueError, r"must be in \[1, 8192\], got 8193"),
    ((torch.zeros(8, 4).t(), 1), ValueError, "contiguous in its last dim"),
    ((torch.zeros(4, 8), 0), ValueError, r"num_topk must be an int in \[1, min\(num_experts=8, 32\)\], got 0"),
    ((torch.zeros(4, 8), 9), ValueError, r"num_experts=8, 32\)\], got 9"),
    ((torch.zeros(4, 64), 33), ValueError, r"num_experts=64, 32\)\], got 33"),
    ((torch.zeros(4, 8), True), ValueError, "got True"),
    ((torch.zeros(4, 8), 2.0), ValueError, "got 2.0"),
]


@pytest.mark.parametrize("args,error,match", BAD_CALLS)
def test_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        tilebake.moe.topk_gate(*args)


@pytest.mark.parametrize("num_experts,k", [(1, 1), (8, 1), (72, 6), (256, 8), (1024, 32), (1025, 9), (8192, 32)])
@pytest.mark.parametrize("ties", [False, True])
def test_cpu_path_is_the_stable_topk(num_experts, k, ties):
    scores = make_scores(37, num_experts, ties, "cpu")
    got = tilebake.moe.topk_gate(scores, k)
    assert_indices_equal(got, stable_topk(scores, k), scores)
    assert got.is_contiguous()


def test_variants_cover_every_expert_count():
    """The smallest bucket that holds the row runs: the fast warp kernels up to 1024 experts,
    the general CTA kernel (8192) from 1025 on; every bucket has a variant."""
    from tilebake.moe.topk_gate import MAX_EXPERTS, TopkGateVariant, experts_bucket

    assert MAX_EXPERTS[-1] == 8192 and {v.max_experts for v in TopkGateVariant.all()} == set(MAX_EXPERTS)
    cases = {1: 256, 256: 256, 257: 512, 1024: 1024, 1025: 8192, 5000: 8192, 8192: 8192}
    assert {e: experts_bucket(e) for e in cases} == cases


def test_cpu_path_strided_rows_and_empty():
    wide = make_scores(9, 80, True, "cpu")
    scores = wide[:, :72]
    assert_indices_equal(tilebake.moe.topk_gate(scores, 9), stable_topk(scores.contiguous(), 9), scores)
    assert tilebake.moe.topk_gate(torch.zeros(0, 16), 4).shape == (0, 4)


def test_cpu_path_rejects_non_finite_scores():
    """The documented CPU behaviour (the reference's): ValueError; a GPU writes -1 rows instead."""
    scores = torch.randn(4, 16)
    scores[1, 3] = math.inf
    with pytest.raises(ValueError, match="scores must be finite; row 1 holds inf"):
        tilebake.moe.topk_gate(scores, 2)


# --- GPU: the kernel against the reference ---
# The reference runs on the CPU: torch's CUDA sort may order -0.0 before +0.0 (radix keys), where
# the rule (and the CPU sort, and the kernel) treats them as equal values.

KS = (1, 2, 6, 8, 9, 32)
EXPERTS_K = [(e, k) for e in (1, 8, 31, 72, 256, 512, 1024) for k in KS + (31,) if k <= e]
# The general kernel (a CTA per token): just past the fast ones, odd counts, the limit.
WIDE_EXPERTS_K = [(e, k) for e in (1025, 4097, 5000, 8192) for k in KS]


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,k", EXPERTS_K)
@pytest.mark.parametrize("num_tokens", [1, 8001])
@pytest.mark.parametrize("ties", [False, True])
def test_kernel_matches_stable_topk(num_tokens, num_experts, k, ties):
    scores = make_scores(num_tokens, num_experts, ties, "cuda")
    assert_indices_equal(tilebake.moe.topk_gate(scores, k), stable_topk(scores.cpu(), k), scores)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,k", WIDE_EXPERTS_K)
@pytest.mark.parametrize("num_tokens", [1, 999])
@pytest.mark.parametrize("ties", [False, True])
def test_general_kernel_matches_stable_topk(num_tokens, num_experts, k, ties):
    scores = make_scores(num_tokens, num_experts, ties, "cuda")
    assert_indices_equal(tilebake.moe.topk_gate(scores, k), stable_topk(scores.cpu(), k), scores)


@pytest.mark.gpu
def test_general_kernel_many_tokens_and_strided_rows():
    scores = make_scores(8001, 1025, False, "cuda")
    scores[::5] = torch.round(scores[::5] * 2) / 2  # a fifth of the rows with ties
    assert_indices_equal(tilebake.moe.topk_gate(scores, 8), stable_topk(scores.cpu(), 8), scores)
    wide = make_scores(301, 6007, True, "cuda")
    scores = wide[:, 3 : 3 + 6000]  # an odd row stride and an offset start
    assert_indices_equal(tilebake.moe.topk_gate(scores, 32), stable_topk(scores.cpu(), 32), scores)


@pytest.mark.gpu
def test_kernel_many_tokens():
    scores = make_scores(65536, 256, False, "cuda")
    scores[::7] = torch.round(scores[::7] * 2) / 2  # a seventh of the rows with ties
    assert_indices_equal(tilebake.moe.topk_gate(scores, 8), stable_topk(scores.cpu(), 8), scores)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts", [72, 256, 1000])
def test_kernel_strided_rows(num_experts):
    wide = make_scores(515, num_experts + 13, True, "cuda")
    scores = wide[:, 5 : 5 + num_experts]  # an odd row stride and an offset start
    assert_indices_equal(tilebake.moe.topk_gate(scores, 8), stable_topk(scores.cpu(), 8), scores)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts", [72, 8192])
def test_kernel_all_equal_and_signed_zeros(num_experts):
    """Equal values keep ascending index order; -0.0 == 0.0 (as torch.sort)."""
    scores = torch.zeros(3, num_experts, device="cuda")
    scores[1, ::2] = -0.0
    scores[2] = torch.where(torch.arange(num_experts, device="cuda") % 3 == 0, -0.0, 0.0)
    expected = torch.arange(32, device="cuda").expand(3, 32)
    assert_indices_equal(tilebake.moe.topk_gate(scores, 32), expected, scores)


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("num_experts", [256, 5000])
def test_kernel_non_finite_rows_get_minus_one(bad, num_experts):
    """A row with a NaN or an infinity anywhere: -1 in every column; the other rows are exact."""
    scores = make_scores(301, num_experts, False, "cuda")
    rows = torch.tensor([0, 17, 255, 300], device="cuda")
    scores[rows, torch.tensor([0, 255, 31, num_experts - 1], device="cuda")] = bad
    got = tilebake.moe.topk_gate(scores, 8)
    assert (got[rows] == -1).all(), got[rows]
    keep = torch.ones(301, dtype=torch.bool, device="cuda")
    keep[rows] = False
    assert_indices_equal(got[keep], stable_topk(scores[keep].cpu(), 8), scores[keep])
