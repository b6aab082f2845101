"""The routing references (tilebake.torch.topk, tilebake.torch.moe) against independent
constructions: a brute-force per-row selection, float64 formulas, hand-built ties and groups."""

import math

import pytest
import torch

from tilebake.torch import grouped_topk, normalize_weight, stable_topk
from tilebake.torch.topk import score


def brute_force_topk(row: torch.Tensor, k: int) -> list[int]:
    """k times: the largest remaining value, the smallest index among equals."""
    remaining = list(range(row.numel()))
    chosen = []
    for _ in range(k):
        best = max(remaining, key=lambda i: (row[i].item(), -i))
        chosen.append(best)
        remaining.remove(best)
    return chosen


@pytest.mark.parametrize("num_experts,k", [(8, 1), (8, 8), (64, 6), (256, 8), (512, 32)])
def test_stable_topk_is_the_brute_force_selection(num_experts, k):
    # Few distinct values: many ties, which must go to the smaller index.
    scores = torch.randint(0, 5, (23, num_experts)).float() / 4
    got = stable_topk(scores, k)
    assert got.dtype == torch.int64 and got.shape == (23, k)
    for t in range(23):
        assert got[t].tolist() == brute_force_topk(scores[t], k), t


def test_stable_topk_rejects_non_finite_and_bad_k():
    scores = torch.randn(4, 16)
    scores[2, 5] = math.nan
    with pytest.raises(ValueError, match="scores must be finite; row 2 holds nan"):
        stable_topk(scores, 2)
    with pytest.raises(ValueError, match=r"num_topk must be an int in \[1, 16\], got 17"):
        stable_topk(torch.randn(4, 16), 17)
    with pytest.raises(ValueError, match="2-D floating tensor"):
        stable_topk(torch.randn(16), 2)


@pytest.mark.parametrize("func", ["sqrtsoftplus", "softmax", "sigmoid"])
def test_scores_match_float64_formulas(func):
    logits = torch.randn(37, 64) * 8
    logits[0, :4] = torch.tensor([-100.0, 19.9, 20.0, 80.0])
    x = logits.double()
    if func == "sqrtsoftplus":
        expected = torch.sqrt(torch.nn.functional.softplus(x))
    elif func == "softmax":
        expected = torch.softmax(x, dim=1)
    else:
        expected = torch.sigmoid(x)
    got = score(logits, func)
    assert got.dtype == torch.float32 and not got.isnan().any()
    torch.testing.assert_close(got.double(), expected, rtol=2e-6, atol=1e-7)
    with pytest.raises(ValueError, match="scoring_func must be one of"):
        score(logits, "relu")


def test_grouped_topk_picks_from_the_best_groups_only():
    """8 groups of 4: group score = top-2 sum; a lone large expert in a weak group loses to
    a group with two good experts."""
    scores = torch.zeros(1, 32)
    scores[0, 0] = 10.0  # group 0: 10 + 0 = 10
    scores[0, 8:10] = torch.tensor([6.0, 6.0])  # group 2: 12
    scores[0, 20:22] = torch.tensor([5.5, 5.5])  # group 5: 11
    scores[0, 28:31] = torch.tensor([1.0, 1.0, 9.0])  # group 7: 10 (ties group 0: the smaller group wins)
    got = grouped_topk(scores, num_topk=4, num_groups=8, num_topk_groups=3)
    assert got.tolist() == [[0, 8, 9, 20]]
    assert grouped_topk(scores, 2, 8, 1).tolist() == [[8, 9]]


@pytest.mark.parametrize("num_experts,groups,top_groups,k", [(256, 8, 4, 8), (64, 8, 3, 6), (160, 8, 8, 6)])
def test_grouped_topk_against_brute_force(num_experts, groups, top_groups, k):
    scores = torch.randn(31, num_experts)
    got = grouped_topk(scores, k, groups, top_groups)
    size = num_experts // groups
    for t in range(31):
        g = scores[t].view(groups, size)
        group_scores = torch.sort(g, dim=1, descending=True).values[:, :2].sum(1)
        kept = brute_force_topk(group_scores, top_groups)
        allowed = torch.full((num_experts,), -math.inf)
        for grp in kept:
            allowed[grp * size : (grp + 1) * size] = scores[t, grp * size : (grp + 1) * size]
        assert got[t].tolist() == brute_force_topk(allowed, k), t
    if top_groups == groups:  # every group kept: plain top-k
        assert torch.equal(got, stable_topk(scores, k))


