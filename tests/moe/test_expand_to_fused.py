"""expand_to_fused / expand_to_fused_with_sf: the reference against plain loops, SF layouts,
argument checks, the CPU path, and (GPU) the kernel against the reference byte for byte."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import poison_allocator_
from tests.moe.mapping_helpers import assert_same, random_topk_idx


def layout(num_tokens, num_topk, num_experts, alignment, device="cpu"):
    topk_idx = random_topk_idx(num_tokens, num_topk, num_experts, device=device)
    p2e, _, _, ttp, *_ = tilebake.torch.get_fused_mapping(topk_idx, num_experts, 0, alignment)
    return ttp, p2e


def loop_expand(x, ttp, p2e):
    out = torch.zeros((p2e.numel(), x.shape[1]), dtype=x.dtype)
    for t, row in enumerate(ttp.tolist()):
        for pos in row:
            if pos >= 0:
                out[pos] = x[t]
    return out


def quantized(num_tokens, hidden, npc, packed, device="cpu"):
    x = torch.randn(num_tokens, hidden, device=device)
    return tilebake.torch.cast(x, "e4m3", (1, npc), round_sf=packed, use_packed_ue8m0=packed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_reference_matches_loops(dtype):
    ttp, p2e = layout(40, 4, 8, 8)
    x = torch.randn(40, 64).to(dtype)
    out = tilebake.torch.expand_to_fused(x, ttp, p2e)
    assert_same(out, loop_expand(x, ttp, p2e), "expanded")
    assert bool((out[p2e < 0].float() == 0).all())


@pytest.mark.parametrize("packed,col_major", [(False, False), (False, True), (True, True), (True, False)])
def test_reference_with_sf(packed, col_major):
    ttp, p2e = layout(30, 6, 16, 4)
    data, sf = quantized(30, 256, 32, packed)
    out, out_sf = tilebake.torch.expand_to_fused_with_sf((data, sf), 32, ttp, p2e, col_major)
    assert_same(out, loop_expand(data, ttp, p2e), "expanded data")
    assert_same(out_sf, loop_expand(sf, ttp, p2e), "expanded sf")
    n = p2e.numel()
    if col_major:
        assert out_sf.stride() == (1, -(-n // 4) * 4)
    else:
        assert out_sf.is_contiguous()


def test_cpu_path_is_the_reference():
    ttp, p2e = layout(17, 3, 8, 16)
    x = torch.randn(17, 136).bfloat16()  # 272-byte rows: not a multiple of 64 elements
    assert_same(tilebake.moe.expand_to_fused(x, ttp, p2e), tilebake.torch.expand_to_fused(x, ttp, p2e), "cpu")
    q = quantized(17, 256, 128, True)
    for a, e in zip(
        tilebake.moe.expand_to_fused_with_sf(q, 128, ttp, p2e, True),
        tilebake.torch.expand_to_fused_with_sf(q, 128, ttp, p2e, True),
    ):
        assert_same(a, e, "cpu with sf")


def test_bad_arguments():
    ttp, p2e = layout(8, 2, 4, 4)
    x = torch.randn(8, 64).bfloat16()
    with pytest.raises(ValueError, match="rows must be a multiple of 16 bytes"):
        tilebake.moe.expand_to_fused(torch.randn(8, 12).bfloat16(), ttp, p2e)
    with pytest.raises(ValueError, match="one row per token of x"):
        tilebake.moe.expand_to_fused(x[:7], ttp, p2e)
    with pytest.raises(TypeError, match="token_topk_to_pos must be torch.int32"):
        tilebake.moe.expand_to_fused(x, ttp.long(), p2e)
    with pytest.raises(ValueError, match="pos_to_expert must be a 1-D"):
        tilebake.moe.expand_to_fused(x, ttp, p2e[:, None])
    with pytest.raises(ValueError, match="must be contiguous in its last dim"):
        tilebake.moe.expand_to_fused(torch.randn(64, 8).bfloat16().t(), ttp, p2e)
    data, sf = quantized(8, 256, 32, False)
    with pytest.raises(ValueError, match=r"x\[1\] \(the SF\) must have shape \(8, 2\).*got \(8, 8\)"):
        tilebake.moe.expand_to_fused_with_sf((data, sf), 128, ttp, p2e)
    with pytest.raises(ValueError, match="num_per_channels must be one of"):
        tilebake.moe.expand_to_fused_with_sf((data, sf), 48, ttp, p2e)
    with pytest.raises(TypeError, match="float8_e4m3fn or int8"):
        tilebake.moe.expand_to_fused_with_sf((x.float(), sf), 32, ttp, p2e)
    with pytest.raises(TypeError, match="QuantTensor"):
        tilebake.moe.expand_to_fused_with_sf(data, 32, ttp, p2e)


# --- GPU: the kernel against the reference, byte for byte ---

GPU_CASES = list(
    itertools.product([1, 8001], [(8, 1, 1), (72, 6, 16), (256, 9, 128), (512, 8, 16)], [128, 200, 2048, 7168])
)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,routing,hidden", GPU_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_reference(num_tokens, routing, hidden, dtype):
    num_experts, num_topk, alignment = routing
    ttp, p2e = layout(num_tokens, num_topk, num_experts, alignment, "cuda")
    x = torch.randn(num_tokens, hidden, device="cuda").to(dtype)
    poison_allocator_("cuda")  # padding rows must be written as zeros
    assert_same(tilebake.moe.expand_to_fused(x, ttp, p2e), tilebake.torch.expand_to_fused(x, ttp, p2e), "expanded")


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 8001])
@pytest.mark.parametrize(
    "npc,packed,col_major", [(128, False, False), (32, True, True), (128, True, False), (32, False, True)]
)
@pytest.mark.parametrize("hidden", [256, 7168])
def test_kernel_with_sf_matches_reference(num_tokens, npc, packed, col_major, hidden):
    ttp, p2e = layout(num_tokens, 8, 256, 16, "cuda")
    q = quantized(num_tokens, hidden, npc, packed, "cuda")
    poison_allocator_("cuda")
    out, out_sf = tilebake.moe.expand_to_fused_with_sf(q, npc, ttp, p2e, col_major)
    ref, ref_sf = tilebake.torch.expand_to_fused_with_sf(q, npc, ttp, p2e, col_major)
    assert_same(out, ref, "expanded data")
    assert_same(out_sf, ref_sf, "expanded sf")
    assert out_sf.stride() == ref_sf.stride()


@pytest.mark.gpu
def test_kernel_strided_input_sf_and_rows():
    """x rows with a padded stride; the input SF as per_token_cast's column-major view."""
    ttp, p2e = layout(1000, 6, 64, 32, "cuda")
    x = torch.randn(1000, 1024 + 64, device="cuda").bfloat16()[:, :1024]
    assert_same(tilebake.moe.expand_to_fused(x, ttp, p2e), tilebake.torch.expand_to_fused(x, ttp, p2e), "strided x")
    data, sf = tilebake.torch.cast(
        torch.randn(1000, 512, device="cuda"), "e4m3", (1, 128), use_tma_aligned_col_major_sf=True
    )
    assert sf.stride(0) == 1
    for a, e in zip(
        tilebake.moe.expand_to_fused_with_sf((data, sf), 128, ttp, p2e),
        tilebake.torch.expand_to_fused_with_sf((data, sf), 128, ttp, p2e),
    ):
        assert_same(a, e, "col-major input sf")


@pytest.mark.gpu
def test_kernel_empty_and_e2m1():
    ttp, p2e = layout(0, 4, 8, 16, "cuda")
    x = torch.randn(0, 256, device="cuda").bfloat16()
    assert tilebake.moe.expand_to_fused(x, ttp, p2e).shape == (p2e.numel(), 256)
    ttp, p2e = layout(300, 4, 8, 16, "cuda")
    q = tilebake.torch.cast(torch.randn(300, 256, device="cuda"), "e2m1", (1, 32), round_sf=True, use_packed_ue8m0=True)
    for a, e in zip(
        tilebake.moe.expand_to_fused_with_sf(q, 32, ttp, p2e, True),
        tilebake.torch.expand_to_fused_with_sf(q, 32, ttp, p2e, True),
    ):
        assert_same(a, e, "e2m1")
