"""norm_forward: the reference against float64, argument checks and the CPU path (CI), and the
kernel against the reference on a GPU (3-D and strided inputs, poisoned outputs, in place); and,
for both norm_forward and norm_forward_and_per_token_cast, empty inputs and torch.compile. The
fused cast's own tests: test_norm_forward_and_per_token_cast.py.

Tolerances (../shared/spec/testing.md): out vs reference torch.testing.assert_close defaults
(the kernel sums the squares in another order than torch); rstd rtol=2e-6, atol=1e-7;
norm_input (x + residual rounded to x's dtype) bit-exact.
"""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tests.quant.norm_forward_helpers import DTYPES, EPS, assert_rstd_close, make_input, make_weight
from tilebake.torch import norm_forward_ref


def check_forward(x, weight, residual, out_scale=1.0, use_out=False):
    """norm_forward against the reference; returns the kernel's output."""
    expected, expected_rstd, expected_input = norm_forward_ref(x, weight, EPS, residual, out_scale)
    out = poison_(torch.empty_like(x)) if use_out else None
    residual_out = poison_(torch.empty_like(x)) if use_out and residual is not None else None
    y, rstd, norm_input = tilebake.quant.norm_forward(
        x, weight, EPS, residual=residual, out_scale=out_scale, out=out, residual_out=residual_out, with_rstd=True
    )
    if use_out:
        assert y is out
        assert residual is None or norm_input is residual_out
    if residual is None:
        assert norm_input is x
    assert y.dtype == x.dtype and y.shape == x.shape and rstd.shape == x.shape[:-1]
    assert not y.float().isnan().any()
    torch.testing.assert_close(y, expected)
    assert_rstd_close(rstd, expected_rstd)
    assert_bytes_equal(norm_input, expected_input, "norm_input")
    return y


# --- the reference ---


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_against_float64(dtype):
    x = make_input((7, 256), dtype, "cpu")
    residual = make_input((7, 256), dtype, "cpu")
    weight = make_weight(256, dtype, "cpu")
    y, rstd, norm_input = norm_forward_ref(x, weight, EPS, residual, out_scale=0.75)
    v = (x.float() + residual.float()).to(dtype).double()
    assert torch.equal(norm_input, (x + residual))
    r64 = 1 / torch.sqrt((v * v).mean(-1) + EPS)
    torch.testing.assert_close(rstd.double(), r64, rtol=1e-6, atol=0)
    torch.testing.assert_close(y, (v * r64[:, None] * weight.double() * 0.75).to(dtype))


# --- CPU: argument checks and the slow path ---

