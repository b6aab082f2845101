"""moe_topk_gate_forward: the reference (tilebake.torch.moe_topk_gate_forward_ref) against an
independent per-token brute force (plain Python selection, hashing and mapping), its argument
checks, and (GPU) the kernel against the reference: indices bit-exact on inputs whose top-k
boundary gaps exceed 1e-6 (plus exact ties), weights and scores within rtol 1e-5."""

import math

import pytest
import torch

import tilebake
from tests.helpers import poison_, poison_allocator_
from tilebake.torch import moe_topk_gate_forward_ref
from tilebake.torch.gate import random_experts
from tilebake.torch.topk import score

FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")
M32 = 0xFFFFFFFF
# Separated inputs: no two distinct selection values (or group scores) this close at the top-k
# boundary, 10x the 1e-6 the original uses, far above the few-ulp score differences of two
# implementations (scores lie in (0, 1), bias tiers 1.0 apart).
MIN_GAP = 1e-5


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


# ---------------------------------------------------------------- inputs


def make_options(num_tokens, num_experts, k, shared, which, device="cpu", dup=3):
    """Optional arguments named in `which` (a set), random but valid."""
    opts = {}
    r = torch.rand
    if "mask" in which:
        opts["mask"] = r(num_tokens) > 0.2
    if "bias" in which:
        opts["bias"] = torch.randint(0, 3, (num_experts,)).float()  # tiers 1.0 apart: scores lie in (0, 1)
    if "image" in which:
        opts["image_bias"] = torch.randint(0, 3, (num_experts,)).float()
        opts["image_token_mask"] = r(num_tokens) > 0.5
    if "unmapped" in which or "fix" in which:
        opts["unmapped_topk_idx"] = torch.stack([torch.randperm(num_experts)[:k] for _ in range(num_tokens)])
    if "fix" in which:
        opts["fix_routing_mask"] = r(num_tokens) > 0.6
    if "random" in which:
        opts["force_random"] = r(num_tokens) > 0.7
    if "map" in which:
        num_logical = num_experts + shared
        opts["to_physical_map"] = torch.randint(0, 4 * num_logical, (num_logical, dup), dtype=torch.int32)
        opts["logical_count"] = torch.randint(1, dup + 1, (num_logical,), dtype=torch.int32)
    return {n: t.to(device) for n, t in opts.items()}


def separated_logits(num_tokens, num_experts, k, func, bias=None, num_groups=1, num_topk_groups=1, ties=True):
    """fp32 logits whose selection values (score + bias, float64) have no gap in (0, MIN_GAP] among
    the top k + 1 (and, grouped, among the group scores), so a last-ulp difference between two
    implementations' score arithmetic cannot reorder them; a third of the rows get an exact tie
    (a copy of the row's best logit on an expert of equal bias)."""
    bias64 = torch.zeros(num_experts, dtype=torch.float64) if bias is None else bias.double().cpu()
    # Softmax scores of E experts are ~1/E: a wider logit range keeps thousands of them separated.
    step = (5.0 if func != "softmax" else max(5.0, 0.004 * num_experts)) / num_experts

    def rows(n):
        x = -5.0 + torch.argsort(torch.rand(n, num_experts), dim=1).double() * step
        x = x + torch.rand(n, num_experts, dtype=torch.float64) * step * 0.25
        return x.float()

    def scores64(x):
        x = x.double()
        if func == "sqrtsoftplus":
            return torch.sqrt(torch.nn.functional.softplus(x))
        if func == "softmax":
            return torch.softmax(x, dim=1)
        return torch.sigmoid(x)

    def bad_gaps(v, upto):
        top = torch.sort(v, dim=1, descending=True).values[:, : upto + 1]
        gaps = top[:, :-1] - top[:, 1:]
        return ((gaps > 0) & (gaps <= MIN_GAP)).any(dim=1)

    def check(x):
        sel = scores64(x) + bias64
        if num_groups == 1:
            return bad_gaps(sel, min(k, num_experts - 1))
        size = num_experts // num_groups
        grouped = sel.view(-1, num_groups, size)
        top2 = torch.sort(grouped, dim=2, descending=True).values[:, :, :2].sum(dim=2)
        bad = bad_gaps(top2, min(num_topk_groups, num_groups - 1))
        kept = torch.sort(top2, dim=1, descending=True, stable=True).indices[:, :num_topk_groups]
        keep = torch.zeros_like(top2, dtype=torch.bool).scatter_(1, kept, True).repeat_interleave(size, dim=1)
        masked = torch.where(keep, sel, -math.inf)
        return bad | bad_gaps(masked, min(k, num_topk_groups * size - 1))

    x = rows(num_tokens)
    if ties and num_experts > 1:
        sel = scores64(x) + bias64
        best = sel.argmax(dim=1)
        for t in range(0, num_tokens, 3):
            same = (bias64 == bias64[best[t]]).nonzero()[:, 0]
            other = same[torch.randint(0, same.numel(), (1,))].item()
            x[t, other] = x[t, best[t]]
    for _ in range(50):
        bad = check(x)
        if not bad.any():
            return x
        x[bad] = rows(int(bad.sum()))
    raise AssertionError("could not build well-separated logits")


