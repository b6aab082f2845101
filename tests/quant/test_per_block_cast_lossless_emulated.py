"""The per_block_cast_lossless kernel's generated CUDA C++, run on the CPU by build_tools/block_emu.py
(a fiber per thread, warp-greedy random schedules, stuck barriers reported) against the reference,
through the op's own launch arguments (per_block_cast_lossless.launch): every block pair and SF
layout of the GPU tests checked without a GPU. Opt-in (TILEBAKE_EMULATE=1: it lowers the kernel
and compiles it with g++, then runs a few minutes); needs tilelang and g++.
build_tools/gpu_tests_on_emu.py runs the GPU tests themselves the same way."""

import importlib

import pytest
import torch

import tilebake
from tests.helpers import EMULATED, assert_bytes_equal, poison_
from tests.quant.test_per_block_cast_lossless import CASES, _bad_scales, case_id, make_fp4, poisoned_out, sf_kwargs

pytestmark = EMULATED

op = importlib.import_module("tilebake.quant.per_block_cast_lossless")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    from build_tools.gpu_tests_on_emu import emulated_kernel

    v = op.PerBlockCastLosslessVariant("e4m3")
    return {(v.out_fmt,): emulated_kernel(v, tmp_path_factory.mktemp("emu"))}


def emulated(kernels, x, inb, outb, packed, col, y=None):
    """The op's launch on CPU tensors into poisoned outputs of the returned layout."""
    num_tokens, hidden = x[0].shape[0], 2 * x[0].shape[1]
    data, sf = poisoned_out(num_tokens, hidden, outb, packed, col, "cpu")
    y = data if y is None else y
    op.launch(x[0], x[1], y, sf, inb, outb, packed, kernels=kernels)
    return y, sf


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
@pytest.mark.parametrize("num_tokens,hidden", [(1, 128), (136, 288), (257, 1056)])
def test_emulated_kernel_matches_reference(kernels, case, num_tokens, hidden):
    inb, in_packed, in_col, outb, packed, col = case
    x = make_fp4(num_tokens, hidden, inb, in_packed, in_col, "cpu")
    got = emulated(kernels, x, inb, outb, packed, col)
    expected = tilebake.torch.per_block_cast_lossless(x, "e4m3", inb, outb, **sf_kwargs(packed, col))
    assert_bytes_equal(got[0], expected[0], "data")
    assert_bytes_equal(got[1], expected[1], "sf")


@pytest.mark.parametrize("outb", [(128, 128), (1, 128), (32, 32)])
@pytest.mark.parametrize("packed", [False, True])
def test_emulated_bad_blocks_get_nan_scales(kernels, outb, packed):
    x, bad = _bad_scales(outb, packed, "cpu")
    kwargs = sf_kwargs(packed, False)
    expected = tilebake.torch.per_block_cast_lossless(x, "e4m3", (1, 32), outb, **kwargs, on_error="nan")
    got = emulated(kernels, x, (1, 32), outb, packed, False)
    assert_bytes_equal(got[1], expected[1], "sf")
    bm, bk = outb
    for i in range(256 // bm):
        for j in range(512 // bk):
            if (i, j) not in bad:
                rows, cols = slice(bm * i, bm * (i + 1)), slice(bk * j, bk * (j + 1))
                assert_bytes_equal(got[0][rows, cols], expected[0][rows, cols], f"data block {(i, j)}")


def test_emulated_strided_rows(kernels):
    data, sf = make_fp4(300, 640, (1, 32), True, False, "cpu")
    wide = torch.zeros(300, 640 // 2 + 48, dtype=torch.int8)
    wide[:, 16 : 16 + 320] = data
    y = poison_(torch.empty(300, 640 + 64, dtype=torch.float8_e4m3fn))[:, 32 : 32 + 640]
    for outb in [(1, 128), (32, 32), (128, 128)]:
        got = emulated(kernels, (wide[:, 16 : 16 + 320], sf), (1, 32), outb, False, False, y=y)
        expected = tilebake.torch.per_block_cast_lossless((data, sf), "e4m3", (1, 32), outb)
        assert_bytes_equal(got[0], expected[0], "data")
        assert_bytes_equal(got[1], expected[1], "sf")
