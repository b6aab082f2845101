"""moe_topk_gate_forward's reference (tilebake.torch.moe_topk_gate_forward_ref) against an
independent per-token brute force (plain Python selection, hashing and mapping), and its documented
semantics on the CPU: non-finite tokens, the scores rows, fixed routing out of range, the priority
of mask over random over fixed, the random experts, the physical mapping, the weights and shared
slots, strided inputs."""

import math

import pytest
import torch

from tests.moe.gate_forward_helpers import ALL, FUNCS, make_options
from tilebake.torch import moe_topk_gate_forward_ref
from tilebake.torch.gate import random_experts
from tilebake.torch.topk import score

M32 = 0xFFFFFFFF


# ---------------------------------------------------------------- an independent brute force


def fmix32_py(h: int) -> int:
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def brute_random(t: int, ep_rank: int, num_experts: int, k: int) -> list[int]:
    seed = fmix32_py(fmix32_py(ep_rank) ^ t)
    chosen: list[int] = []
    for s in range(k):
        pick = None
        for a in range(64):
            cand = fmix32_py(seed + (s * 64 + a + 1) * 0x9E3779B9) % num_experts
            if cand not in chosen:
                pick = cand
                break
        if pick is None:
            pick = min(set(range(num_experts)) - set(chosen))
        chosen.append(pick)
    return chosen


def brute_select(values: list[float], k: int, allowed: list[int]) -> list[int]:
    """k times the largest allowed value, the smaller index among equals."""
    chosen: list[int] = []
    for _ in range(k):
        best = max((i for i in allowed if i not in chosen), key=lambda i: (values[i], -i))
        chosen.append(best)
    return chosen


