"""per_token_cast with stochastic_cast=True (SR): the data rounded stochastically, the SF those
of RNE. CPU: the e2m1 SR encoder (neighbours, specials, unbiased), the op against the reference
(tilebake.torch.cast(stochastic_rounding=True)), reproducible, within one level of RNE, unbiased;
GPU: the kernel bit-exact against the reference (quantized inputs, a wide range of binades,
NaN / inf, empty)."""

import itertools
import math

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.per_token_cast_helpers import SF_OPTIONS, alloc_out, make_input, make_quantized, sf_kwargs
from tilebake.torch.cast import unpack_from_e2m1fn_x2

E2M1_LEVELS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def level_rank(data, fmt):
    """Signed level index of each code on the real line (+-0 -> 0, next magnitude up -> +-1, ...),
    so two codes are neighbouring levels iff their ranks differ by 1. e4m3 NaN (0x7F) is rank
    +-127, beyond the largest finite level 126."""
    if fmt == "e4m3":
        b = data.view(torch.uint8).to(torch.int64)
        mag, neg = b & 0x7F, (b & 0x80) != 0
    else:
        b = data.view(torch.uint8).to(torch.int64)
        c = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(b.shape[0], -1)
        mag, neg = c & 7, (c & 8) != 0
    return torch.where(neg, -mag, mag)


def dequant(data, sf, fmt, npc):
    """data * sf with an fp32 row-major (T, G) sf (plain or e4m3 SF)."""
    values = data.float() if fmt == "e4m3" else unpack_from_e2m1fn_x2(data)
    return values * sf.float().repeat_interleave(npc, dim=1)[:, : values.shape[1]]


def check_sr(x, fmt, npc, sf_option, col=False, x_block_size=None, use_out=False, may_equal_rne=False):
    """SR per_token_cast against the reference (bytes), run twice (same bytes), against RNE
    (same SF, every code within one level, some codes differ unless `may_equal_rne`: a
    re-quantisation onto the same grid can be exact, and then SR has nothing to round).
    Returns (data, sf)."""
    kwargs = sf_kwargs(sf_option, col)
    expected = tilebake.torch.cast(x, fmt, (1, npc), x_block_size, stochastic_rounding=True, **kwargs)
    rne = tilebake.quant.per_token_cast(x, fmt, npc, x_block_size, **kwargs)
    out = None
    if use_out:
        data_in = x if isinstance(x, torch.Tensor) else x[0]
        hidden = expected[0].shape[1] * (2 if fmt == "e2m1" else 1)
        out = alloc_out(data_in.shape[0], hidden, fmt, npc, sf_option, col, data_in.device)
    data, sf = tilebake.quant.per_token_cast(x, fmt, npc, x_block_size, stochastic_cast=True, out=out, **kwargs)
    if out is not None:
        assert data is out[0] and sf is out[1]
    tag = f"SR {fmt} npc={npc} sf={sf_option} col={col} x_block={x_block_size} shape={tuple(data.shape)}"
    assert_bytes_equal(data, expected[0], f"data ({tag})")
    assert_bytes_equal(sf, expected[1], f"sf ({tag})")
    again = tilebake.quant.per_token_cast(x, fmt, npc, x_block_size, stochastic_cast=True, **kwargs)
    assert_bytes_equal(again[0], data, f"second SR run ({tag})")
    assert_bytes_equal(sf, rne[1], f"SR sf vs RNE sf ({tag})")
    step = (level_rank(data, fmt) - level_rank(rne[0], fmt)).abs()
    assert step.max().item() <= 1, f"{tag}: an SR code is {step.max().item()} levels from RNE"
    if data.numel() >= 4096 and not may_equal_rne:  # P(all equal) is astronomically small at this size
        assert not torch.equal(data.view(torch.uint8), rne[0].view(torch.uint8)), f"{tag}: SR equals RNE"
    return data, sf


# CPU: the encoders, then the op's properties.


def test_sr_e2m1_encoder_neighbours_and_specials():
    from tilebake.torch.stochastic import sr_float32_to_e2m1_codes, sr_random_bits

    q = torch.cat([torch.rand(1 << 14) * 14 - 7, torch.randn(1 << 12) * 1e-3])
    rbits = sr_random_bits(torch.randint(0, 1 << 32, q.shape), torch.arange(q.numel()))
    codes = sr_float32_to_e2m1_codes(q, rbits)
    values = unpack_from_e2m1fn_x2(pack_e2m1_codes(codes))
    m = q.abs().clamp(max=6)
    i = torch.searchsorted(E2M1_LEVELS, m, right=True) - 1  # lower neighbour's index
    lo, hi = E2M1_LEVELS[i], E2M1_LEVELS[(i + 1).clamp(max=7)]
    assert ((values.abs() == lo) | (values.abs() == hi)).all()
    assert (torch.signbit(values) == torch.signbit(q)).all()
    # Exactly representable magnitudes never move; NaN and +-inf give +-6 (as RNE); -0 stays -0.
    specials = torch.tensor([0.0, -0.0, 0.5, -1.5, 3.0, 6.0, -6.0, 7.5, float("inf"), -float("inf"), float("nan")])
    codes = sr_float32_to_e2m1_codes(specials, torch.full(specials.shape, (1 << 32) - 1))
    assert codes.tolist() == [0, 8, 1, 11, 5, 7, 15, 7, 7, 15, 7]
    codes = sr_float32_to_e2m1_codes(specials, torch.zeros(specials.shape, dtype=torch.int64))
    assert codes.tolist() == [0, 8, 1, 11, 5, 7, 15, 7, 7, 15, 7]


