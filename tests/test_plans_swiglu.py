"""Call plans of swiglu_forward, swiglu_forward_and_per_token_cast, swiglu_backward and
swiglu_backward_and_per_token_cast, traced on the CPU (every step but the launch): for each key
pattern the plans take and a few shapes, the kernel arguments equal what the Python path passes
for the same tensors, the results' layouts (shape, stride, dtype) equal the CPU path's result of
the same call, and inputs the Python path rejects return NotImplemented."""

import importlib
import itertools

import pytest
import torch

from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace
from tilebake import config
from tilebake._runtime import plan
from tilebake.quant._common import sf_strides_for_kernel

pytestmark = needs_plans

F = importlib.import_module("tilebake.quant.swiglu_forward")
B = importlib.import_module("tilebake.quant.swiglu_backward")
PF = importlib.import_module("tilebake.quant._swiglu_forward_plans")
PB = importlib.import_module("tilebake.quant._swiglu_backward_plans")
NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
SF_MODES = ((False, False), (True, False), (True, True))  # (round_sf, use_packed_ue8m0)
# (T, 2H): one row; H % 128 == 64; an odd row count and a wide layer
SHAPES = ((1, 128), (7, 384), (8001 % 37, 2 * 7168))


def idfn(value):
    if isinstance(value, torch.dtype):
        return NAMES[value]
    return "-".join(map(str, value)) if isinstance(value, tuple) else None


def f32(value: float) -> float:
    return torch.tensor(value, dtype=torch.float32).item()


def make_x(shape, dtype, padded: bool):
    """x, as a view of a wider buffer (row stride above 2H) where `padded`."""
    rows, width = shape
    if not padded:
        return torch.randn(rows, width).to(dtype)
    return torch.randn(rows, width + 64).to(dtype)[:, :width]


def make_options(rows, has_psum, has_weights, num_experts):
    """psum (a valid layout: the last expert owns every row) and topk_weights, or None."""
    psum = torch.tensor([0] * (num_experts - 1) + [rows], dtype=torch.int32) if has_psum else None
    weights = torch.rand(rows) if has_weights else None
    return psum, weights


def option_params(x, psum, weights, scale, clamp) -> dict:
    """The kernel arguments the Python path passes for psum, topk_weights and the scalars."""
    p_ptr, num_experts, use_psum, steps, alignment = F.psum_args(psum, x)
    return dict(
        P=p_ptr, num_experts=num_experts, use_psum=use_psum, search_steps=steps, alignment=alignment,
        W=x.data_ptr() if weights is None else weights.data_ptr(), has_weights=int(weights is not None),
        scale=f32(1.0 if scale is None else scale), clamp_value=float("inf") if clamp is None else f32(clamp),
    )  # fmt: skip


def layout(t):
    if isinstance(t, tuple):
        return tuple(layout(u) for u in t)
    return tuple(t.shape), t.stride(), t.dtype


def case_options(i):
    """The optional arguments of case i: psum, weights, experts, routed_scaling_factor, clamp_value."""
    return bool(i & 1), bool(i & 2), 1 + 4 * (i % 3), (None, 2.5, 0.0)[i % 3], (None, 7.0)[(i >> 2) & 1]


# --- swiglu_forward ---

FWD_CASES = list(itertools.product((torch.bfloat16, torch.float32), ("bf16", "fp32"), range(8)))


