"""CPU tests of the cast references (tilebake.torch.cast, cast_back) at the edges: no NaN from
finite inputs, NaN inputs, empty inputs, strided inputs and partial blocks, a custom amax clamp,
cast_with_precomputed_sf with power-of-two scales, and the argument checks (each error naming the
argument)."""

import importlib

import pytest
import torch

from tests.torch.cast_oracle import DEFAULT_CLAMP, F32, FMT_MAX, codes_of, rand_x

# `tilebake.torch.cast` the attribute is the function; the module holds the helpers too.
ref = importlib.import_module("tilebake.torch.cast")
cast, cast_back = ref.cast, ref.cast_back

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
