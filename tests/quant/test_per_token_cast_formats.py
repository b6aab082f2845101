"""per_token_cast's other formats: e2m1 output (packed two to an int8), e4m3 scale factors and
quantized (QuantTensor) inputs of every SF kind and block. CPU: the slow path with and without a
poisoned out=, the e2m1 layout and round trip, empty inputs and argument checks; GPU: bit-exact
against the reference (tilebake.torch.cast), every quantized-input kernel, NaN / inf codes and the
runtime amax clamp."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.per_token_cast_helpers import QUANT_TENSOR_X as _Q
from tests.quant.per_token_cast_helpers import SF_OPTIONS, SHAPES, alloc_out, make_input, make_quantized, sf_kwargs
from tilebake.torch.cast import unpack_from_e2m1fn_x2


def check_cast(x, fmt, npc, sf_option, col, x_block_size=None, use_out=False):
    """per_token_cast (plain or QuantTensor x) against the reference, bytes and SF strides."""
    expected = tilebake.torch.cast(x, fmt, (1, npc), x_block_size, **sf_kwargs(sf_option, col))
    out = None
    if use_out:
        data_in = x if isinstance(x, torch.Tensor) else x[0]
        hidden = expected[0].shape[1] * (2 if fmt == "e2m1" else 1)
        out = alloc_out(data_in.shape[0], hidden, fmt, npc, sf_option, False, data_in.device)
        expected = tilebake.torch.cast(x, fmt, (1, npc), x_block_size, **sf_kwargs(sf_option, False))
        col = False  # a preallocated SF is row-major
    data, sf = tilebake.quant.per_token_cast(x, fmt, npc, x_block_size, out=out, **sf_kwargs(sf_option, col))
    if out is not None:
        assert data is out[0] and sf is out[1]
    tag = f"{fmt} npc={npc} sf={sf_option} col={col} x_block={x_block_size}"
    assert_bytes_equal(data, expected[0], f"data ({tag})")
    assert_bytes_equal(sf, expected[1], f"sf ({tag})")
    assert sf.stride() == expected[1].stride() or sf.shape[0] <= 1, (tag, sf.stride(), expected[1].stride())


# CPU: the slow path for every new option, with and without a poisoned out=.


@pytest.mark.parametrize("sf_option", list(SF_OPTIONS))
@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_e2m1_and_e4m3_sf(dtype, fmt, sf_option):
    for npc in (16, 64):
        for col in (False, True):
            check_cast(make_input(37, 208, dtype, "cpu"), fmt, npc, sf_option, col)
        check_cast(make_input(5, 256, dtype, "cpu", row_stride=320), fmt, npc, sf_option, False, use_out=True)


@pytest.mark.parametrize("x_sf", ["fp32", "ue8m0", "e4m3sf"])
@pytest.mark.parametrize("in_fmt", ["e4m3", "e2m1"])
def test_cpu_quantized_input(in_fmt, x_sf):
    for x_block, col in [((1, 128), False), ((128, 128), True), ((32, 32), False), ((1, 16), True)]:
        q = make_quantized(37, 208, in_fmt, x_block, x_sf, col, "cpu", row_pad=32)
        check_cast(q, "e4m3", 32, "plain", False, x_block)
        check_cast(q, "e2m1", 16, "e4m3sf", True, x_block, use_out=True)


def test_cpu_e2m1_layout_and_round_trip():
    """e2m1 output: int8 (T, H/2), even element in the low nibble, and data * sf is within half
    an e2m1 step (relative 1/4 above 1, else 1/4 of the block's scale) of x."""
    x = make_input(16, 256, torch.float32, "cpu")
    data, sf = tilebake.quant.per_token_cast(x, "e2m1", 32)
    assert data.dtype == torch.int8 and data.shape == (16, 128) and sf.shape == (16, 8)
    values = unpack_from_e2m1fn_x2(data)
    assert values.shape == (16, 256)
    y = values * sf.repeat_interleave(32, dim=1)
    assert torch.all((y - x).abs() <= 0.25 * (x.abs().clamp(min=sf.repeat_interleave(32, dim=1))) + 1e-30)
    # Element 0 of a row sits in the low nibble: the code of +6 * sf (the block maximum) is 7.
    row_max = x[0, :32].abs().argmax().item()
    byte = int(data[0, row_max // 2]) & 0xFF
    assert ((byte >> (4 * (row_max % 2))) & 7) == 7


def test_cpu_new_ops_empty():
    x = torch.empty(0, 256, dtype=torch.bfloat16)
    data, sf = tilebake.quant.per_token_cast(x, "e2m1", 16, use_e4m3_sf=True)
    assert (
        data.shape == (0, 128) and data.dtype == torch.int8 and sf.shape == (0, 16) and sf.dtype == torch.float8_e4m3fn
    )
    assert tilebake.quant.per_token_cast_with_sf_only(x, "e4m3", 128).shape == (0, 2)
    assert tilebake.quant.per_token_cast_with_precomputed_sf(x, "e2m1", 128, torch.empty(0, 2)).shape == (0, 128)


BAD_NEW_CALLS = [
    (dict(fmt="e2m1", use_e4m3_sf=True, round_sf=True), ValueError, "use_e4m3_sf=True is incompatible with round_sf"),
    (dict(fmt="e2m1", use_packed_ue8m0=True), ValueError, "needs round_sf=True"),
    (dict(fmt="e2m1", stochastic_cast=True, use_packed_ue8m0=True), ValueError, "needs round_sf=True"),
    (dict(x=_Q, stochastic_cast=True), ValueError, "x_block_size must be given"),
    (dict(fmt="e5m2", stochastic_cast=True), ValueError, "fmt must be one of"),
    (dict(fmt="e2m1", x=torch.zeros(4, 120, dtype=torch.bfloat16)), ValueError, "multiple of 16"),
    (
        dict(fmt="e2m1", x=torch.zeros(4, 128, dtype=torch.bfloat16, device="meta")),
        ValueError,
        "CUDA device, an NPU or the CPU",
    ),
    (dict(x_block_size=(1, 128)), ValueError, "x_block_size must be None when x is a plain tensor"),
    (dict(x=_Q), ValueError, "x_block_size must be given"),
    (dict(x=_Q, x_block_size=(1, 8)), ValueError, "x_block_size\\[1\\] must be a multiple of 16"),
    (dict(x=_Q, x_block_size=(0, 128)), ValueError, "x_block_size must be a pair"),
    (dict(x=_Q, x_block_size=128), ValueError, "x_block_size must be a pair"),
    (
        dict(x=(_Q[0], torch.ones(4, 1, dtype=torch.bfloat16)), x_block_size=(1, 128)),
        TypeError,
        "x\\[1\\] \\(the SF\\)",
    ),
    (dict(x=(_Q[0], torch.ones(4, 2)), x_block_size=(1, 128)), ValueError, "must have shape \\(4, 1\\)"),
    (dict(x=(_Q[0], torch.ones(4, 2, dtype=torch.int32)), x_block_size=(1, 32)), ValueError, "packed 4 to an int32"),
    (
        dict(x=(_Q[0], torch.ones(1, 1, device="meta")), x_block_size=(4, 128)),
        ValueError,
        "must be on x\\[0\\]'s device",
    ),
    (dict(x=(_Q[0].bfloat16(), _Q[1]), x_block_size=(1, 128)), TypeError, "x\\[0\\] \\(the data\\) must be"),
    (dict(x=(torch.zeros(4, 12, dtype=torch.int8), _Q[1]), x_block_size=(1, 32)), ValueError, "multiple of 8"),
    (dict(x=(_Q[0], _Q[1], _Q[1]), x_block_size=(1, 128)), TypeError, "QuantTensor"),
    (
        dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn, device="meta"), _Q[1]), x_block_size=(1, 128)),
        ValueError,
        "x\\[0\\] must be on a CUDA device, an NPU or the CPU",
    ),
    (
        dict(fmt="e2m1", out=(torch.empty(4, 128, dtype=torch.int8), torch.empty(4, 1))),
        ValueError,
        "out\\[0\\] must have shape \\(4, 64\\)",
    ),
    (
        dict(use_e4m3_sf=True, out=(torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 1))),
        TypeError,
        "out\\[1\\] must be torch.float8_e4m3fn",
    ),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_NEW_CALLS, ids=[m for _, _, m in BAD_NEW_CALLS])
