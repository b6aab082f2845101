"""Call plans of the moe ops and apply_rotary, traced on the CPU (every step but the launch):
each plan's kernel arguments equal those the op's Python kernel path passes for the same call
(that path run on CPU tensors with a recording stand-in for the kernel), its outputs have the
layouts of the reference path's, and inputs the Python path rejects (or sends elsewhere)
return NotImplemented. The GPU suite runs the same plans for real."""

import importlib

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace

pytestmark = needs_plans

gate = importlib.import_module("tilebake.moe._plans_gate")
mapping = importlib.import_module("tilebake.moe._plans_mapping")
rotary_plans = importlib.import_module("tilebake.transform._plans_apply_rotary")


class Recorder:
    """A stand-in kernel: records the arguments (by name) of each call the Python path makes."""

    def __init__(self, variant):
        self.variant, self.calls = variant, []

    def __call__(self, device, *args):
        self.calls.append(dict(zip(self.variant.arg_names, args)))


def labeled(kernel, values: dict, tensors: dict) -> dict:
    """A launch's arguments with pointers named by the tensor they point at (pointers into no
    given tensor, e.g. a work buffer's: relative to the first such), floats as fp32."""
    names, kinds = kernel.spec[:2]
    ptrs = {}
    for label, t in tensors.items():
        ptrs.setdefault(t.data_ptr(), label)
    base, out = None, {}
    for name, kind in zip(names, kinds):
        v = values[name]
        if kind == "p":
            if v in ptrs:
                v = ptrs[v]
            else:
                base = v if base is None else base
                v = ("work", v - base)
        elif kind == "f":
            v = float(torch.tensor(v, dtype=torch.float32))
        out[name] = v
    return out


def same_layout(got, want, strides=True):
    """Equal shapes, dtypes and (strides=True) strides; strides=False for the reference's
    results, whose strides of size-1 dims may differ from the kernel path's."""
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same_layout(g, w, strides)
    else:
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        assert got.stride() == want.stride() if strides else got.is_contiguous() == want.is_contiguous()


def check_launches(kernels, launches, recorded, plan_tensors, py_tensors):
    assert [launch[0] for launch in launches] == list(range(len(kernels)))
    for kernel, launch, rec in zip(kernels, launches, recorded):
        assert labeled(kernel, params_of(kernel, launch), plan_tensors) == labeled(kernel, rec, py_tensors)


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
    p = gate.forward_plan(kernel, 0, num_experts, k, shared, 1.5, 3, num_groups, num_topk_groups, set(present), given_out)
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
            num_topk_groups,
            num_tokens, num_experts, k, shared, kernels={(func, op.expert_bound(num_experts)): rec},
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
        names = dict(zip([n for n, _ in gate.FORWARD_OPTIONAL], ("Mask", "Bias", "ImageBias", "ImageMask", "FixMask",
                                                                    "Map", "Count", "Unmapped", "Random", "Scores")))  # fmt: skip
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
