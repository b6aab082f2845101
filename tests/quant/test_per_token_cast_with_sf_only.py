"""per_token_cast_with_sf_only: the scale factors alone, equal to per_token_cast's in every SF
option and layout (CPU), its argument checks, and bit-exact against the reference on a GPU
(strided rows, a preallocated out_sf)."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.per_token_cast_helpers import QUANT_TENSOR_X as _Q
from tests.quant.per_token_cast_helpers import SF_OPTIONS, SHAPES, alloc_out, make_input, sf_kwargs


@pytest.mark.parametrize("sf_option", list(SF_OPTIONS))
@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
def test_cpu_sf_only_equals_per_token_cast_sf(fmt, sf_option):
    x = make_input(37, 208, torch.bfloat16, "cpu")
    for col in (False, True):
        sf = tilebake.quant.per_token_cast_with_sf_only(x, fmt, 16, **sf_kwargs(sf_option, col))
        expected = tilebake.quant.per_token_cast(x, fmt, 16, **sf_kwargs(sf_option, col))[1]
        assert_bytes_equal(sf, expected, "sf")
        assert sf.stride() == expected.stride()
    out_sf = alloc_out(37, 208, fmt, 16, sf_option, False, "cpu")[1]
    result = tilebake.quant.per_token_cast_with_sf_only(x, fmt, 16, out_sf=out_sf, **sf_kwargs(sf_option, False))
    assert result is out_sf
    assert_bytes_equal(out_sf, tilebake.torch.cast(x, fmt, (1, 16), **sf_kwargs(sf_option, False))[1], "out_sf")


BAD_SF_ONLY = [
    (dict(fmt="e5m2"), ValueError, "fmt must be one of"),
    (dict(num_per_channels=8), ValueError, "num_per_channels must be one of"),
    (dict(use_packed_ue8m0=True), ValueError, "needs round_sf=True"),
    (dict(use_e4m3_sf=True, round_sf=True), ValueError, "incompatible with round_sf"),
    (dict(x=_Q), TypeError, "no QuantTensor input"),
    (dict(x=torch.zeros(4, 200, dtype=torch.bfloat16)), ValueError, "multiple of 16"),
    (dict(x=torch.zeros(4, 128, dtype=torch.bfloat16, device="meta")), ValueError, "CUDA device, an NPU or the CPU"),
    (
        dict(num_per_channels=32, out_sf=torch.empty(4, 4), use_tma_aligned_col_major_sf=True),
        ValueError,
        "out_sf must be TMA-aligned column-major",
    ),
    (dict(out_sf=torch.empty(4, 1, dtype=torch.int32)), TypeError, "out_sf must be torch.float32"),
    (dict(out_sf=torch.empty(4, 1), round_sf=True, use_packed_ue8m0=True), TypeError, "out_sf must be torch.int32"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_SF_ONLY, ids=[m for _, _, m in BAD_SF_ONLY])
def test_sf_only_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(4, 128, dtype=torch.bfloat16), fmt="e4m3", num_per_channels=128)
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.per_token_cast_with_sf_only(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("col", [False, True], ids=["rowmajor", "colmajor"])
@pytest.mark.parametrize("sf_option", list(SF_OPTIONS))
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_sf_only(dtype, fmt, sf_option, col):
    for (num_tokens, hidden), npc in itertools.product(SHAPES + [(127, 208 + 256)], (16, 128)):
        x = make_input(num_tokens, hidden, dtype, "cuda", row_stride=hidden + 32 if num_tokens == 127 else None)
        expected = tilebake.torch.cast(x, fmt, (1, npc), **sf_kwargs(sf_option, col))[1]
        sf = tilebake.quant.per_token_cast_with_sf_only(x, fmt, npc, **sf_kwargs(sf_option, col))
        assert_bytes_equal(sf, expected, f"sf ({num_tokens}x{hidden} npc={npc})")
        assert sf.stride() == expected.stride() or num_tokens <= 1
    x = make_input(8001, 2048, dtype, "cuda")
    out_sf = alloc_out(8001, 2048, fmt, 32, sf_option, False, "cuda")[1]
    assert (
        tilebake.quant.per_token_cast_with_sf_only(x, fmt, 32, out_sf=out_sf, **sf_kwargs(sf_option, False)) is out_sf
    )
    assert_bytes_equal(out_sf, tilebake.torch.cast(x, fmt, (1, 32), **sf_kwargs(sf_option, False))[1], "out_sf")
