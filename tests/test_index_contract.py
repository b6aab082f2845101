"""The out-of-range contract of every index / position input of the public ops, in one place.

Each case feeds boundary values (0, the last valid index), values at and far past the bound
(INT32_MAX, 2^40) and negative ones (-1, INT32_MIN, INT64_MIN) and asserts what the op's
docstring documents, on the CPU path and on a GPU (small shapes: the file also runs as-is under
compute-sanitizer memcheck). Ops without index inputs: normalize_weight, topk_gate (indices are
outputs), the quant casts and norms, engram_gate_* / fused_weight / grad_w_reduce / sinkhorn, and
the whole mhc family (mixes, residuals and partials only: nothing there is read as an index).
"""

import pytest
import torch

import tilebake
from tilebake.engram import engram_hash
from tilebake.moe import (
    expand_to_fused,
    expand_to_fused_with_sf,
    get_fused_mapping,
    moe_topk_gate_backward,
    moe_topk_gate_forward,
    reduce_fused,
)
from tilebake.quant import swiglu_backward, swiglu_forward
from tilebake.torch import moe_topk_gate_backward_ref, rotary_embedding_ref
from tilebake.torch.engram import engram_hash_ref, make_offsets
from tilebake.torch.swiglu import get_mapping_from_psum
from tilebake.transform import apply_rotary

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
TOKENS = [1, 7, 33]
I32_MAX, I32_MIN, I64_MIN = 2**31 - 1, -(2**31), -(2**63)


def inject(values: torch.Tensor, specials) -> torch.Tensor:
    """values (flat, on the CPU) with `specials` written at distinct random places (cycled when
    there are more specials than places)."""
    flat = values.reshape(-1).clone()
    places = torch.randperm(flat.numel())
    for i, v in enumerate(specials[: flat.numel()]):
        flat[places[i]] = v
    return flat.view(values.shape)


# --- get_fused_mapping: topk_idx outside [0, num_experts) drops the slot; rows >= N are dropped.


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("num_expanded", [0, 9])
def test_get_fused_mapping_topk_idx(device, num_tokens, num_expanded):
    experts, k, alignment = 5, 4, 4
    clean = torch.randint(0, experts, (num_tokens, k))
    raw = inject(clean, [0, experts - 1, -1, experts, I32_MAX, 2**40, I32_MIN, I64_MIN, -2])
    invalid = (raw < 0) | (raw >= experts)
    want = get_fused_mapping(torch.where(invalid, -1, raw), experts, num_expanded, alignment, True)
    got = get_fused_mapping(raw.to(device), experts, num_expanded, alignment, True)
    names = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "start", "end", "counts")
    for name, g, w in zip(names, got[:7], want[:7]):
        assert torch.equal(g.cpu(), w), name
    assert got[7] == []
    token_topk_to_pos = got[3].cpu()
    assert (token_topk_to_pos[invalid] == -1).all()
    rows = got[0].shape[0]
    assert ((token_topk_to_pos >= -1) & (token_topk_to_pos < rows)).all()


# --- expand_to_fused(_with_sf) and reduce_fused: a position outside [0, N) is skipped.


