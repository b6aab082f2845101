"""norm_backward: the reference against float64 autograd, argument checks and the CPU path (CI),
and the kernel against the reference on a GPU.

Tolerances (../shared/spec/testing.md): x_grad torch.testing.assert_close defaults; weight_grad
atol = 2e-3 / sqrt(num_sms), rtol 1e-4 (fp32) / 8e-3 (bf16: one rounding of a sum whose fp32
value differs in the last bits flips at most one bf16 ulp, 2^-8).
"""

import math

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tilebake.torch import norm_backward_ref, norm_forward_ref

DTYPES = [torch.bfloat16, torch.float32]
EPS = 1e-6


def make_inputs(num_tokens, hidden, dtype, device, has_weight=True, has_rog=False, row_stride=None):
    """(out_grad, x, weight, rstd, residual_out_grad). Row scales 2^-2 .. 2^2 only: x_grad is a
    difference of two terms, and with rows over many binades fp32 cancellation error would
    exceed assert_close's default atol for fp32 in the reference as much as in the kernel."""
    width = row_stride or hidden
    x = (torch.randn(num_tokens, width, device=device) * torch.exp2(
        torch.randint(-2, 3, (num_tokens, 1), device=device).float()
    )).to(dtype)[:, :hidden]  # fmt: skip
    g = torch.randn(num_tokens, width, device=device).to(dtype)[:, :hidden]
    weight = (torch.rand(hidden, device=device) * 2 - 0.5).to(dtype) if has_weight else None
    _, rstd, _ = norm_forward_ref(x, weight, EPS)
    rog = torch.randn(num_tokens, hidden, device=device).to(dtype) if has_rog else None
    return g, x, weight, rstd, rog


def weight_grad_tolerance(dtype):
    num_sms = tilebake.get_num_sms() if torch.cuda.is_available() else 1
    return dict(atol=2e-3 / math.sqrt(num_sms), rtol=1e-4 if dtype == torch.float32 else 8e-3)


# --- the reference against float64 autograd ---


@pytest.mark.parametrize("has_weight", [False, True])
def test_reference_is_the_gradient(has_weight):
    g, x, weight, rstd, rog = make_inputs(9, 256, torch.float32, "cpu", has_weight, has_rog=True)
    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_() if has_weight else None
    out_scale = 0.625
    y = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + EPS) * out_scale
    if has_weight:
        y = y * w64
    y.backward(g.double())
    x_grad, weight_grad = norm_backward_ref(g, x, weight, rstd, rog, out_scale)
    torch.testing.assert_close(x_grad.double(), x64.grad + rog.double(), rtol=1e-5, atol=1e-5)
    if has_weight:
        torch.testing.assert_close(weight_grad.double(), w64.grad, rtol=1e-5, atol=1e-5)
    else:
        assert weight_grad is None


# --- CPU: argument checks and the slow path ---


def _args(**overrides):
    args = dict(
        out_grad=torch.zeros(4, 128, dtype=torch.bfloat16),
        x=torch.zeros(4, 128, dtype=torch.bfloat16),
        weight=torch.zeros(128, dtype=torch.bfloat16),
        rstd=torch.zeros(4),
    )
    args.update(overrides)
    return args