def test_grouped_topk_rejects_bad_groups():
    with pytest.raises(ValueError, match="num_groups=6 must divide the number of experts 64"):
        grouped_topk(torch.randn(2, 64), 4, 6, 2)
    with pytest.raises(ValueError, match=r"num_topk must be an int in \[1, 16\], got 17"):
        grouped_topk(torch.randn(2, 64), 17, 8, 2)
    with pytest.raises(ValueError, match="at least 2 experts"):
        grouped_topk(torch.randn(2, 8), 1, 8, 2)


def test_normalize_weight_formula():
    w = torch.rand(41, 8)
    w[3] = 0  # an all-zero row divides by 1e-20
    denominator, normalized = normalize_weight(w)
    expected = w.double().sum(1) + 1e-20
    torch.testing.assert_close(denominator.double(), expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(normalized.double(), w.double() / expected[:, None], rtol=0, atol=2e-6)
    assert denominator[3] == torch.tensor(1e-20, dtype=torch.float32) and (normalized[3] == 0).all()
    torch.testing.assert_close(normalized[torch.arange(41) != 3].sum(1), torch.ones(40), rtol=0, atol=2e-6)
    with pytest.raises(TypeError, match="topk_weights must be torch.float32, got torch.bfloat16"):
        normalize_weight(w.bfloat16())


def owner_and_local(expert: int, n: int, num_ep_ranks: int, num_tp_ranks: int) -> tuple[int, int]:
    """(tensor-parallel rank, its local number) of one expert, by walking the layout: GPUs in
    order, per_gpu experts each, GPU g on TP rank g % num_tp_ranks, each rank numbering its GPUs'
    experts in GPU order."""
    per_gpu = n // num_ep_ranks
    seen = [0] * num_tp_ranks
    for gpu in range(num_ep_ranks + expert // per_gpu + 1):  # (an index past n: GPUs go on)
        for place in range(per_gpu):
            if gpu * per_gpu + place == expert:
                return gpu % num_tp_ranks, seen[gpu % num_tp_ranks]
            seen[gpu % num_tp_ranks] += 1
    raise AssertionError("unreachable")


@pytest.mark.parametrize("n, num_ep_ranks, num_tp_ranks", [(256, 8, 2), (72, 6, 3), (64, 4, 4), (8, 8, 1), (9, 1, 1)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_mask_indices_by_tp_keeps_a_ranks_experts_in_its_numbering(n, num_ep_ranks, num_tp_ranks, dtype):
    from tilebake.torch import mask_indices_by_tp

    indices = torch.randint(-3, n, (37, 9), dtype=dtype)
    indices[0, :3] = torch.tensor([0, n - 1, -1])
    for tp_rank in range(num_tp_ranks):
        got = mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)
        assert got.dtype == dtype and got.shape == indices.shape
        want = [
            -1 if e < 0 or owner_and_local(e, n, num_ep_ranks, num_tp_ranks)[0] != tp_rank
            else owner_and_local(e, n, num_ep_ranks, num_tp_ranks)[1]
            for e in indices.flatten().tolist()
        ]  # fmt: skip
        assert got.flatten().tolist() == want


def test_mask_indices_by_tp_rejects_bad_arguments():
    from tilebake.torch import mask_indices_by_tp

    idx = torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="tp_rank"):
        mask_indices_by_tp(idx, 8, 2, 2, 2)
    with pytest.raises(ValueError, match="multiple of num_ep_ranks"):
        mask_indices_by_tp(idx, 9, 2, 0, 1)
    with pytest.raises(TypeError, match="integer tensor"):
        mask_indices_by_tp(idx.float(), 8, 2, 0, 1)
