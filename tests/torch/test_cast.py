"""CPU tests of the plain-PyTorch cast references (tilebake.torch.cast) against the independent
brute-force oracle of cast_oracle.py (per-element Python arithmetic on numpy float32 scalars and
explicit code tables, no torch float8 conversion, no bit tricks): the e2m1 and e4m3 element
encodings, cast (every format, block and SF option), requantising a quantized input, and cast_back
(the round trip, and bit-exact against data * sf rounded by hand). SF layouts:
test_cast_sf_layouts.py; NaN, empty, strided inputs and argument checks: test_cast_edge_cases.py."""

import importlib

import numpy as np
import pytest
import torch

from tests.torch.cast_oracle import (
    DEFAULT_CLAMP,
    E2M1_POS,
    E4M3_POS,
    F32,
    FMT_MAX,
    bf_cast,
    bf_decode,
    bf_e2m1_code,
    bf_e4m3_code,
    calc_diff,
    codes_of,
    expand,
    rand_x,
    sf_values,
)

# `tilebake.torch.cast` the attribute is the function; the module holds the helpers too.
ref = importlib.import_module("tilebake.torch.cast")
cast, cast_back = ref.cast, ref.cast_back

# ------------------------------------------------------------------------------------------
# Element encodings
# ------------------------------------------------------------------------------------------


def test_e2m1_encode_every_value_against_table():
    grid = [k / 64.0 for k in range(0, 8 * 64 + 1)]  # 0 .. 8 in steps of 1/64: all midpoints
    vals = grid + [-v for v in grid] + [-0.0, float("inf"), float("-inf"), float("nan"), 1e30, 1e-30]
    q = torch.tensor(vals, dtype=torch.float32)
    got = ref.e2m1_encode(q).numpy()
    for v, code in zip(vals, got):
        assert int(code) == bf_e2m1_code(v), (v, int(code))
    # -0.0 keeps its sign bit; NaN and +-inf saturate to magnitude 6
    assert int(got[vals.index(-0.0, len(grid))]) == 8
    assert int(got[-5]) == 7 and int(got[-4]) == 15 and (int(got[-3]) & 7) == 7


def test_unpack_from_e2m1fn_x2_all_bytes():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    tab = E2M1_POS + [-v for v in E2M1_POS]
    for t in (b, b.view(torch.int8)):
        y = ref.unpack_from_e2m1fn_x2(t.reshape(4, 64))
        assert y.shape == (4, 128) and y.dtype == torch.float32
        y = y.reshape(-1).tolist()
        for byte in range(256):
            assert y[2 * byte] == tab[byte & 0xF]
            assert y[2 * byte + 1] == tab[byte >> 4]
    assert ref.unpack_from_e2m1fn_x2(b.reshape(2, 8, 16), torch.bfloat16).shape == (2, 8, 32)
    with pytest.raises(TypeError, match="x"):
        ref.unpack_from_e2m1fn_x2(torch.zeros(4))


def test_e4m3_encode_rne_all_midpoints():
    pos = E4M3_POS
    mids = [(a + b) / 2 for a, b in zip(pos[:-1], pos[1:])]
    nudged = [np.nextafter(F32(m), F32(0)) for m in mids] + [np.nextafter(F32(m), F32(1e9)) for m in mids]
    vals = pos + mids + [float(v) for v in nudged] + [500.0, 1e30, 2.0**-10, 2.0**-11, 3 * 2.0**-11]
    vals = vals + [-v for v in vals]
    got = ref.e4m3_encode(torch.tensor(vals, dtype=torch.float32)).view(torch.uint8).tolist()
    assert got == [bf_e4m3_code(v) for v in vals]


# ------------------------------------------------------------------------------------------
# cast against the brute force
# ------------------------------------------------------------------------------------------

