"""Call plans (tilebake/_runtime/plan.py, native_call.c) on the CPU: expressions, the checks that
send a call back to the Python path, allocation through torch's exchange API, the returned
structure, and each op plan's kernel arguments and output layouts, traced (every step but the
launch) on CPU tensors. The GPU tests run the same plans for real (every CUDA call after an
op's first with a key takes its plan)."""

import itertools

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, trace
from tilebake._runtime import plan
from tilebake._runtime.loader import _native

pytestmark = needs_plans


def test_expressions_match_python():
    """Each expression, with operands from -9 to 9 (Python's floor division and modulo), against
    Python's value: passed in as a shape (value + 1000), which the plan checks."""
    exprs = ["A // B", "A % B", "A * B - 7", "min(A, B, 3)", "max(A, -B)", "A < B", "A <= B", "A > B", "A >= B",
             "A == B", "A != B", "A < B and B > 0", "A < 0 or not B", "(A + 3) // 4 * 4", "-A % 5", "2 * -A // 3"]  # fmt: skip
    plans = {}
    for e in exprs:
        b = plan.Builder()
        b.tensor(0, torch.float32, ("a", "b", "w"), strides=(None, None, None), align=1)
        b.let("A", "a - 9")
        b.let("B", "b - 9")
        b.check(f"({e}) + 1000 == w")
        b.returns(None)
        plans[e] = b.build()
    for av, bv in itertools.product(range(-9, 10), [v for v in range(-9, 10) if v]):
        for e in exprs:
            want = int(eval(e, {"A": av, "B": bv})) + 1000
            assert trace(plans[e], torch.empty(av + 9, bv + 9, want))[0] is None, (e, av, bv)
            assert trace(plans[e], torch.empty(av + 9, bv + 9, want + 1))[0] is NotImplemented, (e, av, bv)


def test_division_by_zero_takes_the_python_path():
    b = plan.Builder()
    b.tensor(0, torch.float32, ("a", "b"), align=1)
    b.let("q", "b // a")
    b.returns(None)
    assert trace(b.build(), torch.empty(0, 3))[0] is NotImplemented
    assert trace(b.build(), torch.empty(2, 3))[0] is None


def _one_tensor_plan(dtype=torch.bfloat16, align=16):
    b = plan.Builder()
    x = b.tensor(0, dtype, ("T", "H"), strides=("xs", 1), align=align)
    b.check("H % 8 == 0")
    y = b.alloc(torch.float32, ("T", "H // 8"))
    b.returns((y, None, x))
    return b.build()


def test_allocates_and_returns_the_structure():
    x = torch.randn(3, 64).bfloat16()
    (y, none, same), launches = trace(_one_tensor_plan(), x)
    assert same is x and none is None and launches == []
    assert y.shape == (3, 8) and y.dtype == torch.float32 and y.is_contiguous() and y.device == x.device



def test_repeated_shapes_allocate_fresh_contiguous_tensors():
    """From the second call of a shape on, outputs come from torch.empty_like of a cached
    one-element template: each call still gets its own contiguous tensor of the call's shape,
    and a shape change (or an empty output) allocates as the first call did."""
    p = _one_tensor_plan()
    outs = []
    for rows in (3, 3, 3, 3, 5, 5, 3, 1, 1, 0, 0, 2):
        (y, _, _), _ = trace(p, torch.randn(rows, 64).bfloat16())
        assert y.shape == (rows, 8) and y.dtype == torch.float32 and y.is_contiguous()
        assert y.stride() == (8, 1) and not y.requires_grad
        outs.append(y)
    storages = [y.untyped_storage().data_ptr() for y in outs if y.numel()]
    assert len(set(storages)) == len(storages)  # no two outputs share memory

@pytest.mark.parametrize(
    "arg",
    [
        torch.randn(3, 64),  # dtype
        torch.randn(3, 64, 1).bfloat16(),  # rank
        torch.randn(3, 60).bfloat16(),  # the check
        torch.randn(64, 3).bfloat16().t(),  # stride
        torch.randn(3 * 64 + 1).bfloat16()[1:].view(3, 64),  # alignment
        torch.randn(3, 64).bfloat16().as_subclass(type("Sub", (torch.Tensor,), {})),  # a subclass
        None,
        "x",
    ],
)
def test_unexpected_arguments_take_the_python_path(arg):
    assert trace(_one_tensor_plan(), arg)[0] is NotImplemented


