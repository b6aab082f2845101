"""The engram ops' Ascend kernels run on the CPU (emulator.py) through their NPU wrappers, against
the references (tilebake.torch.engram): engram_hash, fused_weight, grad_w_reduce and the Sinkhorn
momentum and step_reduce bit-equal, engram_gate_fwd and _bwd within one bf16 rounding of their
outputs and the Sinkhorn finalize within 1e-6 (sums in another order); the Sinkhorn step bit-equal
to an fp32 model of its own order of sums (_step_model) and within 1e-5 of float64. Odd sizes, negative and extreme
token ids, empty tables, image tokens, the kv form's strided k and v, in place. A model, not an
NPU: nothing here ran on one."""

import pytest
import torch

from tests.ascend.emulator import assert_in_bounds, tensors_of
from tests.ascend.test_emulated import emulator  # noqa: F401 (the session's emulator fixture)
from tilebake.engram import _engram_ascend
from tilebake.torch.engram import (
    engram_gate_bwd_ref,
    engram_gate_fwd_ref,
    engram_hash_ref,
    engram_sinkhorn_finalize_ref,
    engram_sinkhorn_momentum_update_ref,
    engram_sinkhorn_step_reduce_ref,
    engram_sinkhorn_step_ref,
    fused_weight_ref,
    grad_w_reduce_ref,
    make_offsets,
    sum_partials,
)

pytest.importorskip("tilelang")


@pytest.fixture
def emu(emulator, monkeypatch):  # noqa: F811
    emulator.install(monkeypatch, _engram_ascend)
    emulator.launches.clear()
    return emulator


@pytest.mark.parametrize("tokens, ngram, layers, tables", [(1, 2, 1, 1), (333, 3, 2, 4), (1000, 4, 3, 2)])
def test_engram_hash(emu, tokens, ngram, layers, tables):
    ids = torch.randint(-(2**31), 2**31 - 1, (tokens, ngram), dtype=torch.int32)
    ids[0, 0], ids[-1, -1] = 2**31 - 1, -(2**31)
    multipliers = torch.randint(-(2**62), 2**62, (layers, ngram), dtype=torch.int64)
    vocab = torch.randint(1, 100_000, (layers, ngram - 1, tables), dtype=torch.int32)
    vocab[0, 0, 0] = 0  # a table without entries: -1
    offsets = make_offsets(vocab)
    mask = torch.rand(tokens) > 0.8
    for m in (None, mask):
        got = _engram_ascend.engram_hash_npu(ids, multipliers, vocab, offsets, m)
        assert torch.equal(got, engram_hash_ref(ids, multipliers, vocab, offsets, m))


@pytest.mark.parametrize("hc, hidden", [(1, 1), (3, 1000), (4, 7168)])
def test_fused_weight(emu, hc, hidden):
    wh, we = (torch.randn(hc, hidden).to(torch.bfloat16) for _ in range(2))
    got = _engram_ascend.fused_weight_npu(wh, we)
    assert torch.equal(got, fused_weight_ref(wh, we))


