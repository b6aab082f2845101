"""Call plans of the router ops (topk_gate, normalize_weight, moe_topk_gate_forward and
_backward), traced on the CPU (every step but the launch): each plan's kernel arguments equal
those the op's Python kernel path passes for the same call (that path run on CPU tensors with a
recording stand-in for the kernel), its outputs have that path's layouts (and the reference's
shapes), inputs the Python path rejects return NotImplemented, and each public function finds
its plan under its key (plan.run replaced by a trace). The GPU suite runs the same plans for
real. The mapping ops: tests/test_plans_moe_mapping.py."""

import importlib

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace
from tests.plan_recording import Recorder, check_launches, same_layout

pytestmark = needs_plans

gate = importlib.import_module("tilebake.moe._plans_gate")


# --- topk_gate, normalize_weight ---


@pytest.mark.parametrize("num_experts,num_topk", [(1, 1), (7, 3), (256, 8), (300, 8), (1025, 32)])
def test_topk_gate_plan(monkeypatch, num_experts, num_topk):
    import tilebake

    op = importlib.import_module("tilebake.moe.topk_gate")

    bucket = op.experts_bucket(num_experts)
    kernel = ManifestKernel(op.TopkGateVariant(bucket))
    p = gate.topk_gate_plan(kernel, 0, num_experts, num_topk)
    for num_tokens in (1, 5, 37):
        scores = torch.randn(num_tokens, num_experts + 3)[:, 1 : num_experts + 1]  # strided rows
        rec = Recorder(kernel.variant)
        monkeypatch.setitem(op._KERNELS, (bucket,), rec)
        py_out = op._launch(scores, num_topk)
        out, launches = trace(p, scores)
        same_layout(out, py_out)
        same_layout(out, tilebake.moe.topk_gate(scores, num_topk), strides=False)
        check_launches([kernel], launches, rec.calls, {"S": scores, "Out": out}, {"S": scores, "Out": py_out})
    assert trace(p, torch.randn(0, num_experts))[0] is NotImplemented  # no rows: the Python path
    assert trace(p, torch.randn(4, num_experts + 1))[0] is NotImplemented  # another expert count
    assert trace(p, torch.randn(4, num_experts).double())[0] is NotImplemented
    if num_experts > 1:
        assert trace(p, torch.randn(num_experts, 4).t())[0] is NotImplemented  # last dim strided


def test_normalize_weight_plan():
    import tilebake

    op = importlib.import_module("tilebake.moe.normalize_weight")

    kernel = ManifestKernel(op.NormalizeWeightVariant("fp32"))
    p = gate.normalize_weight_plan(kernel, 0)
    for num_tokens, num_topk in ((1, 1), (5, 8), (37, 32)):
        w = torch.rand(num_tokens, num_topk + 2)[:, :num_topk]
        (den, norm), launches = trace(p, w)
        same_layout((den, norm), (torch.empty(num_tokens), torch.empty(num_tokens, num_topk)))  # new_empty's
        same_layout((den, norm), tilebake.moe.normalize_weight(w), strides=False)
        assert params_of(kernel, launches[0]) == dict(
            W=w.data_ptr(), D=den.data_ptr(), N=norm.data_ptr(), num_tokens=num_tokens, num_topk=num_topk,
            w_stride=w.stride(0),
        )  # fmt: skip
    assert trace(p, torch.rand(3, 33))[0] is NotImplemented  # more than 32 slots
    assert trace(p, torch.rand(0, 4))[0] is NotImplemented
    assert trace(p, torch.rand(3, 4).double())[0] is NotImplemented


# --- moe_topk_gate_backward ---


