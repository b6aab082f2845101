"""per_block_cast_lossless: the reference is exact (dequantised output == dequantised input),
the accepted block sizes (per-token (1, 128) as well as 2-D blocks) and the returned layouts,
out= (either part None, given tensors returned themselves), argument checks, the CPU path, and
bit-exact GPU results against the reference. tests/quant/test_per_block_cast_lossless_emulated.py
runs the kernel's C++ on the CPU against the same cases (opt-in)."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.cast import to_tma_aligned_col_major

# Output blocks: the original's tested ones (1, 128), (32, 32), (128, 128) with every SF layout,
# and every other reduction shape the kernel takes (per-token widths, a few rows, all of a
# warp's rows, two and four warps) with one rotating layout each.
CORE_OUT_BLOCKS = [(1, 128), (32, 32), (128, 128)]
MORE_OUT_BLOCKS = [(1, 16), (1, 32), (1, 64), (2, 128), (4, 32), (8, 64), (16, 16), (16, 128), (32, 128),
                   (64, 64), (128, 32), (128, 16)]  # fmt: skip
SF_MODES = [(False, False), (True, False), (True, True), (False, True)]  # (packed UE8M0, column-major)
# input SF: (x_block_size, packed UE8M0 (else fp32 powers of two), column-major)
IN_LAYOUTS = [((1, 32), True, False), ((1, 16), False, False), ((32, 32), False, True), ((1, 32), True, True)]


def _cases():
    cases = []
    for inb, in_packed, in_col in IN_LAYOUTS:
        for i, outb in enumerate(CORE_OUT_BLOCKS + MORE_OUT_BLOCKS):
            if outb[0] % inb[0] or outb[1] % inb[1]:
                continue
            modes = SF_MODES if outb in CORE_OUT_BLOCKS else [SF_MODES[(i + len(cases)) % 4]]
            cases += [(inb, in_packed, in_col, outb, packed, col) for packed, col in modes]
    return cases


CASES = _cases()


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


def sf_kwargs(packed, col):
    return dict(use_tma_aligned_col_major_sf=col, round_sf=packed, use_packed_ue8m0=packed)


def expected_sf_layout(num_tokens, hidden, outb, packed, col):
    """(shape, strides, dtype) of the returned SF."""
    rows, cols = -(-num_tokens // outb[0]), -(-hidden // outb[1])
    if packed:
        cols = -(-cols // 4)
    strides = (1, -(-rows // 4) * 4) if col else (cols, 1)
    return (rows, cols), strides, torch.int32 if packed else torch.float32


def poisoned_out(num_tokens, hidden, outb, packed, col, device):
    """0xFF-filled outputs of the returned layouts (column-major padding included)."""
    (rows, cols), _, dtype = expected_sf_layout(num_tokens, hidden, outb, packed, col)
    data = torch.empty(num_tokens, hidden, dtype=torch.float8_e4m3fn, device=device)
    if col:
        padded = -(-rows // 4) * 4
        sf = torch.empty((cols, padded), dtype=dtype, device=device).t()[:rows]
    else:
        sf = torch.empty((rows, cols), dtype=dtype, device=device)
    return poison_(data), poison_(sf)


def run_and_compare(case, num_tokens, hidden, device, out=None):
    inb, in_packed, in_col, outb, out_packed, out_col = case
    x = make_fp4(num_tokens, hidden, inb, in_packed, in_col, device)
    kwargs = sf_kwargs(out_packed, out_col)
    expected = tilebake.torch.per_block_cast_lossless(x, "e4m3", inb, outb, **kwargs)
    data, sf = tilebake.quant.per_block_cast_lossless(x, "e4m3", inb, outb, **kwargs, out=out)
    if out is not None:
        assert data is out[0] and sf is out[1]
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    shape, strides, _ = expected_sf_layout(num_tokens, hidden, outb, out_packed, out_col)
    assert sf.shape == shape and (sf.stride() == strides or shape[0] <= 1)
    # Lossless: the dequantised values are exactly the input's.
    before = tilebake.torch.cast_back(x, "e2m1", inb, out_dtype=torch.float32)
    after = tilebake.torch.cast_back((data, sf), "e4m3", outb, out_dtype=torch.float32)
    assert torch.equal(before, after)


# --- CPU ---


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_cpu_path_is_lossless_and_matches_reference(case):
    run_and_compare(case, 136, 288, "cpu")


@pytest.mark.parametrize("outb", [(1, 128), (1, 32), (32, 32), (128, 128), (64, 32)])
@pytest.mark.parametrize("packed,col", SF_MODES)
def test_cpu_returned_layouts(outb, packed, col):
    """Per-token output blocks from (1, 32) input: data e4m3 (T, H) row-major; the SF
    (ceil(T/bm), ceil(H/bk)) fp32 or (.., ceil(ceil(H/bk)/4)) int32, row-major or the
    TMA-aligned column-major view (stride (1, T blocks padded to 4))."""
    x = make_fp4(200, 416, (1, 32), True, False, "cpu")
    data, sf = tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), outb, **sf_kwargs(packed, col))
    assert data.dtype == torch.float8_e4m3fn and data.shape == (200, 416) and data.stride() == (416, 1)
    shape, strides, dtype = expected_sf_layout(200, 416, outb, packed, col)
    assert (sf.dtype, tuple(sf.shape), sf.stride()) == (dtype, shape, strides)


@pytest.mark.parametrize("which", ["both", "data", "sf", "neither"])
@pytest.mark.parametrize("packed,col", [(False, False), (True, True)])
def test_cpu_out_parts_are_returned_themselves(which, packed, col):
    """out=(data, sf): a None part is allocated; a given one is filled and returned (the same
    object), whatever its strides."""
    given = poisoned_out(200, 416, (1, 128), packed, col, "cpu")
    out = (given[0] if which in ("both", "data") else None, given[1] if which in ("both", "sf") else None)
    case = ((1, 32), True, False, (1, 128), packed, col)
    x = make_fp4(200, 416, (1, 32), True, False, "cpu")
    data, sf = tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), (1, 128), **sf_kwargs(packed, col), out=out)
    assert (data is given[0]) == (out[0] is not None) and (sf is given[1]) == (out[1] is not None)
    expected = tilebake.torch.per_block_cast_lossless(x, "e4m3", (1, 32), (1, 128), **sf_kwargs(packed, col))
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    run_and_compare(case, 200, 416, "cpu", out=poisoned_out(200, 416, (1, 128), packed, col, "cpu"))


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
    # Per-token output blocks never mix rows: the same scales are fine at (1, 32).
    out = tilebake.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (1, 32))
    assert torch.equal(out[1][:, 0], sf[:, 0] * 2.0**-6)
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
    data, sf = tilebake.quant.per_block_cast_lossless(
        (torch.empty(0, 64, dtype=torch.int8), torch.empty(0, 4)), "e4m3", (1, 32), (1, 128), False, True, True
    )
    assert data.shape == (0, 128) and sf.shape == (0, 1) and sf.dtype == torch.int32


def _x(rows=4, half=64, sf=None):
    return (torch.zeros(rows, half, dtype=torch.int8), torch.ones(rows, 4) if sf is None else sf)


def _out(data_shape=(4, 128), sf_shape=(4, 1), data_dtype=torch.float8_e4m3fn, sf_dtype=torch.float32):
    return (torch.empty(data_shape, dtype=data_dtype), torch.empty(sf_shape, dtype=sf_dtype))


BAD_CALLS = [
    (dict(fmt="e2m1"), ValueError, "fmt must be one of"),
    (dict(out_block_size=(256, 128)), ValueError, "out_block_size must be a pair of powers of two"),
    (dict(out_block_size=(1, 256)), ValueError, "out_block_size must be a pair of powers of two"),
    (dict(out_block_size=(1, 8)), ValueError, "out_block_size must be a pair of powers of two"),
    (dict(out_block_size=(48, 32)), ValueError, "out_block_size must be a pair of powers of two"),
    (dict(out_block_size=(True, 128)), ValueError, "out_block_size must be a pair of powers of two"),
    (dict(out_block_size=128), ValueError, "out_block_size must be a pair of powers of two"),
    (dict(x_block_size=(1, 8)), ValueError, "x_block_size must be a pair of powers of two"),
    (dict(x_block_size=(1, 48)), ValueError, "x_block_size must be a pair of powers of two"),
    (dict(x_block_size=(256, 32)), ValueError, "x_block_size must be a pair of powers of two"),
    (dict(x_block_size=None), ValueError, "x_block_size must be a pair of powers of two"),
    (dict(x_block_size=(2, 32), out_block_size=(1, 128)), ValueError, "whole number of input blocks"),
    (dict(x_block_size=(1, 64), out_block_size=(1, 32)), ValueError, "whole number of input blocks"),
    (dict(round_sf=1), TypeError, "round_sf must be a bool"),
    (dict(check="yes"), TypeError, "check must be a bool"),
    (dict(x=torch.zeros(4, 64, dtype=torch.int8)), TypeError, "x must be a QuantTensor"),
    (dict(x=(torch.zeros(4, 64), torch.ones(4, 4))), TypeError, "x\\[0\\] must be int8"),
    (dict(x=_x(half=40)), ValueError, "multiple of 16"),
    (dict(x=(torch.zeros(64, 4, dtype=torch.int8).t(), torch.ones(4, 4))), ValueError, "contiguous in its last dim"),
    (dict(x=_x(sf=torch.ones(4, 3))), ValueError, "x\\[1\\] must have shape \\(4, 4\\)"),
    (dict(x=_x(sf=torch.ones(4, 4, dtype=torch.int32))), ValueError, "x\\[1\\] must have shape \\(4, 1\\)"),
    (dict(x=_x(sf=torch.ones(4, 4, dtype=torch.float16))), TypeError, "x\\[1\\] must be torch.float32"),
    (dict(out=torch.empty(4, 128)), TypeError, "out must be a \\(data, sf\\) pair"),
    (dict(out=(None, None, None)), TypeError, "out must be a \\(data, sf\\) pair"),
    (dict(out=_out(data_shape=(4, 64))), ValueError, "out\\[0\\] must have shape \\(4, 128\\)"),
    (dict(out=_out(data_dtype=torch.int8)), TypeError, "out\\[0\\] must be torch.float8_e4m3fn"),
    (dict(out=(torch.empty(4, 136, dtype=torch.float8_e4m3fn)[:, :128], None)), ValueError, "row stride"),
    (dict(out=(None, torch.empty(4, 2))), ValueError, "out\\[1\\] must have shape \\(4, 1\\)"),
    (dict(out=(None, torch.empty(4, 1, dtype=torch.int32))), TypeError, "out\\[1\\] must be torch.float32"),
    (dict(out=(None, torch.empty(4, 1)), use_packed_ue8m0=True), TypeError, "out\\[1\\] must be torch.int32"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=_x(), fmt="e4m3", x_block_size=(1, 32), out_block_size=(1, 128))
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
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_gpu_poisoned_out_is_every_byte_written(case):
    """Preallocated 0xFF outputs: every data byte and every scale (the zero bytes of a last
    packed word too) is written; the given tensors come back."""
    *_, outb, packed, col = case
    run_and_compare(case, 200, 416, "cuda", out=poisoned_out(200, 416, outb, packed, col, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["data", "sf"])
def test_gpu_out_with_one_part_none(which):
    given = poisoned_out(129, 1056, (1, 128), True, True, "cuda")
    out = (given[0], None) if which == "data" else (None, given[1])
    x = make_fp4(129, 1056, (1, 32), True, False, "cuda")
    kwargs = sf_kwargs(True, True)
    data, sf = tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), (1, 128), **kwargs, out=out)
    assert (data is given[0]) == (which == "data") and (sf is given[1]) == (which == "sf")
    expected = tilebake.torch.per_block_cast_lossless(x, "e4m3", (1, 32), (1, 128), **kwargs)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")


@pytest.mark.gpu
@pytest.mark.parametrize("outb", [(1, 128), (32, 32), (128, 128)])
def test_gpu_strided_rows(outb):
    """Input rows and output rows with strides beyond the row (views of wider buffers)."""
    data, sf = make_fp4(300, 640, (1, 32), True, False, "cuda")
    wide = torch.zeros(300, 640 // 2 + 48, dtype=torch.int8, device="cuda")
    wide[:, 16 : 16 + 320] = data
    x = (wide[:, 16 : 16 + 320], sf)
    y = poison_(torch.empty(300, 640 + 64, dtype=torch.float8_e4m3fn, device="cuda"))[:, 32 : 32 + 640]
    got = tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), outb, out=(y, None))
    expected = tilebake.torch.per_block_cast_lossless((data, sf), "e4m3", (1, 32), outb)
    assert got[0] is y
    assert_bytes_equal(got[0], expected[0], "data")
    assert_bytes_equal(got[1], expected[1], "sf")


def _bad_scales(outb, packed, device="cuda"):
    """A (256, 512) input with (1, 32) UE8M0/fp32 scales and two broken output blocks: one
    whose scales spread beyond 2^11 (for bm == 1 the spread is along the row), one holding a
    scale that is not a power of two. Returns (x, bad output blocks)."""
    data, sf = make_fp4(256, 512, (1, 32), packed, False, device, spread=4)
    ones = torch.ones(256, 512, dtype=torch.float8_e4m3fn, device=device)
    sf = tilebake.torch.cast_back((ones, sf), "e4m3", (1, 32), out_dtype=torch.float32)[:, ::32].contiguous()
    bm, bk = outb
    # Output block (3 // bm, 0): 2^12 above every other scale (with bm == 1, bk 128: above the
    # other three scales of row 3 in the block).
    sf[3, 0] = sf.max() * 2.0**12
    sf[200, 9] = 3.0
    return (data, sf), {(3 // bm, 0), (200 // bm, 9 * 32 // bk)}


@pytest.mark.gpu
@pytest.mark.parametrize("outb", [(128, 128), (1, 128), (32, 32)])
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_bad_blocks_get_nan_scales(outb, packed):
    """Blocks the cast cannot do exactly carry NaN (UE8M0 0xFF) scales, the others are right;
    check=True raises."""
    x, bad = _bad_scales(outb, packed)
    kwargs = sf_kwargs(packed, False)
    expected = tilebake.torch.per_block_cast_lossless(x, "e4m3", (1, 32), outb, **kwargs, on_error="nan")
    out = tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), outb, **kwargs)
    assert_bytes_equal(out[1], expected[1], "sf")
    bm, bk = outb
    for i in range(256 // bm):
        for j in range(512 // bk):
            if (i, j) not in bad:
                rows, cols = slice(bm * i, bm * (i + 1)), slice(bk * j, bk * (j + 1))
                assert_bytes_equal(out[0][rows, cols], expected[0][rows, cols], f"data block {(i, j)}")
    if not packed:
        assert {tuple(ij) for ij in torch.isnan(out[1]).nonzero().tolist()} == bad
    with pytest.raises(ValueError, match="cannot be re-quantised exactly"):
        tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), outb, **kwargs, check=True)
    if packed:  # the column-major packed SF is scanned too
        with pytest.raises(ValueError, match="cannot be re-quantised exactly"):
            tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), outb, True, True, True, check=True)


@pytest.mark.gpu
def test_gpu_empty():
    for outb in [(32, 32), (1, 128)]:
        data, sf = tilebake.quant.per_block_cast_lossless(
            (torch.empty(0, 64, dtype=torch.int8, device="cuda"), torch.empty(0, 4, device="cuda")),
            "e4m3",
            (1, 32),
            outb,
        )
        assert data.shape == (0, 128) and sf.shape == (0, 128 // outb[1])
