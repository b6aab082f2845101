"""The batched_transpose_weight_sf kernel's generated CUDA C++, run on the CPU by
build_tools/block_emu.py (a fiber per thread) against the reference, through the op's own launches
(batched_transpose_weight_sf.transform): both sf1 layouts, groups, strided scales and outs of
other strides, checked without a GPU. Opt-in (TILEBAKE_EMULATE=1: lowers the kernel and
compiles it with g++, a few seconds); needs tilelang and g++."""

import importlib

import pytest
import torch

import tilebake
from tests.helpers import EMULATED, assert_bytes_equal, poison_
from tests.quant.test_batched_transpose_weight_sf import GPU_SHAPES, make_sf

pytestmark = EMULATED

op = importlib.import_module("tilebake.quant.batched_transpose_weight_sf")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    from build_tools.gpu_tests_on_emu import emulated_kernel

    v = op.BatchedTransposeWeightSfVariant("fp32")
    return {(v.in_dtype,): emulated_kernel(v, tmp_path_factory.mktemp("emu"))}


@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize("shape", [s for s in GPU_SHAPES if s[-2] * s[-1] <= 56 * 56])
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("strided", [False, True])
def test_emulated_kernel_matches_reference(kernels, bs, shape, transpose, strided):
    sf = make_sf(shape[:-2] + shape[:-3:-1], "cpu").transpose(-1, -2) if strided else make_sf(shape, "cpu")
    ((e0, e1),) = tilebake.torch.batched_transpose_weight_sf([sf], bs, [transpose])
    outs = (poison_(torch.empty_like(e0)), poison_(torch.empty_like(e1)))
    got = op.transform(sf, bs, transpose, outs, kernels=kernels)
    assert got[0] is outs[0] and got[1] is outs[1]
    assert_bytes_equal(got[0], e0, "sf0")
    assert_bytes_equal(got[1], e1, "sf1")
    assert got[0].stride() == e0.stride() and got[1].stride() == e1.stride()


def test_emulated_outs_of_other_strides(kernels):
    sf = make_sf((2, 3, 5), "cpu")
    ((e0, e1),) = tilebake.torch.batched_transpose_weight_sf([sf], 128, [True])
    sf0 = poison_(torch.empty(2, 384, 2, dtype=torch.int32))  # row-major, not the MN-major view
    sf1 = poison_(torch.empty(2, 640, 1, dtype=torch.int32)).transpose(1, 2)  # (2, 1, 640), strides (640, 1, 1)
    outs = (sf0, sf1)
    got = op.transform(sf, 128, True, outs, kernels=kernels)
    assert_bytes_equal(got[0], e0, "sf0")
    assert_bytes_equal(got[1], e1, "sf1")