def test_parameters_and_tensors_requiring_grad_take_the_plan():
    """Model weights are nn.Parameters: the plan takes them (and tensors requiring grad), as the
    Python path does."""
    for t in (torch.nn.Parameter(torch.randn(3, 64).bfloat16()), torch.randn(3, 64).bfloat16().requires_grad_()):
        (y, _, same), _ = trace(_one_tensor_plan(), t)
        assert same is t and y.shape == (3, 8)


def test_cpu_tensors_are_never_launched():
    assert _native().run(_one_tensor_plan(), torch.randn(3, 64).bfloat16()) is NotImplemented


def test_tuple_items_and_missing_arguments():
    b = plan.Builder()
    b.tensor((0, 1), torch.float32, ("n",), align=1)
    b.returns(None)
    p = b.build()
    t = torch.empty(4)
    assert trace(p, (None, t))[0] is None
    assert trace(p, (t,))[0] is NotImplemented
    assert trace(p, [None, t])[0] is NotImplemented  # lists: the Python path
    assert trace(p)[0] is NotImplemented


def test_without_the_exchange_api_no_plan_is_built(monkeypatch):
    class NoCapsule:
        pass

    with pytest.raises(AttributeError):
        _native().plan(b"", (), (), None, NoCapsule, NoCapsule, (), None)
    monkeypatch.setattr(plan, "available", lambda: False)
    assert plan.build_if_available(lambda: pytest.fail("built")) is None


def test_config_changes_empty_the_plans():
    import tilebake

    plans = plan.cache()
    plans["k"] = object()
    tilebake.set_amax_clamp_for_quant("e4m3", False, 2e-4)
    assert plans == {}
    tilebake.config.reset_runtime_config()


# --- the ops' plans: tests/test_plans_<group>.py (the cast ops: test_plans_cast.py) ---


def test_a_planned_key_still_traces_under_torch_compile(monkeypatch):
    """A key with a plan (as after an eager CUDA call) does not reach the native call while
    dynamo traces: fullgraph=True traces the op's torch.library node."""
    import importlib

    from tilebake.quant import _cast_plans as plans

    ptc = importlib.import_module("tilebake.quant.per_token_cast")
    kernel = ManifestKernel(ptc.PerTokenCastVariant("bf16", "e4m3", 128, "fp32"))
    key = (torch.bfloat16, "e4m3", 128, None, False, False, False, False, False, True)
    p = plans.per_token_plan(kernel, 0, torch.bfloat16, "e4m3", 128, torch.float32, False, False, False, 1e-4)
    monkeypatch.setitem(ptc._PLANS, key, p)
    x = torch.randn(33, 256).bfloat16()
    data, sf = torch.compile(lambda t: ptc.per_token_cast(t, "e4m3", 128), fullgraph=True, backend="aot_eager")(x)
    want = ptc.per_token_cast(x, "e4m3", 128)
    assert torch.equal(data.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(sf, want[1])


def test_every_native_call_is_skipped_while_dynamo_traces():
    """Each op's plan lookup and plan.run sit under `if not torch.compiler.is_compiling():` (the
    test above shows why, for one op; dynamo also cannot hash keys holding classes): a source
    check over every op module."""
    from pathlib import Path

    import tilebake

    unguarded = []
    for path in Path(tilebake.__file__).parent.rglob("*.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "plan.run(" in line and "def run" not in line:
                # the guard encloses the key lookup too (dynamo cannot hash some keys' items)
                above = "\n".join(lines[max(0, i - 20) : i])
                guarded = "if not torch.compiler.is_compiling():" in above
                if not guarded or above.rindex("is_compiling()") > above.rfind("try:"):
                    unguarded.append(f"{path.name}:{i + 1}")
    assert not unguarded, f"plan.run without the torch.compiler.is_compiling() guard: {unguarded}"


def test_version_bump_takes_the_written_tuple_even_in_inference_mode():
    """Plans bump every tensor they wrote in one call with a tuple; the function is picked once,
    also when the first plan is built under torch.inference_mode (whose tensors have no version)."""
    plan._bump_tuple.cache_clear()
    with torch.inference_mode():
        bump = plan._bump_tuple()
        bump((torch.empty(2), torch.empty(3)))  # inference tensors: no version, no error
    a, b = torch.empty(2), torch.empty(3)
    before = (a._version, b._version)
    bump((a, b))
    assert (a._version, b._version) == (before[0] + 1, before[1] + 1)