def fused_maps(num_tokens, k):
    """A mapping of every slot to a distinct row of N = T * k + 3 rows, rows 0 and N - 1 among
    them; then some slots knocked out with out-of-range positions (their rows made padding with
    a negative pos_to_expert). Targeted rows carry expert ids up to INT32_MAX (never indices)."""
    rows = num_tokens * k + 3
    used = torch.cat([torch.tensor([0, rows - 1]), 1 + torch.randperm(rows - 2)[: num_tokens * k - 2]])
    pos = used[torch.randperm(num_tokens * k)].to(torch.int32).view(num_tokens, k)
    pos_to_expert = torch.full((rows,), -1, dtype=torch.int32)
    pos_to_expert[pos.reshape(-1).long()] = inject(torch.randint(0, 4, (num_tokens * k,), dtype=torch.int32), [I32_MAX])
    unused = torch.ones(rows, dtype=torch.bool)
    unused[pos.reshape(-1).long()] = False
    pos_to_expert[unused.nonzero()[:1, 0]] = I32_MIN  # another negative padding marker
    knocked = torch.randperm(num_tokens * k)[: max(1, num_tokens * k // 3)]
    for i, slot in enumerate(knocked.tolist()):
        row = int(pos.view(-1)[slot])
        pos.view(-1)[slot] = (-1, rows, I32_MAX, I32_MIN)[i % 4]
        pos_to_expert[row] = (-1, I32_MIN)[i % 2]
    return pos, pos_to_expert


def expected_rows(src, pos, rows):
    out = torch.zeros((rows, *src.shape[1:]), dtype=src.dtype)
    for t in range(pos.shape[0]):
        for p in pos[t].tolist():
            if 0 <= p < rows:
                out[p] = src[t]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_expand_to_fused_positions(device, num_tokens):
    pos, pos_to_expert = fused_maps(num_tokens, 2)
    rows = pos_to_expert.shape[0]
    x = torch.randn(num_tokens, 8).to(torch.bfloat16)
    got = expand_to_fused(x.to(device), pos.to(device), pos_to_expert.to(device))
    assert torch.equal(got.cpu(), expected_rows(x, pos, rows))
    data = torch.randn(num_tokens, 32).clamp(-400, 400).to(torch.float8_e4m3fn)
    sf = torch.rand(num_tokens, 1) + 0.5
    for col_major in (False, True):
        out, out_sf = expand_to_fused_with_sf(
            (data.to(device), sf.to(device)), 128, pos.to(device), pos_to_expert.to(device), col_major
        )
        assert torch.equal(out.cpu().view(torch.uint8), expected_rows(data.view(torch.uint8), pos, rows))
        assert torch.equal(out_sf.cpu(), expected_rows(sf, pos, rows))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reduce_fused_positions(device, num_tokens, dtype):
    k, rows, hidden = 4, 11, 8
    pos = inject(torch.randint(0, rows, (num_tokens, k), dtype=torch.int32), [0, rows - 1, -1, rows, I32_MAX, I32_MIN])
    x = torch.randint(-8, 9, (rows, hidden)).to(dtype)  # small integers: every sum is exact
    w = torch.randint(-4, 5, (num_tokens, k)).float()
    want = torch.zeros(num_tokens, hidden, dtype=torch.float64)
    for t in range(num_tokens):
        for j, p in enumerate(pos[t].tolist()):
            if 0 <= p < rows:
                want[t] += x[p].double() * float(w[t, j])
    got = reduce_fused(x.to(device), w.to(device), pos.to(device))
    assert torch.equal(got.cpu(), want.to(dtype))
    unweighted = reduce_fused(x.to(device), None, pos.to(device))
    valid = (pos >= 0) & (pos < rows)
    assert torch.equal(unweighted.cpu().double(), (x.double()[pos.long().clamp(0, rows - 1)] * valid[..., None]).sum(1))


# --- moe_topk_gate_forward: fixed-routing ids, logical_count (to_physical_map's column), ep_rank.


def gate_logits(num_tokens, experts):
    return torch.randn(num_tokens, experts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_moe_topk_gate_fixed_routing_ids(device, num_tokens):
    experts, k = 16, 3
    logits = gate_logits(num_tokens, experts)
    given = torch.stack([torch.randperm(experts)[:k] for _ in range(num_tokens)])
    given[0, :2] = torch.tensor([0, experts - 1])
    bad_values = [-1, experts, I32_MAX, 2**40, I32_MIN, I64_MIN]
    bad_rows = torch.rand(num_tokens) < 0.5
    bad_rows[0] = False
    for i, t in enumerate(bad_rows.nonzero()[:, 0].tolist()):
        given[t, i % k] = bad_values[i % len(bad_values)]
    fixed = torch.rand(num_tokens) < 0.8
    fixed[0] = True
    unmapped = given.clone().to(device)
    idx, w = moe_topk_gate_forward(
        logits.to(device), k, False, 0, 1.5, 0, fix_routing_mask=fixed.to(device), unmapped_topk_idx=unmapped
    )
    idx, w = idx.cpu(), w.cpu()
    unrouted = fixed & bad_rows
    assert (idx[unrouted] == -1).all() and (w[unrouted] == 0).all()
    keep = fixed & ~bad_rows
    assert torch.equal(idx[keep], given[keep])
    assert torch.equal(unmapped.cpu()[fixed], given[fixed])  # fixed rows are read, never written
    scores = torch.sqrt(torch.nn.functional.softplus(logits, threshold=20))
    picked = scores.gather(1, given.clamp(0, experts - 1))
    torch.testing.assert_close(w[keep], (picked / picked.sum(1, keepdim=True) * 1.5)[keep], rtol=1e-5, atol=0)
    want_idx, want_w = moe_topk_gate_forward(
        logits, k, False, 0, 1.5, 0, fix_routing_mask=fixed, unmapped_topk_idx=given.clone()
    )
    # Fixed rows agree with the CPU exactly (the top-k rows may differ on near-ties: not compared).
    assert torch.equal(idx[fixed], want_idx[fixed])
    torch.testing.assert_close(w[fixed], want_w[fixed], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("ep_rank", [0, I32_MAX])
def test_moe_topk_gate_to_physical_map(device, num_tokens, ep_rank):
    experts, k, dup = 8, 2, 3
    logical = experts + 1  # one shared slot
    # Map entries are copied, not used as indices: any int32, negative ones too.
    table = inject(torch.randint(0, 100, (logical, dup), dtype=torch.int32), [I32_MAX, I32_MIN, -1])
    wide = torch.zeros(logical, 2 * dup, dtype=torch.int32)
    wide[:, :dup] = table
    count = torch.tensor([1, dup, 0, -1, dup + 1, I32_MAX, I32_MIN, 2, 2], dtype=torch.int32)
    logits = gate_logits(num_tokens, experts)
    unmapped = torch.empty(num_tokens, k, dtype=torch.int64, device=device)
    idx, _ = moe_topk_gate_forward(
        logits.to(device), k, True, 1, 1.0, ep_rank, to_physical_map=wide[:, :dup].to(device),
        logical_count=count.to(device), unmapped_topk_idx=unmapped,
    )  # fmt: skip
    ids = torch.cat([unmapped.cpu(), torch.full((num_tokens, 1), experts)], 1)
    want = torch.full((num_tokens, k + 1), -1, dtype=torch.int64)
    for t in range(num_tokens):
        for j, e in enumerate(ids[t].tolist()):
            c = int(count[e])
            if 1 <= c <= dup:
                want[t, j] = int(table[e, (ep_rank + t * 23333) % c])
    assert torch.equal(idx.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ep_rank", [-1, I32_MIN, 2**31])
def test_moe_topk_gate_ep_rank_outside_int32_raises(device, ep_rank):
    with pytest.raises(ValueError, match="ep_rank"):
        moe_topk_gate_forward(gate_logits(7, 8).to(device), 2, False, 0, 1.0, ep_rank)


# --- moe_topk_gate_backward: -1 masks a slot; other values outside [0, E): CPU raises, GPU masks.


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_moe_topk_gate_backward_topk_idx(device, num_tokens):
    experts, k = 12, 4
    scores = torch.rand(num_tokens, experts) + 0.1
    idx = torch.stack([torch.randperm(experts)[:k] for _ in range(num_tokens)])
    idx[0, :2] = torch.tensor([0, experts - 1])
    idx = inject(idx, [-1, -1])
    w, g = torch.rand(num_tokens, k), torch.randn(num_tokens, k)
    args = lambda i, dev: (scores.to(dev), i.to(dev), w.to(dev), g.to(dev), 2.0)  # noqa: E731
    masked = moe_topk_gate_backward(*args(idx, device)).cpu()
    want = moe_topk_gate_backward_ref(*args(idx, "cpu")).float()
    tol = 1e-5 + 1e-5 * float(want.abs().max())
    torch.testing.assert_close(masked, want, rtol=1e-5, atol=tol)
    outside = inject(idx, [experts, I32_MAX, 2**40, I32_MIN, I64_MIN, -2])
    if device == "cpu":
        with pytest.raises(ValueError):
            moe_topk_gate_backward(*args(outside, device))
        return
    got = moe_topk_gate_backward(*args(outside, device)).cpu()
    sanitized = torch.where((outside < 0) | (outside >= experts), -1, outside)
    assert torch.equal(got, moe_topk_gate_backward(*args(sanitized, device)).cpu())


# --- apply_rotary: a cache row (position + seqlen_offset, 64-bit) outside [0, S) leaves the token.


def rotated(q0, cache, rows):
    """float64 NeoX rotation of q0 (T, H, rot) by cache row rows[t] where it is in range."""
    half = q0.shape[-1] // 2
    out = q0.double().clone()
    for t, r in enumerate(rows.tolist()):
        if 0 <= r < cache.shape[0]:
            cos, sin = cache[r, :half].double(), cache[r, half:].double()
            x1, x2 = q0[t, :, :half].double(), q0[t, :, half:].double()
            out[t, :, :half], out[t, :, half:] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64, None], ids=["i32", "i64", "none"])
@pytest.mark.parametrize("offset", [0, 3, -3, 2**31, -(2**40)])
def test_apply_rotary_positions(device, num_tokens, pos_dtype, offset):
    cache_rows = 9
    angles = torch.arange(cache_rows, dtype=torch.float64)[:, None] * (10000.0 ** (-torch.arange(32) / 32))[None]
    cache = torch.cat((angles.cos(), angles.sin()), 1).float()
    if pos_dtype is None:
        positions, rows = None, torch.arange(num_tokens) + offset
    else:
        info = torch.iinfo(pos_dtype)
        specials = [0, cache_rows - 1, -1, cache_rows, info.max, info.min, -offset, cache_rows - 1 - offset]
        specials = [v for v in specials if info.min <= v <= info.max]
        if pos_dtype == torch.int64:
            specials += [2**40, -(2**40)]
        positions = inject(torch.randint(-3, cache_rows + 3, (num_tokens,), dtype=pos_dtype), specials)
        rows = positions.long() + offset
    q = torch.randn(num_tokens, 2, 64)
    key = torch.randn(num_tokens, 1, 64)
    q_dev, k_dev = q.to(device, copy=True), key.to(device, copy=True)
    apply_rotary(
        q_dev, cache.to(device), k_dev, None if positions is None else positions.to(device), seqlen_offset=offset
    )
    outside = (rows < 0) | (rows >= cache_rows)
    assert torch.equal(q_dev.cpu()[outside], q[outside]) and torch.equal(k_dev.cpu()[outside], key[outside])
    torch.testing.assert_close(q_dev.cpu().double(), rotated(q, cache, rows), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_dev.cpu().double(), rotated(key, cache, rows), rtol=1e-5, atol=1e-5)
    want_q, _ = rotary_embedding_ref(
        q.to(device),
        cache.to(device),
        None,
        positions if positions is None else positions.to(device),
        False,
        False,
        offset,
    )
    assert torch.equal(q_dev, want_q)


# --- swiglu_forward / swiglu_backward: the psum layout.


def swiglu_counts(x, psum):
    count = torch.zeros(4, dtype=torch.int64, device=x.device)
    y = swiglu_forward(x, "fp32", psum, clamp_value=1e30, clamped_count=count)
    return y, count


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize(
    "psum, ordered",
    [
        ([0, 3, 5], True),  # boundary: the first expert empty
        ([2, 6, 40], True),  # the last expert's rows past the tensor
        ([4, 9, I32_MAX], True),
        ([I32_MAX], True),
        ([5, 3, 12], False),  # decreasing
        ([9, 2], False),
        ([4, -1, 9], False),  # negative
        ([-3], False),
        ([I32_MIN, 6], False),
    ],
)
def test_swiglu_psum_layout(device, num_tokens, psum, ordered):
    """Ordered (non-decreasing, >= 0): expert e owns rows [align(psum[e-1]), psum[e]) of the
    tensor, the same on both paths. Otherwise each row is still an expert's or a padding row and
    values are computed for every row, but which rows count may differ between the paths."""
    tilebake.config.set_token_alignment(4)
    hidden = 64
    x = torch.randn(num_tokens, 2 * hidden).to(device)
    p = torch.tensor(psum, dtype=torch.int32, device=device)
    y_all, count_all = swiglu_counts(x, None)
    y, count = swiglu_counts(x, p)
    assert torch.equal(y, y_all)  # psum selects counted rows only
    valid = get_mapping_from_psum(p.cpu(), num_tokens, 4) >= 0
    assert int(count_all[3]) == num_tokens * hidden
    assert int(count[3]) % hidden == 0 and 0 <= int(count[3]) <= num_tokens * hidden
    if ordered or device == "cpu":
        assert int(count[3]) == int(valid.sum()) * hidden
    w = torch.rand(num_tokens, device=device) + 0.5
    g = torch.randn(num_tokens, hidden, device=device)
    x_grad_all, wg_all = swiglu_backward(x, g, "fp32", None, w, 1.0)
    x_grad, wg = swiglu_backward(x, g, "fp32", p, w, 1.0)
    padding = (wg == 0) & (x_grad == 0).all(1)
    same = (wg == wg_all) & (x_grad == x_grad_all).all(1)
    assert (padding | same).all()  # every row is either an expert's or a padding row
    if ordered or device == "cpu":
        assert torch.equal(same.cpu(), valid)


# --- engram_hash: token ids are hashed, never indices.


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_engram_hash_token_ids(device, num_tokens):
    ngram, layers, tables = 3, 2, 2
    ids = inject(torch.randint(-100, 100, (num_tokens, ngram), dtype=torch.int32), [0, -1, I32_MAX, I32_MIN, 1])
    mul = torch.randint(-(2**62), 2**62, (layers, ngram))
    voc = torch.randint(1, 1000, (layers, ngram - 1, tables), dtype=torch.int32)
    off = make_offsets(voc)
    got = engram_hash(*(t.to(device) for t in (ids, mul, voc, off))).cpu()
    assert torch.equal(got, engram_hash_ref(ids, mul, voc, off))
    lo = off[:, None, :].expand_as(got)
    assert ((got >= lo) & (got < lo + voc.reshape(layers, 1, -1))).all()