def call_both(fn, logits, k, use_shared, num_shared, rsf, ep_rank, func, opts, **kw):
    """(tilebake result, reference result), each with its own copies of the in/out tensors."""
    outs = []
    for f in (fn, moe_topk_gate_forward_ref):
        o = {n: (t.clone() if n in ("unmapped_topk_idx",) else t) for n, t in opts.items()}
        scores = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        idx, w = f(logits, k, use_shared, num_shared, rsf, ep_rank, func, scores=scores, **o, **kw)
        outs.append((idx, w, o.get("unmapped_topk_idx"), scores))
    return outs


# ---------------------------------------------------------------- CPU: reference vs brute force

ALL = {"mask", "bias", "image", "unmapped", "fix", "random", "map"}


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


def test_cpu_path_alias_out_and_empty():
    logits = torch.randn(11, 40)
    opts = make_options(11, 40, 4, 1, ALL - {"fix"})
    ref = moe_topk_gate_forward_ref(logits, 4, True, 1, 2.0, 1, **opts)
    got = tilebake.moe.moe_topk_gate_forward(logits, 4, True, 1, 2.0, 1, **opts)
    alias = tilebake.moe.moe_topk_gate(logits, 4, True, 1, 2.0, 1, **opts)
    out = (torch.empty(11, 5, dtype=torch.int64), torch.empty(11, 5))
    res = tilebake.moe.moe_topk_gate_forward(logits, 4, True, 1, 2.0, 1, **opts, out=out)
    assert res[0] is out[0] and res[1] is out[1]
    for pair in (got, alias, out):
        assert torch.equal(pair[0], ref[0]) and torch.equal(pair[1], ref[1])
    idx, w = tilebake.moe.moe_topk_gate_forward(torch.empty(0, 40), 4, True, 1, 2.0, 1)
    assert idx.shape == (0, 5) and w.shape == (0, 5)


def check_torch_compile(device, backend):
    """torch.compile(fullgraph=True) traces the op through its torch.library schema (mutating
    unmapped_topk_idx and scores, filling an out pair); same results as eager."""
    num_tokens, num_experts, k = 29, 64, 6
    logits = torch.randn(num_tokens, num_experts, device=device)
    opts = make_options(num_tokens, num_experts, k, 1, ALL, device=device)

    def run(logits, unmapped, scores, out):
        o = dict(opts, unmapped_topk_idx=unmapped)
        a = tilebake.moe.moe_topk_gate_forward(logits, k, True, 1, 2.0, 3, "softmax", scores=scores, **o)
        b = tilebake.moe.moe_topk_gate(logits, k, True, 1, 2.0, 3, "softmax", out=out, num_groups=8, num_topk_groups=2)
        return a, b

    results = []
    for f in (run, torch.compile(run, fullgraph=True, backend=backend)):
        unmapped = opts["unmapped_topk_idx"].clone()
        scores = torch.empty(num_tokens, num_experts, device=device)
        out = (
            torch.empty(num_tokens, k + 1, dtype=torch.int64, device=device),
            torch.empty(num_tokens, k + 1, device=device),
        )
        (a, b) = f(logits, unmapped, scores, out)
        results.append((a, b, unmapped, scores, out))
    (a, b, unmapped, scores, out), (ca, cb, cunmapped, cscores, cout) = results
    for x, y in (
        (a[0], ca[0]),
        (a[1], ca[1]),
        (b[0], cb[0]),
        (unmapped, cunmapped),
        (scores, cscores),
        (out[0], cout[0]),
        (out[1], cout[1]),
    ):
        assert torch.equal(x, y)
    assert torch.equal(cout[0], cb[0]) and not torch.equal(unmapped, opts["unmapped_topk_idx"])


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    check_torch_compile("cpu", "aot_eager")