BAD_FORWARD = [
    (dict(x=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x=torch.zeros(128, dtype=torch.bfloat16)), ValueError, "x must be \\(num_tokens, hidden\\) or"),
    (
        dict(x=torch.zeros(4, 120, dtype=torch.bfloat16)),
        ValueError,
        "x.shape\\[-1\\] \\(hidden\\) must be a multiple of 16",
    ),
    (dict(x=torch.zeros(4, 8192 + 16, dtype=torch.bfloat16)), ValueError, "in \\[1, 8192\\], got 8208"),
    (dict(x=torch.zeros(4, 0, dtype=torch.bfloat16)), ValueError, "x.shape\\[-1\\] \\(hidden\\)"),
    (dict(x=torch.zeros(128, 4, dtype=torch.bfloat16).t()), ValueError, "x must be contiguous in its last dim"),
    (dict(x=torch.zeros(4, 132, dtype=torch.bfloat16)[:, :128]), ValueError, "x's row and batch strides"),
    (
        dict(x=torch.zeros(3 * 516, dtype=torch.bfloat16).as_strided((3, 4, 128), (516, 128, 1))),
        ValueError,
        "x's row and batch strides must be multiples of 16 bytes, got strides \\(516, 128, 1\\)",
    ),
    (dict(x=torch.zeros(4, 128, dtype=torch.bfloat16, device="meta")), ValueError, "x must be on a CUDA device"),
    (dict(x="x"), TypeError, "x must be a torch.Tensor"),
    (dict(weight=torch.zeros(128)), TypeError, "weight must have x's dtype"),
    (dict(weight=torch.zeros(64, dtype=torch.bfloat16)), ValueError, "weight must have shape \\(128,\\)"),
    (dict(weight=torch.zeros(256, dtype=torch.bfloat16)[::2]), ValueError, "weight must be contiguous"),
    (dict(weight=torch.zeros(128, dtype=torch.bfloat16, device="meta")), ValueError, "weight must be on cpu"),
    (dict(eps="1e-6"), TypeError, "eps must be a Python float"),
    (dict(out_scale=None), TypeError, "out_scale must be a Python float"),
    (dict(residual=torch.zeros(4, 128)), TypeError, "residual must be torch.bfloat16"),
    (dict(residual=torch.zeros(5, 128, dtype=torch.bfloat16)), ValueError, "residual must have shape \\(4, 128\\)"),
    (
        dict(residual=torch.zeros(4, 128, dtype=torch.bfloat16), residual_out=torch.zeros(4, 128)),
        TypeError,
        "residual_out must be torch.bfloat16",
    ),
    (dict(out=torch.zeros(4, 128)), TypeError, "out must be torch.bfloat16"),
    (dict(out=torch.zeros(4, 256, dtype=torch.bfloat16)), ValueError, "out must have shape \\(4, 128\\)"),
    (dict(out=torch.zeros(4, 132, dtype=torch.bfloat16)[:, :128]), ValueError, "out's row and batch strides"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_FORWARD, ids=[m for _, _, m in BAD_FORWARD])
def test_norm_forward_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(4, 128, dtype=torch.bfloat16), weight=None, eps=EPS)
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.norm_forward(**args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_weight", [False, True])
@pytest.mark.parametrize("has_residual", [False, True])
def test_cpu_norm_forward_is_the_reference(dtype, has_weight, has_residual):
    for shape in ((37, 208), (2, 5, 128)):
        x = make_input(shape, dtype, "cpu")
        weight = make_weight(shape[-1], dtype, "cpu") if has_weight else None
        residual = make_input(shape, dtype, "cpu") if has_residual else None
        expected = norm_forward_ref(x, weight, EPS, residual, 2.0)
        y, rstd, norm_input = tilebake.quant.norm_forward(x, weight, EPS, residual, 2.0, with_rstd=True)
        assert_bytes_equal(y, expected[0], "out")
        assert_bytes_equal(rstd, expected[1], "rstd")
        assert_bytes_equal(norm_input, expected[2], "norm_input")
        out, residual_out = poison_(torch.empty_like(x)), poison_(torch.empty_like(x))
        y, rstd, norm_input = tilebake.quant.norm_forward(x, weight, EPS, residual, 2.0, out, residual_out)
        assert y is out and rstd is None
        assert_bytes_equal(out, expected[0], "out=")
        if has_residual:
            assert norm_input is residual_out
            assert_bytes_equal(residual_out, expected[2], "residual_out=")
        else:
            assert norm_input is x


def test_cpu_empty():
    x = torch.empty(0, 256, dtype=torch.bfloat16)
    y, rstd, norm_input = tilebake.quant.norm_forward(x, None, EPS, with_rstd=True)
    assert y.shape == (0, 256) and rstd.shape == (0,) and norm_input is x
    (data, sf), _, _, _ = tilebake.quant.norm_forward_and_per_token_cast(x, None, EPS, "e4m3", 128)
    assert data.shape == (0, 256) and sf.shape == (0, 2)


def check_torch_compile(device, backend):
    """torch.compile(fullgraph=True) traces both ops through their torch.library schemas (no graph
    break), with the optional outputs and preallocated buffers, and gives the eager bytes."""
    x = make_input((37, 256), torch.bfloat16, device)
    weight, residual = make_weight(256, torch.bfloat16, device), make_input((37, 256), torch.bfloat16, device)
    out, residual_out = poison_(torch.empty_like(x)), poison_(torch.empty_like(x))

    def forward(x, weight, residual, out, residual_out):
        plain = tilebake.quant.norm_forward(x, weight, EPS, with_rstd=True)
        into = tilebake.quant.norm_forward(x, weight, EPS, residual, 2.0, out, residual_out)
        fused = tilebake.quant.norm_forward_and_per_token_cast(
            x, weight, EPS, "e4m3", 32, residual, 0.5, True, True, True, with_out_bf16=True, with_rstd=True
        )
        return plain, into, fused

    compiled = torch.compile(forward, fullgraph=True, backend=backend)
    (y, rstd, norm_input), (y2, rstd2, norm_input2), fused = compiled(x, weight, residual, out, residual_out)
    eager_plain = tilebake.quant.norm_forward(x, weight, EPS, with_rstd=True)
    eager_into = tilebake.quant.norm_forward(x, weight, EPS, residual, 2.0)
    assert_bytes_equal(y, eager_plain[0], "out")
    assert_bytes_equal(rstd, eager_plain[1], "rstd")
    assert_bytes_equal(norm_input, x, "norm_input without residual")
    assert rstd2 is None
    assert_bytes_equal(out, eager_into[0], "out= buffer")
    assert_bytes_equal(residual_out, eager_into[2], "residual_out= buffer")
    assert_bytes_equal(y2, eager_into[0], "returned out")
    assert_bytes_equal(norm_input2, eager_into[2], "returned norm_input")
    eager_fused = tilebake.quant.norm_forward_and_per_token_cast(
        x, weight, EPS, "e4m3", 32, residual, 0.5, True, True, True, with_out_bf16=True, with_rstd=True
    )
    (data, sf), y_bf16, rstd3, norm_input3 = fused
    assert_bytes_equal(data, eager_fused[0][0], "data")
    assert_bytes_equal(sf, eager_fused[0][1], "sf")
    assert sf.stride() == eager_fused[0][1].stride(), (sf.stride(), eager_fused[0][1].stride())
    for got, want, name in zip((y_bf16, rstd3, norm_input3), eager_fused[1:], ("out_bf16", "rstd", "norm_input")):
        assert_bytes_equal(got, want, name)


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    """The torch.library registration (schemas + Meta shapes), checked where CI runs."""
    check_torch_compile("cpu", "aot_eager")


# --- GPU: the kernels against the reference ---

SHAPES = [(t, h) for t in (1, 127, 8001) for h in (128, 208, 2048, 4096, 7168, 8192)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_weight,has_residual", [(False, False), (True, False), (True, True), (False, True)])
@pytest.mark.parametrize("num_tokens,hidden", SHAPES)
def test_gpu_norm_forward(num_tokens, hidden, dtype, has_weight, has_residual):
    x = make_input((num_tokens, hidden), dtype, "cuda")
    weight = make_weight(hidden, dtype, "cuda") if has_weight else None
    residual = make_input((num_tokens, hidden), dtype, "cuda") if has_residual else None
    check_forward(x, weight, residual, out_scale=1.0 if has_weight else 0.375)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 50, 1024), (1, 1, 16), (2, 33, 7168 + 16), (4, 1, 4096)])
