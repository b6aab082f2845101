"""An independent oracle for the cast references' tests (tests/torch/test_cast*.py): per-element
Python arithmetic on numpy float32 scalars and explicit code tables (no torch float8 conversion, no
bit tricks), plus the inputs and decoding those tests share."""

import bisect
import math

import numpy as np
import torch

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
