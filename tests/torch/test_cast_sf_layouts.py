"""CPU tests of the cast reference's (tilebake.torch.cast) scale-factor layouts: packed UE8M0
(four exponent bytes to an int32, along the token or the hidden axis, checked byte by byte) and
the TMA-aligned column-major SF (stride, padding zeroed, same values, read back alike by
cast_back)."""

import importlib

import numpy as np
import pytest
import torch

from tests.torch.cast_oracle import rand_x

# `tilebake.torch.cast` the attribute is the function; the module holds the helpers too.
ref = importlib.import_module("tilebake.torch.cast")
cast, cast_back = ref.cast, ref.cast_back

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
