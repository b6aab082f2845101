"""Properties of the cast family beyond per_token_cast / per_block_cast / cast / cast_back (those
are in tests/test_properties.py): the SF-only and precomputed-SF variants, the SF layouts, the
per-channel cast, fake quantisation, FP4 unpacking, the lossless FP4 -> FP8 re-quantisation and
the weight-SF transpose. The scale factors are checked against numerics.md's formula computed
here, the data against a round-trip error bound or an exact decode."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tilebake
from tests.properties.strategies import (
    DEVICES,
    FINITE_SPECIALS,
    FLOATS,
    PROPERTY,
    SEEDS,
    assert_bytes_equal,
    dense,
    strided_rows,
    values,
)

FMT_MAX = {"e4m3": 448.0, "e2m1": 6.0}
CLAMP = {
    ("e4m3", False): 1e-4,
    ("e4m3", True): 448 * 2.0**-9,
    ("e2m1", False): 6 * 2.0**-126,
    ("e2m1", True): 6 * 2.0**-9,
}
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_decode(packed: torch.Tensor) -> torch.Tensor:
    """int8 (.., K) -> fp32 (.., 2K): the low nibble first, bit 3 the sign (a table, not the op)."""
    b = packed.cpu().view(torch.uint8).long()
    codes = torch.stack((b & 15, b >> 4), -1).flatten(-2)
    mag = E2M1_VALUES[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


def decode(data: torch.Tensor) -> torch.Tensor:
    return e2m1_decode(data) if data.dtype == torch.int8 else data.cpu().float()


def ue8m0_bytes(words: torch.Tensor, count: int, dim: int = -1) -> torch.Tensor:
    """Packed UE8M0 int32 words -> their first `count` exponent bytes along `dim` (little-endian)."""
    w = dense(words.movedim(dim, -1))
    return w.view(torch.uint8)[..., :count].movedim(-1, dim).long()


def block_sf(x: torch.Tensor, fmt: str, bm: int, bk: int, round_sf: bool, e4m3_sf: bool = False) -> torch.Tensor:
    """numerics.md's scale per (bm, bk) block, computed here: c = max(amax, clamp); c / fmt_max,
    or c * (1 / fmt_max) rounded up to a power of two through its bits."""
    t, h = x.shape
    a = x.float().abs().cpu()
    a = torch.nn.functional.pad(a, (0, -h % bk, 0, -t % bm)).view(-(-t // bm), bm, -(-h // bk), bk).amax((1, 3))
    c = a.clamp_min(CLAMP[(fmt, e4m3_sf)])
    if not round_sf:
        s = c / FMT_MAX[fmt]
        # an e4m3 SF saturates at 448 (numerics.md; torch's own .to gives NaN above it in some versions)
        return s.clamp(max=448.0).to(torch.float8_e4m3fn).float() if e4m3_sf else s
    s = c * torch.tensor(1 / FMT_MAX[fmt], dtype=torch.float32)
    e = ((s.view(torch.int32) - 1) >> 23) + 1 - 127
    return torch.exp2(e.float())


def sf_values(sf: torch.Tensor, cols: int, packed_dim: int = -1) -> torch.Tensor:
    """Any SF layout -> fp32 values (packed UE8M0: 2^(byte - 127))."""
    if sf.dtype == torch.int32:
        return torch.exp2(ue8m0_bytes(sf, cols, packed_dim).float() - 127)
    return sf.cpu().float()


# --- per_token_cast's SF (every layout), its SF-only and precomputed-SF variants ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 40), hidden=st.integers(1, 24).map(lambda h: 16 * h),
       npc=st.sampled_from([16, 32, 64, 128]), fmt=st.sampled_from(["e4m3", "e2m1"]), dtype=FLOATS,
       layout=st.sampled_from(["plain", "round", "packed", "col", "col_packed", "e4m3_sf"]),
       pad=st.sampled_from([0, 16]), special_rate=st.sampled_from([0.0, 0.1]))  # fmt: skip
def test_per_token_sf_layouts_and_variants(seed, tokens, hidden, npc, fmt, dtype, layout, pad, special_rate, device):
    """The SF is numerics.md's formula in every layout (packed bytes = exponent + 127, the
    column-major view holds the same values); with_sf_only gives per_token_cast's SF bytes and
    with_precomputed_sf, given its power-of-two SF, its data bytes. Rows may be strided."""
    if fmt == "e2m1" and hidden % 32:
        hidden += 16
    round_sf = layout in ("round", "packed", "col_packed")
    opts = dict(round_sf=round_sf, use_packed_ue8m0="packed" in layout,
                use_tma_aligned_col_major_sf=layout.startswith("col"), use_e4m3_sf=layout == "e4m3_sf")  # fmt: skip
    x = strided_rows(values(seed, (tokens, hidden), dtype, FINITE_SPECIALS, special_rate), pad, device)
    data, sf = tilebake.quant.per_token_cast(x, fmt, npc, **opts)
    cols = -(-hidden // npc)
    want = block_sf(x, fmt, 1, npc, round_sf, layout == "e4m3_sf")
    assert_bytes_equal(sf_values(sf, cols), want, f"SF ({layout})")
    if layout.startswith("col"):
        assert sf.stride(0) == 1, "a column-major SF"
    assert_bytes_equal(tilebake.quant.per_token_cast_with_sf_only(x, fmt, npc, **opts), sf, "with_sf_only")
    if layout == "round":  # a power-of-two SF: 1 / sf = the cast's own multiplier (numerics.md; not so for
        # plain SF, where the cast multiplies by fmt_max / c: test_per_token_cast_with_any_precomputed_sf)
        got = tilebake.quant.per_token_cast_with_precomputed_sf(x, fmt, npc, sf, round_sf=round_sf)
        assert_bytes_equal(got, data, "with_precomputed_sf")
    if device == "cuda":
        want_data, want_sf = tilebake.quant.per_token_cast(x.cpu(), fmt, npc, **opts)
        assert_bytes_equal(data, want_data, "data against the CPU path")
        assert_bytes_equal(sf, want_sf, "SF against the CPU path")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 140), hidden=st.integers(1, 8).map(lambda h: 32 * h),
       block=st.sampled_from([(1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (128, 32), (32, 128)]),
       fmt=st.sampled_from(["e4m3", "e2m1"]), dtype=FLOATS, log_sf=st.integers(-20, 20))  # fmt: skip
def test_cast_with_any_precomputed_sf(seed, tokens, hidden, block, fmt, dtype, log_sf, device):
    """per_token_ / per_block_cast_with_precomputed_sf with a given SF (not made from x): q = x *
    (1 / sf) (numerics.md), e4m3 saturating at +-448 (torch's RNE below), e2m1 the nearest of its
    8 magnitudes (6 above)."""
    bm, bk = block
    x = values(seed, (tokens, hidden), dtype, (0.0, -0.0, 1e-39, 448.0, -1e38), 0.05)
    g = torch.Generator().manual_seed(seed + 7)
    shape = (-(-tokens // bm), -(-hidden // bk))
    sf = torch.exp2(log_sf + torch.randint(-3, 4, shape, generator=g).float()) * 1.25

    def call(x, sf):
        if bm == 1:
            return tilebake.quant.per_token_cast_with_precomputed_sf(x, fmt, bk, sf)
        return tilebake.quant.per_block_cast_with_precomputed_sf(x, fmt, block, sf)

    data = call(x.to(device), sf.to(device))
    q = x.float() * (1 / sf).repeat_interleave(bm, 0)[:tokens].repeat_interleave(bk, 1)[:, :hidden]
    got = decode(data)
    if fmt == "e4m3":
        assert_bytes_equal(data.cpu(), q.clamp(-448, 448).to(torch.float8_e4m3fn), "e4m3 codes")
    else:
        best = (q.abs().clamp(max=6)[..., None] - E2M1_VALUES).abs().min(-1).values
        assert bool(((got.abs() - q.abs().clamp(max=6)).abs() <= best).all()), "not a nearest e2m1 value"
        assert bool(((got == 0) | (got.sign() == q.sign())).all()), "e2m1 sign"
    if device == "cuda":
        assert_bytes_equal(data, call(x, sf), "data against the CPU path")


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 150), cols=st.integers(1, 10),
       block=st.sampled_from([(32, 32), (32, 128), (128, 32), (128, 128)]), fmt=st.sampled_from(["e4m3", "e2m1"]),
       dtype=FLOATS, layout=st.sampled_from(["plain", "round", "packed", "col"]))  # fmt: skip
def test_per_block_sf_and_variants(seed, tokens, cols, block, fmt, dtype, layout, device):
    """per_block_cast's SF is the formula over each (bm, bk) tile (partial edge tiles over their
    valid elements); with_sf_only gives the same SF, with_precomputed_sf (power-of-two SF) the
    same data."""
    bm, bk = block
    hidden = 32 * cols
    round_sf = layout in ("round", "packed")
    opts = dict(round_sf=round_sf, use_packed_ue8m0=layout == "packed", use_tma_aligned_col_major_sf=layout == "col")
    x = values(seed, (tokens, hidden), dtype, FINITE_SPECIALS, 0.05).to(device)
    data, sf = tilebake.quant.per_block_cast(x, fmt, block, **opts)
    assert_bytes_equal(sf_values(sf, -(-hidden // bk)), block_sf(x, fmt, bm, bk, round_sf), f"SF ({layout})")
    assert_bytes_equal(tilebake.quant.per_block_cast_with_sf_only(x, fmt, block, **opts), sf, "with_sf_only")
    if layout == "round":  # power-of-two SF: the same multiplier as the cast's (see the per-token test)
        got = tilebake.quant.per_block_cast_with_precomputed_sf(x, fmt, block, sf, round_sf=round_sf)
        assert_bytes_equal(got, data, "with_precomputed_sf")
    if device == "cuda":
        want_data, want_sf = tilebake.quant.per_block_cast(x.cpu(), fmt, block, **opts)
        assert_bytes_equal(data, want_data, "data against the CPU path")
        assert_bytes_equal(sf, want_sf, "SF against the CPU path")


# --- dequantisation: data * sf per element, decoded here ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 40), hidden=st.integers(1, 16).map(lambda h: 32 * h),
       npc=st.sampled_from([16, 32, 64, 128]), fmt=st.sampled_from(["e4m3", "e2m1"]),
       layout=st.sampled_from(["plain", "packed", "col", "e4m3_sf"]),
       out=st.sampled_from(["bf16", "fp32"]))  # fmt: skip
def test_per_token_cast_back_is_data_times_sf(seed, tokens, hidden, npc, fmt, layout, out, device):
    """per_token_cast_back = cast_back with (1, npc) = decoded data * SF (fp32, exact for these
    formats' products), rounded to bf16 once."""
    opts = dict(round_sf=layout == "packed", use_packed_ue8m0=layout == "packed",
                use_tma_aligned_col_major_sf=layout == "col", use_e4m3_sf=layout == "e4m3_sf")  # fmt: skip
    x = values(seed, (tokens, hidden), torch.float32, FINITE_SPECIALS, 0.05)
    q = tilebake.quant.per_token_cast(x.to(device), fmt, npc, **opts)
    got = tilebake.quant.per_token_cast_back(q, out, npc)
    scales = sf_values(q[1], -(-hidden // npc)).repeat_interleave(npc, 1)[:, :hidden]
    want = (decode(q[0]) * scales).to(torch.bfloat16 if out == "bf16" else torch.float32)
    assert_bytes_equal(got, want, "dequantised")
    assert_bytes_equal(tilebake.quant.cast_back(q, out, (1, npc)), got, "cast_back with (1, npc)")
    if device == "cuda":
        want = tilebake.quant.per_token_cast_back(tuple(t.cpu() for t in q), out, npc)
        assert_bytes_equal(got, want, "against the CPU path")


# --- per_channel_cast: column blocks of num_per_tokens rows ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 300), hidden=st.integers(1, 12).map(lambda h: 16 * h),
       npt=st.sampled_from([32, 128]), dtype=FLOATS, round_sf=st.booleans(), packed=st.booleans(),
       quantized_npc=st.sampled_from([None, 32, 128]))  # fmt: skip
def test_per_channel_cast(seed, tokens, hidden, npt, dtype, round_sf, packed, quantized_npc, device):
    """The SF is the formula over (npt, 1) column blocks (packed along tokens); data * SF is within
    e4m3's rounding of x. A per-token QuantTensor input is re-scaled from its dequantised values."""
    packed = packed and round_sf
    x = values(seed, (tokens, hidden), dtype, FINITE_SPECIALS, 0.05)
    arg, npc = x.to(device), None
    if quantized_npc is not None:
        npc = quantized_npc
        arg = tilebake.quant.per_token_cast(x.to(device), "e4m3", npc)
        x = tilebake.quant.cast_back(arg, "fp32", (1, npc)).cpu()
    data, sf = tilebake.quant.per_channel_cast(arg, "e4m3", npt, round_sf=round_sf, num_per_channels=npc,
                                               use_packed_ue8m0=packed)  # fmt: skip
    blocks = -(-tokens // npt)
    scales = sf_values(sf, blocks, packed_dim=0)
    assert_bytes_equal(scales, block_sf(x, "e4m3", npt, 1, round_sf), "SF")
    full = scales.repeat_interleave(npt, 0)[:tokens]
    y = decode(data) * full
    err, bound = (y - x.float()).abs(), 2.0**-4 * x.float().abs() + 2.0**-10 * full
    assert bool((err <= bound).all()), f"worst excess {(err - bound).max().item()}"
    if device == "cuda":
        cpu_arg = arg.cpu() if isinstance(arg, torch.Tensor) else tuple(t.cpu() for t in arg)
        want = tilebake.quant.per_channel_cast(cpu_arg, "e4m3", npt, round_sf=round_sf, num_per_channels=npc,
                                               use_packed_ue8m0=packed)  # fmt: skip
        assert_bytes_equal(data, want[0], "data against the CPU path")
        assert_bytes_equal(sf, want[1], "SF against the CPU path")


# --- per_token_cast_and_cast_back: in place, the round trip's bytes; the row padding untouched ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 40), hidden=st.integers(1, 16).map(lambda h: 32 * h),
       npc=st.sampled_from([16, 32, 64, 128]), fmt=st.sampled_from(["e4m3", "e2m1"]), dtype=FLOATS,
       sf_kind=st.sampled_from(["plain", "round", "e4m3_sf"]), pad=st.sampled_from([0, 8, 32]))  # fmt: skip
def test_per_token_cast_and_cast_back_in_place(seed, tokens, hidden, npc, fmt, dtype, sf_kind, pad, device):
    round_sf, e4m3_sf = sf_kind == "round", sf_kind == "e4m3_sf"
    pad = pad * 2 if dtype == torch.bfloat16 else pad  # row strides a multiple of 16 bytes
    x = values(seed, (tokens, hidden), dtype, FINITE_SPECIALS, 0.05)
    q = tilebake.quant.per_token_cast(x, fmt, npc, round_sf=round_sf, use_e4m3_sf=e4m3_sf)
    want = tilebake.quant.cast_back(q, "fp32", (1, npc)).to(dtype)
    buf = strided_rows(x, pad, device)
    base = buf if not pad else buf.as_strided((tokens, hidden + pad), (hidden + pad, 1))
    before = base.clone()
    version = buf._version
    assert tilebake.quant.per_token_cast_and_cast_back(buf, fmt, npc, round_sf=round_sf, use_e4m3_sf=e4m3_sf) is None
    assert_bytes_equal(buf, want, "fake-quantised")
    assert buf._version > version, "version counter not bumped"
    if pad:
        assert_bytes_equal(base[:, hidden:], before[:, hidden:], "the row padding")


# --- FP4 unpacking: a table of the 16 codes ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), unsigned=st.booleans(),
       out_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))  # fmt: skip