@pytest.mark.parametrize("tokens, hc, hidden", [(1, 1, 128), (37, 4, 1000), (9, 2, 16384)])
@pytest.mark.parametrize("masked", [False, True])
def test_engram_gate_fwd(emu, tokens, hc, hidden, masked):
    x = torch.randn(tokens, hc, hidden).to(torch.bfloat16)
    kv = torch.randn(tokens, hc + 1, hidden).to(torch.bfloat16)
    w = torch.rand(hc, hidden) + 0.5
    mask = (torch.rand(tokens) > 0.5) if masked else None
    out, saved = _engram_ascend.gate_forward_npu(x, kv[:, :hc], kv[:, hc], w, 1e-6, 1e-3, mask, True, False)
    want = engram_gate_fwd_ref(x, kv, w, 1e-6, 1e-3, mask)
    for got, ref, name in zip(saved.unbind(0), want[1:], ("dot", "gate", "rstd_x", "rstd_k")):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(out, want[0], rtol=8e-3, atol=1e-2)  # one bf16 rounding of the output
    if masked:
        assert torch.equal(out[mask], x[mask])
    inplace = x.clone()
    out, saved = _engram_ascend.gate_forward_npu(inplace, kv[:, :hc], kv[:, hc], w, 1e-6, 1e-3, mask, False, True)
    assert out is inplace and saved is None
    torch.testing.assert_close(inplace, want[0], rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("partials, hc, hidden", [(1, 1, 1), (13, 3, 1000), (64, 4, 7168)])
def test_grad_w_reduce(emu, partials, hc, hidden):
    p = torch.randn(partials, hc, hidden)
    wh, we = (torch.randn(hc, hidden).to(torch.bfloat16) for _ in range(2))
    gh, ge = torch.randn(hc, hidden), torch.randn(hc, hidden)
    want_h, want_e = gh.clone(), ge.clone()
    grad_w_reduce_ref(p, wh, we, want_h, want_e)
    _engram_ascend.grad_w_reduce_npu(p, wh, we, gh, ge)
    assert torch.equal(gh, want_h) and torch.equal(ge, want_e)


@pytest.mark.parametrize("tokens, hc, hidden", [(1, 1, 128), (37, 4, 1000), (5, 2, 8192)])
@pytest.mark.parametrize("masked", [False, True])
def test_engram_gate_bwd(emu, tokens, hc, hidden, masked):
    x = torch.randn(tokens, hc, hidden).to(torch.bfloat16)
    kv = torch.randn(tokens, hc + 1, hidden).to(torch.bfloat16)
    w = torch.rand(hc, hidden) + 0.5
    mask = (torch.rand(tokens) > 0.5) if masked else None
    _, dot, gate, rx, rk = engram_gate_fwd_ref(x, kv, w, 1e-6, 1e-3, mask)
    g = torch.randn(tokens, hc, hidden).to(torch.bfloat16)
    want = engram_gate_bwd_ref(g, x, kv, w, dot, gate, rx, rk, 1e-3, mask)
    grad_kv = torch.full(kv.shape, float("nan")).to(torch.bfloat16)
    saved = {"dot": dot, "gate_score": gate, "rstd_x": rx, "rstd_k": rk}
    dx, partial = _engram_ascend.gate_backward_npu(g, x, kv[:, :hc], kv[:, hc], w, saved, 1e-3, mask, grad_kv[:, :hc],
                                                   grad_kv[:, hc])  # fmt: skip
    torch.testing.assert_close(dx, want[0], rtol=8e-3, atol=1e-2)  # one bf16 rounding
    torch.testing.assert_close(grad_kv, want[1], rtol=8e-3, atol=1e-2)
    assert partial.shape == (64, hc, hidden)
    torch.testing.assert_close(partial.sum(0, keepdim=True), want[2], rtol=1e-4, atol=1e-4)  # token sums in another order


@pytest.mark.parametrize("g_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("nesterov", [False, True])
def test_engram_sinkhorn_momentum(emu, g_dtype, m_dtype, nesterov):
    g = torch.randn(5001).to(g_dtype)
    mb = torch.randn(5001).to(m_dtype)
    want_mb = mb.clone()
    want = engram_sinkhorn_momentum_update_ref(g, want_mb, 0.9, nesterov)
    one_minus = float(torch.tensor(1 - 0.9, dtype=torch.float32))
    got = _engram_ascend.sinkhorn_momentum_npu(g, mb, 0.9, one_minus, nesterov)
    assert torch.equal(got, want) and torch.equal(mb, want_mb)


@pytest.mark.parametrize("parts, cols", [(1, 1), (13, 3000), (64, 4096)])
def test_engram_sinkhorn_step_reduce(emu, parts, cols):
    p = torch.randn(parts, cols)
    want, got = torch.empty(cols), torch.full((cols,), float("nan"))
    engram_sinkhorn_step_reduce_ref(p, want)
    _engram_ascend.sinkhorn_step_reduce_npu(p, got)
    assert torch.equal(got, want)


@pytest.mark.parametrize("rows, cols", [(1, 1), (70, 3000), (3, 5000)])
def test_engram_sinkhorn_finalize(emu, rows, cols):
    m, rs, cs = torch.randn(rows, cols), torch.rand(rows) + 0.5, torch.rand(cols) + 0.5
    got = _engram_ascend.sinkhorn_finalize_npu(m, rs, cs, 1e-8, 0.3, None)
    torch.testing.assert_close(got, engram_sinkhorn_finalize_ref(m, rs, cs, 1e-8, 0.3), rtol=1e-5, atol=1e-6)


def _step_model(m, rs, cs, eps, cores=64, threads=128):
    """The Ascend step's fp32 arithmetic in its order (each product and sum rounded on its own):
    x = (rs * M) * cs; thread t sums x^2 over columns t, t + threads, ... in order, the threads'
    sums added in thread order; rs' = rs / (sqrt + eps); core c adds ((rs' * M) * cs)^2 over its
    rows c, c + cores, ... in row order."""
    rows, cols = m.shape
    width = -(-cols // threads) * threads
    x = torch.zeros(rows, width)
    x[:, :cols] = rs[:, None] * m * cs[None, :]
    part = torch.zeros(rows, threads)
    for q in range(width // threads):
        sq = x[:, q * threads : (q + 1) * threads]
        part = part + sq * sq
    total = torch.zeros(rows)
    for t in range(threads):
        total = total + part[:, t]
    norm = total.double().sqrt().float()  # correctly rounded, as sqrtf (torch's fp32 sqrt here is not)
    new_rs = rs / (norm + eps)
    y = new_rs[:, None] * m * cs[None, :]
    partial = torch.zeros(min(cores, rows), cols)
    for r in range(rows):
        partial[r % cores] = partial[r % cores] + y[r] * y[r]
    return norm, new_rs, partial


@pytest.mark.parametrize("rows, cols", [(1, 1), (70, 3000), (130, 1028), (3, 8192), (65, 13)])
def test_engram_sinkhorn_step(emu, rows, cols):
    m, rs, cs = torch.randn(rows, cols), torch.rand(rows) + 0.5, torch.rand(cols) + 0.5
    want_rs = rs.clone()
    want_norm, _ = engram_sinkhorn_step_ref(m, want_rs, cs, 1e-20)
    model_norm, model_rs, model_partial = _step_model(m, rs, cs, 1e-20)
    got_rs = rs.clone()
    norm, partial = _engram_ascend.sinkhorn_step_npu(m, got_rs, cs, 1e-20)
    assert partial.shape == (min(64, rows), cols)
    assert_in_bounds(emu.launches[-1], tensors_of(("m", m, False), ("cs", cs, False), ("partial", partial, True)))
    assert torch.equal(norm, model_norm) and torch.equal(got_rs, model_rs) and torch.equal(partial, model_partial)
    # against the reference (torch's sums in another order) and float64
    torch.testing.assert_close(norm, want_norm)
    torch.testing.assert_close(got_rs, want_rs)
    norm64 = (rs.double()[:, None] * m.double() * cs.double()).norm(dim=1)
    torch.testing.assert_close(norm.double(), norm64, rtol=1e-5, atol=1e-5)
    want64 = ((got_rs.double()[:, None] * m.double() * cs.double()) ** 2).sum(0)
    torch.testing.assert_close(sum_partials(partial).double(), want64, rtol=1e-5, atol=1e-5)