def test_strided_logits_and_unmapped_rows():
    wide = torch.randn(13, 100)
    logits = wide[:, 10:74]
    unmapped = torch.empty(13, 16, dtype=torch.int64)[:, 2:8]
    idx, w = moe_topk_gate_forward_ref(logits, 6, False, 0, 1.0, 0, unmapped_topk_idx=unmapped)
    idx2, w2 = moe_topk_gate_forward_ref(logits.contiguous(), 6, False, 0, 1.0, 0)
    assert torch.equal(idx, idx2) and torch.equal(w, w2) and torch.equal(unmapped, idx)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(logits=torch.randn(4, 8).double()), TypeError, "logits must be torch.float32"),
        (dict(logits=torch.randn(4, 8193)), ValueError, r"1 to 8192 experts"),
        (dict(logits=torch.randn(8, 4).t()), ValueError, "logits must have a contiguous last dimension"),
        (dict(num_topk=9), ValueError, r"num_topk must be an int in \[1, 8\]"),
        (dict(num_topk=0), ValueError, r"num_topk must be an int in \[1, 8\]"),
        (dict(num_shared_experts=3), ValueError, "num_shared_experts must be 0, 1 or 2"),
        (dict(logits=torch.randn(4, 64), num_topk=31, use_shared_as_routed=True, num_shared_experts=2), ValueError,
         "num_topk \\+ shared slots must be at most 32"),
        (dict(scoring_func="relu"), ValueError, "scoring_func must be one of"),
        (dict(ep_rank=-1), ValueError, "ep_rank must be an int"),
        (dict(routed_scaling_factor=math.inf), ValueError, "routed_scaling_factor must be finite"),
        (dict(routed_scaling_factor="2"), TypeError, "routed_scaling_factor must be a real number"),
        (dict(use_shared_as_routed=1), TypeError, "use_shared_as_routed must be a bool"),
        (dict(mask=torch.ones(4)), ValueError, "mask must be a torch.bool tensor of shape \\(4,\\)"),
        (dict(bias=torch.zeros(7)), ValueError, "bias must be a torch.float32 tensor of shape \\(8,\\)"),
        (dict(bias=torch.full((8,), math.nan)), ValueError, "bias must be finite"),
        (dict(image_bias=torch.zeros(8)), ValueError, "image_bias and image_token_mask must be given together"),
        (dict(fix_routing_mask=torch.ones(4, dtype=torch.bool)), ValueError, "fix_routing_mask requires unmapped"),
        (dict(unmapped_topk_idx=torch.zeros(4, 2, dtype=torch.int32)), ValueError,
         "unmapped_topk_idx must be a torch.int64 tensor of shape \\(4, 2\\)"),
        (dict(to_physical_map=torch.zeros(8, 2, dtype=torch.int32)), ValueError, "must be given together"),
        (dict(to_physical_map=torch.zeros(9, 2, dtype=torch.int32), logical_count=torch.ones(9, dtype=torch.int32)),
         ValueError, "to_physical_map must be a torch.int32 tensor of shape \\(8, 2\\)"),
        (dict(out=(torch.empty(4, 2, dtype=torch.int64), torch.empty(4, 3))), ValueError,
         "out\\[1\\] must be a torch.float32 tensor of shape \\(4, 2\\)"),
        (dict(scores=torch.empty(4, 7)), ValueError, "scores must be a torch.float32 tensor of shape \\(4, 8\\)"),
        (dict(num_groups=3), ValueError, "num_groups=3 must divide the 8 experts"),
        (dict(num_groups=8), ValueError, "groups of at least 2"),
        (dict(num_groups=4, num_topk_groups=5), ValueError, r"num_topk_groups must be an int in \[1, 4\]"),
        (dict(num_groups=4, num_topk_groups=1, num_topk=3), ValueError, "num_topk=3 exceeds the experts of the kept"),
        (dict(num_topk_groups=2), ValueError, "num_topk_groups must be 1 when num_groups is 1"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("fn", ["ref", "op"])
def test_bad_arguments(kwargs, error, match, fn):
    args = dict(logits=torch.randn(4, 8), num_topk=2, use_shared_as_routed=False, num_shared_experts=0,
                routed_scaling_factor=1.0, ep_rank=0)  # fmt: skip
    args.update(kwargs)
    f = moe_topk_gate_forward_ref if fn == "ref" else tilebake.moe.moe_topk_gate_forward
    with pytest.raises(error, match=match):
        f(**args)


def test_variants():
    from tilebake.moe.moe_topk_gate_forward import EXPERT_BOUNDS, MoeTopkGateForwardVariant, expert_bound

    ids = [v.id for v in MoeTopkGateForwardVariant.all()]
    assert len(ids) == 9 and len(set(ids)) == 9
    assert [expert_bound(n) for n in (1, 256, 257, 512, 513, 8192)] == [256, 256, 512, 512, 8192, 8192]
    assert EXPERT_BOUNDS[-1] == tilebake.moe._router.MAX_EXPERTS


# ---------------------------------------------------------------- GPU: kernel vs reference


def unscored_rows(opts, num_tokens):
    """The rows whose scores must be 0: masked out, or force_random (among the unmasked)."""
    rows = torch.zeros(num_tokens, dtype=torch.bool)
    if "mask" in opts:
        rows |= ~opts["mask"].cpu()
    if "force_random" in opts:
        rows |= opts["force_random"].cpu()
    return rows


def assert_gate_equal(got, ref, bad_rows=None, zero_rows=None):
    """Indices (and unmapped) bit-exact, weights and scores within rtol 1e-5; the messages name the
    first differing token and slot. bad_rows: the non-finite tokens (NaN scores rows unless in
    zero_rows); zero_rows: the rows whose scores must be exactly 0."""
    (idx, w, unmapped, scores), (r_idx, r_w, r_unmapped, r_scores) = got, ref
    diff = (idx != r_idx).nonzero()
    if diff.numel():
        t, s = diff[0].tolist()
        raise AssertionError(
            f"topk_idx: {diff.shape[0]} slots differ; first token {t} slot {s}: got {idx[t].tolist()}, "
            f"ref {r_idx[t].tolist()}"
        )
    if unmapped is not None:
        diff = (unmapped != r_unmapped).nonzero()
        if diff.numel():
            t, s = diff[0].tolist()
            got_row, ref_row = unmapped[t].tolist(), r_unmapped[t].tolist()
            raise AssertionError(f"unmapped_topk_idx: token {t}: got {got_row}, ref {ref_row}")
    assert not w.isnan().any(), f"topk_weights NaN at {w.isnan().nonzero()[:5].tolist()}"
    torch.testing.assert_close(w, r_w, rtol=1e-5, atol=1e-7, msg=lambda m: f"topk_weights: {m}")
    nan_rows = scores.isnan().all(dim=1)
    assert torch.equal(scores.isnan(), r_scores.isnan()), "scores: NaN pattern differs"
    if zero_rows is not None:
        zero_rows = zero_rows.to(scores.device)
        assert (scores[zero_rows] == 0).all(), "scores: a masked-out or random row is not 0"
        assert not (scores[~zero_rows] == 0).all(dim=1).any() or scores.shape[1] == 0, "scores: a scored row is 0"
    if bad_rows is not None:
        bad_rows = bad_rows.to(scores.device)
        if zero_rows is not None:
            bad_rows = bad_rows & ~zero_rows
        assert torch.equal(nan_rows, bad_rows), "scores: NaN rows are not the non-finite tokens"
    torch.testing.assert_close(scores, r_scores, rtol=1e-5, atol=1e-7, equal_nan=True, msg=lambda m: f"scores: {m}")


GPU_SHAPES = [  # (tokens, experts, k, use_shared, num_shared, num_groups, num_topk_groups)
    (1, 8, 1, False, 0, 1, 1),
    (8001, 256, 8, True, 1, 1, 1),
    (8001, 256, 8, False, 0, 8, 4),
    (127, 512, 32, False, 0, 1, 1),
    (333, 512, 16, True, 2, 32, 4),
    (999, 72, 6, True, 2, 1, 1),
    (77, 160, 30, True, 2, 1, 1),
    (500, 64, 4, True, 1, 8, 2),
    (257, 33, 5, False, 0, 1, 1),
    (64, 12, 12, True, 1, 3, 3),
    (1000, 512, 8, False, 0, 8, 4),
    (300, 96, 5, False, 0, 3, 1),
    (513, 600, 8, True, 1, 1, 1),  # one CTA per token from here (more than 512 experts)
    (300, 1024, 32, False, 0, 8, 3),
    (129, 2000, 13, True, 2, 20, 5),  # groups of 100: not whole slots
    (257, 8192, 8, False, 0, 32, 4),
    (65, 8192, 30, True, 2, 1, 1),
]


@pytest.mark.gpu
@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("which", ["none", "bias", "all"])
def test_gpu_kernel_matches_reference(func, shape, which):
    num_tokens, num_experts, k, use_shared, num_shared, groups, top_groups = shape
    shared = num_shared if use_shared else 0
    names = {"none": set(), "bias": {"bias"}, "all": ALL}[which]
    opts = make_options(num_tokens, num_experts, k, shared, names, device="cuda")
    # Separation uses the text-token bias; image tokens use their own bias: separate for both.
    logits = separated_logits(num_tokens, num_experts, k, func, opts.get("bias"), groups, top_groups)
    if "image_bias" in opts:
        img = separated_logits(num_tokens, num_experts, k, func, opts["image_bias"], groups, top_groups)
        logits = torch.where(opts["image_token_mask"].cpu()[:, None], img, logits)
    logits = logits.cuda()
    poison_allocator_("cuda")
    got, ref = call_both(
        tilebake.moe.moe_topk_gate_forward, logits, k, use_shared, num_shared, 1.5, 3, func, opts,
        num_groups=groups, num_topk_groups=top_groups,
    )  # fmt: skip
    assert_gate_equal(got, ref, zero_rows=unscored_rows(opts, num_tokens))


@pytest.mark.gpu
@pytest.mark.parametrize("func", FUNCS)
def test_gpu_non_finite_strided_and_out(func):
    num_tokens, num_experts, k = 2049, 200, 7
    wide = torch.empty(num_tokens, 264, device="cuda")
    logits = wide[:, 40:240]
    logits.copy_(separated_logits(num_tokens, num_experts, k, func).cuda())
    bad = torch.zeros(num_tokens, dtype=torch.bool)
    for t, v in ((0, math.nan), (5, math.inf), (6, -math.inf), (2048, math.nan), (77, math.nan)):
        logits[t, t % num_experts] = v
        bad[t] = True
    opts = make_options(num_tokens, num_experts, k, 2, ALL, device="cuda")
    opts["unmapped_topk_idx"] = torch.empty(num_tokens, 20, dtype=torch.int64, device="cuda")[:, 3 : 3 + k]
    opts["unmapped_topk_idx"].copy_(torch.stack([torch.randperm(num_experts)[:k] for _ in range(num_tokens)]))
    results = []
    for f in (tilebake.moe.moe_topk_gate_forward, moe_topk_gate_forward_ref):
        o = dict(opts)
        o["unmapped_topk_idx"] = opts["unmapped_topk_idx"].clone()
        out = (poison_(torch.empty(num_tokens, k + 2, dtype=torch.int64, device="cuda")),
               poison_(torch.empty(num_tokens, k + 2, device="cuda")))  # fmt: skip
        scores = poison_(torch.empty(num_tokens, 300, device="cuda"))[:, 50:250]
        idx, w = f(logits, k, True, 2, 2.0, 11, func, out=out, scores=scores, **o)
        assert idx is out[0] and w is out[1]
        results.append((idx, w, o["unmapped_topk_idx"], scores))
    assert_gate_equal(results[0], results[1], bad, unscored_rows(opts, num_tokens))
    routed = opts["mask"].cpu() & ~bad
    assert (results[0][0].cpu()[~routed] == -1).all()


@pytest.mark.gpu
def test_gpu_65536_tokens_deepseek_v3():
    num_tokens, num_experts, k = 65536, 256, 8
    bias = torch.randint(0, 3, (num_experts,)).float()
    logits = separated_logits(num_tokens, num_experts, k, "sigmoid", bias, 8, 4, ties=True).cuda()
    opts = {"bias": bias.cuda(), "unmapped_topk_idx": torch.empty(num_tokens, k, dtype=torch.int64, device="cuda")}
    fn = tilebake.moe.moe_topk_gate_forward
    got, ref = call_both(fn, logits, k, False, 0, 2.5, 0, "sigmoid", opts, num_groups=8, num_topk_groups=4)
    assert_gate_equal(got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,k", [(32, 32), (8, 8), (512, 32), (300, 3)])
def test_gpu_force_random_every_token(num_experts, k):
    num_tokens = 4097
    logits = torch.randn(num_tokens, num_experts, device="cuda")
    opts = {"force_random": torch.ones(num_tokens, dtype=torch.bool, device="cuda")}
    got, ref = call_both(tilebake.moe.moe_topk_gate_forward, logits, k, False, 0, 1.0, 123, "sqrtsoftplus", opts)
    assert_gate_equal(got, ref, zero_rows=torch.ones(num_tokens, dtype=torch.bool))
    assert all(len(set(r)) == k for r in got[0][:64].tolist())


@pytest.mark.gpu
def test_gpu_alias_empty_and_nan_bias_stays_in_bounds():
    logits = torch.randn(0, 64, device="cuda")
    idx, w = tilebake.moe.moe_topk_gate(logits, 4, True, 1, 1.0, 0)
    assert idx.shape == (0, 5) and w.shape == (0, 5)
    logits = torch.randn(100, 64, device="cuda")
    bias = torch.full((64,), math.nan, device="cuda")
    bias[:10] = 0.0
    idx, w = tilebake.moe.moe_topk_gate_forward(logits, 8, False, 0, 1.0, 0, bias=bias)
    torch.cuda.synchronize()
    assert ((idx == -1) | ((idx >= 0) & (idx < 64))).all()  # unspecified, but in range, and no hang


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    check_torch_compile("cuda", "inductor")


def test_constants_agree_with_the_reference_and_names_stay_functions():
    import importlib

    from tilebake._hash import GOLDEN
    from tilebake.moe import _router
    from tilebake.torch import gate, topk

    # One home (tilebake.moe._router): the op, its kernels and the reference share the objects.
    mod = importlib.import_module("tilebake.moe.moe_topk_gate_forward")
    assert mod.SCORING_FUNCS is topk.SCORING_FUNCS is _router.SCORING_FUNCS
    assert mod.check_gate_args is gate.check_gate_args is _router.check_gate_args
    assert (gate.DRAWS_PER_SLOT, gate.PHYSICAL_STRIDE, gate.GOLDEN) == (64, 23333, 0x9E3779B9) == (
        _router.DRAWS_PER_SLOT, _router.PHYSICAL_STRIDE, GOLDEN
    )  # fmt: skip
    assert callable(tilebake.moe.moe_topk_gate_forward) and tilebake.moe.moe_topk_gate_forward.__name__ == (
        "moe_topk_gate_forward"
    )
    assert tilebake.moe.moe_topk_gate.__name__ == "moe_topk_gate"
