"""One small smoke case per compiled op, for `python -m tilebake doctor` (and tests/test_smoke.py).

Each case builds a small input from a fixed seed (37 tokens: not a multiple of any tile), calls the
public API on the given device and compares the result with the tilebake.torch reference computed
on CPU copies of the inputs: bit for bit where the op's tests compare bit for bit, with the tests'
tolerances otherwise; NaN never passes. On CPU tensors the API takes the reference path, so there
the cases only check that they are well formed.

One exception to the CPU copies: the SwiGLU references call torch.exp, and the kernels' expf is
CUDA's; torch's CPU exp may round differently in the last bit. Their tests compare against the
reference on the GPU, so these two cases run the reference on the device too.

Only torch and tilebake are imported (this module ships in the runtime wheel).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch

import tilebake

SMOKE_CASES: dict[str, Callable[[torch.device], None]] = {}

T = 37  # tokens
H = 512  # hidden
EPS = 1e-6


def smoke_case(op: str):
    """Register `fn(device)` as the smoke case of `op` (a manifest op stem); an AssertionError it
    raises comes out prefixed with the op's name."""

    def register(fn):
        def case(device: torch.device) -> None:
            try:
                fn(device)
            except AssertionError as e:
                raise AssertionError(f"{op}: {e}") from None

        if op in SMOKE_CASES:
            raise ValueError(f"two smoke cases for {op}")
        case.__name__ = case.__qualname__ = fn.__name__
        SMOKE_CASES[op] = case
        return case

    return register


# --- inputs and comparisons ---


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape, spread: int = 0) -> torch.Tensor:
    """fp32 N(0, 1), each row scaled by 2^U[-spread, spread] (many binades)."""
    x = torch.randn(*shape, generator=g)
    if spread:
        x = x * torch.exp2(torch.randint(-spread, spread + 1, (*shape[:-1], 1), generator=g).float())
    return x


