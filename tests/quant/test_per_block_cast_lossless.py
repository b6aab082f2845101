"""per_block_cast_lossless: the reference is exact (dequantised output == dequantised input),
argument checks, the CPU path, and bit-exact GPU results against the reference."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tilebake.torch.cast import to_tma_aligned_col_major

OUT_BLOCKS = [(32, 32), (32, 128), (128, 32), (128, 128)]
# input SF: (x_block_size, packed UE8M0 (else fp32 powers of two), column-major)
IN_LAYOUTS = [((1, 32), True, False), ((1, 16), False, False), ((32, 32), False, True), ((1, 32), True, True)]
CASES = [
    (inb, in_packed, in_col, outb, out_packed, out_col)
    for (inb, in_packed, in_col), outb, (out_packed, out_col) in itertools.product(
        IN_LAYOUTS, OUT_BLOCKS, [(False, False), (True, False), (True, True), (False, True)]
    )
    if outb[0] % inb[0] == 0 and outb[1] % inb[1] == 0
]


def case_id(c):
    inb, ip, ic, outb, op, oc = c
    return (
        f"in{inb[0]}x{inb[1]}{'-ue8m0' if ip else '-fp32'}{'-col' if ic else ''}"
        f"-out{outb[0]}x{outb[1]}{'-ue8m0' if op else '-fp32'}{'-col' if oc else ''}"
    )


def make_fp4(num_tokens, hidden, x_block, packed, col, device, spread=6):
    """An e2m1 QuantTensor with power-of-two scales: values whose block scales spread over
    2^spread (within the lossless limit 2^11 for spread <= 10)."""
    x = torch.randn(num_tokens, hidden, device=device)
    x = x * torch.exp2(torch.randint(0, spread + 1, (num_tokens, 1), device=device).float() - 3)
    x = x * torch.exp2(torch.randint(0, 2, (1, hidden), device=device).float())
    data, sf = tilebake.torch.cast(x, "e2m1", x_block, round_sf=True, use_packed_ue8m0=packed)
    if col:
        sf = to_tma_aligned_col_major(sf)
    return data, sf


def run_and_compare(case, num_tokens, hidden, device):
    inb, in_packed, in_col, outb, out_packed, out_col = case
    x = make_fp4(num_tokens, hidden, inb, in_packed, in_col, device)
    kwargs = dict(use_tma_aligned_col_major_sf=out_col, round_sf=out_packed, use_packed_ue8m0=out_packed)
    expected = tilebake.torch.per_block_cast_lossless(x, "e4m3", inb, outb, **kwargs)
    data, sf = tilebake.quant.per_block_cast_lossless(x, "e4m3", inb, outb, **kwargs)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert sf.stride() == expected[1].stride() or sf.shape[0] <= 1
    # Lossless: the dequantised values are exactly the input's.
    before = tilebake.torch.cast_back(x, "e2m1", inb, out_dtype=torch.float32)
    after = tilebake.torch.cast_back((data, sf), "e4m3", outb, out_dtype=torch.float32)
    assert torch.equal(before, after)


# --- CPU ---


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_cpu_path_is_lossless_and_matches_reference(case):
    run_and_compare(case, 200, 384, "cpu")


def test_reference_is_exact_at_the_ratio_limit_and_raises_beyond():
    """Scales spread by exactly 2^11 in one block are fine (every FP4 code, smallest to
    largest, survives); 2^12 raises, naming the block."""
    codes = torch.arange(16, dtype=torch.int32).repeat(32, 2)  # every e2m1 code, 32 x 32
    data = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    sf = torch.ones(32, 1)
    sf[0] = 2.0**11
    out = tilebake.torch.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (32, 32))
    assert out[1].item() == 2.0**5
    before = tilebake.torch.cast_back((data, sf), "e2m1", (1, 32), out_dtype=torch.float32)
    assert torch.equal(tilebake.torch.cast_back(out, "e4m3", (32, 32), out_dtype=torch.float32), before)
    sf[0] = 2.0**12
    with pytest.raises(ValueError, match="output block \\(0, 0\\).*ratio of 2\\^11"):
        tilebake.torch.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (32, 32))
    with pytest.raises(ValueError, match="ratio of 2\\^11"):
        tilebake.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (32, 32))
    sf[0] = 3.0  # not a power of two
    with pytest.raises(ValueError, match="normal powers of two"):
        tilebake.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (32, 32))
    nan_sf = tilebake.torch.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (32, 32), on_error="nan")[1]
    assert torch.isnan(nan_sf).all()


def test_cpu_empty():
    data, sf = tilebake.quant.per_block_cast_lossless(
        (torch.empty(0, 64, dtype=torch.int8), torch.empty(0, 4)), "e4m3", (1, 32), (128, 128)
    )
    assert data.shape == (0, 128) and sf.shape == (0, 1)


def _x(rows=4, half=64, sf=None):
    return (torch.zeros(rows, half, dtype=torch.int8), torch.ones(rows, 4) if sf is None else sf)


BAD_CALLS = [
    (dict(fmt="e2m1"), ValueError, "fmt must be one of"),
    (dict(out_block_size=(64, 128)), ValueError, "out_block_size must be a pair"),
    (dict(x_block_size=(1, 8)), ValueError, "x_block_size must be a pair of powers of two"),
    (dict(x_block_size=(1, 48)), ValueError, "x_block_size must be a pair of powers of two"),
    (dict(x_block_size=(256, 32)), ValueError, "x_block_size must be a pair of powers of two"),
    (dict(x_block_size=None), ValueError, "x_block_size must be a pair of powers of two"),
    (dict(round_sf=1), TypeError, "round_sf must be a bool"),
    (dict(check="yes"), TypeError, "check must be a bool"),
    (dict(x=torch.zeros(4, 64, dtype=torch.int8)), TypeError, "x must be a QuantTensor"),
    (dict(x=(torch.zeros(4, 64), torch.ones(4, 4))), TypeError, "x\\[0\\] must be int8"),
    (dict(x=_x(half=40)), ValueError, "multiple of 16"),
    (dict(x=(torch.zeros(64, 4, dtype=torch.int8).t(), torch.ones(4, 4))), ValueError, "contiguous in its last dim"),
    (dict(x=_x(sf=torch.ones(4, 3))), ValueError, "x\\[1\\] must have shape \\(4, 4\\)"),
    (dict(x=_x(sf=torch.ones(4, 4, dtype=torch.int32))), ValueError, "x\\[1\\] must have shape \\(4, 1\\)"),
    (dict(x=_x(sf=torch.ones(4, 4, dtype=torch.float16))), TypeError, "x\\[1\\] must be torch.float32"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=_x(), fmt="e4m3", x_block_size=(1, 32), out_block_size=(128, 128))
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.per_block_cast_lossless(**args)


# --- GPU ---

GPU_SHAPES = [(1, 128), (127, 7168), (8001, 384), (256, 7168 + 32)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
@pytest.mark.parametrize("num_tokens,hidden", GPU_SHAPES)
def test_gpu_bit_exact_and_lossless(num_tokens, hidden, case):
    run_and_compare(case, num_tokens, hidden, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_bad_blocks_get_nan_scales(packed):
    """Blocks the cast cannot do exactly carry NaN (UE8M0 0xFF) scales, the others are right;
    check=True raises."""
    data, sf = make_fp4(256, 512, (1, 32), packed, False, "cuda", spread=4)
    sf_fp32 = tilebake.torch.cast_back(
        (torch.ones(256, 512, dtype=torch.float8_e4m3fn, device="cuda"), sf), "e4m3", (1, 32), out_dtype=torch.float32
    )[:, ::32].contiguous()
    sf_fp32[3, 0] *= 2.0**14  # row block 0, column block 0: ratio > 2^11
    sf_fp32[200, 9] = 3.0  # row block 1 (of 128), column block 2 (of 128): not a power of two
    x = (data, sf_fp32)
    expected = tilebake.torch.per_block_cast_lossless(
        x, "e4m3", (1, 32), (128, 128), round_sf=packed, use_packed_ue8m0=packed, on_error="nan"
    )
    out = tilebake.quant.per_block_cast_lossless(
        x, "e4m3", (1, 32), (128, 128), round_sf=packed, use_packed_ue8m0=packed
    )
    assert_bytes_equal(out[1], expected[1], "sf")
    bad = torch.zeros(2, 4, dtype=torch.bool)
    bad[0, 0] = bad[1, 2] = True
    for i, j in itertools.product(range(2), range(4)):
        if not bad[i, j]:
            rows, cols = slice(128 * i, 128 * (i + 1)), slice(128 * j, 128 * (j + 1))
            assert_bytes_equal(out[0][rows, cols], expected[0][rows, cols], f"data block {(i, j)}")
    if not packed:
        assert torch.equal(torch.isnan(out[1]).cpu(), bad)
    with pytest.raises(ValueError, match="cannot be re-quantised exactly"):
        tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), (128, 128), check=True)


@pytest.mark.gpu
def test_gpu_empty():
    data, sf = tilebake.quant.per_block_cast_lossless(
        (torch.empty(0, 64, dtype=torch.int8, device="cuda"), torch.empty(0, 4, device="cuda")),
        "e4m3",
        (1, 32),
        (32, 32),
    )
    assert data.shape == (0, 128) and sf.shape == (0, 4)
