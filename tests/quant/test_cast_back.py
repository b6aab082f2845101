"""cast_back / per_token_cast_back: argument checks (CPU), the CPU path, and bit-exact GPU
results against the reference for every SF layout per_token_cast produces."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.test_per_token_cast import make_input

# (out fmt, num_per_channels, round_sf, packed UE8M0, column-major SF)
LAYOUTS = [
    (fmt, npc, rs, packed, col)
    for fmt, npc, (rs, packed), col in itertools.product(
        ("bf16", "fp32"), (16, 32, 64, 128), [(False, False), (True, False), (True, True)], (False, True)
    )
]
LAYOUT_IDS = [
    f"{f}-npc{n}-{'round' if r else 'plain'}{'-packed' if p else ''}{'-colmajor' if c else ''}"
    for f, n, r, p, c in LAYOUTS
]
OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def quantized(num_tokens, hidden, npc, rs, packed, col, device, row_stride=None):
    x = make_input(num_tokens, hidden, torch.bfloat16, device)
    data, sf = tilebake.torch.cast(
        x, "e4m3", (1, npc), round_sf=rs, use_packed_ue8m0=packed, use_tma_aligned_col_major_sf=col
    )
    if row_stride is not None:  # the same data seen through a strided view
        wide = torch.zeros(num_tokens, row_stride, dtype=data.dtype, device=device)
        wide[:, :hidden] = data
        data = wide[:, :hidden]
    return x, (data, sf)


def check(num_tokens, hidden, layout, device, row_stride=None):
    fmt, npc, rs, packed, col = layout
    x, q = quantized(num_tokens, hidden, npc, rs, packed, col, device, row_stride)
    expected = tilebake.torch.cast_back(q, "e4m3", (1, npc), out_dtype=OUT_DTYPES[fmt])
    y = tilebake.quant.cast_back(q, fmt, (1, npc))
    assert_bytes_equal(y, expected, "y")
    assert y.is_contiguous()
    y2 = tilebake.quant.per_token_cast_back(q, fmt, npc)
    assert_bytes_equal(y2, expected, "per_token_cast_back")
    if num_tokens:
        # The round trip keeps e4m3's precision: the original's bound for e4m3 (calc_diff < 1e-3).
        xf, yf = x.double(), y.double()
        assert (xf - yf).square().sum() / (xf.square() + yf.square()).sum() < 1e-3


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_cpu_path_matches_reference(layout):
    check(19, 320, layout, "cpu")


BAD_CALLS = [
    (dict(fmt="e4m3"), ValueError, "fmt must be one of"),
    (
        dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn, device="meta"), torch.ones(4, 1, device="meta"))),
        ValueError,
        "x\\[0\\] must be on a CUDA device or the CPU",
    ),
    (dict(x_block_size=(128, 128)), NotImplementedError, "x_block_size must be \\(1, num_per_channels\\)"),
    (dict(x_block_size=(1, 100)), ValueError, "num_per_channels must be one of"),
    (dict(x_block_size=5), ValueError, "x_block_size must be a pair"),
    (dict(x_special_fmt="e5m6"), ValueError, "x_special_fmt is reserved"),
    (dict(x=torch.zeros(4, 128)), TypeError, "x must be a \\(data, sf\\) tuple"),
    (dict(x=(torch.zeros(4, 128), torch.ones(4, 1))), NotImplementedError, "x\\[0\\] must be float8_e4m3fn"),
    (
        dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 2))),
        ValueError,
        "x\\[1\\] must have shape \\(4, 1\\)",
    ),
    (
        dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 1, dtype=torch.float64))),
        TypeError,
        "x\\[1\\] must be torch.float32",
    ),
    (dict(x=(torch.zeros(4, 120, dtype=torch.float8_e4m3fn), torch.ones(4, 1))), ValueError, "multiple of 16"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 1)), fmt="bf16", x_block_size=(1, 128))
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.cast_back(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("num_tokens,hidden", [(1, 128), (127, 2048), (8001, 7168), (16384, 4096), (3, 208), (0, 256)])
def test_gpu_bit_exact(num_tokens, hidden, layout):
    check(num_tokens, hidden, layout, "cuda")
    if num_tokens:
        check(num_tokens, hidden, layout, "cuda", row_stride=hidden + 16)


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    _, q = quantized(100, 512, 32, True, True, True, "cuda")
    y = torch.compile(lambda d, s: tilebake.quant.cast_back((d, s), "bf16", (1, 32)), fullgraph=True)(*q)
    assert_bytes_equal(y, tilebake.torch.cast_back(q, "e4m3", (1, 32)), "y")


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    _, q = quantized(10, 256, 32, True, True, True, "cpu")
    y = torch.compile(
        lambda d, s: tilebake.quant.cast_back((d, s), "bf16", (1, 32)), fullgraph=True, backend="aot_eager"
    )(*q)
    assert_bytes_equal(y, tilebake.torch.cast_back(q, "e4m3", (1, 32)), "y")