BAD_CALLS = [
    (dict(x=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x=torch.zeros(1, 4, 128, dtype=torch.bfloat16)), ValueError, "x must be \\(num_tokens, hidden\\), got"),
    (dict(x=torch.zeros(4, 112, dtype=torch.bfloat16)), ValueError, "must be a multiple of 32"),
    (dict(x=torch.zeros(4, 8192 + 32, dtype=torch.bfloat16)), ValueError, "in \\[1, 8192\\]"),
    (dict(x=torch.zeros(4, 132, dtype=torch.bfloat16)[:, :128]), ValueError, "x's row and batch strides"),
    (dict(out_grad=torch.zeros(4, 128)), TypeError, "out_grad must be torch.bfloat16"),
    (dict(out_grad=torch.zeros(3, 128, dtype=torch.bfloat16)), ValueError, "out_grad must have shape \\(4, 128\\)"),
    (dict(weight=torch.zeros(128)), TypeError, "weight must have x's dtype"),
    (dict(weight=torch.zeros(96, dtype=torch.bfloat16)), ValueError, "weight must have shape \\(128,\\)"),
    (dict(rstd=torch.zeros(4, dtype=torch.bfloat16)), TypeError, "rstd must be torch.float32"),
    (dict(rstd=torch.zeros(4, 1)), ValueError, "rstd must have shape \\(4,\\)"),
    (dict(rstd=torch.zeros(8)[::2]), ValueError, "rstd must be contiguous"),
    (dict(residual_out_grad=torch.zeros(4, 128)), TypeError, "residual_out_grad must be torch.bfloat16"),
    (dict(out_scale="2"), TypeError, "out_scale must be a Python float"),
    (dict(weight=None, weight_grad=torch.zeros(128)), ValueError, "weight_grad is given but weight is None"),
    (dict(weight_grad=torch.zeros(128, dtype=torch.float16)), TypeError, "weight_grad must be bfloat16 or float32"),
    (dict(weight_grad=torch.zeros(64)), ValueError, "weight_grad must have shape \\(128,\\)"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    with pytest.raises(exc, match=message):
        tilebake.quant.norm_backward(**_args(**overrides))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_weight", [False, True])
@pytest.mark.parametrize("has_rog", [False, True])
def test_cpu_path_is_the_reference(dtype, has_weight, has_rog):
    g, x, weight, rstd, rog = make_inputs(37, 224, dtype, "cpu", has_weight, has_rog)
    expected_dx, expected_dw = norm_backward_ref(g, x, weight, rstd, rog, 1.5)
    x_grad, weight_grad = tilebake.quant.norm_backward(g, x, weight, rstd, rog, 1.5)
    assert_bytes_equal(x_grad, expected_dx, "x_grad")
    if has_weight:
        assert_bytes_equal(weight_grad, expected_dw.to(dtype), "weight_grad")
        for buf_dtype in DTYPES:
            start = torch.randn(224).to(buf_dtype)
            buf = start.clone()
            _, result = tilebake.quant.norm_backward(g, x, weight, rstd, rog, 1.5, weight_grad=buf)
            assert result is buf
            assert_bytes_equal(buf, (start.float() + expected_dw).to(buf_dtype), "accumulated weight_grad")
    else:
        assert weight_grad is None


def check_torch_compile(device, backend):
    """torch.compile(fullgraph=True) traces norm_backward through its torch.library schema,
    with and without weight, accumulating into a weight_grad buffer; same bytes as eager."""
    g, x, weight, rstd, rog = make_inputs(37, 224, torch.bfloat16, device, True, True)
    start = torch.randn(224, device=device)

    def backward(g, x, weight, rstd, rog, buf):
        unit = tilebake.quant.norm_backward(g, x, None, rstd, rog, 1.5)
        accumulated = tilebake.quant.norm_backward(g, x, weight, rstd, rog, 1.5, weight_grad=buf)
        return unit, accumulated

    buf = start.clone()
    (dx_unit, dw_unit), (dx, dw) = torch.compile(backward, fullgraph=True, backend=backend)(
        g, x, weight, rstd, rog, buf
    )
    assert dw_unit is None
    eager_buf = start.clone()
    eager_dx, _ = tilebake.quant.norm_backward(g, x, weight, rstd, rog, 1.5, weight_grad=eager_buf)
    assert_bytes_equal(dx_unit, tilebake.quant.norm_backward(g, x, None, rstd, rog, 1.5)[0], "x_grad, unit weight")
    assert_bytes_equal(dx, eager_dx, "x_grad")
    assert_bytes_equal(buf, eager_buf, "accumulated weight_grad")
    assert_bytes_equal(dw, eager_buf, "returned weight_grad")


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    """The torch.library registration (schema + Meta shapes), checked where CI runs."""
    check_torch_compile("cpu", "aot_eager")


# --- GPU: the kernel against the reference ---


def check_backward(g, x, weight, rstd, rog, out_scale=1.0):
    expected_dx, expected_dw = norm_backward_ref(g, x, weight, rstd, rog, out_scale)
    x_grad, weight_grad = tilebake.quant.norm_backward(g, x, weight, rstd, rog, out_scale)
    assert x_grad.dtype == x.dtype and x_grad.shape == x.shape
    assert not x_grad.float().isnan().any()
    torch.testing.assert_close(x_grad, expected_dx)
    if weight is None:
        assert weight_grad is None
        return
    assert weight_grad.dtype == weight.dtype and weight_grad.shape == weight.shape
    torch.testing.assert_close(weight_grad, expected_dw.to(weight.dtype), **weight_grad_tolerance(weight.dtype))
    for buf_dtype in DTYPES:  # accumulation into a caller's buffer, either dtype
        start = torch.randn(x.shape[1], device=x.device).to(buf_dtype)
        buf = start.clone()
        _, result = tilebake.quant.norm_backward(g, x, weight, rstd, rog, out_scale, weight_grad=buf)
        assert result is buf
        torch.testing.assert_close(buf, (start.float() + expected_dw).to(buf_dtype), **weight_grad_tolerance(buf_dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_weight,has_rog", [(True, False), (True, True), (False, False), (False, True)])
@pytest.mark.parametrize("hidden", [128, 224, 2048, 4096, 7168, 8192])
@pytest.mark.parametrize("num_tokens", [1, 127, 8001])
def test_gpu_norm_backward(num_tokens, hidden, dtype, has_weight, has_rog):
    check_backward(*make_inputs(num_tokens, hidden, dtype, "cuda", has_weight, has_rog), out_scale=1.25)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_strided_rows_and_sm_counts(dtype):
    """Rows sliced from wider buffers; fewer persistent CTAs (the partials buffer shrinks)."""
    inputs = make_inputs(999, 4096, dtype, "cuda", True, True, row_stride=4096 + 64)
    device_sms = tilebake.config.get_device_num_sms()
    for num_sms in (device_sms, device_sms - 19, 1):
        tilebake.set_num_sms(num_sms)
        check_backward(*inputs)


@pytest.mark.gpu
def test_gpu_chain_with_norm_forward_matches_autograd():
    """rstd and norm_input from the norm_forward kernel feed norm_backward; against float64 autograd."""
    x = torch.randn(300, 2048, device="cuda")
    residual = torch.randn(300, 2048, device="cuda")
    weight = torch.rand(2048, device="cuda") + 0.5
    g = torch.randn(300, 2048, device="cuda")
    _, rstd, norm_input = tilebake.quant.norm_forward(x, weight, EPS, residual, 0.5, with_rstd=True)
    x_grad, weight_grad = tilebake.quant.norm_backward(g, norm_input, weight, rstd, g, 0.5)
    v = (x + residual).double().requires_grad_()
    w = weight.double().requires_grad_()
    y = v * torch.rsqrt((v * v).mean(-1, keepdim=True) + EPS) * w * 0.5
    y.backward(g.double())
    torch.testing.assert_close(x_grad.double(), v.grad + g.double(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight_grad.double(), w.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    check_torch_compile("cuda", "inductor")


@pytest.mark.gpu
def test_gpu_empty():
    g, x, weight, rstd, _ = make_inputs(0, 256, torch.bfloat16, "cuda")
    x_grad, weight_grad = tilebake.quant.norm_backward(g, x, weight, rstd)
    assert x_grad.shape == (0, 256) and torch.equal(weight_grad, torch.zeros_like(weight))
    buf = torch.ones(256, device="cuda")
    _, result = tilebake.quant.norm_backward(g, x, weight, rstd, weight_grad=buf)
    assert result is buf and torch.equal(buf, torch.ones_like(buf))


def test_launch_arguments_match_the_built_kernels():
    """Each kernel keeps only the parameters its variant uses (the lowering drops the others);
    the launchers pass exactly those, by name. Checked against the installed manifest."""
    import importlib

    from tilebake._runtime import loader
    from tilebake.errors import CorruptArtifactError

    forward = importlib.import_module("tilebake.quant.norm_forward")
    forward_cast = importlib.import_module("tilebake.quant.norm_forward_and_per_token_cast")
    backward = importlib.import_module("tilebake.quant.norm_backward")
    try:
        kernels = loader.manifest()["kernels"]
    except CorruptArtifactError:
        pytest.skip("no built kernels installed")
    variants = (*forward.NormForwardVariant.all(), *forward_cast.NormForwardCastVariant.all())
    expected = {v.id: v.arg_names for v in (*variants, *backward.NormBackwardVariant.all())}
    built = [vid for vid in expected if vid in kernels]
    if not built:
        pytest.skip("the norm kernels are not in this build")
    assert len(built) == len(expected), f"partly built: missing {sorted(set(expected) - set(built))}"
    for vid in built:
        for arch, entry in kernels[vid].items():
            assert sorted(p["name"] for p in entry["params"]) == sorted(expected[vid]), (vid, arch)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("num_partials,hidden", [(1, 32), (7, 4096), (264, 8192), (9, 7168), (133, 160)])
def test_gpu_weight_grad_is_the_fixed_order_sum(num_partials, hidden, out_dtype):
    """The partials' reduction kernel: exactly tilebake.torch.engram.sum_partials (8 groups of
    every 8th row, then the groups in order), rounded once; added into a buffer in fp32 first."""
    import importlib

    from tilebake.torch.engram import sum_partials

    nb = importlib.import_module("tilebake.quant.norm_backward")
    reduce = nb._REDUCE_KERNELS["bf16" if out_dtype == torch.bfloat16 else "fp32",]
    partials = torch.randn(num_partials, hidden, device="cuda") * 100
    want = sum_partials(partials)
    out = torch.full((hidden,), float("nan"), device="cuda").to(out_dtype)
    reduce(0, partials.data_ptr(), out.data_ptr(), num_partials, hidden, 0)
    assert_bytes_equal(out, want.to(out_dtype), "weight_grad")
    start = torch.randn(hidden, device="cuda").to(out_dtype)
    buf = start.clone()
    reduce(0, partials.data_ptr(), buf.data_ptr(), num_partials, hidden, 1)
    assert_bytes_equal(buf, (start.float() + want).to(out_dtype), "accumulated weight_grad")