def pack_e2m1_codes(codes):
    """Codes (n,) (n even) -> packed int8 (1, n / 2)."""
    return ((codes[0::2] | (codes[1::2] << 4)).to(torch.uint8).view(torch.int8))[None]


@pytest.mark.parametrize("value", [0.3, -0.9, 1.2, 2.75, -3.1, 4.5, 5.9])
def test_sr_e2m1_encoder_unbiased(value):
    """P(round up) within 10/sqrt(n) of (m - lower) / gap for one value under n random words."""
    from tilebake.torch.stochastic import sr_float32_to_e2m1_codes, sr_random_bits

    n = 1 << 16
    q = torch.full((n,), value)
    rbits = sr_random_bits(torch.zeros(n, dtype=torch.int64), torch.arange(n))
    values = unpack_from_e2m1fn_x2(pack_e2m1_codes(sr_float32_to_e2m1_codes(q, rbits)))[0].abs()
    m = abs(value)
    i = int(torch.searchsorted(E2M1_LEVELS, torch.tensor(m), right=True)) - 1
    lo, hi = E2M1_LEVELS[i].item(), E2M1_LEVELS[i + 1].item()
    p_up = (m - lo) / (hi - lo)
    assert abs((values == hi).float().mean().item() - p_up) < 10 / math.sqrt(n)


@pytest.mark.parametrize("sf_option", list(SF_OPTIONS))
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_cpu_sr(dtype, fmt, sf_option):
    for npc in (16, 128):
        check_sr(make_input(37, 208, dtype, "cpu"), fmt, npc, sf_option)
        check_sr(make_input(9, 512, dtype, "cpu"), fmt, npc, sf_option, col=True)
        check_sr(make_input(5, 256, dtype, "cpu", row_stride=320), fmt, npc, sf_option, use_out=True)
    # The hash takes the logical index row * H + col: a strided view gives the contiguous bytes.
    x = make_input(7, 256, dtype, "cpu", row_stride=320)
    a = tilebake.quant.per_token_cast(x, fmt, 32, stochastic_cast=True, **sf_kwargs(sf_option, False))
    b = tilebake.quant.per_token_cast(x.contiguous(), fmt, 32, stochastic_cast=True, **sf_kwargs(sf_option, False))
    assert_bytes_equal(a[0], b[0], "strided vs contiguous")


@pytest.mark.parametrize("x_sf", ["fp32", "ue8m0", "e4m3sf"])
@pytest.mark.parametrize("in_fmt", ["e4m3", "e2m1"])
def test_cpu_sr_quantized_input(in_fmt, x_sf):
    for x_block in [(1, 128), (32, 32)]:
        q = make_quantized(37, 256, in_fmt, x_block, x_sf, False, "cpu", row_pad=32)
        check_sr(q, "e4m3", 32, "plain", x_block_size=x_block)
        check_sr(q, "e2m1", 16, "e4m3sf", x_block_size=x_block)


@pytest.mark.parametrize("sf_option", ["plain", "round"])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_cpu_sr_unbiased(fmt, sf_option):
    """testing.md's bound: the mean signed relative error of the dequantised SR result is below
    10 * 2^-mantissa_bits / sqrt(n). Every |q| is in the format's normal range (e4m3 >= 2^-6,
    e2m1 >= 1), where one element's relative error is at most 2^-mantissa_bits, so the mean is
    about 20 standard deviations inside the bound unless SR is biased. (Not with e4m3 SF: a scale
    rounded down lets q exceed fmt_max, which saturates, biased by design.)"""
    npc, rows = 128, 512
    mantissa_bits = 3 if fmt == "e4m3" else 1
    low = 2.0**-4 if fmt == "e4m3" else 1 / 3  # x / amax >= low: |q| >= fmt_max * low / 2 (round_sf)
    x = (low + (1 - low) * torch.rand(rows, npc * 2)) * torch.where(torch.rand(rows, npc * 2) < 0.5, -1.0, 1.0)
    x[:, ::npc] = 1.0  # amax 1 in every block
    x = x * torch.exp2(torch.randint(-8, 9, (rows, 1)).float())
    data, sf = tilebake.quant.per_token_cast(x, fmt, npc, stochastic_cast=True, **sf_kwargs(sf_option, False))
    rel = (dequant(data, sf, fmt, npc) - x) / x
    n = x.numel()
    bound = 10 * 2.0**-mantissa_bits / math.sqrt(n)
    assert rel.abs().max().item() <= 2.0**-mantissa_bits * (1 + 1e-6)
    assert abs(rel.mean().item()) < bound, (rel.mean().item(), bound)
    assert rel.abs().mean().item() > 0  # SR did round (the bound is not met trivially)


