"""Property-based tests (hypothesis): shapes, strides, options and values drawn at random, special
values among them (NaN, +-inf, 0, -0, denormals, the formats' maxima). On the CPU each op is held
to an independent statement of its contract (an error bound, a sort, a left-to-right sum, an
inverse); on a GPU the kernel must also give the CPU path's bytes where the op is exact.

CI runs a fixed example list (derandomized, TILEBAKE_HYPOTHESIS_EXAMPLES=25 each); the H200 runs a
larger, random budget: TILEBAKE_HYPOTHESIS_EXAMPLES=500 TILEBAKE_HYPOTHESIS_RANDOM=1.
The shared settings and helpers are in tests/properties/strategies.py, the other ops' properties
in tests/properties/.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tilebake
from tests.properties.strategies import (
    BF16_MAX,
    DEVICES,
    E4M3_MAX,
    FINITE_SPECIALS,
    PROPERTY,
    assert_bytes_equal,
    values,
)
from tilebake.torch import rotary_embedding_ref

# --- per_token_cast: every finite value within the format's rounding of its block scale ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(1, 40), blocks=st.integers(1, 12),
       npc=st.sampled_from([16, 32, 64, 128]), tail=st.sampled_from([0, 16]), fmt=st.sampled_from(["e4m3", "e2m1"]),
       dtype=st.sampled_from([torch.bfloat16, torch.float32]), round_sf=st.booleans(),
       special_rate=st.sampled_from([0.0, 0.05, 0.5]))  # fmt: skip
def test_per_token_cast_round_trip_error_bound(seed, tokens, blocks, npc, tail, fmt, dtype, round_sf, special_rate,
                                               device):  # fmt: skip
    """x ~ data * sf: |x - y| <= rel |x| + abs sf per block (e4m3: half an ulp of 3 mantissa bits,
    2^-4, and half its smallest step 2^-10; e2m1: a quarter each), y finite; on a GPU the bytes of
    the CPU path. A partial last block (H not a multiple of npc) when tail is set."""
    hidden = max(16, blocks * npc - (npc - tail if tail else 0))
    x = values(seed, (tokens, hidden), dtype, FINITE_SPECIALS, special_rate)
    data, sf = tilebake.quant.per_token_cast(x.to(device), fmt, npc, round_sf=round_sf)
    y = tilebake.quant.cast_back((data, sf), "fp32", (1, npc)).cpu()
    assert y.isfinite().all(), "a finite input dequantised to a non-finite value"
    rel, step = (2.0**-4, 2.0**-10) if fmt == "e4m3" else (0.25, 0.25)
    block_sf = sf.cpu().repeat_interleave(npc, dim=1)[:, :hidden]
    bound = rel * x.float().abs() + step * block_sf
    err = (y - x.float()).abs()
    worst = (err - bound).argmax()
    assert bool((err <= bound).all()), f"x {x.flatten()[worst]} came back as {y.flatten()[worst]}"
    if device == "cuda":
        want = tilebake.quant.per_token_cast(x, fmt, npc, round_sf=round_sf)
        assert_bytes_equal(data, want[0], "data")
        assert_bytes_equal(sf, want[1], "sf")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(1, 300), cols=st.integers(1, 20),
       block=st.sampled_from([(32, 32), (32, 128), (128, 32), (128, 128)]), fmt=st.sampled_from(["e4m3", "e2m1"]),
       dtype=st.sampled_from([torch.bfloat16, torch.float32]), round_sf=st.booleans(),
       special_rate=st.sampled_from([0.0, 0.05]))  # fmt: skip
def test_per_block_cast_round_trip_error_bound(seed, tokens, cols, block, fmt, dtype, round_sf, special_rate, device):
    """2-D blocks, partial edge blocks (any T, H a multiple of 32): the per_token_cast bound with
    the block's scale; on a GPU the bytes of the CPU path."""
    bm, bk = block
    hidden = 32 * cols
    x = values(seed, (tokens, hidden), dtype, FINITE_SPECIALS, special_rate)
    data, sf = tilebake.quant.per_block_cast(x.to(device), fmt, block, round_sf=round_sf)
    y = tilebake.quant.cast_back((data, sf), "fp32", block).cpu()
    assert y.isfinite().all(), "a finite input dequantised to a non-finite value"
    rel, step = (2.0**-4, 2.0**-10) if fmt == "e4m3" else (0.25, 0.25)
    block_sf = sf.cpu().repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:tokens, :hidden]
    err, bound = (y - x.float()).abs(), rel * x.float().abs() + step * block_sf
    assert bool((err <= bound).all()), f"worst excess {(err - bound).max().item()}"
    if device == "cuda":
        want = tilebake.quant.per_block_cast(x, fmt, block, round_sf=round_sf)
        assert_bytes_equal(data, want[0], "data")
        assert_bytes_equal(sf, want[1], "sf")


# --- cast: round to nearest even as torch's .to; stochastic rounding brackets it ---

