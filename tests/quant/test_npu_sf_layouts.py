"""The Ascend SF layouts, which NPU tensors take on every path (the Ascend kernels and the
reference fallbacks alike), as the original's do there: packed UE8M0 bytes two to an int16
(CUDA and CPU: four to an int32), column-major SF without the TMA padding. There is no NPU
here: tilebake.utils.npu_layouts (the one place that decides) is patched to say yes for CPU
tensors, and each op's results are compared byte for byte with the same call in the CUDA / CPU
layouts, fresh random inputs at sizes that leave partial words (an odd group count, 37 tokens).
"""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tilebake import utils

quant = tilebake.quant


@pytest.fixture
def npu_layouts(monkeypatch):
    """Run the body with the NPU layouts on CPU tensors."""

    def patched(call):
        with monkeypatch.context() as m:
            m.setattr(utils, "npu_layouts", lambda device: True)
            return call()

    return patched


def as_int16_words(words: torch.Tensor, count: int) -> torch.Tensor:
    """Packed int32 words along the last dim (`count` bytes used) -> the int16 words of the same
    bytes: the first 2 * ceil(count / 2) bytes of each row, two to a word."""
    dense = torch.empty(words.shape, dtype=words.dtype).copy_(words)  # strides (.., 1), even for a size-1 dim
    data = dense.view(torch.uint8).reshape(*words.shape[:-1], -1)
    return data[..., : 2 * -(-count // 2)].contiguous().view(torch.int16)


def x_bf16(tokens=37, hidden=640):
    return (torch.randn(tokens, hidden) * torch.exp2(torch.randint(-8, 8, (tokens, 1)).float())).bfloat16()


@pytest.mark.parametrize("npc", [32, 128])  # 20 and 5 groups a row
def test_per_token_cast_packed(npu_layouts, npc):
    x = x_bf16()
    want = quant.per_token_cast(x, "e4m3", npc, round_sf=True, use_packed_ue8m0=True)
    got = npu_layouts(lambda: quant.per_token_cast(x, "e4m3", npc, round_sf=True, use_packed_ue8m0=True))
    groups = 640 // npc
    assert got[1].dtype == torch.int16 and got[1].shape == (37, -(-groups // 2))
    assert_bytes_equal(got[0], want[0], "data")
    assert_bytes_equal(got[1], as_int16_words(want[1], groups), "sf")
    sf_only = npu_layouts(lambda: quant.per_token_cast_with_sf_only(x, "e4m3", npc, round_sf=True, use_packed_ue8m0=True))
    assert_bytes_equal(sf_only, got[1], "per_token_cast_with_sf_only")


def test_per_token_cast_col_major_unpadded(npu_layouts):
    x = x_bf16()
    want = quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True)
    got = npu_layouts(lambda: quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True))
    assert want[1].stride() == (1, 40)  # CUDA: the 37 tokens padded to 16 bytes
    assert got[1].shape == (37, 5) and got[1].stride() == (1, 37)  # Ascend: no padding
    assert_bytes_equal(got[1], want[1], "sf")


def test_given_outputs_in_the_npu_layout(npu_layouts):
    x = x_bf16()
    want = quant.per_token_cast(x, "e4m3", 128, round_sf=True, use_packed_ue8m0=True)
    data, sf = torch.empty(37, 640, dtype=torch.float8_e4m3fn), torch.full((37, 3), -1, dtype=torch.int16)
    got = npu_layouts(lambda: quant.per_token_cast(x, "e4m3", 128, round_sf=True, use_packed_ue8m0=True,
                                                   out=(data, sf)))  # fmt: skip
    assert got[1] is sf
    assert_bytes_equal(sf, as_int16_words(want[1], 5), "out[1]")
    with pytest.raises(TypeError, match=r"out\[1\] must be torch.int16"):
        npu_layouts(lambda: quant.per_token_cast(x, "e4m3", 128, round_sf=True, use_packed_ue8m0=True,
                                                 out=(data, want[1])))  # fmt: skip
    col = torch.empty(5, 37).t()  # column-major, 37 tokens apart: the Ascend layout (no 16-byte step)
    npu_layouts(lambda: quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True, out=(None, col)))
    assert_bytes_equal(col, quant.per_token_cast(x, "e4m3", 128)[1], "column-major out[1]")


def test_quantized_inputs_in_the_npu_layout(npu_layouts):
    """cast_back and a re-quantising per_token_cast read int16-packed SF on an NPU."""
    x = x_bf16()
    q = quant.per_token_cast(x, "e4m3", 128, round_sf=True, use_packed_ue8m0=True)
    q16 = (q[0], as_int16_words(q[1], 5))
    assert_bytes_equal(npu_layouts(lambda: quant.cast_back(q16, "bf16", (1, 128))),
                       quant.cast_back(q, "bf16", (1, 128)), "cast_back")  # fmt: skip
    want = quant.per_token_cast(q, "e2m1", 32, x_block_size=(1, 128))
    got = npu_layouts(lambda: quant.per_token_cast(q16, "e2m1", 32, x_block_size=(1, 128)))
    assert_bytes_equal(got[0], want[0], "data")
    assert_bytes_equal(got[1], want[1], "sf")
    with pytest.raises(TypeError, match="torch.int16 .packed UE8M0"):
        npu_layouts(lambda: quant.cast_back(q, "bf16", (1, 128)))  # the CUDA words on an NPU


def test_per_channel_cast_packs_along_tokens(npu_layouts):
    x = torch.randn(70, 256).bfloat16()  # 3 row blocks of 32 tokens
    want = quant.per_channel_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True)
    got = npu_layouts(lambda: quant.per_channel_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True))
    assert got[1].dtype == torch.int16 and got[1].shape == (2, 256)
    assert_bytes_equal(got[0], want[0], "data")
    assert_bytes_equal(got[1], as_int16_words(want[1].t(), 3).t(), "sf")


