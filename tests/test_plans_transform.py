"""apply_rotary's call plan, traced on the CPU: its kernel arguments equal those of the op's
Python kernel path (apply_rotary._launch on CPU tensors, a Recorder for the kernel), that path
counts its in-place writes, the calls it would send to the torch path (misaligned, odd
strides) return NotImplemented, and the public function finds and runs the plan."""

import importlib

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, trace
from tests.plan_recording import Recorder, check_launches

pytestmark = needs_plans

op = importlib.import_module("tilebake.transform.apply_rotary")
rotary_plans = importlib.import_module("tilebake.transform._plans_apply_rotary")


def _inputs(dtype, ndim, rot, num_tokens, q_heads, k_heads, has_key, pos_dtype, max_positions=50):
    """query and key as views of one fused qkv buffer (strided tokens, heads apart)."""
    lead = (num_tokens,) if ndim == 3 else (2, num_tokens)
    qkv = torch.randn(*lead, q_heads + k_heads + 1, rot).to(dtype)
    query = qkv[..., :q_heads, :]
    key = qkv[..., q_heads : q_heads + k_heads, :] if has_key else None
    cache = torch.randn(max_positions, rot)
    positions = None
    if pos_dtype is not None:
        positions = torch.randint(0, max_positions, (*lead[:-1], 2 * lead[-1]), dtype=pos_dtype)[..., ::2]
    return query, cache, key, positions


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ndim", [3, 4])
@pytest.mark.parametrize("rot", [64, 128])
@pytest.mark.parametrize("has_key", [False, True])
@pytest.mark.parametrize("pos_dtype", [None, torch.int32, torch.int64])
@pytest.mark.parametrize("interleaved,conjugate", [(False, False), (True, True)])
def test_rotary_plan(monkeypatch, dtype, ndim, rot, has_key, pos_dtype, interleaved, conjugate):
    fmt = "bf16" if dtype == torch.bfloat16 else "fp32"
    kernel = ManifestKernel(op.ApplyRotaryVariant(fmt, rot))
    p = rotary_plans.rotary_plan(kernel, 0, dtype, ndim, rot, has_key, pos_dtype, interleaved, conjugate)
    for num_tokens, q_heads, k_heads in ((1, 1, 1), (7, 4, 1), (33, 16, 3)):
        query, cache, key, positions = _inputs(dtype, ndim, rot, num_tokens, q_heads, k_heads, has_key, pos_dtype)
        rec = Recorder(kernel.variant)
        monkeypatch.setitem(op._KERNELS, (fmt, rot), rec)
        versions = [t._version for t in (query, key) if t is not None]
        assert op._launch(query, cache, key, positions, interleaved, conjugate, 0)
        # counted (query and key, views of one buffer, share a counter)
        assert all(t._version > v for t, v in zip((query, key), versions) if t is not None)
        result, launches = trace(p, query, cache, key, positions)
        assert result is None
        tensors = {"Q": query, "C": cache, **({"K": key} if has_key else {})}
        tensors.update({"P32": positions} if pos_dtype is not None else {})
        check_launches([kernel], launches, rec.calls, tensors, tensors)
    # what the Python path sends to the torch path, or rejects
    flat = torch.randn(query.numel() + 1).to(dtype)[1:].view(query.shape)  # not 16-byte aligned
    assert trace(p, flat, cache, key, positions)[0] is NotImplemented
    assert trace(p, query, cache[:, :-1], key, positions)[0] is NotImplemented  # another rot_dim
    assert trace(p, query[..., :0, :], cache, key, positions)[0] is NotImplemented  # no heads
    if pos_dtype is not None:
        assert trace(p, query, cache, key, positions.to(torch.int16))[0] is NotImplemented
    if has_key:
        assert trace(p, query, cache, key.double(), positions)[0] is NotImplemented


def test_rotary_entry(monkeypatch):
    """The public function finds the plan (seqlen_offset 0), passes its tensors in order and
    returns None; a bool offset or a float flag misses the plan (the Python path raises)."""
    kernel = ManifestKernel(op.ApplyRotaryVariant("bf16", 64))
    p = rotary_plans.rotary_plan(kernel, 0, torch.bfloat16, 3, 64, True, torch.int32, False, False)
    calls = []

    def run(call, *args):
        calls.append(args)
        return trace(call, *args)[0]

    monkeypatch.setattr(op.plan, "run", run)
    monkeypatch.setitem(op._PLANS, (torch.bfloat16, 3, 64, False, torch.int32, False, bool, False, bool, 0, int), p)
    query, cache, key, positions = _inputs(torch.bfloat16, 3, 64, 5, 2, 1, True, torch.int32)
    before = query.clone()
    assert op.apply_rotary(query, cache, key, positions) is None
    assert len(calls) == 1 and all(a is b for a, b in zip(calls[0], (query, cache, key, positions)))
    assert torch.equal(query, before)  # a trace launches nothing
    with pytest.raises(TypeError, match="seqlen_offset"):
        op.apply_rotary(query, cache, key, positions, seqlen_offset=False)
    with pytest.raises(TypeError, match="interleaved"):
        op.apply_rotary(query, cache, key, positions, interleaved=0.0)
    assert len(calls) == 1