def test_rejects_bad_new_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(4, 128, dtype=torch.bfloat16), fmt="e4m3", num_per_channels=128)
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.per_token_cast(**args)


# GPU: bit-exact against the reference for every new option.


@pytest.mark.gpu
@pytest.mark.parametrize("col", [False, True], ids=["rowmajor", "colmajor"])
@pytest.mark.parametrize("npc", [16, 32, 128])
@pytest.mark.parametrize(
    "fmt,sf_option",
    [("e2m1", "plain"), ("e2m1", "round"), ("e2m1", "packed"), ("e2m1", "e4m3sf"), ("e4m3", "e4m3sf")],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_e2m1_and_e4m3_sf(dtype, fmt, sf_option, npc, col):
    for num_tokens, hidden in SHAPES:
        check_cast(make_input(num_tokens, hidden, dtype, "cuda"), fmt, npc, sf_option, col)
    check_cast(make_input(127, 208, dtype, "cuda", row_stride=208 + 64), fmt, npc, sf_option, col)
    check_cast(make_input(127, 2048, dtype, "cuda"), fmt, npc, sf_option, col, use_out=True)


@pytest.mark.gpu
@pytest.mark.parametrize("col", [False, True], ids=["rowmajor-xsf", "colmajor-xsf"])
@pytest.mark.parametrize("x_block", [(1, 128), (128, 128), (32, 32), (1, 16)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("x_sf", ["fp32", "ue8m0", "e4m3sf"])
@pytest.mark.parametrize("in_fmt", ["e4m3", "e2m1"])
def test_gpu_quantized_input(in_fmt, x_sf, x_block, col):
    outputs = [("e4m3", 128, "plain"), ("e2m1", 16, "e4m3sf"), ("e4m3", 32, "packed"), ("e2m1", 64, "round")]
    for (num_tokens, hidden), (fmt, npc, sf_option) in itertools.product(SHAPES[:4], outputs):
        q = make_quantized(num_tokens, hidden, in_fmt, x_block, x_sf, col, "cuda")
        check_cast(q, fmt, npc, sf_option, col, x_block)
    q = make_quantized(127, 208, in_fmt, x_block, x_sf, col, "cuda", row_pad=48)  # strided rows, odd hidden
    for fmt, npc, sf_option in outputs:
        check_cast(q, fmt, npc, sf_option, False, x_block, use_out=True)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("npc", [16, 32, 64, 128])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("in_fmt", ["e4m3", "e2m1"])
def test_quantized_input_every_block_width(in_fmt, fmt, npc, device):
    """Every (input format, output format, block width) kernel of a quantized input once, 37
    strided rows (test_gpu_quantized_input takes four of the eight output pairs a format)."""
    q = make_quantized(37, 256, in_fmt, (1, 32), "fp32", False, device, row_pad=64)
    check_cast(q, fmt, npc, "plain", False, (1, 32))


@pytest.mark.gpu
def test_gpu_new_options_empty_and_clamp():
    x = torch.empty(0, 256, dtype=torch.bfloat16, device="cuda")
    data, sf = tilebake.quant.per_token_cast(x, "e2m1", 16, use_e4m3_sf=True, use_tma_aligned_col_major_sf=True)
    assert data.shape == (0, 128) and sf.shape == (0, 16) and sf.dtype == torch.float8_e4m3fn
    q = (torch.empty(0, 128, dtype=torch.int8, device="cuda"), torch.empty(0, 8, device="cuda"))
    data, sf = tilebake.quant.per_token_cast(q, "e4m3", 32, x_block_size=(1, 32))
    assert data.shape == (0, 256) and sf.shape == (0, 8)
    assert tilebake.quant.per_token_cast_with_sf_only(x, "e2m1", 32).shape == (0, 8)
    assert tilebake.quant.per_token_cast_with_precomputed_sf(x, "e4m3", 32, torch.empty(0, 8, device="cuda")).shape == (
        0,
        256,
    )
    # The amax clamp of (e2m1, e4m3 SF) is a runtime argument too.
    x = make_input(64, 512, torch.bfloat16, "cuda") * 1e-6
    tilebake.set_amax_clamp_for_quant("e2m1", True, 0.75)
    expected = tilebake.torch.cast(x, "e2m1", (1, 16), use_e4m3_sf=True, amax_clamp=0.75)
    data, sf = tilebake.quant.per_token_cast(x, "e2m1", 16, use_e4m3_sf=True)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert torch.all(sf.float() == 0.125)  # every block below the clamp: e4m3(0.75 / 6)


@pytest.mark.gpu
def test_gpu_e2m1_nan_inf_codes():
    """NaN and +-inf inputs: the reference's codes (NaN and inf saturate to +-6, code 7 | sign)."""
    x = make_input(4, 128, torch.float32, "cuda")
    x[0, 3], x[1, 8], x[2, 100] = float("nan"), float("inf"), float("-inf")
    expected = tilebake.torch.cast(x, "e2m1", (1, 32))
    data, sf = tilebake.quant.per_token_cast(x, "e2m1", 32)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
