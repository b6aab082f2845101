"""unpack_from_e2m1fn_x2: the kernel (fp32 / bf16 out, contiguous aligned CUDA input) and the
reference path (everything else) against tilebake.torch's decode evaluated on the same tensors,
bit for bit (-0.0 included); argument errors on the CPU. The GPU tests also run on the CPU
through build_tools/gpu_tests_on_emu.py (-k "not compile")."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tilebake.torch import unpack_from_e2m1fn_x2 as reference

OUT_DTYPES = [torch.float32, torch.bfloat16]
# (shape of the packed input): one byte, a partial last vector, odd sizes, several ranks
SHAPES = [(1,), (15,), (16,), (8001,), (3, 4103), (2, 3, 64), (1, 1, 1, 17), (4096, 3584)]


def packed(shape, dtype, device):
    return torch.randint(0, 256, shape, dtype=torch.int32, device=device).to(torch.uint8).view(dtype)


def every_byte(dtype, device):
    return torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8).view(dtype).reshape(4, 64)


def test_every_code_decodes_as_the_table():
    y = tilebake.quant.unpack_from_e2m1fn_x2(torch.tensor([[0x21, -1, 0x08, 0x7F]], dtype=torch.int8))
    assert y.tolist() == [[0.5, 1.0, -6.0, -6.0, -0.0, 0.0, -6.0, 6.0]]
    assert torch.signbit(y[0, 4]) and not torch.signbit(y[0, 5])  # code 8 is -0.0


@pytest.mark.parametrize("out_dtype", OUT_DTYPES + [torch.float16, torch.float64])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_cpu_path_is_the_reference(dtype, out_dtype):
    x = every_byte(dtype, "cpu")
    y = tilebake.quant.unpack_from_e2m1fn_x2(x, out_dtype)
    assert y.shape == (4, 128) and y.dtype == out_dtype
    assert_bytes_equal(y, reference(x, out_dtype), "y")


@pytest.mark.parametrize(
    "x,out_dtype,exc,message",
    [
        (torch.zeros(4), torch.float32, TypeError, "x must be int8 or uint8"),
        ([1, 2], torch.float32, TypeError, "x must be a torch.Tensor"),
        (torch.zeros(4, dtype=torch.int8), torch.int32, TypeError, "out_dtype must be a floating torch.dtype"),
        (torch.zeros(4, dtype=torch.int8), "fp32", TypeError, "out_dtype must be a floating torch.dtype"),
        (torch.zeros((), dtype=torch.int8), torch.float32, ValueError, "at least one dimension"),
    ],
)
def test_rejects_bad_arguments(x, out_dtype, exc, message):
    with pytest.raises(exc, match=message):
        tilebake.quant.unpack_from_e2m1fn_x2(x, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8], ids=["int8", "uint8"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gpu_bit_exact(shape, dtype, out_dtype):
    x = packed(shape, dtype, "cuda")
    for _ in range(2):  # the Python path, then the plan
        y = tilebake.quant.unpack_from_e2m1fn_x2(x, out_dtype)
        assert y.shape == (*shape[:-1], 2 * shape[-1]) and y.dtype == out_dtype and y.is_contiguous()
        assert_bytes_equal(y, reference(x, out_dtype), "y")


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["fp32", "bf16"])
def test_gpu_every_byte(out_dtype):
    x = every_byte(torch.int8, "cuda")
    assert_bytes_equal(tilebake.quant.unpack_from_e2m1fn_x2(x, out_dtype), reference(x, out_dtype), "y")


@pytest.mark.gpu
def test_gpu_other_inputs_take_the_reference():
    """Strided, misaligned, empty, other output dtypes: the reference's values all the same."""
    base = packed((64, 130), torch.int8, "cuda")
    for x, out_dtype in [
        (base[:, :64], torch.float32),  # strided rows
        (base.view(-1)[1:8001], torch.bfloat16),  # misaligned
        (base[:0], torch.float32),  # empty
        (base, torch.float16),
        (base, torch.float64),
    ]:
        y = tilebake.quant.unpack_from_e2m1fn_x2(x, out_dtype)
        assert_bytes_equal(y, reference(x, out_dtype), "y")


@pytest.mark.gpu
def test_gpu_torch_compile():
    x = packed((5, 64), torch.uint8, "cuda")
    compiled = torch.compile(lambda t: tilebake.quant.unpack_from_e2m1fn_x2(t, torch.bfloat16), fullgraph=True)
    assert_bytes_equal(compiled(x), reference(x, torch.bfloat16), "y")
