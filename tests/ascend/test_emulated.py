"""Our Ascend kernels run on the CPU (emulator.py: the lowered AscendC compiled with g++ against a
model of the C API), each through its op's NPU wrapper, against the CPU path of the same public op:
bit-equal where the arithmetic is exact in both (selection, quantisation with exact scales,
casts), within stated tolerances where the order of a sum or a math function differs. Every GM
copy is checked to stay inside its tensor, and writes inside outputs. Odd sizes: 1 token, tokens
not a multiple of a core's rows, strided rows. A model, not an NPU: nothing here ran on one."""

import os
from pathlib import Path

import pytest
import torch

import tilebake
from tests.ascend.emulator import Emulator, assert_in_bounds, tensors_of
from tilebake.moe import _normalize_weight_ascend, _topk_gate_ascend
from tilebake.quant import (
    _batched_transpose_weight_sf_ascend,
    _cast_ascend,
    _cast_back_ascend,
    _norm_backward_ascend,
    _norm_forward_ascend,
    _per_block_cast_ascend,
    _per_block_cast_lossless_ascend,
    _per_channel_cast_ascend,
    _per_token_cast_ascend,
    _swiglu_backward_ascend,
    _swiglu_forward_ascend,
)
from tilebake.torch import normalize_weight as normalize_weight_ref
from tilebake.torch import stable_topk
from tilebake.transform import _apply_rotary_ascend

pytest.importorskip("tilelang")  # the stage-1 tree comes from the wheel build of `setup`


@pytest.fixture(scope="session")
def emulator(request, tmp_path_factory):
    """TILEBAKE_ASCEND_LOWERED: a stage-1 tree's dav-3510 dir to use instead of the wheel build's."""
    lowered = os.environ.get("TILEBAKE_ASCEND_LOWERED")
    if not lowered:
        lowered = request.getfixturevalue("setup")[0].parent / "build" / "kernels" / "dav-3510"
    return Emulator(Path(lowered), tmp_path_factory.mktemp("emulated"))


@pytest.fixture
def emu(emulator, monkeypatch):
    emulator.install(
        monkeypatch, _topk_gate_ascend, _normalize_weight_ascend, _per_token_cast_ascend, _per_block_cast_ascend,
        _cast_back_ascend, _cast_ascend, _norm_forward_ascend, _per_channel_cast_ascend, _apply_rotary_ascend,
        _swiglu_forward_ascend, _swiglu_backward_ascend, _norm_backward_ascend, _per_block_cast_lossless_ascend,
        _batched_transpose_weight_sf_ascend,
    )  # fmt: skip
    emulator.launches.clear()
    return emulator


def strided(x: torch.Tensor, pad: int = 64) -> torch.Tensor:
    """x's values in rows `pad` elements longer than they are (a view)."""
    wide = torch.full((x.shape[0], x.shape[1] + pad), float("nan"), dtype=x.dtype)
    wide[:, : x.shape[1]] = x
    return wide[:, : x.shape[1]]


