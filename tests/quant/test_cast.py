"""cast: argument checks, RNE through torch, stochastic rounding (SR) properties of the reference
(determinism, neighbours only, unbiasedness, specials) on CPU, and bit-exact GPU SR vs it."""

import math

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_allocator_
from tilebake.torch.stochastic import stochastic_cast

E4M3 = torch.float8_e4m3fn
SR_PAIRS = [(torch.float32, torch.bfloat16), (torch.float32, E4M3), (torch.bfloat16, E4M3)]
SR_IDS = ["fp32-bf16", "fp32-e4m3", "bf16-e4m3"]


def many_binades(n, dtype, device, lo=-20, hi=9):
    x = torch.randn(n, device=device) * torch.exp2(torch.randint(lo, hi, (n,), device=device).float())
    return x.to(dtype)


def neighbours(x, dtype):
    """The representable values just below and above x (in magnitude order on the real line)."""
    rne = x.to(dtype).float()
    xf = x.float()
    if dtype == torch.bfloat16:
        bits = rne.to(torch.bfloat16).view(torch.int16)
        step_up = (bits + torch.where(rne >= 0, 1, -1).to(torch.int16)).view(torch.bfloat16).float()
        step_dn = (bits - torch.where(rne > 0, 1, -1).to(torch.int16)).view(torch.bfloat16).float()
    else:
        bits = rne.to(E4M3).view(torch.uint8).to(torch.int16)
        sign = bits & 0x80
        mag = bits & 0x7F
        up_mag = torch.where(sign == 0, (mag + 1).clamp(max=0x7E), (mag - 1).clamp(min=0))
        dn_mag = torch.where(sign == 0, (mag - 1).clamp(min=0), (mag + 1).clamp(max=0x7E))
        step_up = ((up_mag | sign).to(torch.uint8)).view(E4M3).float()
        step_dn = ((dn_mag | sign).to(torch.uint8)).view(E4M3).float()
    lo = torch.where(rne <= xf, rne, step_dn)
    hi = torch.where(rne >= xf, rne, step_up)
    return lo, hi


@pytest.mark.parametrize("src,dst", SR_PAIRS, ids=SR_IDS)
def test_sr_deterministic_and_neighbours_only(src, dst):
    x = many_binades(1 << 16, src, "cpu", hi=8)
    y1, y2 = tilebake.quant.cast(x, dst, True), tilebake.quant.cast(x.clone(), dst, True)
    assert_bytes_equal(y1, y2, "two SR runs")
    assert_bytes_equal(y1, stochastic_cast(x, dst), "CPU path vs reference")
    lo, hi = neighbours(x, dst)
    yf = y1.float()
    assert ((yf == lo) | (yf == hi)).all()
    assert not torch.equal(y1.view(torch.uint8), x.to(dst).view(torch.uint8))  # differs from RNE


@pytest.mark.parametrize("src,dst", SR_PAIRS, ids=SR_IDS)
@pytest.mark.parametrize("value", [1.0 + 2**-10, 0.3, -2.7, 3e-3, -1.7e-3])
def test_sr_unbiased(src, dst, value):
    """The original's check_bias: P(x < sr) within 10/sqrt(n) of the expected fraction, and the
    mean signed error within 10 * gap / sqrt(n)."""
    n = 1 << 16
    x = torch.full((n,), value).to(src)
    # Equal values still get different random bits from their index.
    y = tilebake.quant.cast(x, dst, True).float()
    xf = x.float()
    lo, hi = neighbours(x[:1], dst)
    gap = (hi - lo).item()
    if gap == 0:
        pytest.skip("exactly representable")
    p_up = ((xf[0] - lo) / gap).item()
    frac_up = (y == hi.item()).float().mean().item()
    assert abs(frac_up - p_up) < 10 / math.sqrt(n)
    assert abs((y - xf).mean().item()) < 10 * gap / math.sqrt(n)


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
def test_sr_e4m3_specials(src):
    x = torch.tensor([448.0, 449.0, 500.0, 1e9, float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 2**-12])
    x = x.to(src)
    y = stochastic_cast(x, E4M3).view(torch.uint8).tolist()
    assert y[:6] == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE]  # saturates like torch's .to(e4m3)
    assert y[6] & 0x7F == 0x7F  # NaN stays NaN
    assert y[7:9] == [0x00, 0x80]
    assert y[9] in (0, 1)


def test_sr_bf16_specials():
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 3.3895313892515355e38, 0.0, -0.0, 1e-40])
    y = stochastic_cast(x, torch.bfloat16)
    assert y[0] == float("inf") and y[1] == -float("inf") and y[2].isnan()
    assert y[3] >= 3.3e38  # the largest finite bf16 or inf
    assert y[4].view(torch.int16) == 0 and y[5].view(torch.int16) == -32768
    assert y[6].item() >= 0


def test_rne_is_torch_to():
    x = many_binades(1000, torch.float32, "cpu")
    for dtype in (torch.bfloat16, E4M3, torch.float32):
        assert_bytes_equal(tilebake.quant.cast(x, dtype), x.to(dtype), str(dtype))
    xb = x.to(torch.bfloat16)
    assert_bytes_equal(tilebake.quant.cast(xb, E4M3), xb.to(E4M3), "bf16->e4m3")


BAD = [
    (dict(x=torch.zeros(6)), ValueError, "numel\\(\\) % 4 == 0"),
    (dict(dtype=torch.float16), TypeError, "dtype must be"),
    (dict(x=torch.zeros(8, dtype=torch.float16)), TypeError, "x must be float32"),
    (dict(x=torch.zeros(8, dtype=E4M3)), ValueError, "stochastic_rounding=True supports"),
    (dict(x=torch.zeros(4, 8).t()), ValueError, "x must be contiguous"),
    (dict(stochastic_rounding=1), TypeError, "stochastic_rounding must be a bool"),
    (dict(x=[1.0]), TypeError, "x must be a torch.Tensor"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD, ids=[m for _, _, m in BAD])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(8), dtype=torch.bfloat16, stochastic_rounding=True)
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.cast(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("src,dst", SR_PAIRS, ids=SR_IDS)
@pytest.mark.parametrize("shape", [(4,), (1, 128), (127, 2052), (8001, 7168), (3, 5, 4), (0, 8), (1028,)])
def test_gpu_sr_bit_exact(shape, src, dst):
    x = many_binades(math.prod(shape), src, "cuda").reshape(shape)
    if x.numel() > 20:  # specials and fp32 denormals too
        x.view(-1)[:10] = torch.tensor([448.0, 470.0, float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-40,
                                        -3e-39, 2**-18], device="cuda").to(src)  # fmt: skip
    poison_allocator_("cuda")  # y starts as 0xFF bytes
    y = tilebake.quant.cast(x, dst, True)
    assert_bytes_equal(y, stochastic_cast(x.cpu(), dst).cuda(), "gpu vs reference")
    assert_bytes_equal(tilebake.quant.cast(x, dst, True), y, "deterministic")


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    x = many_binades(64, torch.float32, "cpu")
    y = torch.compile(lambda t: tilebake.quant.cast(t, E4M3, True), fullgraph=True, backend="aot_eager")(x)
    assert_bytes_equal(y, stochastic_cast(x, E4M3), "compiled")
