"""Call plans of the mapping ops (get_fused_mapping, expand_to_fused, expand_to_fused_with_sf,
reduce_fused), traced on the CPU: as tests/test_plans_moe.py for the router ops. Also each op's
native entry (its plan key, run()'s arguments, what it returns around the plan), with plan.run
replaced by a trace."""

import importlib

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace
from tests.plan_recording import Recorder, check_launches, same_layout
from tilebake.moe._common import alloc_fused_sf, sf_columns
from tilebake.torch import mapping as ref

pytestmark = needs_plans

mapping = importlib.import_module("tilebake.moe._plans_mapping")
MAPS = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end",
        "num_tokens_per_expert")  # fmt: skip


def _maps(num_tokens, num_topk, num_experts=5, alignment=4):
    """(token_topk_to_pos, pos_to_expert) of a random routing (the reference mapping)."""
    topk_idx = torch.randint(-1, num_experts, (num_tokens, num_topk))
    maps = ref.get_fused_mapping(topk_idx, num_experts, 0, alignment, True)
    return maps[3], maps[0]


def through_plans(monkeypatch, op, plans, key, p):
    """Make op's public function find plan p under `key` and run it as a trace (CPU tensors)."""
    calls = []

    def run(call, *args):
        calls.append(args)
        return trace(call, *args)[0]

    monkeypatch.setattr(op.plan, "run", run)
    monkeypatch.setitem(plans, key, p)
    return calls


# --- get_fused_mapping ---


def _mapping_kernels(op, num_experts):
    wide = "_wide" if num_experts > op.FAST_MAX_EXPERTS else ""
    stages = ("count" + wide, "scan", "scatter" + wide)
    return stages, [ManifestKernel(op.GetFusedMappingVariant(s)) for s in stages]


@pytest.mark.parametrize("num_experts", [4, 1024, 1500])
@pytest.mark.parametrize("num_expanded,alignment", [(0, 1), (0, 16), (100, 4)])
def test_fused_mapping_plan(monkeypatch, num_experts, num_expanded, alignment):
    op = importlib.import_module("tilebake.moe.get_fused_mapping")
    stages, kernels = _mapping_kernels(op, num_experts)
    p = mapping.fused_mapping_plan(kernels, 0, num_experts, num_expanded, alignment)
    for num_tokens, num_topk in ((1, 1), (37, 8), (2049, 3)):
        topk_idx = torch.randint(-1, num_experts, (num_tokens, num_topk))
        recs = {s: Recorder(k.variant) for s, k in zip(stages, kernels)}
        for s, rec in recs.items():
            monkeypatch.setitem(op._KERNELS, (s,), rec)
        py = op._launch(topk_idx, num_experts, num_expanded, alignment, True)  # no sync: the counts are unset
        got, launches = trace(p, topk_idx)
        same_layout(got, py[:7])
        same_layout(got, ref.get_fused_mapping(topk_idx, num_experts, num_expanded, alignment, True)[:7], False)
        recorded = [recs[s].calls[0] for s in stages]
        check_launches(kernels, launches, recorded, {"idx": topk_idx, **dict(zip(MAPS, got))},
                       {"idx": topk_idx, **dict(zip(MAPS, py[:7]))})  # fmt: skip
    assert trace(p, torch.zeros(0, 4, dtype=torch.int64))[0] is NotImplemented  # no pairs: the Python path
    assert trace(p, torch.zeros(3, 4, dtype=torch.int32))[0] is NotImplemented
    assert trace(p, torch.zeros(4, 3, dtype=torch.int64).t())[0] is NotImplemented  # not contiguous