@pytest.mark.parametrize("dtype,fmt,i", FWD_CASES, ids=idfn)
def test_swiglu_forward_plan(dtype, fmt, i):
    has_psum, has_weights, experts, scale, clamp = case_options(i)
    kernel = ManifestKernel(F.SwigluForwardVariant(NAMES[dtype], fmt, 0, False, False))
    out_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[fmt]
    p = PF.forward_plan(kernel, 0, dtype, out_dtype, has_psum, has_weights, scale, clamp)
    for shape, padded in itertools.product(SHAPES, (False, True)):
        x = make_x(shape, dtype, padded)
        psum, weights = make_options(shape[0], has_psum, has_weights, experts)
        y, launches = trace(p, x, psum, weights)
        assert layout(y) == layout(F.swiglu_forward(x, fmt, psum, weights, scale, clamp))
        assert [launch[0] for launch in launches] == [0]
        assert params_of(kernel, launches[0]) == dict(
            X=x.data_ptr(), Y=y.data_ptr(), C=x.data_ptr(), count_clamps=0, num_tokens=shape[0],
            hidden=shape[1] // 2, x_stride=x.stride(0), y_stride=y.stride(0),
            **option_params(x, psum, weights, scale, clamp),
        )  # fmt: skip
    # what the Python path rejects (or leaves to itself: no rows), the plan refuses
    x = make_x((3, 256), dtype, False)
    psum, weights = make_options(3, has_psum, has_weights, experts)
    assert trace(p, x[:, :192], psum, weights)[0] is NotImplemented  # 2H % 128
    assert trace(p, x[:0], psum, weights)[0] is NotImplemented
    assert trace(p, x.t().contiguous().t(), psum, weights)[0] is NotImplemented  # column-major
    if has_psum:
        assert trace(p, x, psum.long(), weights)[0] is NotImplemented
        assert trace(p, x, psum[None], weights)[0] is NotImplemented
        assert trace(p, x, psum[:0], weights)[0] is NotImplemented
    if has_weights:
        assert trace(p, x, psum, weights[:2])[0] is NotImplemented
        assert trace(p, x, psum, weights.half())[0] is NotImplemented
        assert trace(p, x, psum, torch.rand(6)[::2])[0] is NotImplemented  # not contiguous
        assert trace(p, x, psum, None)[0] is NotImplemented


def test_token_alignment_is_baked_in_and_search_steps_is_bit_length():
    kernel = ManifestKernel(F.SwigluForwardVariant("bf16", "bf16", 0, False, False))
    try:
        config.set_token_alignment(64)
        p = PF.forward_plan(kernel, 0, torch.bfloat16, torch.bfloat16, True, False, None, None)
    finally:
        config.reset_runtime_config()
    x = torch.randn(3, 128).bfloat16()
    for experts in (1, 2, 3, 4, 7, 8, 255, 256, 1000):
        psum = torch.zeros(experts, dtype=torch.int32)
        args = params_of(kernel, trace(p, x, psum, None)[1][0])
        assert (args["alignment"], args["num_experts"], args["search_steps"]) == (64, experts, experts.bit_length())


# --- swiglu_forward_and_per_token_cast ---

FWD_CAST_CASES = list(itertools.product((torch.bfloat16, torch.float32), (32, 128), SF_MODES, (False, True)))


@pytest.mark.parametrize("dtype,npc,sf_mode,col", FWD_CAST_CASES, ids=idfn)
def test_swiglu_forward_and_per_token_cast_plan(dtype, npc, sf_mode, col):
    round_sf, packed = sf_mode
    i = FWD_CAST_CASES.index((dtype, npc, sf_mode, col))
    has_psum, has_weights, experts, scale, clamp = case_options(i)
    kernel = ManifestKernel(F.SwigluForwardVariant(NAMES[dtype], "e4m3", npc, round_sf, packed))
    p = PF.forward_cast_plan(kernel, 0, dtype, npc, has_psum, has_weights, scale, clamp, col, packed)
    for shape, padded in itertools.product(SHAPES, (False, True)):
        x = make_x(shape, dtype, padded)
        psum, weights = make_options(shape[0], has_psum, has_weights, experts)
        (data, sf), launches = trace(p, x, psum, weights)
        ref = F.swiglu_forward_and_per_token_cast(x, "e4m3", npc, psum, weights, scale, col, round_sf, packed, clamp)
        assert layout((data, sf)) == layout(tuple(ref))
        sf_stride_t, sf_stride_g = sf_strides_for_kernel(sf, packed)
        assert [launch[0] for launch in launches] == [0]
        assert params_of(kernel, launches[0]) == dict(
            X=x.data_ptr(), Y=data.data_ptr(), C=x.data_ptr(), count_clamps=0, num_tokens=shape[0],
            hidden=shape[1] // 2, x_stride=x.stride(0), y_stride=data.stride(0), S=sf.data_ptr(),
            sf_stride_t=sf_stride_t, sf_stride_g=sf_stride_g, amax_clamp=f32(config.get_amax_clamp_for_quant("e4m3")),
            **option_params(x, psum, weights, scale, clamp),
        )  # fmt: skip
    x = make_x((3, 256), dtype, False)
    psum, weights = make_options(3, has_psum, has_weights, experts)
    assert trace(p, x.to(torch.float16), psum, weights)[0] is NotImplemented
    assert trace(p, x[:, :192], psum, weights)[0] is NotImplemented
    assert trace(p, torch.randn(3 * 256 + 1).to(dtype)[1:].view(3, 256), psum, weights)[0] is NotImplemented


