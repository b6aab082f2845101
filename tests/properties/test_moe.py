"""Properties of the MoE ops beyond topk_gate / normalize_weight (tests/test_properties.py): the
router forward against a float64 scoring with a tolerant ranking check and exact tie-breaking,
its backward against float64 autograd, the fused mapping against its invariants computed here,
expansion as a row permutation and reduction against float64 sums."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import tilebake
from tests.properties.strategies import (
    DEVICES,
    PROPERTY,
    SEEDS,
    assert_bytes_equal,
    assert_within,
    normal,
    strided_rows,
)


def score64(logits: torch.Tensor, func: str) -> torch.Tensor:
    x = logits.double()
    if func == "sqrtsoftplus":
        return F.softplus(x).sqrt()
    return x.sigmoid() if func == "sigmoid" else x.softmax(-1)


def dev(t, device):
    return None if t is None else t.to(device)


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), func=st.sampled_from(["sqrtsoftplus", "sigmoid", "softmax"]),
       shared=st.sampled_from([(False, 0), (True, 1), (True, 2)]), levels=st.sampled_from([4, 64, 0]),
       options=st.sets(st.sampled_from(["mask", "bias", "nonfinite", "physical", "random", "fixed",
                                        "image"])))  # fmt: skip
def test_moe_topk_gate_forward(seed, data, func, shared, levels, options, device):
    """The chosen experts hold the k largest selection values (float64 scores + bias, within 1e-5:
    fp32 scoring), in descending order, equal values (equal logits and bias) to the smaller id;
    weights = rsf * score / (1e-20 + their sum); shared slots follow with weight 1. mask False: -1
    and 0; a non-finite logit: -1 and 0; random rows: distinct ids; fixed rows: the given ids;
    (an id out of range: -1 and 0); physical ids: map[e, (ep_rank + t * 23333) % count[e]].
    moe_topk_gate is the same op."""
    tokens, experts = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 48)) * 4
    k = data.draw(st.integers(1, min(experts, 32 - shared[1])))
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(tokens, experts, generator=g) * 3
    logits = (raw * levels).round() / levels if levels else raw  # few levels: many exact ties
    bad = torch.zeros(tokens, dtype=torch.bool)
    if "nonfinite" in options:
        bad = torch.rand(tokens, generator=g) < 0.3
        logits[bad, torch.randint(0, experts, (int(bad.sum()),), generator=g)] = float("nan")
    pick = lambda name: torch.rand(tokens, generator=g) < 0.3 if name in options else None  # noqa: E731
    mask, rand, fixed, image = (pick(n) for n in ("mask", "random", "fixed", "image"))
    mask = None if mask is None else ~mask
    bias = (torch.randint(-2, 3, (experts,), generator=g) / 4.0) if "bias" in options else None
    image_bias = (torch.randint(-2, 3, (experts,), generator=g) / 4.0) if image is not None else None
    fixed_ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    fixed_ids[4::5, 0] = torch.tensor([experts, -3])[torch.randint(0, 2, (1,), generator=g)]  # out of range
    unmapped = fixed_ids.clone() if fixed is not None else torch.full((tokens, k), -5)
    ep_rank, total, dup = data.draw(st.integers(0, 9)), experts + shared[1], 3
    phys_map = count = None
    if "physical" in options:
        phys_map = torch.randint(0, 4 * total, (total, dup), generator=g, dtype=torch.int32)
        count = torch.randint(1, dup + 1, (total,), generator=g, dtype=torch.int32)
    scores_out = torch.full((tokens, experts), -7.0)
    d = lambda t: dev(t, device)  # noqa: E731
    args = (d(logits), k, shared[0], shared[1], 2.5, ep_rank, func)
    kw = dict(mask=d(mask), bias=d(bias), image_bias=d(image_bias), image_token_mask=d(image),
              fix_routing_mask=d(fixed), to_physical_map=d(phys_map), logical_count=d(count),
              force_random=d(rand))  # fmt: skip
    unmapped_d, scores_d = d(unmapped), d(scores_out)
    idx, w = tilebake.moe.moe_topk_gate_forward(*args, **kw, unmapped_topk_idx=unmapped_d, scores=scores_d)
    idx2, w2 = tilebake.moe.moe_topk_gate(*args, **kw, unmapped_topk_idx=d(unmapped))
    assert_bytes_equal(idx2, idx, "moe_topk_gate's indices")
    assert_bytes_equal(w2, w, "moe_topk_gate's weights")
    idx, w, unmapped_got = idx.cpu(), w.cpu(), unmapped_d.cpu()
    sc = score64(torch.where(bad[:, None], 0.0, logits), func)
    for t in range(tokens):
        slots, wt = idx[t], w[t]
        fixed_out = fixed is not None and fixed[t] and not (rand is not None and rand[t]) and t % 5 == 4
        if (mask is not None and not mask[t]) or bad[t] or fixed_out:  # masked, non-finite, a fixed id out of range
            assert bool((slots == -1).all()) and bool((wt == 0).all()), f"token {t}: not routed"
            continue
        routed = slots[:k]
        if rand is not None and rand[t]:  # k distinct routed experts; unmapped_topk_idx -1
            assert bool((unmapped_got[t] == -1).all()), f"token {t}: a random row's unmapped ids"
            if phys_map is not None:
                continue  # the logical ids are not returned
            logical = routed
            assert len(set(logical.tolist())) == k and bool(((logical >= 0) & (logical < experts)).all())
        elif fixed is not None and fixed[t]:
            logical = fixed_ids[t]
            assert torch.equal(unmapped_got[t], fixed_ids[t]), "a fixed row's unmapped ids changed"
        else:
            logical = unmapped_got[t]
            b = image_bias if (image is not None and image[t]) else bias
            key = sc[t] + (0 if b is None else b.double())
            chosen = key[logical]
            rest = torch.ones(experts, dtype=torch.bool)
            rest[logical] = False
            assert len(set(logical.tolist())) == k and bool((logical >= 0).all()), f"token {t}: ids {logical}"
            assert not rest.any() or bool(chosen.min() >= key[rest].max() - 1e-5), f"token {t}: not the top k"
            assert bool((chosen[:-1] >= chosen[1:] - 1e-5).all()), f"token {t}: not descending"
            for a in range(k - 1):  # exact ties: the smaller id first
                if chosen[a] == chosen[a + 1]:
                    assert logical[a] < logical[a + 1], f"token {t}: a tie not broken to the smaller id"
        if phys_map is None:
            assert torch.equal(routed, logical), f"token {t}: slots != the logical ids"
        else:
            col = (ep_rank + t * 23333) % count.long()[logical]
            assert torch.equal(routed, phys_map.long()[logical, col]), f"token {t}: physical ids"
        u = sc[t][logical]
        assert_within(wt[:k], 2.5 * u / (1e-20 + u.sum()), 1e-12, 1e-5, f"token {t}: weights")
        if shared[0]:
            ids = torch.arange(experts, experts + shared[1])
            if phys_map is not None:
                ids = phys_map.long()[ids, (ep_rank + t * 23333) % count.long()[ids]]
            assert torch.equal(slots[k:], ids), f"token {t}: shared slots"
            assert bool((wt[k:] == 1).all()), f"token {t}: shared weights"


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), func=st.sampled_from(["sqrtsoftplus", "sigmoid", "softmax"]),
       aux=st.booleans(), masked_slots=st.booleans(), pad=st.sampled_from([0, 5]))  # fmt: skip
def test_moe_topk_gate_backward(seed, data, func, aux, masked_slots, pad, device):
    """grad_logits = float64 autograd of w_j = rsf u[idx_j] / (1e-20 + sum u[idx_j]) (and the
    aux-loss term sum_s sum_e G[s, e] sum_{t in s, mask} u[t, e] / sum u[t]), within rtol 1e-5 +
    1e-5 max|grad| (the documented bound); -1 slots add nothing, duplicates add up, masked
    tokens' rows exactly 0; an index >= E raises ValueError on the CPU."""
    seqs = data.draw(st.integers(1, 3))
    tokens, experts = seqs * data.draw(st.integers(1, 12)), data.draw(st.integers(1, 80))
    k = data.draw(st.integers(1, min(experts, 32)))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g, dtype=torch.float64) * 3
    idx = torch.randint(0, experts, (tokens, k), generator=g)
    if masked_slots:
        idx[torch.rand(tokens, k, generator=g) < 0.2] = -1
    mask = (torch.rand(tokens, generator=g) < 0.8) if aux or data.draw(st.booleans()) else None
    gsum = torch.randn(seqs, experts, generator=g) if aux else None
    if aux and mask is None:
        mask = torch.ones(tokens, dtype=torch.bool)
    gw = torch.randn(tokens, k, generator=g)
    lg = logits.clone().requires_grad_(True)
    u = score64(lg, func)
    sel = torch.where(idx >= 0, u.gather(1, idx.clamp_min(0)), 0.0)
    w64 = 2.5 * sel / (1e-20 + sel.sum(1, keepdim=True))
    loss = (w64 * gw.double()).sum()
    keep = torch.ones(tokens, dtype=torch.double) if mask is None else mask.double()
    if aux:
        share = (u / u.sum(1, keepdim=True)) * keep[:, None]
        loss = loss + (share.view(seqs, -1, experts).sum(1) * gsum.double()).sum()
    loss.backward()
    want = lg.grad * keep[:, None]
    u32 = strided_rows(u.detach().float(), pad)
    idx_in = idx
    if device == "cuda":  # there any index outside [0, E) marks a masked slot, as -1 does
        idx_in = torch.where(idx < 0, torch.tensor([experts, -7])[torch.randint(0, 2, idx.shape, generator=g)], idx)
    got = tilebake.moe.moe_topk_gate_backward(dev(u32, device), dev(idx_in, device), dev(w64.detach().float(), device),
                                              dev(gw, device), 2.5, func, dev(mask, device),
                                              dev(gsum, device))  # fmt: skip
    # cancellation noise where the true gradient is ~0 (a token's one valid slot): float64's below
    # 1e-12 of the inputs' terms, the GPU's fp32 below 1e-6 of them (the docstring's bound)
    terms = 2.5 * gw.abs().max() + (0 if gsum is None else gsum.abs().max())
    noise = (1e-12 if device == "cpu" else 1e-6) * terms
    assert_within(got, want, 1e-5 * want.abs().max() + noise, 1e-5, "grad_logits")
    if mask is not None:
        assert bool((got.cpu()[~mask] == 0).all()), "a masked token's row"
    if device == "cpu":
        bad = idx.clone()
        bad[0, 0] = experts
        with pytest.raises(ValueError):
            tilebake.moe.moe_topk_gate_backward(u32, bad, w64.detach().float(), gw, 2.5, func)