def test_fused_mapping_entry(monkeypatch):
    """The no-sync call returns the plan's 7 tensors and an empty list."""
    op = importlib.import_module("tilebake.moe.get_fused_mapping")
    _, kernels = _mapping_kernels(op, 8)
    p = mapping.fused_mapping_plan(kernels, 0, 8, 0, 16)
    calls = through_plans(monkeypatch, op, op._PLANS, (8, int, 0, int, 16, int, True), p)
    topk_idx = torch.randint(-1, 8, (5, 2))
    result = op.get_fused_mapping(topk_idx, 8, 0, 16, force_no_sync=True)
    assert len(calls) == 1 and calls[0][0] is topk_idx
    assert len(result) == 8 and result[7] == [] and result[0].shape == ((10 + 15 * 8) // 16 * 16,)
    # a bool where an int is checked misses the plan: the Python path raises
    with pytest.raises(ValueError, match="num_experts"):
        op.get_fused_mapping(topk_idx, True, 0, 16, force_no_sync=True)


# --- expand_to_fused, expand_to_fused_with_sf ---


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
def test_expand_plan(monkeypatch, dtype):
    op = importlib.import_module("tilebake.moe.expand_to_fused")
    kernel = ManifestKernel(op.ExpandToFusedVariant(False))
    p = mapping.expand_plan(kernel, 0, dtype)
    vec = 16 // dtype.itemsize
    for num_tokens, cols, num_topk in ((1, vec, 1), (9, 7 * vec, 4), (37, 64 * vec, 2)):
        x = torch.randn(num_tokens, cols + vec).to(dtype)[:, :cols]
        t2p, p2e = _maps(num_tokens, num_topk)
        rec = Recorder(kernel.variant)
        monkeypatch.setitem(op._KERNELS, (False,), rec)
        py = x.new_empty((p2e.shape[0], cols))
        op._launch_rows(x, py, t2p, p2e)
        got, launches = trace(p, x, t2p, p2e)
        same_layout(got, py)
        same_layout(got, ref.expand_to_fused(x, t2p, p2e), False)
        tensors = {"X": x, "P": t2p, "E": p2e}
        check_launches([kernel], launches, rec.calls, {**tensors, "Y": got}, {**tensors, "Y": py})
    misaligned = torch.empty(2 * cols + 1, dtype=dtype)[1 : 1 + cols].view(1, cols)
    t2p, p2e = _maps(1, num_topk)
    assert trace(p, misaligned, t2p, p2e)[0] is NotImplemented  # the Python path raises
    assert trace(p, x[:, : cols - 1], *_maps(num_tokens, num_topk))[0] is NotImplemented  # rows of 16 bytes
    assert trace(p, x, t2p.long(), p2e)[0] is NotImplemented


def test_expand_entry(monkeypatch):
    op = importlib.import_module("tilebake.moe.expand_to_fused")
    p = mapping.expand_plan(ManifestKernel(op.ExpandToFusedVariant(False)), 0, torch.bfloat16)
    calls = through_plans(monkeypatch, op, op._PLANS, torch.bfloat16, p)
    x, (t2p, p2e) = torch.randn(3, 16).bfloat16(), _maps(3, 2)
    assert op.expand_to_fused(x, t2p, p2e).shape == (p2e.shape[0], 16)
    assert len(calls) == 1 and calls[0][0] is x and calls[0][1] is t2p and calls[0][2] is p2e


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("sf_dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("col_major", [False, True])
def test_expand_with_sf_plan(monkeypatch, dtype, sf_dtype, npc, col_major):
    op = importlib.import_module("tilebake.moe.expand_to_fused")
    kernel = ManifestKernel(op.ExpandToFusedVariant(True))
    p = mapping.expand_with_sf_plan(kernel, 0, dtype, sf_dtype, npc, col_major)
    for num_tokens, cols, num_topk in ((1, 16, 1), (9, 112, 4), (37, 1024, 2)):
        data = torch.randint(-100, 100, (num_tokens, cols + 16), dtype=torch.int8)[:, :cols].view(dtype)
        hidden = 2 * cols if dtype == torch.int8 else cols
        c = sf_columns(hidden, npc, sf_dtype == torch.int32)
        sf = torch.randint(0, 99, (c, num_tokens), dtype=torch.int32).to(sf_dtype).t()  # column-major
        t2p, p2e = _maps(num_tokens, num_topk)
        rec = Recorder(kernel.variant)
        monkeypatch.setitem(op._KERNELS, (True,), rec)
        py = (data.new_empty((p2e.shape[0], cols)), alloc_fused_sf(sf, p2e.shape[0], col_major))
        op._launch_rows(data, py[0], t2p, p2e, sf, py[1])
        got, launches = trace(p, (data, sf), t2p, p2e)
        same_layout(got, py)
        same_layout(got, ref.expand_to_fused_with_sf((data, sf), npc, t2p, p2e, col_major), False)
        tensors = {"X": data, "XS": sf, "P": t2p, "E": p2e}
        check_launches([kernel], launches, rec.calls, {**tensors, "Y": got[0], "YS": got[1]},
                       {**tensors, "Y": py[0], "YS": py[1]})  # fmt: skip
    assert trace(p, (data, sf[:, :-1]), t2p, p2e)[0] is NotImplemented  # the SF columns of another npc
    assert trace(p, [data, sf], t2p, p2e)[0] is NotImplemented  # a list: the Python path


def test_expand_with_sf_entry(monkeypatch):
    op = importlib.import_module("tilebake.moe.expand_to_fused")
    p = mapping.expand_with_sf_plan(ManifestKernel(op.ExpandToFusedVariant(True)), 0, torch.int8, torch.int32, 32, True)
    calls = through_plans(monkeypatch, op, op._SF_PLANS, (2, torch.int8, torch.int32, 32, True), p)
    x, (t2p, p2e) = (torch.zeros(3, 32, dtype=torch.int8), torch.zeros(3, 1, dtype=torch.int32)), _maps(3, 2)
    data, sf = op.expand_to_fused_with_sf(x, 32, t2p, p2e, True)
    assert len(calls) == 1 and calls[0][0] is x and sf.stride() == (1, (p2e.shape[0] + 3) // 4 * 4)
    with pytest.raises(TypeError, match="QuantTensor"):  # three items: the key misses, the Python path raises
        op.expand_to_fused_with_sf((*x, x[1]), 32, t2p, p2e, True)


# --- reduce_fused ---

REDUCE_CASES = [(f, w, s, o) for f in ("", "e4m3") for w in (False, True) for s in (False, True) for o in (False, True)
                if f or not s]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fp8_format,has_weights,has_sf,given_out", REDUCE_CASES)
@pytest.mark.parametrize("has_x_sf", [False, True])
def test_reduce_plan(dtype, fp8_format, has_weights, has_sf, given_out, has_x_sf):
    op = importlib.import_module("tilebake.moe.reduce_fused")
    from tilebake.utils import FORMAT_NAMES

    out_dtype = torch.float8_e4m3fn if fp8_format else dtype
    kernel = ManifestKernel(op.ReduceFusedVariant(FORMAT_NAMES[dtype], FORMAT_NAMES[out_dtype]))
    p = mapping.reduce_plan(kernel, 0, dtype, out_dtype, has_weights, has_x_sf, has_sf, given_out)
    vec = 16 // dtype.itemsize
    for num_tokens, hidden, num_topk in ((1, vec, 1), (9, 7 * vec, 4), (37, 1000, 2)):
        t2p, p2e = _maps(num_tokens, num_topk)
        data = torch.randn(p2e.shape[0], hidden + vec).to(dtype)[:, :hidden]
        x_sf = torch.rand(p2e.shape[0]) if has_x_sf else None
        x = (data, x_sf) if has_x_sf else data
        w = torch.rand(num_tokens, num_topk) if has_weights else None
        sf = torch.rand(1) if has_sf else None
        out = torch.empty(num_tokens, hidden + vec, dtype=out_dtype)[:, :hidden] if given_out else None
        got, launches = trace(p, x, w, t2p, sf, out)
        if given_out:
            assert got is out
        else:
            same_layout(got, torch.empty(num_tokens, hidden, dtype=out_dtype))  # new_empty's
            same_layout(got, ref.reduce_fused(x, w, t2p, fp8_format, sf), False)
        dummy = t2p.data_ptr()
        assert params_of(kernel, launches[0]) == dict(
            X=data.data_ptr(), W=dummy if w is None else w.data_ptr(), P=dummy,
            XSF=dummy if x_sf is None else x_sf.data_ptr(), SF=dummy if sf is None else sf.data_ptr(),
            Y=got.data_ptr(), has_weights=int(has_weights), has_x_sf=int(has_x_sf), has_sf=int(has_sf),
            num_tokens=num_tokens, num_expanded=data.shape[0], num_topk=num_topk, hidden=hidden,
            x_stride=data.stride(0), y_stride=got.stride(0),
        )  # fmt: skip

    def like_x(d, s=x_sf):
        return (d, s) if has_x_sf else d

    assert trace(p, like_x(data[:, : hidden - 1]), w, t2p, sf, out)[0] is NotImplemented  # hidden % vec
    assert trace(p, x, w, t2p[:0], sf, None if out is None else out[:0])[0] is NotImplemented  # no tokens
    other = data if has_x_sf else (data, torch.ones(data.shape[0]))  # a plain x for a QuantTensor plan, and back
    assert trace(p, other, w, t2p, sf, out)[0] is NotImplemented
    if has_x_sf:
        assert trace(p, (data, torch.ones(2 * data.shape[0])[::2]), w, t2p, sf, out)[0] is NotImplemented  # strided
    if given_out:
        assert trace(p, x, w, t2p, sf, out.t())[0] is NotImplemented


def test_reduce_entry(monkeypatch):
    op = importlib.import_module("tilebake.moe.reduce_fused")
    kernel = ManifestKernel(op.ReduceFusedVariant("bf16", "bf16"))
    p = mapping.reduce_plan(kernel, 0, torch.bfloat16, torch.bfloat16, True, False, False, True)
    calls = through_plans(monkeypatch, op, op._PLANS, (torch.bfloat16, "", False, True, False), p)
    t2p, p2e = _maps(3, 2)
    x, w, out = torch.randn(p2e.shape[0], 16).bfloat16(), torch.rand(3, 2), torch.empty(3, 16).bfloat16()
    assert op.reduce_fused(x, w, t2p, out=out) is out
    assert len(calls) == 1 and all(a is b for a, b in zip(calls[0], (x, w, t2p, None, out)))


def test_reduce_quant_entry(monkeypatch):
    """A QuantTensor x finds its plan; a 3-tuple misses it (the Python path raises)."""
    op = importlib.import_module("tilebake.moe.reduce_fused")
    kernel = ManifestKernel(op.ReduceFusedVariant("fp32", "e4m3"))
    p = mapping.reduce_plan(kernel, 0, torch.float32, torch.float8_e4m3fn, False, True, True, False)
    calls = through_plans(monkeypatch, op, op._PLANS, ((2, torch.float32), "e4m3", True, False, True), p)
    t2p, p2e = _maps(3, 2)
    x, sf = (torch.randn(p2e.shape[0], 8), torch.rand(p2e.shape[0])), torch.rand(1)
    assert op.reduce_fused(x, None, t2p, "e4m3", sf).dtype == torch.float8_e4m3fn
    assert len(calls) == 1 and calls[0][0] is x and calls[0][3] is sf
    with pytest.raises(TypeError, match="QuantTensor"):
        op.reduce_fused((*x, x[1]), None, t2p, "e4m3", sf)
    assert len(calls) == 1