def test_unpack_from_e2m1fn_x2_is_the_table(seed, shape, unsigned, out_dtype, device):
    """[..., K] bytes (every one of the 256 among them) -> [..., 2K]: low nibble first, codes 0-7
    the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6, bit 3 the sign (-0 for code 8)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)
    raw.view(-1)[: min(256, raw.numel())] = torch.arange(min(256, raw.numel()), dtype=torch.uint8)
    x = raw if unsigned else raw.view(torch.int8)
    got = tilebake.quant.unpack_from_e2m1fn_x2(x.to(device), out_dtype)
    assert_bytes_equal(got, e2m1_decode(raw).to(out_dtype), "decoded")


# --- per_block_cast_lossless: the same values, exactly, in FP8 with new blocks ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 140), cols=st.integers(1, 6),
       blocks=st.sampled_from([((1, 32), (1, 128)), ((1, 32), (32, 32)), ((1, 16), (128, 128)), ((32, 32), (128, 128)),
                               ((1, 64), (32, 64)), ((16, 16), (16, 16))]),
       spread=st.integers(0, 11), base=st.integers(-60, 60), packed_in=st.booleans(), packed_out=st.booleans(),
       col_out=st.booleans())  # fmt: skip
def test_per_block_cast_lossless_keeps_every_value(seed, tokens, cols, blocks, spread, base, packed_in, packed_out,
                                                   col_out, device):  # fmt: skip
    """Input scales 2^base .. 2^(base + spread) (spread <= 11): the e4m3 result dequantises to the
    FP4 input's values exactly, and each new scale is a power of two, max(input scales) / 2^6."""
    (ibm, ibk), (bm, bk) = blocks
    hidden = 128 * cols
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(-128, 128, (tokens, hidden // 2), generator=g, dtype=torch.int8)
    shape_sf = (-(-tokens // ibm), hidden // ibk)
    sf = torch.exp2(base + torch.randint(0, spread + 1, shape_sf, generator=g).float())
    if packed_in:
        words = torch.zeros(shape_sf[0], -(-shape_sf[1] // 4) * 4, dtype=torch.uint8)
        words[:, : shape_sf[1]] = (sf.log2() + 127).to(torch.uint8)
        in_sf = words.view(torch.int32)
    else:
        in_sf = sf
    x = (data.to(device), in_sf.to(device))
    out_data, out_sf = tilebake.quant.per_block_cast_lossless(x, "e4m3", (ibm, ibk), (bm, bk), round_sf=True,
                                                              use_packed_ue8m0=packed_out,
                                                              use_tma_aligned_col_major_sf=col_out)  # fmt: skip
    values_in = e2m1_decode(data) * sf.repeat_interleave(ibm, 0)[:tokens].repeat_interleave(ibk, 1)
    new_sf = sf_values(out_sf, -(-hidden // bk))
    assert bool((new_sf.log2() == new_sf.log2().round()).all()), "a new scale not a power of two"
    full = new_sf.repeat_interleave(bm, 0)[:tokens].repeat_interleave(bk, 1)[:, :hidden]
    assert_bytes_equal(decode(out_data) * full, values_in, "dequantised values")
    big = torch.nn.functional.pad(sf.repeat_interleave(ibm, 0)[:tokens].repeat_interleave(ibk, 1),
                                  (0, -hidden % bk, 0, -tokens % bm))  # fmt: skip
    block_max = big.view(-(-tokens // bm), bm, -(-hidden // bk), bk).amax((1, 3))
    assert_bytes_equal(new_sf, block_max / 64, "new scale = max(input scales) / 2^6")
    if device == "cuda":
        want = tilebake.quant.per_block_cast_lossless((data, in_sf), "e4m3", (ibm, ibk), (bm, bk), round_sf=True,
                                                      use_packed_ue8m0=packed_out,
                                                      use_tma_aligned_col_major_sf=col_out)  # fmt: skip
        assert_bytes_equal(out_data, want[0], "data against the CPU path")
        assert_bytes_equal(out_sf, want[1], "SF against the CPU path")


# --- batched_transpose_weight_sf: each exponent byte where the layout puts it ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, count=st.integers(1, 3), data=st.data(), bs=st.sampled_from([32, 128]))
def test_batched_transpose_weight_sf_places_every_byte(seed, count, data, bs, device):
    """sf0 byte j of word w at row i = exponent byte of sf[i // bs, 4w + j]; sf1 (k, words) byte j of
    word w at row i = that of sf[4w + j, i // bs]; the unused bytes of a last word 0; either sf1
    orientation; grouped (G, ...) scales the same per group; bad scales raise ValueError."""
    g = torch.Generator().manual_seed(seed)
    sfs, flips = [], []
    for _ in range(count):
        groups = data.draw(st.sampled_from([None, 1, 3]))
        nb, kb = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))
        shape = (nb, kb) if groups is None else (groups, nb, kb)
        sfs.append(torch.exp2(torch.randint(-126, 128, shape, generator=g).float()))
        flips.append(data.draw(st.booleans()))
    outs = tilebake.quant.batched_transpose_weight_sf([s.to(device) for s in sfs], bs, flips)
    for s, flip, (sf0, sf1) in zip(sfs, flips, outs):
        s3 = s if s.dim() == 3 else s[None]
        groups, nb, kb = s3.shape
        exp = (s3.log2() + 127).long()
        want0 = torch.nn.functional.pad(exp, (0, -kb % 4)).repeat_interleave(bs, 1)  # (G, n, 4 words)
        want1 = torch.nn.functional.pad(exp.transpose(1, 2), (0, -nb % 4)).repeat_interleave(bs, 1)  # (G, k, ..)
        got0 = ue8m0_bytes(sf0 if s.dim() == 3 else sf0[None], want0.shape[-1])
        got1 = sf1 if s.dim() == 3 else sf1[None]
        got1 = ue8m0_bytes(got1.transpose(1, 2) if flip else got1, want1.shape[-1])
        assert torch.equal(got0, want0), "sf0 bytes"
        assert torch.equal(got1, want1), "sf1 bytes"
        assert sf0.stride(-2) == 1, "sf0 MN-major"
        assert (sf1.stride(-1) == 1) == flip, "sf1's orientation"
    bad = sfs[0].clone()
    bad.view(-1)[int(torch.randint(0, bad.numel(), (1,), generator=g))] = data.draw(
        st.sampled_from([3.0, 0.0, -2.0, float("nan"), float("inf"), 2.0**-130])
    )
    with pytest.raises(ValueError):
        tilebake.quant.batched_transpose_weight_sf([bad.to(device)], bs, [flips[0]])


# --- per_token_cast with stochastic rounding: the RNE scales, a neighbouring code, deterministic ---


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(seed=SEEDS, tokens=st.integers(1, 20), hidden=st.integers(1, 8).map(lambda h: 32 * h),
       npc=st.sampled_from([16, 32, 64, 128]), fmt=st.sampled_from(["e4m3", "e2m1"]), dtype=FLOATS)  # fmt: skip
def test_per_token_cast_stochastic_neighbours(seed, tokens, hidden, npc, fmt, dtype, device):
    x = values(seed, (tokens, hidden), dtype, FINITE_SPECIALS, 0.05).to(device)
    data, sf = tilebake.quant.per_token_cast(x, fmt, npc, stochastic_cast=True)
    rne_data, rne_sf = tilebake.quant.per_token_cast(x, fmt, npc)
    assert_bytes_equal(sf, rne_sf, "SF as without stochastic rounding")
    assert_bytes_equal(tilebake.quant.per_token_cast(x, fmt, npc, stochastic_cast=True)[0], data, "a second run")
    q = x.double().cpu() / sf.cpu().double().repeat_interleave(npc, 1)[:, :hidden]
    got, rne = decode(data), decode(rne_data)
    levels = torch.cat((-E2M1_VALUES[1:].flip(0), E2M1_VALUES))  # -6 .. -0.5, 0, 0.5 .. 6
    if fmt == "e2m1":  # the RNE code or one of its neighbours
        rank = lambda v: (v[..., None] >= levels).sum(-1)  # noqa: E731
        assert bool(((rank(got) - rank(rne)).abs() <= 1).all()), "not a neighbouring e2m1 code"
    else:
        step = (rne.abs() * 2.0**-3).clamp_min(2.0**-9)
        assert bool(((got - q.clamp(-448, 448)).abs() <= step).all()), "not a neighbouring e4m3 code"
    if device == "cuda":
        want = tilebake.quant.per_token_cast(x.cpu(), fmt, npc, stochastic_cast=True)
        assert_bytes_equal(data, want[0], "data against the CPU path")
