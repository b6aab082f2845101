"""reduce_fused: the fmaf emulation against exact rational arithmetic, the reference against a
loop, e4m3 saturation, argument checks, the CPU path, and (GPU) the kernel against the reference
byte for byte."""

import itertools
from fractions import Fraction

import pytest
import torch

import tilebake
from tests.helpers import poison_
from tests.moe.mapping_helpers import assert_same, random_topk_idx
from tilebake.torch.mapping import fma_fp32


def wide_randn(*shape, device="cpu", spread=20):
    """Normal values scaled by 2^U(-spread, spread): many binades."""
    scale = torch.exp2(torch.randint(-spread, spread + 1, shape, device=device).float())
    return torch.randn(*shape, device=device) * scale


def test_fma_fp32_is_correctly_rounded():
    a, b, c = wide_randn(4000, spread=60), wide_randn(4000, spread=20), wide_randn(4000, spread=60)
    a[:50], b[:50] = torch.tensor(1.0 + 2**-12), torch.tensor(1.0 + 2**-12)  # products needing all 48 bits
    c[:50] = -torch.tensor(1.0)
    a[50:100] = 2.0**-70  # subnormal fp32 results
    result = fma_fp32(a, b, c)
    for i in range(4000):
        exact = Fraction(a[i].item()) * Fraction(b[i].item()) + Fraction(c[i].item())
        r = result[i : i + 1]
        up = torch.nextafter(r, torch.tensor([float("inf")]))
        down = torch.nextafter(r, torch.tensor([float("-inf")]))
        err = abs(Fraction(r.item()) - exact)
        for n in (up, down):
            other = abs(Fraction(n.item()) - exact)
            assert err < other or (err == other and r.view(torch.int32).item() % 2 == 0), (i, r, exact)


def loop_reduce(data, x_sf, w, ttp, sf, out_dtype):
    """reduce_fused one token and one slot at a time."""
    out = torch.zeros(ttp.shape[0], data.shape[1])
    for t in range(ttp.shape[0]):
        acc = torch.zeros(data.shape[1])
        for j in range(ttp.shape[1]):
            p = int(ttp[t, j])
            if 0 <= p < data.shape[0]:
                s = torch.tensor(1.0) if w is None else w[t, j]
                s = s * x_sf[p] if x_sf is not None else s
                acc = fma_fp32(data[p].float(), s, acc)
        out[t] = acc * sf[0] if sf is not None else acc
    if out_dtype == torch.float8_e4m3fn:
        return tilebake.torch.mapping.to_e4m3_saturated(out)
    return out.to(out_dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weights,with_x_sf,fp8", [(True, False, False), (False, True, False), (True, True, True),
                                                   (False, False, True)])  # fmt: skip
def test_reference_matches_loop(dtype, weights, with_x_sf, fp8):
    ttp = torch.randint(-1, 50, (20, 5), dtype=torch.int32)
    ttp[3] = -1  # a token with no valid slot
    ttp[4, 2] = 70  # a position past the rows: skipped
    data = wide_randn(50, 64).to(dtype)
    x_sf = torch.rand(50) + 0.5 if with_x_sf else None
    w = torch.rand(20, 5) if weights else None
    sf = torch.tensor([3.0]) if fp8 else None
    x = (data, x_sf) if with_x_sf else data
    out = tilebake.torch.reduce_fused(x, w, ttp, "e4m3" if fp8 else "", sf)
    expected = loop_reduce(data, x_sf, w, ttp, sf, torch.float8_e4m3fn if fp8 else dtype)
    assert_same(out, expected, "reduced")
    assert bool((out[3].float() == 0).all())


def test_e4m3_output_saturates():
    data = torch.tensor([[500.0, -1e30, 448.0, 460.0], [float("inf"), float("-inf"), float("nan"), 1.0]])
    ttp = torch.tensor([[0], [1]], dtype=torch.int32)
    out = tilebake.torch.reduce_fused(data, None, ttp, "e4m3")
    assert out.view(torch.uint8).tolist() == [[0x7E, 0xFE, 0x7E, 0x7E], [0x7E, 0xFE, 0x7F, 0x38]]