# --- swiglu_backward ---

BWD_CASES = list(itertools.product((torch.bfloat16, torch.float32), ("bf16", "fp32"), range(8), (False, True)))


def expected_backward(x, g, results, weights, do_recompute, psum, scale, clamp):
    x_grad = results[0]
    weight_grad = results[-1 - do_recompute] if weights is not None else x_grad
    return dict(
        X=x.data_ptr(), G=g.data_ptr(), DX=x_grad.data_ptr(), WG=weight_grad.data_ptr(),
        A=results[-1].data_ptr() if do_recompute else 0,  # the Python path's empty act_out: a null pointer
        num_tokens=g.shape[0], hidden=g.shape[1], x_stride=x.stride(0), g_stride=g.stride(0),
        do_recompute=int(do_recompute), **option_params(x, psum, weights, scale, clamp),
    )  # fmt: skip


@pytest.mark.parametrize("dtype,fmt,i,do_recompute", BWD_CASES, ids=idfn)
def test_swiglu_backward_plan(dtype, fmt, i, do_recompute):
    has_psum, has_weights, experts, scale, clamp = case_options(i)
    kernel = ManifestKernel(B.SwigluBackwardVariant(NAMES[dtype], NAMES[dtype], fmt, 0, False, False))
    out_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[fmt]
    p = PB.backward_plan(kernel, 0, dtype, out_dtype, has_psum, has_weights, scale, clamp, do_recompute)
    for shape, padded in itertools.product(SHAPES, (False, True)):
        x = make_x(shape, dtype, padded)
        g = make_x((shape[0], shape[1] // 2), dtype, not padded)
        psum, weights = make_options(shape[0], has_psum, has_weights, experts)
        results, launches = trace(p, x, g, psum, weights)
        assert layout(results) == layout(B.swiglu_backward(x, g, fmt, psum, weights, scale, clamp, do_recompute))
        assert [launch[0] for launch in launches] == [0]
        assert params_of(kernel, launches[0]) == expected_backward(
            x, g, results, weights, do_recompute, psum, scale, clamp
        )
    x, g = make_x((3, 256), dtype, False), make_x((3, 128), dtype, False)
    psum, weights = make_options(3, has_psum, has_weights, experts)
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    assert trace(p, x, g.to(other), psum, weights)[0] is NotImplemented  # act_x_grad's dtype must be x's
    assert trace(p, x, g[:2], psum, weights)[0] is NotImplemented
    assert trace(p, x, make_x((3, 256), dtype, False)[:, :128:2], psum, weights)[0] is NotImplemented
    assert trace(p, x[:, :192], g[:, :96], psum, weights)[0] is NotImplemented
    assert trace(p, x, None, psum, weights)[0] is NotImplemented


# --- swiglu_backward_and_per_token_cast ---

BWD_CAST_CASES = list(itertools.product((torch.bfloat16, torch.float32), (32, 128), SF_MODES, (False, True)))


@pytest.mark.parametrize("g_dtype,npc,sf_mode,col", BWD_CAST_CASES, ids=idfn)
def test_swiglu_backward_and_per_token_cast_plan(g_dtype, npc, sf_mode, col):
    round_sf, packed = sf_mode
    i = BWD_CAST_CASES.index((g_dtype, npc, sf_mode, col))
    has_psum, has_weights, experts, scale, clamp = case_options(i)
    do_recompute = bool(i & 4)
    kernel = ManifestKernel(B.SwigluBackwardVariant("e4m3", NAMES[g_dtype], "bf16", npc, round_sf, packed))
    p = PB.backward_cast_plan(
        kernel, 0, g_dtype, npc, has_psum, has_weights, scale, clamp, col, packed, do_recompute
    )
    for shape, padded in itertools.product(SHAPES, (False, True)):
        data = make_x(shape, torch.float8_e4m3fn, padded)
        groups = shape[1] // npc
        x_sf = torch.rand(groups, shape[0]).t() if padded else torch.rand(shape[0], groups)  # any strides
        g = make_x((shape[0], shape[1] // 2), g_dtype, not padded)
        psum, weights = make_options(shape[0], has_psum, has_weights, experts)
        results, launches = trace(p, (data, x_sf), g, psum, weights)
        ref = B.swiglu_backward_and_per_token_cast(
            (data, x_sf), g, "e4m3", npc, psum, weights, scale, col, round_sf, packed, clamp, do_recompute
        )
        assert layout(results) == layout(tuple(r if isinstance(r, torch.Tensor) else tuple(r) for r in ref))
        q, sf = results[1]
        sf_stride_t, sf_stride_g = sf_strides_for_kernel(sf, packed)
        assert [launch[0] for launch in launches] == [0]
        assert params_of(kernel, launches[0]) == dict(
            expected_backward(data, g, results, weights, do_recompute, psum, scale, clamp),
            XS=x_sf.data_ptr(), xs_stride_t=x_sf.stride(0), xs_stride_g=x_sf.stride(1), Q=q.data_ptr(),
            S=sf.data_ptr(), sf_stride_t=sf_stride_t, sf_stride_g=sf_stride_g,
            amax_clamp=f32(config.get_amax_clamp_for_quant("e4m3")),
        )  # fmt: skip
    data = make_x((3, 256), torch.float8_e4m3fn, False)
    x_sf, g = torch.rand(3, 256 // npc), make_x((3, 128), g_dtype, False)
    psum, weights = make_options(3, has_psum, has_weights, experts)
    assert trace(p, (data, x_sf), g, psum, weights)[0] is not NotImplemented
    assert trace(p, [data, x_sf], g, psum, weights)[0] is NotImplemented  # a list: the Python path
    assert trace(p, (data.view(torch.int8), x_sf), g, psum, weights)[0] is NotImplemented
    assert trace(p, (data, x_sf[:, :1]), g, psum, weights)[0] is NotImplemented
    assert trace(p, (data, x_sf.view(torch.int32)), g, psum, weights)[0] is NotImplemented  # packed: not built
    assert trace(p, (data, x_sf), g[:, :64], psum, weights)[0] is NotImplemented


# --- the Python path builds, under the fast path's key, a plan doing what it launched itself ---


class FakeCuda(torch.Tensor):
    """A CPU tensor the ops' Python path takes for a CUDA one: it runs to its launch (recorded
    by Recording) and then builds the call's plan."""

    is_cuda = property(lambda self: True)


class Recording(ManifestKernel):
    launches: list = []

    def __call__(self, device, *args):  # loader.Kernel's call: the declared parameters in order
        Recording.launches.append((self, dict(zip([q.name for q in self.variant.params()], args))))


class RecordingTable:
    def __init__(self, variant_cls):
        self.variant_cls = variant_cls

    def __getitem__(self, key):
        return Recording(self.variant_cls(*key))


def fake(t):
    return t.as_subclass(FakeCuda) if isinstance(t, torch.Tensor) else t


def plain(t):
    if isinstance(t, tuple):
        return tuple(plain(u) for u in t)
    return t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t


def normalised(kernel, params, inputs, result) -> dict:
    """Pointers as the name of the tensor they point at (0 stays 0), floats rounded to fp32."""
    leaves = dict(inputs, **{f"out{i}": t for i, t in enumerate(torch.utils._pytree.tree_leaves(result))})
    names = {t.data_ptr(): name for name, t in leaves.items() if t is not None and t.numel()}
    kinds = dict(zip(kernel.spec[0], kernel.spec[1]))
    return {n: names.get(v, v) if kinds[n] == "p" else f32(v) if kinds[n] == "f" else v for n, v in params.items()}


def check_built_plan(monkeypatch, module, call, inputs):
    """call() on FakeCuda inputs twice: the first (the Python path) launches and builds a plan,
    the second finds it (the fast path); traced, it launches what the Python path did."""
    module._PLANS.clear(), module._CAST_PLANS.clear(), Recording.launches.clear()
    runs = []
    with monkeypatch.context() as m:
        m.setattr(module, "_KERNELS", RecordingTable(module._KERNELS.variant_type))
        result = call()
        (kernel, launched), = Recording.launches
        (built,) = [*module._PLANS.values(), *module._CAST_PLANS.values()]
        assert built is not None
        m.setattr(plan, "run", lambda p, *args: runs.append((p, args)) or "from the plan")
        assert call() == "from the plan"
    (p, args), = runs
    assert p is built
    got, launches = trace(p, *plain(args))
    assert layout(got) == layout(plain(result))
    assert [launch[0] for launch in launches] == [0]
    assert normalised(kernel, params_of(kernel, launches[0]), inputs, got) == normalised(
        kernel, launched, inputs, result
    )
    module._PLANS.clear(), module._CAST_PLANS.clear()


@pytest.mark.parametrize("dtype,fmt,i", FWD_CASES, ids=idfn)
def test_swiglu_forward_builds_its_plan(monkeypatch, dtype, fmt, i):
    has_psum, has_weights, experts, scale, clamp = case_options(i)
    x = make_x(SHAPES[i % 3], dtype, bool(i & 1))
    psum, weights = make_options(x.shape[0], has_psum, has_weights, experts)
    inputs = dict(x=x, psum=psum, weights=weights)
    check_built_plan(monkeypatch, F, lambda: F.swiglu_forward(fake(x), fmt, fake(psum), fake(weights), scale, clamp),
                     inputs)  # fmt: skip


@pytest.mark.parametrize("dtype,npc,sf_mode,col", FWD_CAST_CASES, ids=idfn)
def test_swiglu_forward_and_per_token_cast_builds_its_plan(monkeypatch, dtype, npc, sf_mode, col):
    i = FWD_CAST_CASES.index((dtype, npc, sf_mode, col))
    has_psum, has_weights, experts, scale, clamp = case_options(i)
    x = make_x(SHAPES[i % 3], dtype, bool(i & 1))
    psum, weights = make_options(x.shape[0], has_psum, has_weights, experts)

    def call():
        return F.swiglu_forward_and_per_token_cast(
            fake(x), "e4m3", npc, fake(psum), fake(weights), scale, col, *sf_mode, clamp
        )

    check_built_plan(monkeypatch, F, call, dict(x=x, psum=psum, weights=weights))


@pytest.mark.parametrize("dtype,fmt,i,do_recompute", BWD_CASES, ids=idfn)
def test_swiglu_backward_builds_its_plan(monkeypatch, dtype, fmt, i, do_recompute):
    has_psum, has_weights, experts, scale, clamp = case_options(i)
    shape = SHAPES[i % 3]
    x, g = make_x(shape, dtype, bool(i & 1)), make_x((shape[0], shape[1] // 2), dtype, not i & 1)
    psum, weights = make_options(shape[0], has_psum, has_weights, experts)

    def call():
        return B.swiglu_backward(fake(x), fake(g), fmt, fake(psum), fake(weights), scale, clamp, do_recompute)

    check_built_plan(monkeypatch, B, call, dict(x=x, g=g, psum=psum, weights=weights))


@pytest.mark.parametrize("g_dtype,npc,sf_mode,col", BWD_CAST_CASES, ids=idfn)
def test_swiglu_backward_and_per_token_cast_builds_its_plan(monkeypatch, g_dtype, npc, sf_mode, col):
    i = BWD_CAST_CASES.index((g_dtype, npc, sf_mode, col))
    has_psum, has_weights, experts, scale, clamp = case_options(i)
    shape = SHAPES[i % 3]
    data = make_x(shape, torch.float8_e4m3fn, bool(i & 1))
    x_sf = torch.rand(shape[1] // npc, shape[0]).t() if i & 2 else torch.rand(shape[0], shape[1] // npc)
    g = make_x((shape[0], shape[1] // 2), g_dtype, not i & 1)
    psum, weights = make_options(shape[0], has_psum, has_weights, experts)

    def call():
        return B.swiglu_backward_and_per_token_cast(
            (fake(data), fake(x_sf)), fake(g), "e4m3", npc, fake(psum), fake(weights), scale, col, *sf_mode, clamp,
            bool(i & 4),
        )  # fmt: skip

    check_built_plan(monkeypatch, B, call, dict(x=data, x_sf=x_sf, g=g, psum=psum, weights=weights))


def test_scalar_keys_keep_bools_off_float_plans(monkeypatch):
    """A plan built for routed_scaling_factor=1.0 (clamp_value=1.0) must not take True (== 1.0,
    the same hash), which the Python path rejects: such a call raises the Python path's error."""
    x = make_x((2, 128), torch.bfloat16, False)
    F._PLANS.clear()
    with monkeypatch.context() as m:
        m.setattr(F, "_KERNELS", RecordingTable(F._KERNELS.variant_type))
        F.swiglu_forward(fake(x), "bf16", None, None, 1.0, 1.0)  # the Python path builds the plan
        m.setattr(plan, "run", lambda p, *args: "from the plan")
        assert F.swiglu_forward(fake(x), "bf16", None, None, 1.0, 1.0) == "from the plan"
        with pytest.raises(TypeError, match="routed_scaling_factor"):
            F.swiglu_forward(fake(x), "bf16", None, None, True, 1.0)
        with pytest.raises(TypeError, match="clamp_value"):
            F.swiglu_forward(fake(x), "bf16", None, None, 1.0, True)
    F._PLANS.clear()


def test_planned_keys_still_trace_under_torch_compile(monkeypatch):
    """With each op's plan built for a key (as after an eager CUDA call), torch.compile
    (fullgraph=True) of a call with that key traces the op's torch.library node, not the plan."""
    x, g, w = make_x((7, 256), torch.bfloat16, False), make_x((7, 128), torch.bfloat16, False), torch.rand(7)
    data, x_sf = make_x((7, 256), torch.float8_e4m3fn, False), torch.rand(7, 2)
    ops = [
        (F, lambda x, g, w, data, x_sf: F.swiglu_forward(x, "bf16", None, w, 2.0)),
        (F, lambda x, g, w, data, x_sf: F.swiglu_forward_and_per_token_cast(x, "e4m3", 128, None, w, 2.0)),
        (B, lambda x, g, w, data, x_sf: B.swiglu_backward(x, g, "bf16", None, w, 2.0, None, True)),
        (B, lambda x, g, w, data, x_sf: B.swiglu_backward_and_per_token_cast((data, x_sf), g, "e4m3", 128)),
    ]
    tensors = (x, g, w, data, x_sf)
    for module, op in ops:
        with monkeypatch.context() as m:
            m.setattr(module, "_KERNELS", RecordingTable(module._KERNELS.variant_type))
            op(*map(fake, tensors))  # the Python path builds the plan
        assert len(module._PLANS) + len(module._CAST_PLANS) == 1
        got = torch.compile(op, fullgraph=True, backend="aot_eager")(*tensors)
        for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(op(*tensors))):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        module._PLANS.clear(), module._CAST_PLANS.clear()
