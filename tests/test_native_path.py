"""The native call path on the GPU, op by op (bench/cases.py's cases at small odd shapes): the
second call of a key runs its plan without a Python-path launch, and gives the first call's
bytes; the plans also run inside CUDA graph capture and on a side stream. Ops that stay on the
Python path are listed (PYTHON_PATH) so the list stays true."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from tilebake._runtime import loader, plan

BENCH = Path(__file__).resolve().parent.parent / "bench"

# op case variant (bench/cases.py) -> why its calls take the Python path
PYTHON_PATH: dict[str, str] = {
    "norm_backward_reduce: fp32 partial rows -> bf16 weight grad": "an internal kernel, which its case launches "
    "directly; norm_backward's plan launches it natively",
}


def _cases():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_cases_native", BENCH / "cases.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return [(op, make_case) for op, makers in module.CASES.items() for make_case in makers]


CASES = _cases() if (BENCH / "cases.py").exists() else []


def _clone(tree):
    return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def _bytes(tree):
    """Per tensor leaf: its layout and its bytes (which must both match)."""
    leaves = [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]
    return [(t.shape, t.stride(), t.dtype, t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()) for t in leaves]


def _same(a, b) -> bool:
    return a[:3] == b[:3] and torch.equal(a[3], b[3])


class LaunchCounter:
    """Counts launches through the Python path (loader.Kernel.__call__)."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = loader.Kernel.__call__

        def counted(kernel, *args):
            self.count += 1
            return original(kernel, *args)

        monkeypatch.setattr(loader.Kernel, "__call__", counted)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 2048), (128, 7168)], ids=["1x2048", "128x7168"])
@pytest.mark.parametrize("op,make_case", CASES, ids=[f"{op}-{i}" for i, (op, _) in enumerate(CASES)])
def test_second_call_is_native_and_equal(op, make_case, shape, monkeypatch):
    # Earlier tests in this process may have filled the op's plan cache (plan.MAX_PLANS keys, then
    # no new plans): start from empty caches.
    plan.clear_all()
    case = make_case(*shape)
    args = case["make"]()
    fresh = _clone(args)
    first = case["fn"](*args)  # the Python path (builds the plan)
    counter = LaunchCounter(monkeypatch)
    second = case["fn"](*fresh)
    torch.cuda.synchronize()
    name = f"{op}: {case['variant']}"
    for a, b in zip(_bytes(first), _bytes(second), strict=True):
        assert _same(a, b), f"{name}: the plan's output differs from the Python path's"
    if name in PYTHON_PATH:
        assert counter.count > 0, f"{name} is listed in PYTHON_PATH but ran natively: update the list"
    else:
        assert counter.count == 0, f"{name}: {counter.count} launches took the Python path"


@pytest.mark.gpu
def test_plans_in_graph_capture_and_side_streams():
    import tilebake

    x = torch.randn(300, 7168, device="cuda").bfloat16()
    w = (torch.rand(7168, device="cuda") + 0.5).bfloat16()
    calls = [lambda t: tilebake.quant.per_token_cast(t, "e4m3", 128),
             lambda t: tilebake.quant.norm_forward(t, w, 1e-6)]  # fmt: skip
    for call in calls:
        want = _bytes(call(x))
        want = _bytes(call(x))  # the plan's result
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            got = call(x)
        side.synchronize()
        assert all(_same(a, b) for a, b in zip(want, _bytes(got), strict=True))
        static = torch.zeros_like(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = call(static)  # outputs allocated from the graph's pool
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert all(_same(a, b) for a, b in zip(want, _bytes(captured), strict=True))


def _reused_after_side_stream_use(make, record: bool) -> bool:
    """Whether the allocator hands the block of data = make() out again at once after data,
    written on a busy side stream, is freed (with or without data.record_stream(side))."""
    data = make()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # keeps the side stream busy
        data.view(torch.uint8).add_(1)
    if record:
        data.record_stream(side)
    address, shape, dtype = data.data_ptr(), data.shape, data.dtype
    del data
    again = torch.empty(shape, dtype=dtype, device="cuda")
    reused = again.data_ptr() == address
    torch.cuda.synchronize()
    return reused


@pytest.mark.gpu
def test_plan_outputs_honour_record_stream():
    """An output the plan allocated, used on another stream and recorded there, is not handed
    out again before that stream's work is done, as for torch.empty's tensors (the check can
    fail: without record_stream the block is reused at once)."""
    import tilebake

    x = torch.randn(1024, 7168, device="cuda").bfloat16()
    tilebake.quant.per_token_cast(x, "e4m3", 128)
    torch.cuda.synchronize()
    def make():
        return tilebake.quant.per_token_cast(x, "e4m3", 128)[0]

    assert _reused_after_side_stream_use(make, record=False)
    assert not _reused_after_side_stream_use(make, record=True)


@pytest.mark.gpu
def test_out_buffers_have_their_versions_bumped():
    """Both paths count the write into out= tensors, as torch's out= ops do."""
    import tilebake

    x = torch.randn(4, 512, device="cuda").bfloat16()
    out = tuple(torch.empty_like(t) for t in tilebake.quant.per_token_cast(x, "e4m3", 128))
    for _ in range(2):  # the Python path, then the plan
        before = [t._version for t in out]
        tilebake.quant.per_token_cast(x, "e4m3", 128, out=out)
        assert [t._version for t in out] == [v + 1 for v in before]


@pytest.mark.gpu
def test_without_the_exchange_api_the_python_path_runs(monkeypatch):
    """Where torch has no DLPack C exchange API no plan is built, every call takes the Python
    path and gives the same bytes."""
    import tilebake
    from tilebake._runtime import plan

    x = torch.randn(33, 7168, device="cuda").bfloat16()
    want = _bytes(tilebake.quant.per_token_cast(x, "e4m3", 128))
    monkeypatch.setattr(plan, "available", lambda: False)
    plan.clear_all()
    counter = LaunchCounter(monkeypatch)
    for _ in range(2):
        assert all(_same(a, b) for a, b in zip(want, _bytes(tilebake.quant.per_token_cast(x, "e4m3", 128))))
    assert counter.count == 2
    plan.clear_all()