CAST_SPECIALS = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, 448.0, 464.0, -1e6, 3.4e38)


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), numel=st.integers(1, 3000).map(lambda n: 4 * n),
       pair=st.sampled_from([(torch.float32, torch.bfloat16), (torch.float32, torch.float8_e4m3fn),
                             (torch.bfloat16, torch.float8_e4m3fn), (torch.bfloat16, torch.float32)]),
       special_rate=st.sampled_from([0.0, 0.1]), stochastic=st.booleans())  # fmt: skip
def test_cast(seed, numel, pair, special_rate, stochastic, device):
    """Nearest even: torch's .to (e4m3 saturating at +-448, as torch does); stochastic: one of the
    two neighbours of the value (NaN stays NaN) and the same bits again for the same input."""
    src, dst = pair
    if stochastic and dst == torch.float32:
        return  # no stochastic rounding to fp32
    x = values(seed, (numel,), src, CAST_SPECIALS, special_rate)
    got = tilebake.quant.cast(x.to(device), dst, stochastic).cpu()
    if not stochastic:  # torch's .to on the tensor's device (e4m3 above 448: torch's, by version and device)
        assert_bytes_equal(got, x.to(device).to(dst), "cast")
        # NaN's payload is the device's (CUDA's canonical NaN, the CPU's quiet NaN): its pattern only
        inside = ((x.float().abs() <= E4M3_MAX) | (dst != torch.float8_e4m3fn)) & ~x.float().isnan()
        assert_bytes_equal(got[inside], x[inside].to(dst), "cast, against the CPU's rounding")
        assert torch.equal(got.float().isnan(), x.to(dst).float().isnan()), "cast, NaN pattern"
        return
    assert_bytes_equal(tilebake.quant.cast(x.to(device), dst, True), got, "a second stochastic cast")
    exact = x.float()
    g = got.float()
    assert torch.equal(g.isnan(), exact.isnan()), "NaN pattern"
    finite = exact.isfinite() & (exact.abs() < (E4M3_MAX if dst == torch.float8_e4m3fn else BF16_MAX))
    # a step of the format at the value: at most |nearest| 2^-mantissa bits, at least its smallest subnormal
    mantissa, smallest = (3, 2.0**-9) if dst == torch.float8_e4m3fn else (7, 2.0**-133)
    step = (exact[finite].to(dst).float().abs() * 2.0**-mantissa).clamp(min=smallest)
    assert bool(((g[finite] - exact[finite]).abs() <= 2 * step).all()), "not a neighbour of the value"


# --- topk_gate: a stable descending sort; non-finite rows -1 on a GPU, an error on the CPU ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(1, 64), experts=st.integers(1, 1500), data=st.data(),
       levels=st.sampled_from([2, 5, 1000]), nonfinite=st.booleans(), strided=st.booleans())  # fmt: skip
def test_topk_gate_is_a_stable_sort(seed, tokens, experts, data, levels, nonfinite, strided, device):
    """Ties (few distinct levels) go to the smaller index; a row with a NaN or an infinity gives -1s
    on a GPU and ValueError on the CPU (its documented results)."""
    k = data.draw(st.integers(1, min(experts, 32)))
    g = torch.Generator().manual_seed(seed)
    wide = torch.randint(0, levels, (tokens, experts + 3 * strided), generator=g).float() / levels
    scores = wide[:, :experts]  # an odd row stride when strided
    bad = torch.zeros(tokens, dtype=torch.bool)
    if nonfinite:
        bad = torch.rand(tokens, generator=g) < 0.3
        cols = torch.randint(0, experts, (tokens,), generator=g)
        kinds = torch.tensor([float("nan"), float("inf"), float("-inf")])[torch.randint(0, 3, (tokens,), generator=g)]
        scores[bad, cols[bad]] = kinds[bad]  # (in wide too)
    want = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    if device == "cpu" and bad.any():
        with pytest.raises(ValueError):
            tilebake.moe.topk_gate(scores, k)
        return
    got = tilebake.moe.topk_gate(wide.to(device)[:, :experts], k).cpu()
    assert torch.equal(got[~bad], want[~bad]), "indices of the finite rows"
    assert bool((got[bad] == -1).all()), "a non-finite row's indices"


# --- normalize_weight: 1e-20 + w0 + w1 + ... left to right, then w / that ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(1, 300), k=st.integers(1, 32),
       zeros=st.booleans())  # fmt: skip
def test_normalize_weight_left_to_right(seed, tokens, k, zeros, device):
    w = values(seed, (tokens, k), torch.float32).abs()
    if zeros:
        w[::3] = 0.0  # every third row all zeros: the 1e-20 keeps it finite
    den = torch.full((tokens,), 1e-20)
    for j in range(k):
        den = den + w[:, j]
    got_den, got = tilebake.moe.normalize_weight(w.to(device))
    assert_bytes_equal(got_den, den, "denominator")
    assert_bytes_equal(got, w / den[:, None], "normalized")


# --- apply_rotary: the reference's bytes on a GPU; conjugate undoes it ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(1, 300), heads=st.integers(1, 16), kv=st.integers(0, 4),
       rot=st.sampled_from([64, 128]), interleaved=st.booleans(), conjugate=st.booleans(),
       positions=st.sampled_from([None, torch.int32, torch.int64]), offset=st.integers(0, 5),
       dtype=st.sampled_from([torch.bfloat16, torch.float32]))  # fmt: skip