def _on(t: Optional[torch.Tensor], device) -> Optional[torch.Tensor]:
    """A copy on `device` (always a copy: in-place ops must not touch the reference's input)."""
    return None if t is None else t.to(device, copy=True)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _check_meta(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: got {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"
    )
    if got.is_floating_point():
        nan = got.float().isnan()
        assert not nan.any(), f"{what}: {int(nan.sum())} NaN, first at {nan.nonzero()[0].tolist()}"


def _same(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-exact: dtype, shape and every element's bytes."""
    got, want = _cpu(got), _cpu(want)
    _check_meta(what, got, want)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    bad = got.contiguous().view(bits) != want.contiguous().view(bits)
    if bad.any():
        first = tuple(bad.nonzero()[0].tolist())
        value = (lambda t: t[first].float().item()) if got.is_floating_point() else (lambda t: t[first].item())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements differ, first at {first}: "
            f"got {value(got)!r}, expected {value(want)!r}"
        )


def _same_quantized(got: tuple, want: tuple) -> None:
    """A (data, scale factors) pair, bit-exact."""
    _same("data", got[0], want[0])
    _same("sf", got[1], want[1])


def _close(what: str, got: torch.Tensor, want: torch.Tensor, rtol=None, atol=None) -> None:
    """torch.testing.assert_close (its dtype defaults when rtol/atol are None); NaN fails."""
    got, want = _cpu(got), _cpu(want)
    _check_meta(what, got, want)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: " + " ".join(m.split()))


def _fused_layout(g, num_experts=16, k=6, alignment=16):
    """(topk_idx, get_fused_mapping reference result): k distinct experts a token, 1 in 10 slots -1."""
    idx = torch.topk(torch.rand(T, num_experts, generator=g), k, dim=1).indices
    idx[torch.rand(T, k, generator=g) < 0.1] = -1
    return idx, tilebake.torch.get_fused_mapping(idx, num_experts, 0, alignment)


# --- quant ---


@smoke_case("per_token_cast")
def _per_token_cast(d):
    x = _randn(_gen(), T, H, spread=8).bfloat16()
    data, sf = tilebake.quant.per_token_cast(_on(x, d), "e4m3", 128)
    want = tilebake.torch.cast(x, "e4m3", (1, 128))
    _same_quantized((data, sf), want)


@smoke_case("cast_back")
def _cast_back(d):
    q = tilebake.torch.cast(_randn(_gen(), T, H, spread=8), "e4m3", (1, 32), round_sf=True, use_packed_ue8m0=True)
    y = tilebake.quant.cast_back((_on(q[0], d), _on(q[1], d)), "bf16", (1, 32))
    _same("y", y, tilebake.torch.cast_back(q, "e4m3", (1, 32), out_dtype=torch.bfloat16))


@smoke_case("per_token_cast_and_cast_back")
def _per_token_cast_and_cast_back(d):
    x = _randn(_gen(), T, H, spread=8).bfloat16()
    want = tilebake.torch.per_token_cast_and_cast_back_ref(
        x, "e2m1", 32, True, False, tilebake.config.get_amax_clamp_for_quant("e2m1", False)
    )
    xd = _on(x, d)
    tilebake.quant.per_token_cast_and_cast_back(xd, "e2m1", 32, round_sf=True)
    _same("x (in place)", xd, want)


@smoke_case("cast")
def _cast(d):
    x = _randn(_gen(), T, H, spread=12)
    _same("y", tilebake.quant.cast(_on(x, d), torch.bfloat16, True), tilebake.torch.stochastic_cast(x, torch.bfloat16))


@smoke_case("per_block_cast")
def _per_block_cast(d):
    x = _randn(_gen(), T, H, spread=8).bfloat16()
    data, sf = tilebake.quant.per_block_cast(_on(x, d), "e4m3", (32, 128), round_sf=True)
    want = tilebake.torch.cast(x, "e4m3", (32, 128), round_sf=True)
    _same_quantized((data, sf), want)


@smoke_case("per_channel_cast")
def _per_channel_cast(d):
    x = _randn(_gen(), T, H, spread=4).bfloat16()
    data, sf = tilebake.quant.per_channel_cast(_on(x, d), "e4m3", 32)
    want = tilebake.torch.cast(x, "e4m3", (32, 1))
    _same_quantized((data, sf), want)


@smoke_case("per_block_cast_lossless")
def _per_block_cast_lossless(d):
    g = _gen()
    x = _randn(g, T, H) * torch.exp2(torch.randint(-3, 4, (T, 1), generator=g).float())
    q = tilebake.torch.cast(x, "e2m1", (1, 32), round_sf=True, use_packed_ue8m0=True)
    data, sf = tilebake.quant.per_block_cast_lossless((_on(q[0], d), _on(q[1], d)), "e4m3", (1, 32), (128, 128))
    want = tilebake.torch.per_block_cast_lossless(q, "e4m3", (1, 32), (128, 128))
    _same_quantized((data, sf), want)


@smoke_case("batched_transpose_weight_sf")
def _batched_transpose_weight_sf(d):
    sf = torch.exp2(torch.randint(-20, 11, (5, 7), generator=_gen()).float())
    ((sf0, sf1),) = tilebake.quant.batched_transpose_weight_sf([_on(sf, d)], 128, [True])
    ((want0, want1),) = tilebake.torch.batched_transpose_weight_sf([sf], 128, [True])
    _same("sf0", sf0, want0)
    _same("sf1", sf1, want1)


@smoke_case("unpack_from_e2m1fn_x2")
def _unpack_from_e2m1fn_x2(d):
    x = torch.randint(0, 256, (T, 512), generator=_gen(), dtype=torch.int32).to(torch.uint8)
    _same("y", tilebake.quant.unpack_from_e2m1fn_x2(_on(x, d), torch.bfloat16),
          tilebake.torch.unpack_from_e2m1fn_x2(x, torch.bfloat16))  # fmt: skip


def _swiglu_inputs():
    g = _gen()
    x = _randn(g, T, 2 * 256, spread=6).bfloat16()
    return g, x, torch.rand(T, generator=g) * 2 - 0.5


@smoke_case("swiglu_forward")
def _swiglu_forward(d):
    _, x, weights = _swiglu_inputs()
    x, weights = _on(x, d), _on(weights, d)
    counts = torch.full((4,), 7, dtype=torch.int64, device=d)
    want_counts = counts.clone()
    y = tilebake.quant.swiglu_forward(x, "bf16", None, weights, 1.5, 4.0, counts)
    # On the device: the reference's torch.exp must be the kernel's expf (module docstring).
    want = tilebake.torch.swiglu_forward(
        x, None, weights, 1.5, 4.0, want_counts, tilebake.config.get_token_alignment()
    ).bfloat16()
    _same("y", y, want)
    _same("clamped_count", counts, want_counts)


@smoke_case("swiglu_backward")
def _swiglu_backward(d):
    g, x, weights = _swiglu_inputs()
    grad = _randn(g, T, 256, spread=6).bfloat16()
    x, grad, weights = _on(x, d), _on(grad, d), _on(weights, d)
    x_grad, weight_grad, act = tilebake.quant.swiglu_backward(x, grad, "bf16", None, weights, 1.5, 4.0, True)
    alignment = tilebake.config.get_token_alignment()
    # On the device, as the forward's case.
    want_dx, want_wg, want_act = tilebake.torch.swiglu_backward(x, grad, None, weights, 1.5, 4.0, alignment)
    _same("x_grad", x_grad, want_dx.bfloat16())
    _same("act_out", act, want_act.bfloat16())
    # weight_grad is summed in another order: within 1e-5 * |s| * sum_h |t * g| (the test's bound).
    t = tilebake.torch.swiglu_forward(x, None, None, None, 4.0, None, alignment)
    bound = _cpu(1e-5 * 1.5 * (t.double().abs() * grad.double().abs()).sum(dim=1) + 1e-38)
    wg, want_wg = _cpu(weight_grad), _cpu(want_wg)
    _check_meta("weight_grad", wg, want_wg)
    ratio = (wg.double() - want_wg.double()).abs() / bound
    assert bool((ratio <= 1).all()), f"weight_grad: row {int(ratio.argmax())} is {float(ratio.max())}x the bound"


# --- transform ---


@smoke_case("apply_rotary")
def _apply_rotary(d):
    g = _gen()
    freqs = 10000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    angles = torch.arange(64, dtype=torch.float64)[:, None] * freqs[None, :]
    cache = torch.cat((angles.cos(), angles.sin()), dim=1).float()
    q, k = _randn(g, T, 4, 128, spread=8).bfloat16(), _randn(g, T, 2, 128, spread=8).bfloat16()
    positions = torch.randint(0, 64, (T,), generator=g, dtype=torch.int32)
    qd, kd = _on(q, d), _on(k, d)
    tilebake.transform.apply_rotary(qd, _on(cache, d), kd, _on(positions, d))
    want_q, want_k = tilebake.torch.rotary_embedding_ref(q, cache, k, positions)
    _same("query", qd, want_q)
    _same("key", kd, want_k)


# --- moe ---


@smoke_case("topk_gate")
def _topk_gate(d):
    scores = _randn(_gen(), T, 72, spread=8)
    _same("topk_idx", tilebake.moe.topk_gate(_on(scores, d), 6), tilebake.torch.stable_topk(scores, 6))


@smoke_case("normalize_weight")
def _normalize_weight(d):
    g = _gen()
    w = torch.rand(T, 6, generator=g) * torch.exp2(torch.randint(-60, 20, (T, 1), generator=g).float())
    den, norm = tilebake.moe.normalize_weight(_on(w, d))
    want_den, want_norm = tilebake.torch.normalize_weight(w)
    _same("denominator", den, want_den)
    _same("normalized", norm, want_norm)


@smoke_case("moe_topk_gate_forward")
def _moe_topk_gate_forward(d):
    # Distinct logits on a grid of step 5/64: the top-k boundary gaps are far above the few-ulp
    # score differences of two implementations, so the indices are exact.
    logits = -5.0 + torch.argsort(torch.rand(T, 64, generator=_gen()), dim=1).float() * (5.0 / 64)
    args = (6, True, 1, 1.5, 3, "sqrtsoftplus")
    scores = torch.empty(T, 64, device=d)
    idx, w = tilebake.moe.moe_topk_gate_forward(_on(logits, d), *args, scores=scores)
    want_scores = torch.empty(T, 64)
    want_idx, want_w = tilebake.torch.moe_topk_gate_forward_ref(logits, *args, scores=want_scores)
    _same("topk_idx", idx, want_idx)
    _close("topk_weights", w, want_w, rtol=1e-5, atol=1e-7)
    _close("scores", scores, want_scores, rtol=1e-5, atol=1e-7)


@smoke_case("moe_topk_gate_backward")
def _moe_topk_gate_backward(d):
    g, rsf = _gen(), 2.5
    u = tilebake.torch.topk.score(_randn(g, T, 64) * 3, "sqrtsoftplus")
    idx = tilebake.torch.stable_topk(u + _randn(g, 64) * 0.1, 6)
    idx[torch.rand(T, 6, generator=g) < 0.2] = -1
    mask = torch.rand(T, generator=g) >= 0.1
    idx[~mask] = -1
    sel = torch.where(idx >= 0, u.gather(1, idx.clamp(min=0)), 0.0)
    weights = sel / (1e-20 + sel.sum(1, keepdim=True)) * rsf
    grad_w, h = _randn(g, T, 6), _randn(g, 1, 64)
    got = tilebake.moe.moe_topk_gate_backward(
        *(_on(t, d) for t in (u, idx, weights, grad_w)), rsf, mask=_on(mask, d), grad_scores_sum=_on(h, d)
    )
    want = tilebake.torch.moe_topk_gate_backward_ref(u.double(), idx, weights, grad_w, rsf, "sqrtsoftplus", mask, h)
    _check_meta("grad_logits", _cpu(got), want.float())
    # The test's tolerance: rtol 1e-5, atol 1e-5 * max(max|ref|, the size of the route terms).
    sums = sel.double().sum(1)
    routed = (idx >= 0).any(1) & (sums > 0)
    term_scale = (rsf * grad_w.double().abs().amax(1)[routed] / sums[routed]).max().item() if routed.any() else 0.0
    _close("grad_logits", _cpu(got).double(), want, rtol=1e-5, atol=1e-5 * max(want.abs().max().item(), term_scale))
    assert bool((_cpu(got)[~mask] == 0).all()), "grad_logits: a masked token's row is not zero"


@smoke_case("get_fused_mapping")
def _get_fused_mapping(d):
    idx, want = _fused_layout(_gen())
    got = tilebake.moe.get_fused_mapping(_on(idx, d), 16, 0, 16)
    names = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end")
    for name, a, b in zip(names + ("num_tokens_per_expert",), got[:7], want[:7]):
        _same(name, a, b)
    assert got[7] == want[7], f"num_tokens_per_expert_list: got {got[7]}, expected {want[7]}"


@smoke_case("expand_to_fused")
def _expand_to_fused(d):
    g = _gen()
    _, (p2e, _, _, ttp, *_) = _fused_layout(g)
    x = _randn(g, T, H).bfloat16()
    _same("expanded", tilebake.moe.expand_to_fused(*(_on(t, d) for t in (x, ttp, p2e))),
          tilebake.torch.expand_to_fused(x, ttp, p2e))  # fmt: skip


@smoke_case("reduce_fused")
def _reduce_fused(d):
    g = _gen()
    _, (_, _, _, ttp, *_) = _fused_layout(g)
    data = _randn(g, int(ttp.max()) + 17, H, spread=6).bfloat16()
    w = torch.rand(T, 6, generator=g)
    _same("reduced", tilebake.moe.reduce_fused(*(_on(t, d) for t in (data, w, ttp))),
          tilebake.torch.reduce_fused(data, w, ttp))  # fmt: skip


from tilebake import _smoke_engram, _smoke_mhc, _smoke_norm  # noqa: E402,F401 -- register those cases

# --- running them ---


def run_smoke(device) -> list[str]:
    """Run every case on `device`; "op: what differs" (or the error) for each one that fails.
    On CUDA each case is synchronized, so an asynchronous error is charged to its op."""
    device = torch.device(device)
    failures = []
    cuda = device.type == "cuda"
    with torch.cuda.device(device) if cuda else contextlib.nullcontext():
        for op, case in SMOKE_CASES.items():
            try:
                case(device)
                if cuda:
                    torch.cuda.synchronize(device)
            except AssertionError as e:
                failures.append(str(e))
            except Exception as e:  # noqa: BLE001 -- one broken op must not hide the others
                failures.append(f"{op}: {type(e).__name__}: {e}")
    return failures
