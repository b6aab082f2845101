"""CPU tests of the plain-PyTorch cast references (tilebake.torch.cast) against independent
brute-force oracles written with per-element Python arithmetic on numpy float32 scalars and
explicit code tables (no torch float8 conversion, no bit tricks)."""

import bisect
import importlib
import math

import numpy as np
import pytest
import torch

# `tilebake.torch.cast` the attribute is the function; the module holds the helpers too.
ref = importlib.import_module("tilebake.torch.cast")
cast, cast_back = ref.cast, ref.cast_back

# ------------------------------------------------------------------------------------------
# Independent oracle
# ------------------------------------------------------------------------------------------

F32 = np.float32


def _e4m3_code_value(code):
    """Value of an e4m3fn code from its fields (None for NaN)."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 15 and man == 7:
        return None
    if exp == 0:
        return sign * (man / 8.0) * 2.0**-6
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


E4M3_POS = [_e4m3_code_value(c) for c in range(127)]  # codes 0..126, increasing, max 448
E2M1_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # codes 0..7


def _nearest_even(m, table):
    """Index of the table entry nearest to m >= 0 (saturating), ties to the even index."""
    if math.isnan(m) or m >= table[-1]:
        return len(table) - 1
    i = bisect.bisect_left(table, m)
    if table[i] == m:
        return i
    lo, hi = i - 1, i
    dlo, dhi = m - table[lo], table[hi] - m
    if dlo < dhi:
        return lo
    if dhi < dlo:
        return hi
    return lo if lo % 2 == 0 else hi


def _sign(v):
    return math.copysign(1.0, float(v)) < 0


def bf_e4m3_code(q):
    q = float(q)
    if math.isnan(q):
        return 0xFF if _sign(q) else 0x7F
    return _nearest_even(abs(q), E4M3_POS) | (0x80 if _sign(q) else 0)


def bf_e2m1_code(q):
    q = float(q)
    return _nearest_even(abs(q), E2M1_POS) | (0x8 if _sign(q) else 0)


def bf_decode(codes, fmt):
    if fmt == "e4m3":
        return np.array(
            [
                [_e4m3_code_value(int(c)) if _e4m3_code_value(int(c)) is not None else np.nan for c in row]
                for row in codes
            ],
            dtype=np.float32,
        ).reshape(codes.shape)
    tab = E2M1_POS + [-v for v in E2M1_POS]
    return np.array([[tab[int(c)] for c in row] for row in codes], dtype=np.float32).reshape(codes.shape)


DEFAULT_CLAMP = {
    ("e4m3", False): 1e-4,
    ("e4m3", True): 448.0 / 512,
    ("e2m1", False): 6.0 * 2.0**-126,
    ("e2m1", True): 6.0 / 512,
}
FMT_MAX = {"e4m3": 448.0, "e2m1": 6.0}


def bf_scale(c, fmt, round_sf, e4m3_sf):
    """(sf value as a Python float, inv as np.float32, ue8m0 byte or None) for the clamped amax c."""
    fm = F32(FMT_MAX[fmt])
    c = F32(c)
    if round_sf:
        s = c * (F32(1.0) / fm)
        mant, ex = math.frexp(float(s))
        e = ex - 1 if mant == 0.5 else ex  # ceil(log2(s))
        return 2.0**e, F32(2.0**-e), e + 127
    if e4m3_sf:
        v = c / fm
        sf = E4M3_POS[_nearest_even(float(v), E4M3_POS)]
        return sf, F32(1.0) / F32(sf), None
    return float(c / fm), fm / c, None


def bf_cast(x, fmt, bm, bk, round_sf=False, e4m3_sf=False, clamp=None, qin=None):
    """Brute-force cast of a float32 numpy matrix. qin = (data_values, sf_per_element) requantises.

    Returns (codes uint8 (T,H), sf float64 (Tb,Kb), ue8m0 bytes (Tb,Kb) or None)."""
    if clamp is None:
        clamp = DEFAULT_CLAMP[(fmt, e4m3_sf)]
    if qin is not None:
        d, s = qin
        x = np.empty(d.shape, dtype=np.float32)
        for i in range(d.shape[0]):
            for j in range(d.shape[1]):
                x[i, j] = d[i, j] * s[i, j]
    T, H = x.shape
    Tb, Kb = -(-T // bm), -(-H // bk)
    codes = np.zeros((T, H), dtype=np.uint8)
    sfs = np.zeros((Tb, Kb))
    ue = np.zeros((Tb, Kb), dtype=np.int64) if round_sf else None
    enc = bf_e4m3_code if fmt == "e4m3" else bf_e2m1_code
    for bi in range(Tb):
        rows = range(bi * bm, min(T, bi * bm + bm))
        for bj in range(Kb):
            cols = range(bj * bk, min(H, bj * bk + bk))
            amax = 0.0
            for i in rows:
                for j in cols:
                    a = abs(float(x[i, j]))
                    if not math.isnan(a):
                        amax = max(amax, a)
            c = max(F32(amax), F32(clamp))
            sf, inv, byte = bf_scale(c, fmt, round_sf, e4m3_sf)
            sfs[bi, bj] = sf
            if ue is not None:
                ue[bi, bj] = byte
            for i in rows:
                for j in cols:
                    if qin is not None and bk != 1:
                        q = qin[0][i, j] * (qin[1][i, j] * inv)
                    else:
                        q = x[i, j] * inv
                    codes[i, j] = enc(q)
    return codes, sfs, ue


def codes_of(data, fmt):
    """Output data -> per-element codes, decoded by hand (not with the reference's helpers)."""
    if fmt == "e4m3":
        return data.view(torch.uint8).numpy()
    b = data.view(torch.uint8).numpy().astype(np.int64)
    out = np.empty((b.shape[0], 2 * b.shape[1]), dtype=np.uint8)
    out[:, 0::2] = b & 0xF
    out[:, 1::2] = b >> 4
    return out


def expand(sf_blocks, bm, bk, T, H):
    return np.repeat(np.repeat(np.asarray(sf_blocks, dtype=np.float32), bm, 0), bk, 1)[:T, :H]


def sf_values(sf, bm, bk, T, H, packed):
    """Any SF layout -> float64 (Tb, Kb) values, unpacking UE8M0 bytes by hand."""
    Tb, Kb = -(-T // bm), -(-H // bk)
    if packed:
        w = sf.contiguous().numpy().astype(np.int64) & 0xFFFFFFFF
        if bk == 1:
            b = np.stack([(w >> (8 * i)) & 0xFF for i in range(4)], axis=1).reshape(-1, w.shape[1])[:Tb]
        else:
            b = np.stack([(w >> (8 * i)) & 0xFF for i in range(4)], axis=2).reshape(w.shape[0], -1)[:, :Kb]
        return np.ldexp(1.0, b - 127)
    return sf.float().numpy().astype(np.float64)


def calc_diff(x, y):
    x, y = x.double(), y.double()
    return float(((x - y) ** 2).sum() / (x * x + y * y).sum())


def rand_x(T, H, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Mix of magnitudes, per-row scales over many octaves, and exact zeros.
    x = torch.randn(T, H, generator=g) * torch.exp2(torch.randint(-12, 12, (T, 1), generator=g).float())
    x = x * torch.exp2(torch.randint(-3, 4, (T, H), generator=g).float())
    x[torch.rand(T, H, generator=g) < 0.02] = 0.0
    return x.to(dtype)


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
# SF layouts
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "T,H,fmt,block",
    [
        (3, 448, "e4m3", (1, 32)),
        (127, 192, "e2m1", (1, 16)),
        (127, 448, "e4m3", (128, 128)),
        (127, 192, "e4m3", (32, 1)),
        (1, 64, "e4m3", (1, 128)),
        (127, 64, "e4m3", (1, 16)),
    ],
)
def test_packed_ue8m0_bytes(T, H, fmt, block):
    x = rand_x(T, H, seed=3)
    bm, bk = block
    Tb, Kb = -(-T // bm), -(-H // bk)
    d_ref, sf_ref = cast(x, fmt, block, round_sf=True)
    d, w = cast(x, fmt, block, round_sf=True, use_packed_ue8m0=True)
    assert torch.equal(d.view(torch.uint8), d_ref.view(torch.uint8))
    assert w.dtype == torch.int32 and w.is_contiguous()
    e = np.log2(sf_ref.numpy().astype(np.float64))
    assert np.all(e == np.round(e))
    want = (e + 127).astype(np.int64)
    wb = w.numpy().astype(np.int64) & 0xFFFFFFFF
    if bk == 1:
        assert w.shape == (-(-Tb // 4), Kb)
        for r in range(w.shape[0]):
            for col in range(Kb):
                for i in range(4):
                    byte = (int(wb[r, col]) >> (8 * i)) & 0xFF
                    assert byte == (want[4 * r + i, col] if 4 * r + i < Tb else 0)
    else:
        assert w.shape == (Tb, -(-Kb // 4))
        for r in range(Tb):
            for k in range(w.shape[1]):
                for i in range(4):
                    byte = (int(wb[r, k]) >> (8 * i)) & 0xFF
                    assert byte == (want[r, 4 * k + i] if 4 * k + i < Kb else 0)


@pytest.mark.parametrize(
    "packed,e4m3_sf,block",
    [
        (False, False, (1, 32)),
        (True, False, (1, 32)),
        (False, True, (1, 16)),
        (False, False, (32, 32)),
        (True, False, (128, 128)),
        (True, False, (32, 1)),
    ],
)
@pytest.mark.parametrize("T", [1, 3, 127])
def test_tma_aligned_col_major_sf(packed, e4m3_sf, block, T):
    H = 448
    x = rand_x(T, H, seed=T)
    kw = dict(round_sf=packed, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf)
    d_ref, sf_ref = cast(x, "e4m3", block, **kw)
    d, sf = cast(x, "e4m3", block, use_tma_aligned_col_major_sf=True, **kw)
    assert torch.equal(d.view(torch.uint8), d_ref.view(torch.uint8))
    assert sf.shape == sf_ref.shape and sf.dtype == sf_ref.dtype
    R, C = sf.shape
    align = 16 // sf.element_size()
    pad_r = sf.stride(1)
    assert sf.stride(0) == 1 and pad_r % align == 0 and R <= pad_r < R + align
    assert torch.equal(
        sf.view(torch.uint8) if sf.element_size() == 1 else sf,
        sf_ref.view(torch.uint8) if sf.element_size() == 1 else sf_ref,
    )
    full = torch.as_strided(sf, (C, pad_r), (pad_r, 1), sf.storage_offset())
    pad = full[:, R:]
    if pad.numel():
        assert torch.all(pad.view(torch.uint8) == 0 if pad.element_size() == 1 else pad == 0)
    # cast_back reads every layout identically
    assert torch.equal(cast_back((d, sf), "e4m3", block), cast_back((d_ref, sf_ref), "e4m3", block))


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


# ------------------------------------------------------------------------------------------
# Robustness: NaN, empty, partial blocks, strides
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,kw",
    [
        ("e4m3", {}),
        ("e4m3", {"round_sf": True}),
        ("e4m3", {"use_e4m3_sf": True}),
        ("e2m1", {}),
        ("e2m1", {"round_sf": True}),
        ("e2m1", {"use_e4m3_sf": True}),
    ],
)
def test_no_nan_from_finite_inputs(fmt, kw):
    big = torch.finfo(torch.bfloat16).max
    x = torch.zeros(5, 64)
    x[1] = 1e-30  # below every clamp
    x[2, :3] = torch.tensor([big, -big, 1.0])
    x[3] = -0.0
    x[4] = torch.randn(64) * 1e-6
    for dt in (torch.float32, torch.bfloat16):
        data, sf = cast(x.to(dt), fmt, (1, 32), **kw)
        assert torch.isfinite(sf.float()).all() and (sf.float() > 0).all()
        y = cast_back((data, sf), fmt, (1, 32), out_dtype=torch.float32)
        assert not torch.isnan(y).any()
        if not kw.get("round_sf"):
            # (round_sf can dequantise bf16-max to 256 * 2^120 = inf: the scale is rounded up)
            assert torch.isfinite(y).all()
        if fmt == "e4m3":
            assert not torch.isnan(data.float()).any()
    # all-zero block: sf is clamp / fmt_max, data all zero
    data, sf = cast(torch.zeros(2, 64), fmt, (1, 32), use_e4m3_sf=kw.get("use_e4m3_sf", False))
    clamp = DEFAULT_CLAMP[(fmt, kw.get("use_e4m3_sf", False))]
    assert torch.all(sf.float() == float(F32(clamp) / F32(FMT_MAX[fmt])))
    assert torch.all(data.view(torch.uint8) == 0)


def test_nan_input_is_visible_and_does_not_poison_the_block():
    x = torch.randn(2, 64)
    x[0, 5] = float("nan")
    clean = x.clone()
    clean[0, 5] = 0.0
    d, sf = cast(x, "e4m3", (1, 32))
    d0, sf0 = cast(clean, "e4m3", (1, 32))
    assert torch.equal(sf, sf0)  # amax ignores NaN (fmaxf semantics)
    assert torch.isnan(d.float()[0, 5])  # the NaN element stays NaN in e4m3
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[0, 5] = False
    assert torch.equal(d.view(torch.uint8)[mask], d0.view(torch.uint8)[mask])
    d4, _ = cast(x, "e2m1", (1, 32))
    assert (codes_of(d4, "e2m1")[0, 5] & 7) == 7  # NaN -> magnitude 6 per numerics.md


@pytest.mark.parametrize(
    "fmt,block,kw,sf_shape,sf_dtype",
    [
        ("e4m3", (1, 128), {}, (0, 4), torch.float32),
        ("e2m1", (1, 32), {"round_sf": True, "use_packed_ue8m0": True}, (0, 4), torch.int32),
        ("e4m3", (128, 128), {"use_tma_aligned_col_major_sf": True}, (0, 4), torch.float32),
        ("e4m3", (32, 1), {"round_sf": True, "use_packed_ue8m0": True}, (0, 448), torch.int32),
        ("e4m3", (1, 16), {"use_e4m3_sf": True, "use_tma_aligned_col_major_sf": True}, (0, 28), torch.float8_e4m3fn),
    ],
)
def test_empty_input(fmt, block, kw, sf_shape, sf_dtype):
    x = torch.empty(0, 448, dtype=torch.bfloat16)
    data, sf = cast(x, fmt, block, **kw)
    assert data.shape == ((0, 448) if fmt == "e4m3" else (0, 224))
    assert data.dtype == (torch.float8_e4m3fn if fmt == "e4m3" else torch.int8)
    assert sf.shape == sf_shape and sf.dtype == sf_dtype
    y = cast_back((data, sf), fmt, block)
    assert y.shape == (0, 448) and y.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "fmt,block,kw",
    [
        ("e4m3", (1, 128), {}),
        ("e2m1", (1, 32), {"round_sf": True}),
        ("e4m3", (32, 32), {"use_e4m3_sf": True}),
        ("e4m3", (32, 1), {}),
    ],
)
@pytest.mark.parametrize("T,H", [(1, 64), (3, 192), (127, 448), (5, 100)])
def test_strided_input_and_partial_blocks(fmt, block, kw, T, H):
    g = torch.Generator().manual_seed(T * H)
    buf = torch.randn(T + 40, H + 77, generator=g).bfloat16()
    buf[:, H:] = 3e4  # huge values just past the valid columns and rows: must not enter any amax
    buf[T:, :] = -3e4
    x = buf[:T, :H]
    assert x.stride() == (H + 77, 1)
    d1, s1 = cast(x, fmt, block, **kw)
    d2, s2 = cast(x.contiguous(), fmt, block, **kw)
    assert torch.equal(d1.view(torch.uint8), d2.view(torch.uint8))
    assert torch.equal(
        s1.view(torch.uint8) if s1.element_size() == 1 else s1, s2.view(torch.uint8) if s2.element_size() == 1 else s2
    )
    # partial blocks: amax over valid elements only (all |x| here are < 10, far below 3e4)
    assert float(s1.float().max()) < 10.0 / FMT_MAX[fmt] * 2


def test_custom_amax_clamp():
    x = torch.zeros(1, 32)
    x[0, 0] = 1e-3
    _, sf = cast(x, "e4m3", (1, 32), amax_clamp=0.5)
    assert float(sf) == float(F32(0.5) / F32(448.0))
    _, sf = cast(x, "e4m3", (1, 32))
    assert float(sf) == float(F32(1e-3) / F32(448.0))


def test_precomputed_sf_with_power_of_two_sf_equals_cast():
    x = rand_x(3, 192, seed=5)
    d, sf = cast(x, "e4m3", (1, 32), round_sf=True)
    assert torch.equal(ref.cast_with_precomputed_sf(x, "e4m3", (1, 32), sf).view(torch.uint8), d.view(torch.uint8))


# ------------------------------------------------------------------------------------------
# Argument validation
# ------------------------------------------------------------------------------------------

X = torch.randn(4, 64)


@pytest.mark.parametrize(
    "call,exc,word",
    [
        (lambda: cast(X, "fp8", (1, 32)), ValueError, "fmt"),
        (lambda: cast(X, 8, (1, 32)), TypeError, "fmt"),
        (lambda: cast(X, "e4m3", (0, 32)), ValueError, "block_size"),
        (lambda: cast(X, "e4m3", (1,)), TypeError, "block_size"),
        (lambda: cast(X, "e4m3", (1, 32.0)), TypeError, "block_size"),
        (lambda: cast(X, "e4m3", (1, 32), use_packed_ue8m0=True), ValueError, "use_packed_ue8m0"),
        (lambda: cast(X, "e4m3", (1, 32), round_sf=True, use_e4m3_sf=True), ValueError, "use_e4m3_sf"),
        (lambda: cast(X, "e4m3", (1, 32), round_sf=1), TypeError, "round_sf"),
        (lambda: cast(X, "e4m3", (1, 32), amax_clamp=-1.0), ValueError, "amax_clamp"),
        (lambda: cast(X, "e4m3", (1, 32), amax_clamp="x"), TypeError, "amax_clamp"),
        (lambda: cast(X[None], "e4m3", (1, 32)), ValueError, "x"),
        (lambda: cast(X.to(torch.int32), "e4m3", (1, 32)), TypeError, "x"),
        (lambda: cast(X.half(), "e4m3", (1, 32)), TypeError, "x"),
        (lambda: cast(X[:, :63], "e2m1", (1, 32)), ValueError, "H"),
        (lambda: cast(X, "e4m3", (1, 32), (1, 32)), ValueError, "x_block_size"),
        (lambda: cast(cast(X, "e4m3", (1, 32)), "e4m3", (1, 32)), ValueError, "x_block_size"),
        (lambda: cast(cast(X, "e4m3", (1, 32)), "e4m3", (1, 32), (1, 16)), ValueError, "SF"),
        (lambda: cast((X, X), "e4m3", (1, 32), (1, 32)), TypeError, "data"),
        (
            lambda: cast(
                (cast(X, "e4m3", (1, 32))[0], torch.zeros(4, 2, dtype=torch.float16)), "e4m3", (1, 32), (1, 32)
            ),
            TypeError,
            "SF",
        ),
        (lambda: cast("x", "e4m3", (1, 32)), TypeError, "x"),
        (lambda: cast_back(cast(X, "e4m3", (1, 32)), "e2m1", (1, 32)), TypeError, "fmt"),
        (
            lambda: cast_back(cast(X, "e4m3", (1, 32)), "e4m3", (1, 32), out_dtype=torch.float16),
            ValueError,
            "out_dtype",
        ),
        (lambda: cast_back(cast(X, "e4m3", (1, 32)), "e4m3", (1, 64)), ValueError, "SF"),
        (lambda: cast_back(X, "e4m3", (1, 32)), TypeError, "x"),
        (lambda: cast_back(cast(X, "e4m3", (1, 32)), "e4m3", None), TypeError, "x_block_size"),
    ],
)
def test_bad_arguments_raise_with_name(call, exc, word):
    with pytest.raises(exc, match=word):
        call()