# --- the fused mapping and its expand / reduce ---


def draw_topk(data, seed):
    tokens, experts = data.draw(st.integers(1, 50)), data.draw(st.integers(1, 20))
    k = data.draw(st.integers(1, 9))
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, experts, (tokens, k), generator=g)
    if data.draw(st.booleans()):  # out of range both ways: dropped
        idx[torch.rand(tokens, k, generator=g) < 0.1] = torch.tensor([experts, -5, 2**40])[torch.randint(0, 3, (1,))]
    return idx, experts


def out_of_range_slots(tk2p: torch.Tensor, rows: int, seed: int) -> torch.Tensor:
    """Some dropped slots (-1) given other positions outside [0, rows), which also skip the slot."""
    g = torch.Generator().manual_seed(seed)
    other = torch.tensor([rows, rows + 7, -2, -(2**31)], dtype=torch.int32)[
        torch.randint(0, 4, tk2p.shape, generator=g)
    ]
    return torch.where((tk2p < 0) & (torch.rand(tk2p.shape, generator=g) < 0.5), other, tk2p)


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), alignment=st.sampled_from([1, 3, 8, 128]), rows=st.sampled_from(["sync", "bound",
       "short"]))  # fmt: skip
def test_get_fused_mapping_invariants(seed, data, alignment, rows, device):
    """Expert e's pairs (in flat index order t * k + j) fill [start_e, start_e + count_e), start the
    exclusive sum of align(count, alignment); pos_* name each row's expert, token and pair, -1 on
    padding; out-of-range ids and rows >= N are dropped (-1)."""
    idx, experts = draw_topk(data, seed)
    tokens, k = idx.shape
    bound = (tokens * k + (alignment - 1) * experts) // alignment * alignment
    n_arg = {"sync": 0, "bound": 0, "short": max(1, bound // 2)}[rows]
    out = tilebake.moe.get_fused_mapping(idx.to(device), experts, n_arg, alignment, force_no_sync=rows == "bound")
    p2e, p2t, p2tk, tk2p, start, end, per_expert, per_list = (o.cpu() if torch.is_tensor(o) else o for o in out)
    counts = [int((idx == e).sum()) for e in range(experts)]
    aligned = torch.tensor([-(-c // alignment) * alignment for c in counts])
    assert torch.equal(per_expert.long(), aligned), "num_tokens_per_expert"
    assert torch.equal(start.long(), aligned.cumsum(0) - aligned), "expert_start"
    assert torch.equal(end.long(), aligned.cumsum(0)), "expert_end"
    n = {"sync": int(aligned.sum()), "bound": bound, "short": n_arg}[rows]
    assert per_list == (aligned.tolist() if rows == "sync" else []), "the host list"
    want_e, want_t, want_tk = (torch.full((n,), -1, dtype=torch.int32) for _ in range(3))
    want_pos = torch.full((tokens, k), -1, dtype=torch.int32)
    fill = start.long().clone()
    for flat in range(tokens * k):
        t, j = divmod(flat, k)
        e = int(idx[t, j])
        if 0 <= e < experts:
            p = int(fill[e])
            fill[e] += 1
            if p < n:
                want_e[p], want_t[p], want_tk[p], want_pos[t, j] = e, t, flat, p
    for got, want, what in ((p2e, want_e, "pos_to_expert"), (p2t, want_t, "pos_to_token"),
                            (p2tk, want_tk, "pos_to_token_topk"), (tk2p, want_pos, "token_topk_to_pos")):  # fmt: skip
        assert_bytes_equal(got, want, what)


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float8_e4m3fn,
       torch.int32]), pad=st.sampled_from([0, 16]), quant=st.sampled_from([None, "e4m3", "e2m1"]),
       col=st.booleans(), packed=st.booleans())  # fmt: skip
def test_expand_to_fused_copies_rows(seed, data, dtype, pad, quant, col, packed, device):
    """Row token_topk_to_pos[t, j] of the result is x[t] (bytes, any dtype), padding rows zero, a
    position outside [0, N) skipped;
    with_sf moves the SF rows alike (either SF layout in, either out)."""
    idx, experts = draw_topk(data, seed)
    tokens = idx.shape[0]
    alignment = data.draw(st.sampled_from([1, 4]))
    p2e, _, _, tk2p, *_ = tilebake.moe.get_fused_mapping(idx, experts, 0, alignment)
    tk2p = out_of_range_slots(tk2p, len(p2e), seed)
    hidden = 16 * data.draw(st.integers(1, 6))
    x = torch.randint(-(2**30), 2**30, (tokens, hidden), generator=torch.Generator().manual_seed(seed)).int()
    x = x.view(torch.float32).to(dtype) if dtype.is_floating_point else x  # every bit pattern for int32
    want = torch.zeros(len(p2e), hidden, dtype=dtype)
    if quant is None:
        pad = pad * 16 // x.element_size()
        got = tilebake.moe.expand_to_fused(strided_rows(x, pad).to(device), tk2p.to(device), p2e.to(device))
    else:
        npc = data.draw(st.sampled_from([16, 32, 64, 128]))
        packed = packed and True
        q = tilebake.quant.per_token_cast(normal(seed, (tokens, 32 * (hidden // 16))).to(device), quant, npc,
                                          round_sf=packed, use_packed_ue8m0=packed,
                                          use_tma_aligned_col_major_sf=data.draw(st.booleans()))  # fmt: skip
        got, got_sf = tilebake.moe.expand_to_fused_with_sf(q, npc, tk2p.to(device), p2e.to(device), col)
        x = q[0].cpu()
        want = torch.zeros(len(p2e), x.shape[1], dtype=x.dtype)
        want_sf = torch.zeros(len(p2e), q[1].shape[1], dtype=q[1].dtype)
        for t, j in ((tk2p >= 0) & (tk2p < len(p2e))).nonzero().tolist():
            want_sf[tk2p[t, j]] = q[1][t].cpu()
        assert_bytes_equal(got_sf, want_sf, "SF rows")
        if col:
            assert got_sf.stride(0) == 1, "a column-major SF"
    for t, j in ((tk2p >= 0) & (tk2p < len(p2e))).nonzero().tolist():
        want[tk2p[t, j]] = x[t]
    assert_bytes_equal(got, want, "rows")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, data=st.data(), dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       weights=st.booleans(), row_sf=st.booleans(), fp8=st.booleans(), nan=st.booleans())  # fmt: skip
def test_reduce_fused_sums(seed, data, dtype, weights, row_sf, fp8, nan, device):
    """out[t] = sum over valid slots of x[p] w[t, j] (x_sf[p]) within fp32's rounding of the sum of
    |terms| (float64), then * sf and e4m3 (saturating at 448) or x's dtype; positions outside
    [0, N) add nothing; no valid slot: 0; a
    NaN input gives NaN (documented) where it enters."""
    idx, experts = draw_topk(data, seed)
    tokens, k = idx.shape
    p2e, _, _, tk2p, *_ = tilebake.moe.get_fused_mapping(idx, experts, 0, 1)
    tk2p = out_of_range_slots(tk2p, len(p2e), seed)
    rows, hidden = len(p2e), 8 * data.draw(st.integers(1, 8))
    x = normal(seed, (rows, hidden), dtype, 4.0, (float("nan"),) if nan and not fp8 else (), 0.02)
    w = torch.rand(tokens, k, generator=torch.Generator().manual_seed(seed)) if weights else None
    xsf = torch.rand(rows) + 0.5 if row_sf else None
    sf = torch.tensor([0.25]) if fp8 else None
    arg = x.to(device) if xsf is None else (x.to(device), xsf.to(device))
    got = tilebake.moe.reduce_fused(arg, dev(w, device), tk2p.to(device), "e4m3" if fp8 else "", dev(sf, device))
    valid = (tk2p >= 0) & (tk2p < rows)
    s = torch.where(valid, 1.0 if w is None else w.double(), 0.0)
    if xsf is not None:
        s = s * torch.cat((xsf.double(), torch.ones(1)))[torch.where(valid, tk2p, rows).long()]
    x_pad = torch.cat((x.double(), torch.zeros(1, hidden, dtype=torch.double)))  # row `rows`: 0 (no slot)
    terms = x_pad[torch.where(valid, tk2p, rows).long()] * s[..., None]  # (T, k, H)
    terms = torch.where(valid[..., None], terms, 0.0)
    want, size = terms.sum(1), terms.abs().sum(1)
    if fp8:
        want, size = (want * 0.25).clamp(-448, 448), size * 0.25
        assert got.dtype == torch.float8_e4m3fn
        assert_within(got.float(), want, 2.0**-9 + 1e-6 * size, 2.0**-4, "e4m3 out")
        return
    assert got.dtype == dtype
    rel = 2.0**-8 if dtype == torch.bfloat16 else 0.0
    assert_within(got, want, 1e-6 * size + 1e-38, rel, "out", nonfinite=True)