def test_cpu_sr_empty_and_reference_flag_check():
    x = torch.empty(0, 256)
    data, sf = tilebake.quant.per_token_cast(x, "e2m1", 32, stochastic_cast=True)
    assert data.shape == (0, 128) and sf.shape == (0, 8)
    with pytest.raises(TypeError, match="stochastic_rounding must be a bool"):
        tilebake.torch.cast(torch.zeros(4, 128), "e4m3", (1, 128), stochastic_rounding=1)


# GPU: the kernel bit-exact against the reference.

SR_SHAPES = [(1, 128), (127, 7168), (33, 208)]


@pytest.mark.gpu
@pytest.mark.parametrize("sf_option", ["plain", "packed", "e4m3sf"])
@pytest.mark.parametrize("npc", [16, 128])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_sr_bit_exact(dtype, fmt, npc, sf_option):
    for num_tokens, hidden in SR_SHAPES:
        check_sr(make_input(num_tokens, hidden, dtype, "cuda"), fmt, npc, sf_option)
    check_sr(make_input(127, 208, dtype, "cuda", row_stride=208 + 64), fmt, npc, sf_option, col=True)
    check_sr(make_input(127, 2048, dtype, "cuda"), fmt, npc, sf_option, use_out=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_gpu_sr_8001_tokens(fmt):
    check_sr(make_input(8001, 7168, torch.bfloat16, "cuda"), fmt, 32, "round")


@pytest.mark.gpu
@pytest.mark.parametrize("out_fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("x_sf", ["fp32", "ue8m0", "e4m3sf"])
@pytest.mark.parametrize("in_fmt", ["e4m3", "e2m1"])
def test_gpu_sr_quantized_input(in_fmt, x_sf, out_fmt):
    for (num_tokens, hidden), x_block in itertools.product([(127, 7168), (33, 208)], [(1, 128), (32, 32)]):
        q = make_quantized(num_tokens, hidden, in_fmt, x_block, x_sf, False, "cuda", row_pad=48)
        npc = 16 if out_fmt == "e2m1" else 128
        # e4m3 (1, 128) blocks re-quantised to e4m3 (1, 128): every value lands on its own grid point.
        exact = in_fmt == out_fmt == "e4m3" and x_block == (1, npc)
        check_sr(q, out_fmt, npc, "plain", x_block_size=x_block, may_equal_rne=exact)


def wide_range_input(num_tokens, hidden, dtype, device):
    """Values spread over ~35 binades inside each row (many quantise into the formats' subnormal
    range), rows scaled by up to 2^24: e4m3 scales below 2^-6 (the kernel's two-multiply SR
    path, amax > 448 * 2^6) next to rows in range (its one-multiply path)."""
    g = torch.Generator(device="cpu").manual_seed(num_tokens * 7 + hidden)
    x = torch.randn(num_tokens, hidden, generator=g) * torch.exp2(
        torch.randint(-30, 6, (num_tokens, hidden), generator=g).float()
    )
    x = x * torch.exp2(torch.randint(-4, 25, (num_tokens, 1), generator=g).float())
    return x.to(dtype).to(device)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_cpu_sr_wide_range(fmt):
    for sf_option in ("plain", "round", "e4m3sf"):
        check_sr(wide_range_input(64, 256, torch.float32, "cpu"), fmt, 128 if fmt == "e4m3" else 16, sf_option)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_sr_wide_range(dtype, fmt):
    for sf_option in ("plain", "round", "e4m3sf"):
        check_sr(wide_range_input(257, 2048, dtype, "cuda"), fmt, 128 if fmt == "e4m3" else 16, sf_option)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_gpu_sr_nan_inf_and_empty(fmt):
    """NaN / +-inf inputs (the reference's codes: e4m3 NaN stays NaN, e2m1 saturates) and T = 0."""
    x = make_input(4, 256, torch.float32, "cuda")
    x[0, 3], x[1, 130], x[2, 0], x[3, 255] = float("nan"), float("inf"), float("-inf"), float("inf")
    for sf_option in ("plain", "e4m3sf"):
        expected = tilebake.torch.cast(x, fmt, (1, 32), stochastic_rounding=True, **sf_kwargs(sf_option, False))
        data, sf = tilebake.quant.per_token_cast(x, fmt, 32, stochastic_cast=True, **sf_kwargs(sf_option, False))
        assert_bytes_equal(data, expected[0], f"data ({sf_option})")
        assert_bytes_equal(sf, expected[1], f"sf ({sf_option})")
    data, sf = tilebake.quant.per_token_cast(x[:0], fmt, 32, stochastic_cast=True)
    assert data.shape[0] == 0 and sf.shape == (0, 8)