def test_gpu_norm_forward_3d_strided_poisoned_out(shape, dtype):
    """3-D inputs, rows sliced from wider buffers (real row and batch strides), preallocated
    poisoned outputs, out_scale."""
    hidden = shape[-1]
    x = make_input(shape, dtype, "cuda", row_stride=hidden + 64)
    residual = make_input(shape, dtype, "cuda", row_stride=hidden + 32)
    weight = make_weight(hidden, dtype, "cuda")
    check_forward(x, weight, residual, out_scale=1.5, use_out=True)
    check_forward(x, weight, None, use_out=True)
    check_forward(x[:, ::2] if shape[1] > 1 else x, None, None)  # a row stride of 2 rows


@pytest.mark.gpu
def test_gpu_norm_forward_without_rstd_and_empty():
    x = make_input((64, 1024), torch.bfloat16, "cuda")
    y, rstd, _ = tilebake.quant.norm_forward(x, None, EPS)
    assert rstd is None
    torch.testing.assert_close(y, norm_forward_ref(x, None, EPS)[0])
    for shape in ((0, 256), (0, 3, 256), (2, 0, 256)):
        x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        y, rstd, norm_input = tilebake.quant.norm_forward(x, None, EPS, with_rstd=True)
        assert y.shape == shape and rstd.shape == shape[:-1] and norm_input is x
        (data, sf), _, _, _ = tilebake.quant.norm_forward_and_per_token_cast(
            x, None, EPS, "e4m3", 32, residual=x, with_out_bf16=True
        )
        assert data.shape == shape and sf.shape == (*shape[:-1], 8)


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    check_torch_compile("cuda", "inductor")


@pytest.mark.gpu
def test_gpu_rejects_misaligned_pointers():
    x = torch.zeros(4 * 128 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(4, 128)
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address"):
        tilebake.quant.norm_forward(x, None, EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_in_place(dtype):
    """residual_out=residual (the residual stream updated in place) and out=x: each thread
    reads its elements before it writes them, and a row belongs to one CTA."""
    x = make_input((513, 7168), dtype, "cuda")
    residual = make_input((513, 7168), dtype, "cuda")
    weight = make_weight(7168, dtype, "cuda")
    expected, expected_rstd, expected_input = norm_forward_ref(x, weight, EPS, residual)
    y, rstd, norm_input = tilebake.quant.norm_forward(x, weight, EPS, residual, out=x, residual_out=residual,
                                                      with_rstd=True)  # fmt: skip
    assert y is x and norm_input is residual
    torch.testing.assert_close(y, expected)
    assert_rstd_close(rstd, expected_rstd)
    assert_bytes_equal(norm_input, expected_input, "norm_input")