def test_apply_rotary(seed, tokens, heads, kv, rot, interleaved, conjugate, positions, offset, dtype, device):
    """Query and key as views of one fused buffer (strided tokens). On a GPU bit-exact with
    rotary_embedding_ref; on the CPU, rotating back (the other `conjugate`) restores the input
    within the rounding of two rotations."""
    g = torch.Generator().manual_seed(seed)
    max_pos = tokens + 8
    angles = torch.rand(max_pos, rot // 2, generator=g, dtype=torch.float64) * 6.3
    cache = torch.cat((angles.cos(), angles.sin()), 1).float().to(device)
    qkv = torch.randn(tokens, heads + kv + 1, rot, generator=g).to(dtype).to(device)
    q, k = qkv[:, :heads], (qkv[:, heads : heads + kv] if kv else None)
    pos = None if positions is None else torch.randint(0, max_pos - offset, (tokens,), generator=g).to(positions)
    pos = None if pos is None else pos.to(device)
    before = qkv.clone()
    want_q, want_k = rotary_embedding_ref(q.clone(), cache, None if k is None else k.clone(), pos, interleaved,
                                          conjugate, offset)  # fmt: skip
    tilebake.transform.apply_rotary(q, cache, k, pos, interleaved, conjugate, offset)
    assert_bytes_equal(q, want_q, "query")
    if k is not None:
        assert_bytes_equal(k, want_k, "key")
    assert_bytes_equal(qkv[:, heads + kv :], before[:, heads + kv :], "the head after query and key")
    if device == "cpu":
        tilebake.transform.apply_rotary(q, cache, k, pos, interleaved, not conjugate, offset)
        tol = 2.0**-6 if dtype == torch.bfloat16 else 1e-5
        scale = before[:, : heads + kv].float().abs().amax(-1, keepdim=True)
        err = (qkv[:, : heads + kv].float() - before[:, : heads + kv].float()).abs()
        assert bool((err <= tol * scale).all()), "rotating back did not restore the input"


# --- mHC: the stream mix and its broadcast, the reference's order of roundings ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(1, 70), m=st.integers(1, 8),
       hidden=st.integers(1, 300).map(lambda h: 8 * h), flat_mix=st.booleans())  # fmt: skip
def test_mhc_pre_apply_mix_and_expand(seed, tokens, m, hidden, flat_mix, device):
    """o = bf16(mix[0] x[0] + mix[1] x[1] + ...), each product and sum rounded to fp32 on its own
    (stream order); expand_to_mhc copies a row to every stream and its backward adds them in order."""
    x = values(seed, (tokens, m, hidden), torch.bfloat16, (0.0, -0.0, 1e-39), 0.05)
    g = torch.Generator().manual_seed(seed + 1)
    mix = torch.rand(tokens, m, *(() if flat_mix else (1,)), generator=g)
    acc = mix.reshape(tokens, m, 1)[:, 0] * x[:, 0].float()
    for i in range(1, m):
        acc = acc + mix.reshape(tokens, m, 1)[:, i] * x[:, i].float()
    got = tilebake.mhc.mhc_pre_apply_mix_fwd(x.to(device), mix.to(device))
    assert_bytes_equal(got, acc.bfloat16(), "o")
    row = x[:, 0].contiguous()
    o = torch.empty(tokens, m, hidden, dtype=torch.bfloat16, device=device)
    assert_bytes_equal(
        tilebake.mhc.expand_to_mhc_fwd(row.to(device), o), row[:, None].expand(tokens, m, hidden), "expand"
    )
    total = x[:, 0].float()
    for i in range(1, m):
        total = total + x[:, i].float()
    assert_bytes_equal(tilebake.mhc.expand_to_mhc_bwd(x.to(device)), total.bfloat16(), "expand backward")


# --- argument checks: a wrong dtype names the argument ---


@PROPERTY
@given(dtype=st.sampled_from([torch.float16, torch.float64, torch.int32, torch.int8, torch.bool, torch.uint8]),
       which=st.sampled_from(["per_token_cast", "topk_gate", "normalize_weight", "mhc_pre_apply_mix_fwd"]))  # fmt: skip
def test_wrong_dtype_names_the_argument(dtype, which):
    x = torch.zeros(4, 64, dtype=dtype)
    call, name = {
        "per_token_cast": (lambda: tilebake.quant.per_token_cast(x, "e4m3", 32), "x"),
        "topk_gate": (lambda: tilebake.moe.topk_gate(x, 2), "scores"),
        "normalize_weight": (lambda: tilebake.moe.normalize_weight(x[:, :4]), "topk_weights"),
        "mhc_pre_apply_mix_fwd": (lambda: tilebake.mhc.mhc_pre_apply_mix_fwd(x.view(4, 4, 16), torch.rand(4, 4)), "x"),
    }[which]
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert name in str(info.value), f"{which}: {info.value}"
