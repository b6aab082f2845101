"""per_block_cast (+ _with_sf_only, _with_precomputed_sf): argument checks (CPU), the CPU
path, and bit-exact GPU results against the reference (tilebake.torch.cast with (bm, bk))."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.quant._common import alloc_sf
from tilebake.torch.cast import cast_with_precomputed_sf, unpack_ue8m0
from tilebake.utils import ceil_div

SF_MODES = [(False, False), (True, False), (True, True)]  # (round_sf, packed UE8M0)
BLOCKS = [(32, 32), (32, 128), (128, 32), (128, 128)]
# (in dtype, fmt, block) x SF mode x column-major SF
LAYOUTS = [
    (dtype, fmt, block, rs, packed, col)
    for dtype, fmt, block, (rs, packed), col in itertools.product(
        (torch.bfloat16, torch.float32), ("e4m3", "e2m1"), BLOCKS, SF_MODES, (False, True)
    )
]


def layout_id(layout):
    d, f, (bm, bk), r, p, c = layout
    return f"{str(d)[6:]}-{f}-{bm}x{bk}-{'round' if r else 'plain'}{'-packed' if p else ''}{'-col' if c else ''}"


def make_input(num_tokens, hidden, dtype, device, row_stride=None):
    """Values over many binades: each 32 x 32 tile gets its own random exponent, so blocks
    see very different amax values; sliced from a wider buffer when row_stride is given."""
    width = row_stride or hidden
    exps = torch.randint(-12, 13, (ceil_div(num_tokens, 32), ceil_div(width, 32)), device=device).float()
    exps = exps.repeat_interleave(32, 0)[:num_tokens].repeat_interleave(32, 1)[:, :width]
    base = torch.randn(num_tokens, width, device=device) * torch.exp2(exps)
    return base.to(dtype)[:, :hidden]


def reference(x, fmt, block, round_sf, packed, col):
    return tilebake.torch.cast(
        x, fmt, block, round_sf=round_sf, use_packed_ue8m0=packed, use_tma_aligned_col_major_sf=col
    )


def alloc_out(x, fmt, block, packed, col):
    num_tokens, hidden = x.shape
    if fmt == "e2m1":
        data = torch.empty(num_tokens, hidden // 2, dtype=torch.int8, device=x.device)
    else:
        data = torch.empty(num_tokens, hidden, dtype=torch.float8_e4m3fn, device=x.device)
    sf = alloc_sf(x, ceil_div(num_tokens, block[0]), ceil_div(hidden, block[1]), packed, col)
    return poison_(data), poison_(sf)


def check_all_entry_points(x, layout, use_out=False):
    """per_block_cast, _with_sf_only and _with_precomputed_sf against the references."""
    _, fmt, block, rs, packed, col = layout
    expected = reference(x, fmt, block, rs, packed, col)
    out = alloc_out(x, fmt, block, packed, col) if use_out else None
    data, sf = tilebake.quant.per_block_cast(
        x, fmt, block, use_tma_aligned_col_major_sf=col, round_sf=rs, use_packed_ue8m0=packed, out=out
    )
    if out is not None:
        assert data is out[0] and sf is out[1]
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert sf.stride() == expected[1].stride() or sf.shape[0] <= 1, (sf.stride(), expected[1].stride())

    out_sf = alloc_out(x, fmt, block, packed, col)[1] if use_out else None
    sf_only = tilebake.quant.per_block_cast_with_sf_only(
        x, fmt, block, use_tma_aligned_col_major_sf=col, round_sf=rs, use_packed_ue8m0=packed, out_sf=out_sf
    )
    assert_bytes_equal(sf_only, expected[1], "sf (sf_only)")

    if not packed:  # a precomputed SF is fp32; here the one just computed, in its layout
        out_data = alloc_out(x, fmt, block, packed, col)[0] if use_out else None
        data = tilebake.quant.per_block_cast_with_precomputed_sf(
            x, fmt, block, expected[1], use_tma_aligned_col_major_sf=col, round_sf=rs, out=out_data
        )
        assert_bytes_equal(data, cast_with_precomputed_sf(x, fmt, block, expected[1]), "data (precomputed sf)")


# --- CPU: reference properties, the slow path and argument checks ---


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout_id(v) for v in LAYOUTS])
def test_cpu_path_matches_reference(layout):
    dtype = layout[0]
    check_all_entry_points(make_input(37, 192, dtype, "cpu"), layout)
    check_all_entry_points(make_input(130, 256, dtype, "cpu", row_stride=320), layout, use_out=True)


def test_reference_block_amax_spans_rows():
    """One large value in row 100 sets the scale of its whole 128 x 128 block (rows 0..127)
    and no other block; partial edge blocks are scaled over their valid elements."""
    x = torch.ones(200, 256)
    x[100, 3] = 448.0 * 8
    _, sf = tilebake.quant.per_block_cast(x, "e4m3", (128, 128))
    assert sf.shape == (2, 2)
    assert sf[0, 0] == 8.0 and sf[0, 1] == torch.tensor(1.0) / torch.tensor(448.0)
    assert torch.all(sf[1] == torch.tensor(1.0) / torch.tensor(448.0))
    _, sf = tilebake.quant.per_block_cast(x, "e4m3", (128, 128), round_sf=True, use_packed_ue8m0=True)
    assert unpack_ue8m0(sf, 2).tolist() == [[130, 119], [119, 119]]  # 2^3 and 2^-8 >= 1/448


def test_reference_e2m1_round_trip_within_half_step():
    x = make_input(64, 256, torch.float32, "cpu")
    data, sf = tilebake.quant.per_block_cast(x, "e2m1", (32, 32))
    back = tilebake.torch.cast_back((data, sf), "e2m1", (32, 32), out_dtype=torch.float32)
    block_sf = sf.repeat_interleave(32, 0).repeat_interleave(32, 1)
    # e2m1 steps are at most 2 (between 4 and 6): the error is at most one step of the scale.
    assert torch.all((back - x).abs() <= 1.0 * block_sf + 1e-30)


def test_cpu_empty():
    data, sf = tilebake.quant.per_block_cast(torch.empty(0, 256, dtype=torch.bfloat16), "e4m3", (128, 128))
    assert data.shape == (0, 256) and sf.shape == (0, 2) and sf.dtype == torch.float32
    sf = tilebake.quant.per_block_cast_with_sf_only(torch.empty(0, 256), "e2m1", (32, 32))
    assert sf.shape == (0, 8)


BAD_CALLS = [
    (dict(x=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x="not a tensor"), TypeError, "x must be a torch.Tensor"),
    (dict(x=torch.zeros(4, 128, 2)), ValueError, "x must be 2-D"),
    (dict(x=torch.zeros(4, 120)), ValueError, "multiple of 16"),
    (dict(x=torch.zeros(4, 48), fmt="e2m1"), ValueError, "multiple of 32"),
    (dict(x=torch.zeros(128, 4).t()), ValueError, "contiguous in its last dim"),
    (dict(x=torch.zeros(4, 132, dtype=torch.bfloat16)[:, :128]), ValueError, "row stride must be a multiple of 16"),
    (dict(x=torch.zeros(4, 128, device="meta")), ValueError, "x must be on a CUDA device, an NPU or the CPU"),
    (dict(fmt="e5m2"), ValueError, "fmt must be one of"),
    (dict(block_size=(64, 128)), ValueError, "block_size must be a pair"),
    (dict(block_size=(1, 128)), ValueError, "block_size must be a pair"),
    (dict(block_size=128), ValueError, "block_size must be a pair"),
    (dict(use_packed_ue8m0=True), ValueError, "needs round_sf=True"),
    (dict(round_sf=1), TypeError, "round_sf must be a bool"),
    (dict(use_tma_aligned_col_major_sf="yes"), TypeError, "use_tma_aligned_col_major_sf must be a bool"),
    (dict(out=torch.empty(4, 128)), TypeError, "out must be a \\(data, sf\\) pair"),
    (
        dict(out=(torch.empty(4, 128, dtype=torch.bfloat16), torch.empty(1, 1))),
        TypeError,
        "out\\[0\\] must be torch.float8_e4m3fn",
    ),
    (
        dict(out=(torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 1))),
        ValueError,
        "out\\[1\\] must have shape \\(1, 1\\)",
    ),
    (
        dict(fmt="e2m1", out=(torch.empty(4, 128, dtype=torch.int8), torch.empty(1, 1))),
        ValueError,
        "out\\[0\\] must have shape \\(4, 64\\)",
    ),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(4, 128), fmt="e4m3", block_size=(128, 128))
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.per_block_cast(**args)


def test_sf_only_and_precomputed_reject_bad_arguments():
    x = torch.zeros(4, 128)
    with pytest.raises(ValueError, match="out_sf must have shape \\(1, 1\\)"):
        tilebake.quant.per_block_cast_with_sf_only(x, "e4m3", (128, 128), out_sf=torch.empty(4, 1))
    with pytest.raises(ValueError, match="block_size must be a pair"):
        tilebake.quant.per_block_cast_with_sf_only(x, "e4m3", (16, 128))
    with pytest.raises(TypeError, match="sf must be torch.float32"):
        tilebake.quant.per_block_cast_with_precomputed_sf(x, "e4m3", (128, 128), torch.ones(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="sf must have shape \\(1, 4\\)"):
        tilebake.quant.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 32), torch.ones(1, 1))
    with pytest.raises(ValueError, match="use_packed_ue8m0 must be False"):
        tilebake.quant.per_block_cast_with_precomputed_sf(
            x, "e4m3", (128, 128), torch.ones(1, 1), round_sf=True, use_packed_ue8m0=True
        )
    with pytest.raises(ValueError, match="out must have shape \\(4, 64\\)"):
        tilebake.quant.per_block_cast_with_precomputed_sf(
            x, "e2m1", (128, 128), torch.ones(1, 1), out=torch.empty(4, 128, dtype=torch.int8)
        )


# --- GPU: bit-exact against the reference ---

GPU_SHAPES = [(1, 128), (127, 7168 + 32), (8001, 384), (256, 7168)]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout_id(v) for v in LAYOUTS])
@pytest.mark.parametrize("num_tokens,hidden", GPU_SHAPES)
def test_gpu_bit_exact(num_tokens, hidden, layout):
    """Every entry point, fresh and poisoned out= buffers. H = 7200 ends in a partial
    128-wide block and CTA tile; T = 127 and 8001 end in partial row blocks."""
    x = make_input(num_tokens, hidden, layout[0], "cuda")
    check_all_entry_points(x, layout, use_out=(num_tokens % 2 == 1))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("block", BLOCKS)
def test_gpu_strided_rows_and_special_values(fmt, block):
    x = make_input(300, 512, torch.bfloat16, "cuda", row_stride=640)
    x[5, 7] = float("nan")
    x[40, 300] = float("inf")
    x[41, 301] = -float("inf")
    x[100:140, 64:128] = 0  # a zero block: its scale is the clamp
    for rs, packed in SF_MODES:
        check_all_entry_points(x, (torch.bfloat16, fmt, block, rs, packed, False), use_out=True)
    # H = 208 (e4m3) is not a multiple of 32, 224 (e2m1) not of 128: partial K blocks
    for col in (False, True):
        x = make_input(33, 224 if fmt == "e2m1" else 208, torch.float32, "cuda")
        check_all_entry_points(x, (torch.float32, fmt, block, True, True, col), use_out=True)
        check_all_entry_points(x, (torch.float32, fmt, block, False, False, col))


@pytest.mark.gpu
def test_gpu_amax_clamp_is_runtime():
    x = make_input(256, 512, torch.bfloat16, "cuda") * 1e-8
    tilebake.set_amax_clamp_for_quant("e4m3", False, 1e-3)
    expected = tilebake.torch.cast(x, "e4m3", (128, 128), amax_clamp=1e-3)
    data, sf = tilebake.quant.per_block_cast(x, "e4m3", (128, 128))
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert torch.all(sf == torch.tensor(1e-3) / torch.tensor(448.0))


@pytest.mark.gpu
def test_gpu_empty():
    data, sf = tilebake.quant.per_block_cast(torch.empty(0, 256, device="cuda"), "e2m1", (128, 32), round_sf=True)
    assert data.shape == (0, 128) and sf.shape == (0, 8)
    sf = tilebake.quant.per_block_cast_with_sf_only(torch.empty(0, 256, device="cuda"), "e4m3", (32, 32))
    assert sf.shape == (0, 8)
    data = tilebake.quant.per_block_cast_with_precomputed_sf(
        torch.empty(0, 256, device="cuda"), "e4m3", (32, 32), torch.empty(0, 8, device="cuda")
    )
    assert data.shape == (0, 256)


@pytest.mark.gpu
def test_gpu_rejects_misaligned_pointers():
    x = torch.zeros(4 * 128 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(4, 128)
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address"):
        tilebake.quant.per_block_cast(x, "e4m3", (32, 32))


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    """The torch.library registration (schema + Meta shapes), checked where CI runs."""
    x = make_input(130, 256, torch.bfloat16, "cpu")

    def f(x):
        return tilebake.quant.per_block_cast(
            x, "e2m1", (128, 32), use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True
        )

    data, sf = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    expected = reference(x, "e2m1", (128, 32), True, True, True)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert sf.stride() == expected[1].stride()
    out = alloc_out(x, "e4m3", (32, 32), False, False)
    torch.compile(
        lambda x, d, s: tilebake.quant.per_block_cast(x, "e4m3", (32, 32), out=(d, s)),
        fullgraph=True,
        backend="aot_eager",
    )(x, *out)
    expected = reference(x, "e4m3", (32, 32), False, False, False)
    assert_bytes_equal(out[0], expected[0], "out data")
    assert_bytes_equal(out[1], expected[1], "out sf")


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    x = make_input(300, 1024, torch.bfloat16, "cuda")

    def f(x):
        return tilebake.quant.per_block_cast(x, "e4m3", (128, 128), round_sf=True, use_packed_ue8m0=True)

    data, sf = torch.compile(f, fullgraph=True)(x)
    expected = reference(x, "e4m3", (128, 128), True, True, False)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