def brute_gate(logits, k, use_shared, num_shared, rsf, ep_rank, func, opts, num_groups=1, num_topk_groups=1):
    """Per token, in Python: (idx, weights, unmapped (or None), scores) of the documented semantics.
    The scores come from tilebake.torch.topk.score (tested against float64 formulas elsewhere)."""
    num_tokens, num_experts = logits.shape
    shared = num_shared if use_shared else 0
    width = k + shared
    finite = torch.isfinite(logits).all(dim=1)
    scores = score(torch.where(finite[:, None], logits, 0.0), func)
    scores[~finite] = math.nan
    picked_scores = scores.clone()  # the weights use the scores also where the scores row is 0
    idx = torch.full((num_tokens, width), -1, dtype=torch.int64)
    weights = torch.zeros((num_tokens, width), dtype=torch.float32)
    unmapped_in = opts.get("unmapped_topk_idx")
    unmapped = None if unmapped_in is None else unmapped_in.clone()

    def flag(name, t):
        v = opts.get(name)
        return None if v is None else bool(v[t])

    for t in range(num_tokens):
        if flag("mask", t) is False:
            scores[t] = 0.0  # not routed by score: a zero scores row
            if unmapped is not None:
                unmapped[t] = -1
            continue
        rand = flag("force_random", t) is True
        fixed = not rand and flag("fix_routing_mask", t) is True
        if rand:
            chosen = brute_random(t, ep_rank, num_experts, k)
            scores[t] = 0.0
        elif fixed:
            chosen = unmapped_in[t].tolist()
        else:
            if flag("image_token_mask", t):
                b = opts["image_bias"]
            else:
                b = opts.get("bias", torch.zeros(num_experts))
            sel = (scores[t] + b).tolist() if bool(finite[t]) else [0.0] * num_experts
            allowed = list(range(num_experts))
            if num_groups > 1:
                size = num_experts // num_groups
                # fp32 sum of the two largest, as the kernel and torch add them
                gs = [
                    (torch.tensor(x[0]) + torch.tensor(x[1])).item()
                    for x in (sorted(sel[g * size : (g + 1) * size], reverse=True)[:2] for g in range(num_groups))
                ]
                kept = brute_select(gs, num_topk_groups, list(range(num_groups)))
                allowed = [i for i in allowed if i // size in kept]
            chosen = brute_select(sel, k, allowed)
        ok = bool(finite[t]) and all(0 <= e < num_experts for e in chosen)
        if unmapped is not None and not fixed:
            unmapped[t] = torch.tensor(chosen if ok and not rand else [-1] * k)
        if not ok:
            continue
        picked = [picked_scores[t, e] for e in chosen]
        denom = torch.tensor(1e-20, dtype=torch.float32)
        for p in picked:
            denom = denom + p
        logical = chosen + [num_experts + s for s in range(shared)]
        ws = [p / denom * rsf for p in picked] + [torch.tensor(1.0)] * shared
        for s, e in enumerate(logical):
            phys = e
            if opts.get("to_physical_map") is not None:
                count = int(opts["logical_count"][e])
                dup = opts["to_physical_map"].shape[1]
                phys = -1
                if 1 <= count <= dup:
                    phys = int(opts["to_physical_map"][e, (ep_rank + t * 23333) % count])
            idx[t, s] = phys
            weights[t, s] = ws[s]
    return idx, weights, unmapped, scores


# ---------------------------------------------------------------- CPU: reference vs brute force


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize(
    "num_experts,k,use_shared,num_shared,groups,which",
    [
        (8, 1, False, 0, (1, 1), set()),
        (8, 8, True, 1, (1, 1), {"bias"}),
        (16, 4, True, 2, (4, 2), {"bias", "mask"}),
        (64, 6, True, 2, (8, 3), ALL - {"fix"}),
        (72, 7, False, 2, (1, 1), ALL),
        (256, 8, True, 1, (8, 4), ALL),
        (40, 30, True, 2, (1, 1), {"random", "unmapped", "map"}),
    ],
)
def test_reference_matches_brute_force(func, num_experts, k, use_shared, num_shared, groups, which):
    num_tokens = 37
    logits = torch.randn(num_tokens, num_experts) * 3
    logits[::5, 1] = logits[::5, 0]  # exact ties
    logits[::4, 3] = logits[::4, 2]
    shared = num_shared if use_shared else 0
    opts = make_options(num_tokens, num_experts, k, shared, which)
    kw = dict(num_groups=groups[0], num_topk_groups=groups[1])
    r_opts = {n: (t.clone() if n == "unmapped_topk_idx" else t) for n, t in opts.items()}
    scores = torch.empty(num_tokens, num_experts)
    idx, w = moe_topk_gate_forward_ref(logits, k, use_shared, num_shared, 2.5, 3, func, scores=scores, **r_opts, **kw)
    e_idx, e_w, e_unmapped, e_scores = brute_gate(logits, k, use_shared, num_shared, 2.5, 3, func, opts, *groups)
    assert idx.dtype == torch.int64 and w.dtype == torch.float32 and idx.shape == (num_tokens, k + shared)
    assert torch.equal(idx, e_idx), (idx != e_idx).nonzero()[:5].tolist()
    assert torch.equal(w, e_w), (w != e_w).nonzero()[:5].tolist()
    assert torch.equal(scores, e_scores)
    if e_unmapped is not None:
        assert torch.equal(r_opts["unmapped_topk_idx"], e_unmapped)


def test_non_finite_tokens_are_not_routed():
    logits = torch.randn(6, 16)
    logits[1, 3] = math.nan
    logits[2, 0] = math.inf
    logits[3, 15] = -math.inf
    unmapped = torch.full((6, 2), 7, dtype=torch.int64)
    fix = torch.tensor([0, 0, 0, 1, 0, 0], dtype=torch.bool)
    scores = torch.empty(6, 16)
    idx, w = moe_topk_gate_forward_ref(
        logits, 2, True, 1, 1.0, 0, scores=scores, unmapped_topk_idx=unmapped, fix_routing_mask=fix
    )
    for t in (1, 2, 3):
        assert idx[t].tolist() == [-1, -1, -1] and w[t].tolist() == [0.0, 0.0, 0.0]
        assert scores[t].isnan().all()
    assert unmapped[1].tolist() == [-1, -1] and unmapped[2].tolist() == [-1, -1]
    assert unmapped[3].tolist() == [7, 7]  # a fixed routing is input: kept
    assert not scores[[0, 4, 5]].isnan().any() and (idx[[0, 4, 5]] >= 0).all()


def test_scores_rows_are_zero_unless_routed_by_score_or_fixed():
    logits = torch.randn(6, 16)
    logits[5, 2] = math.nan  # non-finite and masked out: 0, not NaN
    mask = torch.tensor([1, 0, 1, 1, 1, 0], dtype=torch.bool)
    rand = torch.tensor([0, 1, 1, 0, 0, 0], dtype=torch.bool)
    fix = torch.tensor([0, 0, 0, 1, 0, 0], dtype=torch.bool)
    unmapped = torch.tensor([[0, 1]] * 6)
    scores = torch.full((6, 16), 7.0)
    moe_topk_gate_forward_ref(logits, 2, False, 0, 1.0, 0, mask=mask, force_random=rand, fix_routing_mask=fix,
                              unmapped_topk_idx=unmapped, scores=scores)  # fmt: skip
    expected = score(torch.where(torch.isfinite(logits), logits, 0.0), "sqrtsoftplus")
    for t in (0, 3, 4):  # by score, fixed (kept, as the original), by score
        assert torch.equal(scores[t], expected[t])
    for t in (1, 2, 5):  # masked out (row 1: masked beats random), random, masked out
        assert (scores[t] == 0).all()


def test_fixed_routing_out_of_range_unroutes_the_token():
    logits = torch.randn(3, 8)
    unmapped = torch.tensor([[0, 1], [2, 8], [5, -1]])
    fix = torch.tensor([1, 1, 1], dtype=torch.bool)
    idx, w = moe_topk_gate_forward_ref(logits, 2, False, 0, 1.0, 0, fix_routing_mask=fix, unmapped_topk_idx=unmapped)
    assert idx[0].tolist() == [0, 1] and idx[1].tolist() == [-1, -1] and idx[2].tolist() == [-1, -1]
    assert unmapped.tolist() == [[0, 1], [2, 8], [5, -1]]
    s = score(logits[:1], "sqrtsoftplus")[0, :2]
    assert torch.equal(w[0], s / (torch.tensor(1e-20) + s[0] + s[1]))


def test_priority_mask_over_random_over_fixed():
    logits = torch.randn(4, 32)
    every = torch.ones(4, dtype=torch.bool)
    mask = torch.tensor([0, 1, 1, 1], dtype=torch.bool)
    rand = torch.tensor([1, 1, 0, 0], dtype=torch.bool)
    fix = torch.tensor([1, 1, 1, 0], dtype=torch.bool)
    given = torch.tensor([[1, 2, 3]] * 4)
    unmapped = given.clone()
    idx, w = moe_topk_gate_forward_ref(
        logits, 3, False, 0, 1.0, 5, mask=mask, force_random=rand & every, fix_routing_mask=fix,
        unmapped_topk_idx=unmapped,
    )  # fmt: skip
    assert idx[0].tolist() == [-1] * 3 and unmapped[0].tolist() == [-1] * 3  # masked
    assert idx[1].tolist() == random_experts(torch.tensor([1]), 5, 32, 3)[0].tolist()  # random wins over fix
    assert unmapped[1].tolist() == [-1] * 3
    assert idx[2].tolist() == [1, 2, 3] and unmapped[2].tolist() == [1, 2, 3]  # fixed
    top = torch.sort(score(logits, "sqrtsoftplus")[3], descending=True, stable=True).indices[:3]
    assert idx[3].tolist() == top.tolist() == unmapped[3].tolist()


@pytest.mark.parametrize("num_experts,k", [(32, 32), (8, 8), (256, 8), (33, 17)])
def test_random_experts_are_distinct_deterministic_and_match_the_brute_force(num_experts, k):
    tokens = torch.arange(0, 300, 7)
    got = random_experts(tokens, 9, num_experts, k)
    assert ((got >= 0) & (got < num_experts)).all()
    assert all(len(set(row)) == k for row in got.tolist())
    for i, t in enumerate(tokens.tolist()):
        assert got[i].tolist() == brute_random(t, 9, num_experts, k), t
    assert torch.equal(random_experts(tokens, 9, num_experts, k), got)
    if num_experts > k:
        assert not torch.equal(random_experts(tokens, 10, num_experts, k), got)  # ep_rank seeds it


def test_random_experts_fallback_is_used_when_draws_collide():
    # k == E == 32: the last slots often find every one of their 64 draws taken.
    tokens = torch.arange(200)
    got = random_experts(tokens, 0, 32, 32)
    assert all(sorted(row) == list(range(32)) for row in got.tolist())
    fallback_rows = 0
    for t in range(200):
        seed = fmix32_py(fmix32_py(0) ^ t)
        draws = {fmix32_py(seed + (31 * 64 + a + 1) * 0x9E3779B9) % 32 for a in range(64)}
        fallback_rows += got[t, 31].item() not in draws
    assert fallback_rows > 0


def test_physical_mapping_formula_and_bad_counts():
    num_tokens, num_experts = 5, 8
    logits = torch.randn(num_tokens, num_experts)
    pmap = torch.arange(10 * 4, dtype=torch.int32).view(10, 4) * 10
    count = torch.tensor([1, 2, 3, 4, 0, 5, 4, 3, 2, 1], dtype=torch.int32)  # 0 and 5: invalid
    u = torch.empty(5, 8, dtype=torch.int64)
    idx, _ = moe_topk_gate_forward_ref(
        logits, 8, True, 2, 1.0, 7, to_physical_map=pmap, logical_count=count, unmapped_topk_idx=u
    )
    for t in range(num_tokens):
        for s, e in enumerate(u[t].tolist() + [8, 9]):
            c = int(count[e])
            expected = -1 if not 1 <= c <= 4 else int(pmap[e, (7 + t * 23333) % c])
            assert idx[t, s].item() == expected, (t, s)


def test_weights_formula_and_shared_slots():
    logits = torch.randn(9, 24)
    idx, w = moe_topk_gate_forward_ref(logits, 5, True, 2, 1.75, 0, "sigmoid")
    s = torch.sigmoid(logits).gather(1, idx[:, :5])
    denom = torch.full((9,), 1e-20)
    for j in range(5):
        denom = denom + s[:, j]
    assert torch.equal(w[:, :5], s / denom[:, None] * 1.75)
    assert (idx[:, 5:] == torch.tensor([24, 25])).all() and (w[:, 5:] == 1).all()
    # use_shared_as_routed=False: num_shared_experts is ignored
    idx2, w2 = moe_topk_gate_forward_ref(logits, 5, False, 2, 1.75, 0, "sigmoid")
    assert torch.equal(idx2, idx[:, :5]) and torch.equal(w2, w[:, :5])


def test_strided_logits_and_unmapped_rows():
    wide = torch.randn(13, 100)
    logits = wide[:, 10:74]
    unmapped = torch.empty(13, 16, dtype=torch.int64)[:, 2:8]
    idx, w = moe_topk_gate_forward_ref(logits, 6, False, 0, 1.0, 0, unmapped_topk_idx=unmapped)
    idx2, w2 = moe_topk_gate_forward_ref(logits.contiguous(), 6, False, 0, 1.0, 0)
    assert torch.equal(idx, idx2) and torch.equal(w, w2) and torch.equal(unmapped, idx)