CASES = [
    # (T, H, fmt, block, round_sf, e4m3_sf)
    (1, 64, "e4m3", (1, 128), False, False),  # one partial block
    (3, 192, "e4m3", (1, 128), False, False),  # partial last block
    (127, 448, "e4m3", (1, 128), False, False),
    (3, 448, "e4m3", (1, 32), True, False),
    (127, 192, "e4m3", (32, 32), False, False),  # partial token block
    (127, 448, "e4m3", (128, 128), True, False),
    (3, 192, "e4m3", (1, 16), False, True),
    (127, 64, "e4m3", (32, 1), False, False),  # per-channel
    (127, 64, "e4m3", (128, 1), True, False),
    (1, 448, "e2m1", (1, 32), False, False),
    (3, 192, "e2m1", (1, 16), False, True),
    (127, 192, "e2m1", (1, 32), True, False),
    (3, 448, "e2m1", (32, 32), True, False),
    (127, 64, "e2m1", (1, 128), False, False),
]


@pytest.mark.parametrize("T,H,fmt,block,round_sf,e4m3_sf", CASES)
def test_cast_matches_brute_force(T, H, fmt, block, round_sf, e4m3_sf):
    x = rand_x(T, H, torch.bfloat16 if T != 3 else torch.float32, seed=T * 1000 + H)
    data, sf = cast(x, fmt, block, round_sf=round_sf, use_e4m3_sf=e4m3_sf)
    bm, bk = block
    Tb, Kb = -(-T // bm), -(-H // bk)
    assert data.is_contiguous()
    assert data.shape == ((T, H) if fmt == "e4m3" else (T, H // 2))
    assert data.dtype == (torch.float8_e4m3fn if fmt == "e4m3" else torch.int8)
    assert sf.shape == (Tb, Kb) and sf.is_contiguous()
    assert sf.dtype == (torch.float8_e4m3fn if e4m3_sf else torch.float32)
    codes, sfs, ue = bf_cast(x.float().numpy(), fmt, bm, bk, round_sf, e4m3_sf)
    got_sf = sf.float().numpy().astype(np.float64)
    np.testing.assert_array_equal(got_sf, sfs)
    got = codes_of(data, fmt)
    bad = np.argwhere(got != codes)
    assert bad.size == 0, f"{len(bad)} codes differ, first at {bad[:3].tolist()}"
    if round_sf:
        # power of two, >= amax / fmt_max and < 2x that (up to the fp32 rounding of 1/fmt_max)
        m, _ = np.frexp(got_sf)
        assert np.all(m == 0.5)
        xb = np.abs(x.float().numpy())
        for bi in range(Tb):
            for bj in range(Kb):
                blk = xb[bi * bm : (bi + 1) * bm, bj * bk : (bj + 1) * bk]
                need = max(float(blk.max()), DEFAULT_CLAMP[(fmt, False)]) / FMT_MAX[fmt]
                assert need * (1 - 2**-22) <= got_sf[bi, bj] < 2 * need * (1 + 2**-22)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_cast_quantised_values_are_nearest(fmt):
    """Decoded data is the nearest representable value of q = x * inv (checked by distance)."""
    x = rand_x(3, 192, torch.float32, seed=7)
    data, sf = cast(x, fmt, (1, 32))
    fm = F32(FMT_MAX[fmt])
    table = np.array(E4M3_POS if fmt == "e4m3" else E2M1_POS)
    dec = bf_decode(codes_of(data, fmt), fmt)
    xs = x.numpy()
    c = sf.numpy() * fm  # recover c only to recompute inv the way numerics.md does
    for i in range(3):
        for j in range(192):
            cb = F32(np.abs(xs[i, (j // 32) * 32 : (j // 32) * 32 + 32]).max())
            cb = max(cb, F32(DEFAULT_CLAMP[(fmt, False)]))
            assert abs(float(c[i, j // 32]) - float(cb)) <= float(cb) * 2**-22
            q = xs[i, j] * (fm / cb)
            err = abs(float(dec[i, j]) - float(q))
            best = np.min(np.abs(table - abs(float(q))))
            assert err == best
            assert np.isfinite(dec[i, j])


@pytest.mark.parametrize(
    "packed,round_sf,e4m3_sf", [(False, False, False), (True, True, False), (False, True, False), (False, False, True)]
)
@pytest.mark.parametrize(
    "in_fmt,in_block,out_fmt,out_block",
    [
        ("e4m3", (32, 32), "e4m3", (1, 64)),
        ("e4m3", (1, 32), "e4m3", (32, 1)),
        ("e2m1", (1, 16), "e4m3", (1, 32)),
        ("e4m3", (1, 32), "e2m1", (1, 16)),
    ],
)
def test_requantise_matches_brute_force(packed, round_sf, e4m3_sf, in_fmt, in_block, out_fmt, out_block):
    T, H = 37, 192
    x = rand_x(T, H, torch.bfloat16, seed=11)
    in_packed = packed and not e4m3_sf
    qin = cast(
        x,
        in_fmt,
        in_block,
        round_sf=round_sf or in_packed,
        use_packed_ue8m0=in_packed,
        use_tma_aligned_col_major_sf=packed,
        use_e4m3_sf=e4m3_sf,
    )
    data, sf = cast(qin, out_fmt, out_block, in_block, round_sf=round_sf, use_e4m3_sf=e4m3_sf)
    bm, bk = in_block
    d_vals = bf_decode(codes_of(qin[0], in_fmt), in_fmt)
    s_vals = expand(sf_values(qin[1], bm, bk, T, H, in_packed), bm, bk, T, H)
    codes, sfs, _ = bf_cast(None, out_fmt, *out_block, round_sf, e4m3_sf, qin=(d_vals, s_vals))
    np.testing.assert_array_equal(sf.float().numpy().astype(np.float64), sfs)
    np.testing.assert_array_equal(codes_of(data, out_fmt), codes)


# ------------------------------------------------------------------------------------------
# cast_back
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,block,kw,limit",
    [
        ("e4m3", (1, 128), {}, 1e-3),
        ("e4m3", (1, 128), {"round_sf": True, "use_packed_ue8m0": True}, 1e-3),
        ("e4m3", (128, 128), {"use_tma_aligned_col_major_sf": True}, 1e-3),
        ("e4m3", (1, 16), {"use_e4m3_sf": True}, 2e-2),
        ("e2m1", (1, 32), {}, 2e-2),
        ("e2m1", (1, 16), {"use_e4m3_sf": True}, 2e-2),
        ("e2m1", (32, 32), {"round_sf": True, "use_packed_ue8m0": True, "use_tma_aligned_col_major_sf": True}, 2e-2),
    ],
)
@pytest.mark.parametrize("T,H", [(1, 64), (3, 192), (127, 448)])
def test_cast_back_roundtrip_and_exact(fmt, block, kw, limit, T, H):
    g = torch.Generator().manual_seed(T + H)
    x = torch.randn(T, H, generator=g).bfloat16()
    q = cast(x, fmt, block, **kw)
    y = cast_back(q, fmt, block)
    assert y.dtype == torch.bfloat16 and y.shape == (T, H)
    assert calc_diff(x.float(), y.float()) < limit
    # exact: y = bf16(data * sf), product and rounding done independently
    bm, bk = block
    d_vals = bf_decode(codes_of(q[0], fmt), fmt)
    s_vals = expand(sf_values(q[1], bm, bk, T, H, kw.get("use_packed_ue8m0", False)), bm, bk, T, H)
    prod = d_vals * s_vals  # float32 * float32, element-wise IEEE
    y32 = cast_back(q, fmt, block, out_dtype=torch.float32)
    assert y32.dtype == torch.float32
    np.testing.assert_array_equal(y32.numpy(), prod)
    # bf16 RNE done by hand on the bits
    bits = prod.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(y.view(torch.int16).numpy().view(np.uint16), rounded)
