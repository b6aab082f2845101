"""The Sinkhorn helpers against the references: the momentum update bit-exact (buffer and
result, every dtype pair, nesterov on and off); step, step_reduce and finalize within
assert_close's fp32 tolerances (sums in another order); NaN fails; argument errors on the CPU."""

import pytest
import torch

import tilebake
from tilebake.torch import engram as ref

DTYPES = [torch.bfloat16, torch.float32]
CUDA = pytest.param("cuda", marks=pytest.mark.gpu)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("grad_dtype", DTYPES, ids=["g-bf16", "g-fp32"])
@pytest.mark.parametrize("momentum_dtype", DTYPES, ids=["m-bf16", "m-fp32"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("numel", [1, 8001, 1 << 20])
def test_momentum_update_bit_exact(device, grad_dtype, momentum_dtype, nesterov, numel):
    grad = torch.randn(numel, device=device).to(grad_dtype)
    buf = torch.randn(numel, device=device).to(momentum_dtype)
    want_buf = buf.cpu().clone()
    want = ref.engram_sinkhorn_momentum_update_ref(grad.cpu(), want_buf, 0.95, nesterov)
    got = tilebake.engram.engram_sinkhorn_momentum_update(grad, buf, 0.95, nesterov)
    assert got.dtype == torch.float32 and got.shape == grad.shape
    assert torch.equal(got.cpu(), want) and torch.equal(buf.cpu(), want_buf)


def matrix_inputs(rows, cols, device):
    m = torch.randn(rows, cols, device=device)
    return m, torch.rand(rows, device=device) + 0.5, torch.rand(cols, device=device) + 0.5


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("rows,cols", [(1, 4), (8001, 256), (1000, 5120), (3, 8192), (517, 1028)])
def test_step_and_reduce(device, rows, cols):
    m, rs, cs = matrix_inputs(rows, cols, device)
    want_rs = rs.clone()
    want_norm, want_sumsq = ref.engram_sinkhorn_step_ref(m, want_rs, cs, 1e-20)
    norm, partial = tilebake.engram.engram_sinkhorn_step(m, rs, cs, 1e-20)
    torch.testing.assert_close(norm, want_norm)
    torch.testing.assert_close(rs, want_rs)
    sumsq = torch.full((cols,), float("nan"), device=device)
    tilebake.engram.engram_sinkhorn_step_reduce(partial, sumsq)
    # fp32 column sums over many rows in another order: within 1e-5 of the float64 sums
    want64 = ((want_rs.double()[:, None] * m.double() * cs.double()) ** 2).sum(0)
    torch.testing.assert_close(sumsq.double(), want64, rtol=1e-5, atol=1e-5)
    exact = torch.empty_like(sumsq)
    ref.engram_sinkhorn_step_reduce_ref(partial, exact)
    assert torch.equal(sumsq, exact)  # the kernel's fixed order is the reference's
    again = torch.empty_like(sumsq)
    tilebake.engram.engram_sinkhorn_step_reduce(partial, again)
    assert torch.equal(again, sumsq)  # a fixed order: the same bits


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("parts,cols", [(1, 4), (7, 1028), (396, 5120), (1000, 128), (3, 16388)])
def test_step_reduce_is_the_fixed_order_sum(device, parts, cols):
    partial = torch.randn(parts, cols, device=device)
    got = torch.full((cols,), float("nan"), device=device)
    tilebake.engram.engram_sinkhorn_step_reduce(partial, got)
    assert torch.equal(got.cpu(), ref.sum_partials(partial.cpu()))
    torch.testing.assert_close(got.double(), partial.double().sum(0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("rows,cols", [(1, 4), (8001, 256), (1000, 5120), (517, 1028)])
@pytest.mark.parametrize("given", [False, True])
def test_finalize(device, rows, cols, given):
    m, rs, cs = matrix_inputs(rows, cols, device)
    want = ref.engram_sinkhorn_finalize_ref(m, rs, cs, 1e-20, 0.7)
    out = torch.full_like(m, float("nan")) if given else None
    got = tilebake.engram.engram_sinkhorn_finalize(m, rs, cs, 1e-20, 0.7, out=out)
    if given:
        assert got is out
    torch.testing.assert_close(got, want)


def test_rejects_bad_arguments():
    m, rs, cs = matrix_inputs(4, 8, "cpu")
    e = tilebake.engram
    with pytest.raises(ValueError, match="momentum_buffer must have grad's shape"):
        e.engram_sinkhorn_momentum_update(torch.zeros(8), torch.zeros(4), 0.9)
    with pytest.raises(TypeError, match="grad must be bfloat16 or float32"):
        e.engram_sinkhorn_momentum_update(torch.zeros(8, dtype=torch.float16), torch.zeros(8), 0.9)
    with pytest.raises(TypeError, match="beta1 must be a Python float"):
        e.engram_sinkhorn_momentum_update(torch.zeros(8), torch.zeros(8), torch.tensor(0.9))
    with pytest.raises(TypeError, match="nesterov must be a bool"):
        e.engram_sinkhorn_momentum_update(torch.zeros(8), torch.zeros(8), 0.9, 1)
    with pytest.raises(ValueError, match="row_scale must be \\(4,\\)"):
        e.engram_sinkhorn_step(m, rs[:3], cs, 1e-20)
    with pytest.raises(ValueError, match="col_scale must be \\(8,\\)"):
        e.engram_sinkhorn_finalize(m, rs, cs[:3], 1e-20, 1.0)
    with pytest.raises(TypeError, match="matrix must be float32"):
        e.engram_sinkhorn_step(m.double(), rs, cs, 1e-20)
    with pytest.raises(ValueError, match="col_sumsq must be \\(8,\\)"):
        e.engram_sinkhorn_step_reduce(torch.zeros(3, 8), torch.zeros(4))
    with pytest.raises(ValueError, match="out must have matrix's shape"):
        e.engram_sinkhorn_finalize(m, rs, cs, 1e-20, 1.0, out=torch.zeros(4, 4))