@pytest.mark.parametrize("tokens, experts, k", [(1, 8, 1), (130, 256, 8), (67, 72, 6), (5, 300, 9), (3, 8192, 16)])
def test_topk_gate(emu, tokens, experts, k):
    scores = torch.randn(tokens, experts)
    scores[0, 1] = scores[0, 3]  # a tie: the smaller index first
    got = _topk_gate_ascend.topk_gate_npu(scores, k)
    assert torch.equal(got, stable_topk(scores, k))
    assert_in_bounds(emu.launches[-1], tensors_of(("scores", scores, False), ("out", got, True)))
    if tokens > 2:
        scores[1, experts // 2] = float("nan")
        scores[2, 0] = float("-inf")
        got = _topk_gate_ascend.topk_gate_npu(strided(scores), k)
        assert (got[1:3] == -1).all() and torch.equal(got[3:], stable_topk(scores[3:], k))


@pytest.mark.parametrize("tokens, k", [(1, 1), (100, 7), (4097, 32)])
def test_normalize_weight(emu, tokens, k):
    w = torch.rand(tokens, k)
    denominator, normalized = _normalize_weight_ascend.normalize_weight_npu(w)
    want = normalize_weight_ref(w)
    assert torch.equal(denominator, want[0]) and torch.equal(normalized, want[1])
    assert_in_bounds(emu.launches[-1], tensors_of(("w", w, False), ("d", denominator, True), ("n", normalized, True)))


def _special_rows(x: torch.Tensor) -> torch.Tensor:
    """x with a zero row, a row of tiny values and one of huge values (where it has the rows)."""
    x = x.clone()
    if x.shape[0] >= 4:
        x[1] = 0
        x[2] *= 1e-30
        x[3] *= 1e30 if x.dtype == torch.float32 else 1e30
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("round_sf, packed", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("tokens, hidden", [(1, 128), (37, 384), (70, 7168)])
def test_per_token_cast_and_cast_back(emu, dtype, round_sf, packed, tokens, hidden):
    x = _special_rows(torch.randn(tokens, hidden).to(dtype))
    data, sf = _per_token_cast_ascend.per_token_cast(strided(x), 32, round_sf, packed, False)
    want = tilebake.quant.per_token_cast(x, "e4m3", 32, round_sf=round_sf, use_packed_ue8m0=packed)
    want_sf = want[1].view(torch.int16).reshape(sf.shape) if packed else want[1]
    assert torch.equal(data.view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(sf, want_sf)
    for out_dtype, fmt in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        back = _cast_back_ascend.cast_back(data, sf, fmt, 1, 32)
        assert torch.equal(back, tilebake.quant.cast_back(want, fmt, (1, 32)))
        assert back.dtype == out_dtype
    sf_only = _per_token_cast_ascend.per_token_cast(x, 32, round_sf, packed, False, store_data=False)
    assert sf_only[0] is None and torch.equal(sf_only[1], sf)
    if not packed:
        given = torch.rand(tokens, hidden // 32) + 0.5
        data = _per_token_cast_ascend.with_precomputed_sf(strided(x), 32, given)
        want = tilebake.quant.per_token_cast_with_precomputed_sf(x, "e4m3", 32, given)
        assert torch.equal(data.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("round_sf", [False, True])
def test_per_token_cast_and_cast_back_in_place(emu, dtype, round_sf):
    x = _special_rows(torch.randn(45, 256).to(dtype))
    want = x.clone()
    tilebake.quant.per_token_cast_and_cast_back(want, "e4m3", 32, round_sf=round_sf)
    view = strided(x)
    assert _cast_back_ascend.fake_quant(view, "e4m3", 32, round_sf, False, 1e-4)
    assert torch.equal(view, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("round_sf, packed", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("tokens, hidden", [(1, 128), (70, 384)])
def test_per_block_cast(emu, dtype, fmt, round_sf, packed, tokens, hidden):
    x = _special_rows(torch.randn(tokens, hidden).to(dtype))
    data, sf = _per_block_cast_ascend.per_block_cast(strided(x), fmt, (32, 32), False, round_sf, packed)
    want = tilebake.quant.per_block_cast(x, fmt, (32, 32), round_sf=round_sf, use_packed_ue8m0=packed)
    want_sf = want[1].view(torch.int16).reshape(sf.shape) if packed else want[1]
    assert torch.equal(data.view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(sf, want_sf)
    if not packed:
        data = _per_block_cast_ascend.with_precomputed_sf(x, fmt, (32, 32), sf)
        want = tilebake.quant.per_block_cast_with_precomputed_sf(x, fmt, (32, 32), sf)
        assert torch.equal(data.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("round_sf, packed", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("tokens, hidden", [(1, 128), (97, 384)])
def test_per_channel_cast(emu, dtype, round_sf, packed, tokens, hidden):
    x = _special_rows(torch.randn(tokens, hidden).to(dtype))
    data, sf = _per_channel_cast_ascend.per_channel_cast(strided(x), None, 32, None, round_sf, packed)
    want = tilebake.quant.per_channel_cast(x, "e4m3", 32, round_sf=round_sf, use_packed_ue8m0=packed)
    assert torch.equal(data.view(torch.uint8), want[0].view(torch.uint8))
    if packed:  # two row blocks' bytes to an int16 here, four to an int32 in the CUDA layout
        got = sf.view(torch.uint8).reshape(-1, hidden, 2).transpose(1, 2).reshape(-1, hidden)
        want_bytes = want[1].view(torch.uint8).reshape(-1, hidden, 4).transpose(1, 2).reshape(-1, hidden)
        assert torch.equal(got[: -(-tokens // 32)], want_bytes[: -(-tokens // 32)])
    else:
        assert torch.equal(sf, want[1])


@pytest.mark.parametrize("numel", [4, 4 * 1001, 1 << 16])
def test_stochastic_cast(emu, numel):
    x = torch.randn(numel) * torch.logspace(-30, 30, numel)
    got = _cast_ascend.stochastic_cast(x)
    assert torch.equal(got.view(torch.int16), tilebake.quant.cast(x, torch.bfloat16, True).view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_weight, with_residual", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("shape", [(1, 128), (2, 37, 1024), (70, 7168)])
def test_norm_forward(emu, dtype, with_weight, with_residual, shape):
    x = torch.randn(shape).to(dtype)
    weight = torch.rand(shape[-1]).to(dtype) + 0.5 if with_weight else None
    residual = torch.randn(shape).to(dtype) if with_residual else None
    out, rstd, norm_input = _norm_forward_ascend.norm_forward(x, weight, 1e-6, residual, 0.5, True)
    want = tilebake.quant.norm_forward(x, weight, 1e-6, residual, 0.5, with_rstd=True)
    # the sum of squares in another order than the reference's: within a rounding of the output
    torch.testing.assert_close(out, want[0], rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
    torch.testing.assert_close(rstd, want[1], rtol=1e-5, atol=0)
    assert torch.equal(norm_input, want[2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("round_sf, packed", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("with_weight, with_residual, shape", [(True, True, (2, 37, 1024)), (False, False, (1, 128))])
def test_norm_forward_and_per_token_cast(emu, dtype, round_sf, packed, with_weight, with_residual, shape):
    """The fused kernel: the bytes of norm_forward's kernel followed by per_token_cast's (a zero
    row and huge values among the rows), and the CPU path's within the norm's tolerance."""
    x = _special_rows(torch.randn(shape).view(-1, shape[-1])).view(shape).to(dtype)
    weight = torch.rand(shape[-1]).to(dtype) + 0.5 if with_weight else None
    residual = torch.randn(shape).to(dtype) if with_residual else None
    args = (x, weight, 1e-6, residual, 0.5)
    (data, sf), out_bf16, rstd, norm_input = _norm_forward_ascend.norm_forward_and_per_token_cast(
        *args, round_sf, packed, True, True
    )
    fused = emu.launches[-1]
    y, want_rstd, want_input = _norm_forward_ascend.norm_forward(*args, True)
    want = _per_token_cast_ascend.per_token_cast(y.view(-1, shape[-1]), 32, round_sf, packed, False)
    assert torch.equal(data.view(-1, shape[-1]).view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(sf.view(-1, sf.shape[-1]), want[1]) and sf.shape[:-1] == shape[:-1]
    assert torch.equal(out_bf16, y.to(torch.bfloat16)) and torch.equal(rstd, want_rstd)
    assert torch.equal(norm_input, want_input)
    ro = norm_input if with_residual else None
    written = (("data", data), ("sf", sf), ("y", out_bf16), ("rstd", rstd), ("ro", ro))
    read = (("x", x), ("w", weight), ("r", residual))
    assert_in_bounds(fused, tensors_of(*((n, t, True) for n, t in written), *((n, t, False) for n, t in read)))
    cpu = tilebake.quant.norm_forward_and_per_token_cast(
        x, weight, 1e-6, "e4m3", 32, residual, 0.5, round_sf=round_sf, with_out_bf16=True, with_rstd=True
    )
    torch.testing.assert_close(rstd, cpu[2], rtol=1e-5, atol=0)
    if not packed:  # dequantised: the CPU path's output within an e4m3 step (2^-4 relative, or the
        # subnormal step 2^-9 of the group's SF near 0) plus the norm's rounding
        flat_sf = sf.view(-1, sf.shape[-1])
        back = tilebake.quant.cast_back((data.view(-1, shape[-1]), flat_sf), "fp32", (1, 32)).view(shape)
        bound = 0.07 * cpu[1].float().abs() + flat_sf.repeat_interleave(32, -1).view(shape) * 2**-9
        assert ((back - cpu[1].float()).abs() <= bound).all()
    # without rstd or the bf16 copy: those outputs' pointers are x's and x is never written
    before = x.clone()
    (data2, sf2), none_bf16, none_rstd, _ = _norm_forward_ascend.norm_forward_and_per_token_cast(
        *args, round_sf, packed, False, False
    )
    assert none_bf16 is None and none_rstd is None and torch.equal(x, before)
    assert torch.equal(data2.view(torch.uint8), data.view(torch.uint8)) and torch.equal(sf2, sf)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("interleaved, conjugate", [(False, False), (True, False), (False, True)])
def test_apply_rotary(emu, dtype, interleaved, conjugate):
    tokens, q_heads, k_heads, rot = 37, 8, 2, 64
    cache = torch.randn(100, rot)
    positions = torch.randint(-5, 110, (tokens,))  # some outside the cache: those tokens stay as they are
    q, k = torch.randn(tokens, q_heads, rot).to(dtype), torch.randn(tokens, k_heads, rot).to(dtype)
    want_q, want_k = q.clone(), k.clone()
    tilebake.transform.apply_rotary(want_q, cache, want_k, positions, interleaved, conjugate)
    assert _apply_rotary_ascend.apply_rotary_npu(q, cache, k, positions, interleaved, conjugate, 0)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


def assert_e4m3_close(got, want):
    """e4m3 bytes from two exp implementations (glibc's here, torch's on the CPU): at most one
    code apart, and on at most 1% of the elements."""
    a, b = got.view(torch.uint8).to(torch.int16), want.view(torch.uint8).to(torch.int16)
    assert ((a & 0x80) == (b & 0x80)).all() and ((a - b).abs() <= 1).all()
    assert (a != b).float().mean() <= 0.01


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "e4m3"])
@pytest.mark.parametrize("weights, clamp", [(False, None), (True, 5.0)])
def test_swiglu_forward(emu, dtype, fmt, weights, clamp):
    tokens, hidden = 45, 192
    x = (torch.randn(tokens, 2 * hidden) * 3).to(dtype)
    w = torch.rand(tokens) if weights else None
    scale = 1.5 if weights else None
    if fmt == "e4m3":
        y, sf = _swiglu_forward_ascend.swiglu_forward(x, fmt, w, scale, clamp, "round")
        want = tilebake.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 32, None, w, scale, round_sf=True,
                                                                clamp_value=clamp)  # fmt: skip
        assert torch.equal(sf, want[1])  # power-of-two scales: the same unless an amax crosses a power of 2
        assert_e4m3_close(y, want[0])
    else:
        y, _ = _swiglu_forward_ascend.swiglu_forward(x, fmt, w, scale, clamp)
        want = tilebake.quant.swiglu_forward(x, fmt, None, w, scale, clamp)
        tol = {"fp32": 1e-6, "bf16": 8e-3}[fmt]  # the exp's last bit: one rounding of the output
        torch.testing.assert_close(y, want, rtol=tol, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weights, clamp, recompute", [(False, None, False), (True, 5.0, True)])
def test_swiglu_backward(emu, dtype, weights, clamp, recompute):
    tokens, hidden = 37, 128
    x = (torch.randn(tokens, 2 * hidden) * 3).to(dtype)
    g = torch.randn(tokens, hidden).to(dtype)
    w = torch.rand(tokens) if weights else None
    scale = 1.5 if weights else None
    dx, _, wg, act = _swiglu_backward_ascend.swiglu_backward(x, None, g, "fp32", None, w, scale, clamp, recompute)
    want = tilebake.quant.swiglu_backward(x, g, "fp32", None, w, scale, clamp, recompute)
    torch.testing.assert_close(dx, want[0], rtol=1e-5, atol=1e-5)
    if weights:
        torch.testing.assert_close(wg, want[1], rtol=1e-5, atol=1e-4)  # a row's sum in another order
    if recompute:
        torch.testing.assert_close(act, want[-1], rtol=8e-3 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_weight, with_residual", [(False, False), (True, True)])
def test_norm_backward(emu, dtype, with_weight, with_residual):
    tokens, hidden = 70, 384
    x = torch.randn(tokens, hidden).to(dtype)
    weight = torch.rand(hidden).to(dtype) + 0.5 if with_weight else None
    rstd = tilebake.quant.norm_forward(x, weight, 1e-6, with_rstd=True)[1]
    out_grad = torch.randn(tokens, hidden).to(dtype)
    residual_grad = torch.randn(tokens, hidden).to(dtype) if with_residual else None
    dx, dw = _norm_backward_ascend.norm_backward(out_grad, x, weight, rstd, residual_grad, 0.5)
    want = tilebake.quant.norm_backward(out_grad, x, weight, rstd, residual_grad, 0.5)
    torch.testing.assert_close(dx, want[0], rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-4)
    if with_weight:
        # 64 cores' fp32 partials summed (the caller rounds to the weight's dtype)
        tol = {"rtol": 8e-3, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-3}
        torch.testing.assert_close(dw.to(dtype), want[1], **tol)


@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weights", [False, True])
def test_swiglu_backward_and_per_token_cast(emu, grad_dtype, weights):
    tokens, hidden = 29, 192
    x = tilebake.quant.per_token_cast(torch.randn(tokens, 2 * hidden) * 3, "e4m3", 32)
    g = torch.randn(tokens, hidden).to(grad_dtype)
    w = torch.rand(tokens) if weights else None
    scale = 1.5 if weights else None
    dx, (q, sf), wg, _ = _swiglu_backward_ascend.swiglu_backward(x[0], x[1], g, "bf16", None, w, scale, None, False,
                                                                "round")  # fmt: skip
    want = tilebake.quant.swiglu_backward_and_per_token_cast(x, g, "e4m3", 32, None, w, scale, round_sf=True)
    torch.testing.assert_close(dx, want[0] if isinstance(want[0], torch.Tensor) else want[0][0], rtol=8e-3, atol=1e-5)
    quantized = want[1] if isinstance(want[0], torch.Tensor) else want[0]
    assert torch.equal(sf, quantized[1])
    assert_e4m3_close(q, quantized[0])
    if weights:
        torch.testing.assert_close(wg, want[-1], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("tokens, hidden", [(1, 256), (70, 768)])
def test_per_block_cast_lossless(emu, packed, tokens, hidden):
    rows = torch.randn(tokens, hidden) * torch.exp2(torch.randint(-4, 4, (tokens, 1)).float())  # within 2^11 a block
    x = tilebake.quant.per_token_cast(rows, "e2m1", 32, round_sf=True)
    data, sf = _per_block_cast_lossless_ascend.per_block_cast_lossless(x[0], x[1], (1, 32), (32, 32), False, packed,
                                                                       True)  # fmt: skip
    want = tilebake.quant.per_block_cast_lossless(x, "e4m3", (1, 32), (32, 32), use_packed_ue8m0=packed)
    assert torch.equal(data.view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(sf, want[1].view(torch.int16).reshape(sf.shape) if packed else want[1])


def _ue8m0_bytes(t: torch.Tensor, per: int, along_rows: bool, count: int) -> torch.Tensor:
    """The UE8M0 bytes of a packed SF matrix (`per` to an element, packed along its columns, or
    its rows with along_rows), the packed dim unfolded to `count` entries."""
    t = t.to(torch.int64) & ((1 << (8 * per)) - 1)
    if along_rows:
        return _ue8m0_bytes(t.T, per, False, count).T
    k = torch.arange(count)
    return (t[:, k // per] >> (8 * (k % per))) & 0xFF


@pytest.mark.parametrize("shape", [(5, 7), (2, 4, 6)])
@pytest.mark.parametrize("transpose", [False, True])
def test_batched_transpose_weight_sf(emu, shape, transpose):
    """Against the CUDA layout (four UE8M0 bytes an int32) byte by byte: the Ascend one packs two
    an int16."""
    s = torch.exp2(torch.randint(-20, 20, shape).float())
    (sf0, sf1), = _batched_transpose_weight_sf_ascend.batched_transpose_weight_sf([s], 32, [transpose])
    (w0, w1), = tilebake.quant.batched_transpose_weight_sf([s], 32, [transpose])
    nb, kb = shape[-2:]
    for g in range(s.shape[0] if s.dim() == 3 else 1):
        pick = (lambda t: t[g]) if s.dim() == 3 else (lambda t: t)
        assert torch.equal(_ue8m0_bytes(pick(sf0), 2, False, kb), _ue8m0_bytes(pick(w0), 4, False, kb))
        rows = transpose  # sf1 (n packed, k * 32) as given, or its transposed view
        a1, b1 = (pick(t) if rows else pick(t).T for t in (sf1, w1))
        assert torch.equal(_ue8m0_bytes(a1, 2, True, nb), _ue8m0_bytes(b1, 4, True, nb))
