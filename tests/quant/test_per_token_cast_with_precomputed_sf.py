"""per_token_cast_with_precomputed_sf: the cast with caller-given scale factors, against
tilebake.torch.cast_with_precomputed_sf (CPU, and bit-exact on a GPU over scales of many binades
and the ones per_token_cast picks), and its argument checks."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.per_token_cast_helpers import QUANT_TENSOR_X as _Q
from tests.quant.per_token_cast_helpers import SHAPES, alloc_out, make_input
from tilebake.torch.cast import cast_with_precomputed_sf
from tilebake.utils import ceil_div


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
def test_cpu_precomputed_sf(fmt):
    x = make_input(37, 208, torch.bfloat16, "cpu")
    sf = torch.rand(37, 7) + 0.01  # any positive scales, not only the ones per_token_cast would pick
    expected = cast_with_precomputed_sf(x, fmt, (1, 32), sf)
    assert_bytes_equal(tilebake.quant.per_token_cast_with_precomputed_sf(x, fmt, 32, sf), expected, "data")
    out = alloc_out(37, 208, fmt, 32, "plain", False, "cpu")[0]
    assert tilebake.quant.per_token_cast_with_precomputed_sf(x, fmt, 32, sf, out=out) is out
    assert_bytes_equal(out, expected, "out")
    # With the SF per_token_cast chose, the data equals per_token_cast's except where x * (1/sf)
    # and x * (fmt_max / c) round differently: at most a few codes.
    data, sf = tilebake.quant.per_token_cast(x, fmt, 32, round_sf=True)
    again = tilebake.quant.per_token_cast_with_precomputed_sf(x, fmt, 32, sf, round_sf=True)
    assert_bytes_equal(again, data, "round_sf data (power-of-two scales: 1/sf is exact)")


BAD_PRECOMPUTED = [
    (dict(fmt="e5m2"), ValueError, "fmt must be one of"),
    (dict(num_per_channels=8), ValueError, "num_per_channels must be one of"),
    (dict(use_tma_aligned_col_major_sf=True), ValueError, "row-major, non-packed"),
    (dict(round_sf=True, use_packed_ue8m0=True), ValueError, "row-major, non-packed"),
    (dict(use_e4m3_sf=True, round_sf=True), ValueError, "incompatible with round_sf"),
    (dict(sf=torch.ones(4, 1, dtype=torch.int32)), TypeError, "sf must be torch.float32"),
    (dict(sf=torch.ones(4, 1, dtype=torch.float8_e4m3fn)), TypeError, "sf must be torch.float32"),
    (dict(sf=torch.ones(4, 2)), ValueError, "sf must have shape \\(4, 1\\)"),
    (dict(num_per_channels=32, sf=torch.ones(4, 4).t().contiguous().t()), ValueError, "sf must be row-major"),
    (dict(sf=torch.ones(4, 1, device="meta")), ValueError, "sf must be on"),
    (dict(x=_Q), TypeError, "no QuantTensor input"),
    (dict(x=torch.zeros(4, 200, dtype=torch.bfloat16)), ValueError, "multiple of 16"),
    (dict(out=torch.empty(4, 128, dtype=torch.int8)), TypeError, "out must be torch.float8_e4m3fn"),
    (dict(fmt="e2m1", out=torch.empty(4, 128, dtype=torch.int8)), ValueError, "out must have shape \\(4, 64\\)"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_PRECOMPUTED, ids=[m for _, _, m in BAD_PRECOMPUTED])
def test_precomputed_sf_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(4, 128, dtype=torch.bfloat16), fmt="e4m3", num_per_channels=128, sf=torch.ones(4, 1))
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.per_token_cast_with_precomputed_sf(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("npc", [16, 32, 64, 128])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_precomputed_sf(dtype, fmt, npc):
    for num_tokens, hidden in SHAPES:
        x = make_input(num_tokens, hidden, dtype, "cuda", row_stride=hidden + 64 if num_tokens == 127 else None)
        groups = ceil_div(hidden, npc)
        # Scales over many binades, and the ones per_token_cast picks.
        for sf in (
            torch.rand(num_tokens, groups, device="cuda")
            * torch.exp2(torch.randint(-20, 20, (num_tokens, groups), device="cuda").float())
            + 1e-30,
            tilebake.torch.cast(x, fmt, (1, npc))[1],
        ):
            expected = cast_with_precomputed_sf(x, fmt, (1, npc), sf)
            assert_bytes_equal(
                tilebake.quant.per_token_cast_with_precomputed_sf(x, fmt, npc, sf), expected, f"{num_tokens}x{hidden}"
            )
    x = make_input(8001, 2048, dtype, "cuda")
    sf = tilebake.torch.cast(x, fmt, (1, npc))[1]
    out = alloc_out(8001, 2048, fmt, npc, "plain", False, "cuda")[0]
    assert tilebake.quant.per_token_cast_with_precomputed_sf(x, fmt, npc, sf, out=out) is out
    assert_bytes_equal(out, cast_with_precomputed_sf(x, fmt, (1, npc), sf), "out")