def test_cpu_path_and_out():
    ttp = torch.randint(-1, 30, (10, 4), dtype=torch.int32)
    data, w = torch.randn(30, 128).bfloat16(), torch.rand(10, 4)
    ref = tilebake.torch.reduce_fused(data, w, ttp)
    assert_same(tilebake.moe.reduce_fused(data, w, ttp), ref, "cpu path")
    out = poison_(torch.empty(10, 128, dtype=torch.bfloat16))
    assert tilebake.moe.reduce_fused(data, w, ttp, out=out) is out
    assert_same(out, ref, "out=")


def test_bad_arguments():
    ttp = torch.zeros(4, 2, dtype=torch.int32)
    x = torch.randn(8, 64).bfloat16()
    with pytest.raises(ValueError, match="sf .* is only for fp8_format='e4m3'"):
        tilebake.moe.reduce_fused(x, None, ttp, "", torch.ones(1))
    with pytest.raises(ValueError, match="fp8_format must be"):
        tilebake.moe.reduce_fused(x, None, ttp, "e5m2")
    with pytest.raises(ValueError, match="topk_weights must have token_topk_to_pos's shape"):
        tilebake.moe.reduce_fused(x, torch.rand(4, 3), ttp)
    with pytest.raises(TypeError, match="topk_weights must be a float32"):
        tilebake.moe.reduce_fused(x, torch.rand(4, 2).double(), ttp)
    with pytest.raises(TypeError, match="x must be bfloat16 or float32"):
        tilebake.moe.reduce_fused(x.half(), None, ttp)
    with pytest.raises(ValueError, match="hidden\\) must be a multiple of 8"):
        tilebake.moe.reduce_fused(torch.randn(8, 12).bfloat16(), None, ttp)
    with pytest.raises(ValueError, match="one scale per row"):
        tilebake.moe.reduce_fused((x, torch.ones(7)), None, ttp)
    with pytest.raises(TypeError, match="token_topk_to_pos must be torch.int32"):
        tilebake.moe.reduce_fused(x, None, ttp.long())
    with pytest.raises(ValueError, match="out must be a torch.bfloat16 tensor of shape"):
        tilebake.moe.reduce_fused(x, None, ttp, out=torch.empty(4, 64))


# --- GPU: the kernel against the reference, byte for byte ---

FLAGS = [(True, False, False), (True, True, True), (False, True, False), (False, False, True)]
GPU_CASES = list(itertools.product([1, 8001], [128, 200, 7168], [torch.bfloat16, torch.float32], [False, True], FLAGS))


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,hidden,dtype,fp8,flags", GPU_CASES)
def test_kernel_matches_reference(num_tokens, hidden, dtype, fp8, flags):
    weights, with_x_sf, with_sf = flags
    with_sf = with_sf and fp8
    num_topk, num_experts = 9, 64
    topk_idx = random_topk_idx(num_tokens, num_topk, num_experts, device="cuda")
    _, _, _, ttp, *_ = tilebake.torch.get_fused_mapping(topk_idx, num_experts, 0, 16)
    num_expanded = int(ttp.max()) + 17
    data = wide_randn(num_expanded, hidden, device="cuda", spread=6).to(dtype)
    x = (data, torch.rand(num_expanded, device="cuda") + 0.5) if with_x_sf else data
    w = torch.rand(num_tokens, num_topk, device="cuda") if weights else None
    sf = torch.tensor([37.0], device="cuda") if with_sf else None  # sums past 448 saturate
    fmt = "e4m3" if fp8 else ""
    out = poison_(torch.empty(num_tokens, hidden, dtype=torch.float8_e4m3fn if fp8 else dtype, device="cuda"))
    tilebake.moe.reduce_fused(x, w, ttp, fmt, sf, out=out)
    assert_same(out, tilebake.torch.reduce_fused(x, w, ttp, fmt, sf), "reduced")


@pytest.mark.gpu
def test_kernel_strided_rows_and_empty():
    ttp = torch.randint(-1, 500, (300, 6), dtype=torch.int32, device="cuda")
    data = torch.randn(500, 1024 + 64, device="cuda").bfloat16()[:, :1024]
    w = torch.rand(300, 6, device="cuda")
    assert_same(tilebake.moe.reduce_fused(data, w, ttp), tilebake.torch.reduce_fused(data, w, ttp), "strided x")
    out = tilebake.moe.reduce_fused(data, w[:0], ttp[:0])
    assert out.shape == (0, 1024)