def test_per_block_cast_and_lossless(npu_layouts):
    x = torch.randn(96, 384).bfloat16()  # 12 column blocks of 32
    want = quant.per_block_cast(x, "e4m3", (32, 32), round_sf=True, use_packed_ue8m0=True)
    got = npu_layouts(lambda: quant.per_block_cast(x, "e4m3", (32, 32), round_sf=True, use_packed_ue8m0=True))
    assert got[1].dtype == torch.int16 and got[1].shape == (3, 6)
    assert_bytes_equal(got[1], as_int16_words(want[1], 12), "per_block_cast sf")
    fp4 = quant.per_token_cast(x, "e2m1", 32, round_sf=True, use_packed_ue8m0=True)
    fp4_16 = (fp4[0], as_int16_words(fp4[1], 12))
    want = quant.per_block_cast_lossless(fp4, "e4m3", (1, 32), (32, 32), round_sf=True, use_packed_ue8m0=True)
    got = npu_layouts(lambda: quant.per_block_cast_lossless(fp4_16, "e4m3", (1, 32), (32, 32), round_sf=True,
                                                            use_packed_ue8m0=True))  # fmt: skip
    assert_bytes_equal(got[0], want[0], "lossless data")
    assert_bytes_equal(got[1], as_int16_words(want[1], 12), "lossless sf")


def test_fused_casts(npu_layouts):
    x = torch.randn(37, 2 * 640).bfloat16()
    want = quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, round_sf=True, use_packed_ue8m0=True)
    got = npu_layouts(lambda: quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, round_sf=True,
                                                                      use_packed_ue8m0=True))  # fmt: skip
    assert_bytes_equal(got[0], want[0], "swiglu data")
    assert_bytes_equal(got[1], as_int16_words(want[1], 5), "swiglu sf")
    h, w = x_bf16(), torch.randn(640).bfloat16()
    want = quant.norm_forward_and_per_token_cast(h, w, 1e-6, "e4m3", 32, round_sf=True, use_packed_ue8m0=True)[0]
    sf = torch.empty(37, 10, dtype=torch.int16)
    got = npu_layouts(lambda: quant.norm_forward_and_per_token_cast(h, w, 1e-6, "e4m3", 32, round_sf=True,
                                                                    use_packed_ue8m0=True, out=(None, sf))[0])  # fmt: skip
    assert got[1] is sf
    assert_bytes_equal(got[0], want[0], "norm data")
    assert_bytes_equal(sf, as_int16_words(want[1], 20), "norm sf")


@pytest.mark.parametrize("transpose", [False, True])
def test_batched_transpose_weight_sf(npu_layouts, transpose):
    sf = torch.exp2(torch.randint(-20, 11, (3, 5), dtype=torch.float32))  # 5 column blocks, 3 row blocks
    (want0, want1), = quant.batched_transpose_weight_sf([sf], 32, [transpose])
    (got0, got1), = npu_layouts(lambda: quant.batched_transpose_weight_sf([sf], 32, [transpose]))
    assert got0.dtype == got1.dtype == torch.int16
    assert got0.shape == (96, 3) and got0.stride() == (1, 96)  # MN-major, as on CUDA
    assert_bytes_equal(got0, as_int16_words(want0, 5), "sf0")
    rows1 = (lambda t: t.t()) if transpose else (lambda t: t)
    assert_bytes_equal(rows1(got1), as_int16_words(rows1(want1), 3), "sf1")