@pytest.mark.parametrize("num_experts", [5, 256, 1500])
@pytest.mark.parametrize("has_mask,has_aux", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("given_out", [False, True])
def test_backward_plan(monkeypatch, num_experts, has_mask, has_aux, given_out):
    op = importlib.import_module("tilebake.moe.moe_topk_gate_backward")
    from tilebake.torch.moe import moe_topk_gate_backward_ref

    bucket = next(m for m in op.MAX_EXPERTS if num_experts <= m)
    kernel = ManifestKernel(op.MoeTopkGateBackwardVariant(bucket))
    p = gate.backward_plan(kernel, 0, num_experts, 2.5, op.SCORING_CODES["softmax"], has_mask, has_aux, given_out)
    k = min(num_experts, 4)
    for num_tokens in (1, 6):
        scores = torch.rand(num_tokens, num_experts + 1)[:, :num_experts]
        idx = torch.stack([torch.randperm(num_experts)[:k] for _ in range(num_tokens)])
        tw, grad = torch.rand(num_tokens, k), torch.randn(num_tokens, k)
        mask = torch.rand(num_tokens) > 0.3 if has_mask else None
        h = torch.randn(2 if num_tokens % 2 == 0 else 1, num_experts) if has_aux else None
        out = torch.empty(num_tokens, num_experts) if given_out else None
        rec = Recorder(kernel.variant)
        monkeypatch.setitem(op._KERNELS, (bucket,), rec)
        version = out._version if given_out else None
        py_out = op._launch(scores, idx, tw, grad, 2.5, "softmax", mask, h, out)
        if given_out:
            assert out._version > version  # the Python path counts its write
        got, launches = trace(p, scores, idx, tw, grad, mask, h, out)
        if given_out:
            assert got is out
        same_layout(got, py_out)
        same_layout(got, moe_topk_gate_backward_ref(scores, idx, tw, grad, 2.5, "softmax", mask, h), strides=False)
        tensors = dict(U=scores, IDX=idx, TW=tw, G=grad, **({"MASK": mask} if has_mask else {}))
        tensors.update({"H": h} if has_aux else {})
        check_launches([kernel], launches, rec.calls, {**tensors, "DX": got}, {**tensors, "DX": py_out})
    # rejected: int32 indices; with the aux term, a sequence count that does not divide the tokens
    scores, tw, grad = torch.rand(3, num_experts), torch.rand(3, k), torch.randn(3, k)
    mask = torch.ones(3, dtype=torch.bool) if has_mask else None
    h = torch.randn(1, num_experts) if has_aux else None
    out = torch.empty(3, num_experts) if given_out else None
    assert trace(p, scores, torch.zeros(3, k, dtype=torch.int64), tw, grad, mask, h, out)[0] is not NotImplemented
    assert trace(p, scores, torch.zeros(3, k, dtype=torch.int32), tw, grad, mask, h, out)[0] is NotImplemented
    if has_aux:
        h2 = torch.randn(2, num_experts)
        assert trace(p, scores, torch.zeros(3, k, dtype=torch.int64), tw, grad, mask, h2, out)[0] is NotImplemented


# --- moe_topk_gate_forward ---

FORWARD_CASES = [
    ((), False, 0, 1, 1),
    (("bias",), False, 0, 1, 1),
    (("mask", "bias", "unmapped_topk_idx", "scores"), True, 1, 1, 1),
    (("image_bias", "image_token_mask", "to_physical_map", "logical_count"), True, 2, 1, 1),
    (("fix_routing_mask", "unmapped_topk_idx", "force_random", "mask"), False, 0, 4, 2),
    (tuple(n for n, _ in gate.FORWARD_OPTIONAL), True, 2, 4, 2),  # every option
]


def _forward_inputs(present, num_tokens, num_experts, k, shared):
    logical = num_experts + shared
    make = {
        "mask": lambda: torch.rand(num_tokens) > 0.2,
        "bias": lambda: torch.randn(num_experts),
        "image_bias": lambda: torch.randn(num_experts),
        "image_token_mask": lambda: torch.rand(num_tokens) > 0.5,
        "fix_routing_mask": lambda: torch.rand(num_tokens) > 0.5,
        "to_physical_map": lambda: torch.randint(0, 99, (logical, 5), dtype=torch.int32)[:, :3],
        "logical_count": lambda: torch.randint(1, 4, (logical,), dtype=torch.int32),
        "unmapped_topk_idx": lambda: torch.stack([torch.randperm(num_experts)[:k] for _ in range(num_tokens)]),
        "force_random": lambda: torch.rand(num_tokens) > 0.7,
        "scores": lambda: torch.empty(num_tokens, num_experts + 2)[:, :num_experts],
    }
    return {name: make[name]() if name in present else None for name, _ in gate.FORWARD_OPTIONAL}


@pytest.mark.parametrize("num_experts", [16, 300, 1000])
@pytest.mark.parametrize("present,use_shared,num_shared,num_groups,num_topk_groups", FORWARD_CASES)
@pytest.mark.parametrize("given_out", [False, True])
def test_forward_plan(num_experts, present, use_shared, num_shared, num_groups, num_topk_groups, given_out):
    op = importlib.import_module("tilebake.moe.moe_topk_gate_forward")
    from tilebake.torch.gate import moe_topk_gate_forward_ref

    k, shared, func = 6, num_shared if use_shared else 0, "sigmoid"
    variant = op.MoeTopkGateForwardVariant(func, op.expert_bound(num_experts))
    kernel = ManifestKernel(variant)
    p = gate.forward_plan(
        kernel, 0, num_experts, k, shared, 1.5, 3, num_groups, num_topk_groups, set(present), given_out
    )
    for num_tokens in (1, 7):
        logits = torch.randn(num_tokens, num_experts + 4)[:, 2 : num_experts + 2]
        opt = _forward_inputs(present, num_tokens, num_experts, k, shared)
        out = (torch.empty(num_tokens, k + shared, dtype=torch.int64), torch.empty(num_tokens, k + shared))
        out = out if given_out else None
        written = [t for t in (*(out or ()), opt["unmapped_topk_idx"], opt["scores"]) if t is not None]
        versions = [t._version for t in written]
        rec = Recorder(variant)
        py = op._forward(
            logits, k, use_shared, num_shared, 1.5, 3, func, *list(opt.values())[:9], out, opt["scores"], num_groups,
            num_topk_groups, num_tokens, num_experts, k, shared, kernels={(func, op.expert_bound(num_experts)): rec},
        )  # fmt: skip
        assert [t._version for t in written] == [v + 1 for v in versions]  # the Python path counts its writes
        got, launches = trace(p, logits, tuple(opt.values()), out)
        if given_out:
            assert got[0] is out[0] and got[1] is out[1]
        ref = moe_topk_gate_forward_ref(
            logits, k, use_shared, num_shared, 1.5, 3, func, *list(opt.values())[:9], None, None,
            num_groups=num_groups, num_topk_groups=num_topk_groups,
        )  # fmt: skip
        same_layout(got, py)
        same_layout(got, ref, strides=False)
        kernel_names = ("Mask", "Bias", "ImageBias", "ImageMask", "FixMask", "Map", "Count", "Unmapped", "Random")
        names = dict(zip([n for n, _ in gate.FORWARD_OPTIONAL], (*kernel_names, "Scores")))
        tensors = {"L": logits, **{names[n]: t for n, t in opt.items() if t is not None}}
        check_launches([kernel], launches, rec.calls, {**tensors, "OutIdx": got[0], "OutW": got[1]},
                       {**tensors, "OutIdx": py[0], "OutW": py[1]})  # fmt: skip
    # rejected: no rows, another expert count, a strided mask
    assert trace(p, torch.randn(0, num_experts), tuple(opt.values()), out)[0] is NotImplemented
    assert trace(p, torch.randn(7, num_experts + 1), tuple(opt.values()), out)[0] is NotImplemented
    if "mask" in present:
        strided = dict(opt, mask=torch.ones(14, dtype=torch.bool)[::2])
        assert trace(p, logits, tuple(strided.values()), out)[0] is NotImplemented
    if given_out:
        assert trace(p, logits, tuple(opt.values()), list(out))[0] is NotImplemented  # a list: the Python path


# --- the public functions find their plans ---


def _through_plans(monkeypatch, op, key, p):
    calls = []

    def run(call, *args):
        calls.append(args)
        return trace(call, *args)[0]

    monkeypatch.setattr(op.plan, "run", run)
    monkeypatch.setitem(op._PLANS, key, p)
    return calls


def test_entries(monkeypatch):
    import tilebake

    op = importlib.import_module("tilebake.moe.topk_gate")
    calls = _through_plans(
        monkeypatch, op, (20, 4, int), gate.topk_gate_plan(ManifestKernel(op.TopkGateVariant(256)), 0, 20, 4)
    )
    scores = torch.randn(3, 20)
    assert tilebake.moe.topk_gate(scores, 4).shape == (3, 4) and calls[-1][0] is scores
    with pytest.raises(ValueError, match="num_topk"):
        tilebake.moe.topk_gate(torch.randn(3, 1), True)  # a bool misses the (1, 1, int) key

    op = importlib.import_module("tilebake.moe.normalize_weight")
    calls = _through_plans(
        monkeypatch, op, torch.float32, gate.normalize_weight_plan(ManifestKernel(op.NormalizeWeightVariant("fp32")), 0)
    )
    w = torch.rand(3, 4)
    assert tilebake.moe.normalize_weight(w)[1].shape == (3, 4) and calls[-1][0] is w

    op = importlib.import_module("tilebake.moe.moe_topk_gate_backward")
    kernel = ManifestKernel(op.MoeTopkGateBackwardVariant(256))
    p = gate.backward_plan(kernel, 0, 20, 2.0, 0, True, False, True)
    calls = _through_plans(monkeypatch, op, (20, 2.0, float, "sqrtsoftplus", False, True, False), p)
    args = (torch.rand(3, 20), torch.zeros(3, 4, dtype=torch.int64), torch.rand(3, 4), torch.rand(3, 4))
    mask, out = torch.ones(3, dtype=torch.bool), torch.empty(3, 20)
    assert tilebake.moe.moe_topk_gate_backward(*args, 2.0, mask=mask, out=out) is out
    assert all(a is b for a, b in zip(calls[-1], (*args, mask, None, out)))

    op = importlib.import_module("tilebake.moe.moe_topk_gate_forward")
    kernel = ManifestKernel(op.MoeTopkGateForwardVariant("softmax", 256))
    p = gate.forward_plan(kernel, 0, 20, 4, 1, 2.5, 0, 1, 1, {"bias"}, False)
    numbers = (4, int, True, bool, 1, int, 2.5, float, 0, int, 1, int, 1, int)  # num_topk .. num_topk_groups
    key = (20, "softmax", *numbers, True, False, *[True] * 8, None)  # bias given, out None
    calls = _through_plans(monkeypatch, op, key, p)
    logits, bias = torch.randn(3, 20), torch.randn(20)
    idx, weights = tilebake.moe.moe_topk_gate(logits, 4, True, 1, 2.5, 0, "softmax", bias=bias)
    assert idx.shape == (3, 5) and calls[-1][0] is logits and calls[-1][1][1] is bias and calls[-1][2] is None
    with pytest.raises(ValueError, match="num_shared_experts"):
        tilebake.moe.moe_topk_gate(logits, 4, True, True, 2.5, 0, "softmax", bias=bias)
    assert len(calls) == 1


def test_a_planned_key_still_traces_under_torch_compile(monkeypatch):
    """With a plan for its key, the router forward traces with fullgraph=True (the native call
    is skipped while dynamo traces; the traced op runs later)."""
    import tilebake

    op = importlib.import_module("tilebake.moe.moe_topk_gate_forward")
    kernel = ManifestKernel(op.MoeTopkGateForwardVariant("sqrtsoftplus", 256))
    numbers = (4, int, False, bool, 0, int, 1.0, float, 0, int, 1, int, 1, int)
    key = (20, "sqrtsoftplus", *numbers, *[True] * 10, None)
    monkeypatch.setitem(op._PLANS, key, gate.forward_plan(kernel, 0, 20, 4, 0, 1.0, 0, 1, 1, set(), False))
    logits = torch.randn(5, 20)

    def route(t):
        return tilebake.moe.moe_topk_gate_forward(t, 4, False, 0, 1.0, 0)

    got = torch.compile(route, fullgraph=True, backend="aot_eager")(logits)
    want = route(logits)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
