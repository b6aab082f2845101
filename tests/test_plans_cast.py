"""The cast ops' call plans (tilebake/quant/_cast_plans.py) traced on the CPU: every step but the
launch. For each planned key pattern and a few shapes (1, odd sizes): the kernel arguments equal
what the Python path passes (pointers, strides, sizes, SF codes, the amax clamp), the grid the
manifest's expression of them, the returned layouts those of the CPU reference path's result for
the same call, given tensors returned themselves; and inputs the Python path rejects (or leaves
to itself: an empty problem) return NotImplemented. The GPU tests run the same plans for real."""

import importlib
import itertools

import pytest
import torch

import tilebake
from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace
from tests.plan_recording import RecordingTable
from tilebake import config
from tilebake._runtime import plan
from tilebake._runtime.loader import _native
from tilebake.quant import _cast_plans as plans

pytestmark = needs_plans

ptc = importlib.import_module("tilebake.quant.per_token_cast")
pbc = importlib.import_module("tilebake.quant.per_block_cast")
pcc = importlib.import_module("tilebake.quant.per_channel_cast")
cast_mod = importlib.import_module("tilebake.quant.cast")
IN = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def layout(t):
    """Shape, dtype and the strides that matter (a size-1 dim's stride addresses nothing: the
    reference and the CUDA path may differ there)."""
    return tuple(t.shape), tuple(st if n > 1 else None for st, n in zip(t.stride(), t.shape)), t.dtype


def like(t):
    """An uninitialised tensor laid out as t (a column-major SF view keeps its strides)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)


def check_launch(kernel, launches, want):
    """One launch of `kernel` with exactly `want`'s arguments, its grid the manifest's expression."""
    assert [launch[0] for launch in launches] == [0]
    got = params_of(kernel, launches[0])
    if "amax_clamp" in want:
        assert got.pop("amax_clamp") == pytest.approx(want.pop("amax_clamp"), rel=1e-7)
    assert got == want
    grid = eval(kernel.spec[2][0], {"min": min, "max": max}, got)
    assert launches[0][1] == (grid, 1, 1) and grid >= 1


def assert_python_path_agrees(launches, kernel, recorder):
    """The Python path's launch (recorded) passed what the plan's traced launch passes."""
    (python,) = recorder.calls
    recorder.calls.clear()
    traced = params_of(kernel, launches[0])
    assert python.pop("amax_clamp") == pytest.approx(traced.pop("amax_clamp"), rel=1e-7)
    assert python == traced


def misaligned(t):
    """t's values at an address 2 elements (4 or 8 bytes) off a 16-byte boundary."""
    buf = torch.empty(t.numel() + 2, dtype=t.dtype)[2:]
    return buf.view(t.shape).copy_(t)


# --- per_token_cast, _with_sf_only, _with_precomputed_sf ---

SF_OPTIONS = {  # name -> (round_sf, use_packed_ue8m0, use_e4m3_sf)
    "fp32": (False, False, False),
    "round": (True, False, False),
    "ue8m0": (True, True, False),
    "e4m3sf": (False, False, True),
}
# (fmt, SF option, stochastic): the hot kernels, the e2m1 'rne' kernel, the 'runtime' kernel
PTC_CASES = [
    ("e4m3", "fp32", False), ("e4m3", "round", False), ("e4m3", "ue8m0", False),
    ("e2m1", "fp32", False), ("e2m1", "ue8m0", False), ("e2m1", "e4m3sf", False),
    ("e4m3", "e4m3sf", False), ("e4m3", "round", True), ("e2m1", "fp32", True), ("e2m1", "e4m3sf", True),
]  # fmt: skip
PTC_SHAPES = [(1, 16), (9, 272), (130, 1040)]


def ptc_kernel(dtype, fmt, npc, option, stochastic, store_data=1, precomputed=False):
    """The kernel the op picks (its variant_key) and the plan builder's SF arguments."""
    round_sf, packed, e4m3_sf = SF_OPTIONS[option]
    sf_mode = ptc.SF_PRECOMPUTED if precomputed else ptc._sf_mode(round_sf, packed, e4m3_sf)
    key = ptc.variant_key(IN[dtype], fmt, npc, sf_mode, store_data, int(stochastic))
    sf_dtype = {ptc.SF_E4M3: torch.float8_e4m3fn, ptc.SF_UE8M0: torch.int32}.get(sf_mode, torch.float32)
    return ManifestKernel(ptc.PerTokenCastVariant(*key)), sf_mode, sf_dtype


def ptc_want(kernel, x, data, sf, sf_mode, clamp, stochastic=0):
    """per_token_cast's kernel arguments for these tensors (what _per_token_cast_general.launch
    and the hot path pass)."""
    unit = 4 if sf_mode == ptc.SF_UE8M0 else 1
    want = dict(
        X=x.data_ptr(), Y=0 if data is None else data.data_ptr(), S=sf.data_ptr(), amax_clamp=clamp,
        num_tokens=x.shape[0], hidden=x.shape[1], x_stride=x.stride(0), y_stride=0 if data is None else data.stride(0),
        sf_stride_t=sf.stride(0) * unit, sf_stride_g=sf.stride(1) * unit,
    )  # fmt: skip
    if kernel.variant.sf_mode in ("rne", "runtime"):
        want.update(SB=sf.data_ptr(), SE=sf.data_ptr(), sf_mode=sf_mode)
    if kernel.variant.sf_mode == "runtime":
        want.update(store_data=int(data is not None), stochastic=stochastic)
    return want


@pytest.mark.parametrize("fmt,option,stochastic", PTC_CASES)
@pytest.mark.parametrize("col_major", [False, True])
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_token_cast_plan(dtype, fmt, option, stochastic, col_major, given):
    npc = 32 if fmt == "e4m3" else 16
    round_sf, packed, e4m3_sf = SF_OPTIONS[option]
    kernel, sf_mode, sf_dtype = ptc_kernel(dtype, fmt, npc, option, stochastic)
    assert (kernel.variant.sf_mode in ("rne", "runtime")) == (fmt == "e2m1" or e4m3_sf or stochastic)
    clamp = config.get_amax_clamp_for_quant(fmt, e4m3_sf)
    p = plans.per_token_plan(
        kernel, 0, dtype, fmt, npc, sf_dtype, packed, col_major, given, clamp, plans.CAST, sf_mode, int(stochastic)
    )
    kwargs = dict(round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf, stochastic_cast=stochastic)
    for num_tokens, hidden in PTC_SHAPES:
        x = torch.randn(num_tokens, hidden).to(dtype)
        ref = tilebake.quant.per_token_cast(x, fmt, npc, use_tma_aligned_col_major_sf=col_major, **kwargs)
        out = (like(ref[0]), like(ref[1])) if given else None
        (data, sf), launches = trace(p, x, out)
        if given:
            assert data is out[0] and sf is out[1]
        assert (layout(data), layout(sf)) == (layout(ref[0]), layout(ref[1]))
        check_launch(kernel, launches, ptc_want(kernel, x, data, sf, sf_mode, clamp, int(stochastic)))
        if kernel.variant.sf_mode in ("rne", "runtime"):  # launched by _per_token_cast_general.launch
            table = RecordingTable(ptc.PerTokenCastVariant)
            ptc.launch(table, x, IN[dtype], None, None, fmt, npc, data, sf, sf_mode, clamp, 1, hidden, int(stochastic))
            assert_python_path_agrees(launches, kernel, table)
        # a strided x (rows 16 bytes further apart) takes the plan too
        wide = torch.randn(num_tokens, hidden + 16).to(dtype)[:, :hidden]
        assert trace(p, wide, out)[0] is not NotImplemented
    x = torch.randn(4, 64).to(dtype)
    ref = tilebake.quant.per_token_cast(x, fmt, npc, use_tma_aligned_col_major_sf=col_major, **kwargs)
    out = (like(ref[0]), like(ref[1])) if given else None
    assert trace(p, x, out)[0] is not NotImplemented
    rejected = [torch.randn(4, 24).to(dtype), torch.randn(0, 64).to(dtype), misaligned(x), x.t().contiguous().t()]
    rejected.append(torch.randn(4, 64 + 8 // dtype.itemsize).to(dtype)[:, :64])  # rows 8 bytes off 16
    for bad in rejected:  # H % 16, no rows, a misaligned start, a column-major x, unaligned rows
        assert trace(p, bad, out)[0] is NotImplemented
    if given:
        assert trace(p, x, [*out])[0] is NotImplemented  # a list: the Python path
        assert trace(p, x, (out[0], None))[0] is NotImplemented
        assert trace(p, x, (like(ref[0])[:, : ref[0].shape[1] // 2], out[1]))[0] is NotImplemented  # shape
        assert trace(p, x, (out[0], out[1].expand(-1, -1)[:1].expand(4, -1)))[0] is NotImplemented  # overlap
        assert trace(p, x, (misaligned(out[0]), out[1]))[0] is NotImplemented


@pytest.mark.parametrize("option", list(SF_OPTIONS))
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("col_major", [False, True])
@pytest.mark.parametrize("given", [False, True])
def test_per_token_cast_with_sf_only_plan(option, fmt, col_major, given):
    dtype, npc = torch.bfloat16, 64
    round_sf, packed, e4m3_sf = SF_OPTIONS[option]
    kernel, sf_mode, sf_dtype = ptc_kernel(dtype, fmt, npc, option, False, store_data=0)
    assert kernel.variant.sf_mode == "runtime"
    clamp = config.get_amax_clamp_for_quant(fmt, e4m3_sf)
    p = plans.per_token_plan(kernel, 0, dtype, fmt, npc, sf_dtype, packed, col_major, given, clamp, plans.SF_ONLY,
                             sf_mode)  # fmt: skip
    kwargs = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
    for num_tokens, hidden in PTC_SHAPES:
        x = torch.randn(num_tokens, hidden).to(dtype)
        ref = tilebake.quant.per_token_cast_with_sf_only(x, fmt, npc, use_e4m3_sf=e4m3_sf, **kwargs)
        out_sf = like(ref) if given else None
        sf, launches = trace(p, x, out_sf)
        assert layout(sf) == layout(ref) and (sf is out_sf or not given)
        check_launch(kernel, launches, ptc_want(kernel, x, None, sf, sf_mode, clamp))
        table = RecordingTable(ptc.PerTokenCastVariant)
        ptc.launch(table, x, IN[dtype], None, None, fmt, npc, None, sf, sf_mode, clamp, 0, hidden)
        assert_python_path_agrees(launches, kernel, table)
    assert trace(p, torch.randn(0, 64).to(dtype), None)[0] is NotImplemented
    assert trace(p, torch.randn(3, 40).to(dtype), None)[0] is NotImplemented


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_token_cast_with_precomputed_sf_plan(dtype, fmt, given):
    npc = 32
    kernel, sf_mode, _ = ptc_kernel(dtype, fmt, npc, "fp32", False, precomputed=True)
    assert kernel.variant.sf_mode == "runtime" and sf_mode == ptc.SF_PRECOMPUTED
    p = plans.per_token_plan(kernel, 0, dtype, fmt, npc, torch.float32, False, False, given, 0.0, plans.PRECOMPUTED,
                             sf_mode)  # fmt: skip
    for num_tokens, hidden in PTC_SHAPES:
        x = torch.randn(num_tokens, hidden).to(dtype)
        sf = tilebake.quant.per_token_cast_with_sf_only(x, fmt, npc)
        ref = tilebake.quant.per_token_cast_with_precomputed_sf(x, fmt, npc, sf)
        out = like(ref) if given else None
        data, launches = trace(p, x, sf, out)
        assert layout(data) == layout(ref) and (data is out or not given)
        check_launch(kernel, launches, ptc_want(kernel, x, data, sf, sf_mode, 0.0))
        table = RecordingTable(ptc.PerTokenCastVariant)
        ptc.launch(table, x, IN[dtype], None, None, fmt, npc, data, sf, sf_mode, 0.0, 1, hidden)
        assert_python_path_agrees(launches, kernel, table)
        # the SF may be a column slice of a wider one (any row stride), not column-major
        wide = torch.empty(num_tokens, sf.shape[1] + 3)[:, 1 : 1 + sf.shape[1]].copy_(sf)
        assert trace(p, x, wide, out)[0] is not NotImplemented
        if sf.shape[1] > 1:
            assert trace(p, x, sf.t().contiguous().t(), out)[0] is NotImplemented
    x = torch.randn(3, 64).to(dtype)
    assert trace(p, x, torch.ones(3, 3), None)[0] is NotImplemented  # ceil(64 / 32) SF columns
    assert trace(p, x, torch.ones(3, 2).to(torch.float8_e4m3fn), None)[0] is NotImplemented


# --- per_block_cast, _with_sf_only, _with_precomputed_sf ---

PBC_SHAPES = [(1, 32), (37, 288), (129, 416)]
PBC_CASES = list(itertools.product(("e4m3", "e2m1"), ((32, 128), (128, 32)), ("fp32", "round", "ue8m0")))


def pbc_want(x, data, sf, mode, round_sf, packed, fmt):
    return dict(
        X=x.data_ptr(), Y=x.data_ptr() if data is None else data.data_ptr(), S=sf.data_ptr(),
        amax_clamp=config.get_amax_clamp_for_quant(fmt, False), mode=mode, round_sf=int(round_sf),
        packed_sf=int(packed), sf_stride_m=sf.stride(0) * 4, sf_stride_k=sf.stride(1) * 4, num_tokens=x.shape[0],
        hidden=x.shape[1], x_stride=x.stride(0), y_stride=0 if data is None else data.stride(0),
    )  # fmt: skip


@pytest.mark.parametrize("fmt,block,option", PBC_CASES)
@pytest.mark.parametrize("col_major", [False, True])
@pytest.mark.parametrize("given", [False, True])
def test_per_block_cast_plans(fmt, block, option, col_major, given, monkeypatch):
    """per_block_cast and _with_sf_only (a float32 x), _with_precomputed_sf (bf16)."""
    table = RecordingTable(pbc.PerBlockCastVariant)
    monkeypatch.setattr(pbc, "_KERNELS", table)
    round_sf, packed, _ = SF_OPTIONS[option]
    clamp = config.get_amax_clamp_for_quant(fmt, False)
    kw = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
    for dtype, mode, form in ((torch.float32, 0, plans.CAST), (torch.float32, 1, plans.SF_ONLY),
                              (torch.bfloat16, 2, plans.PRECOMPUTED)):  # fmt: skip
        if form == plans.PRECOMPUTED and (packed or col_major):  # takes an fp32 SF, any layout (built for col False)
            continue
        kernel = ManifestKernel(pbc.PerBlockCastVariant(IN[dtype], fmt, *block))
        kernel_round = round_sf and form != plans.PRECOMPUTED  # a precomputed SF is not rounded again
        p = plans.per_block_plan(kernel, 0, dtype, fmt, *block, packed, col_major, given, clamp, mode, kernel_round,
                                 form)  # fmt: skip
        for num_tokens, hidden in PBC_SHAPES:
            x = torch.randn(num_tokens, hidden).to(dtype)
            if form == plans.CAST:
                ref = tilebake.quant.per_block_cast(x, fmt, block, **kw)
                out = (like(ref[0]), like(ref[1])) if given else None
                (data, sf), launches = trace(p, x, out)
                assert (layout(data), layout(sf)) == (layout(ref[0]), layout(ref[1]))
                assert not given or (data is out[0] and sf is out[1])
            elif form == plans.SF_ONLY:
                ref = tilebake.quant.per_block_cast_with_sf_only(x, fmt, block, **kw)
                out = like(ref) if given else None
                (sf, launches), data = trace(p, x, out), None
                assert layout(sf) == layout(ref) and (sf is out or not given)
            else:
                sf = tilebake.quant.per_block_cast(x, fmt, block, use_tma_aligned_col_major_sf=True)[1]
                ref = tilebake.quant.per_block_cast_with_precomputed_sf(x, fmt, block, sf, round_sf=round_sf)
                out = like(ref) if given else None
                data, launches = trace(p, x, sf, out)  # a column-major SF
                assert layout(data) == layout(ref) and (data is out or not given)
            check_launch(kernel, launches, pbc_want(x, data, sf, mode, kernel_round, packed, fmt))
            assert pbc._launch((IN[dtype], fmt, *block), mode, x, data, sf, fmt, kernel_round, packed)
            assert_python_path_agrees(launches, kernel, table)
        if given:
            continue
        x = torch.randn(4, 64).to(dtype)
        rest = (torch.ones(1, -(-64 // block[1])), None) if form == plans.PRECOMPUTED else (None,)
        assert trace(p, x, *rest)[0] is not NotImplemented
        bad = [torch.randn(4, 40).to(dtype), torch.randn(0, 64).to(dtype), misaligned(x)]
        bad += [torch.randn(4, 80).to(dtype)] if fmt == "e2m1" else []  # H a multiple of 32
        for t in bad:
            assert trace(p, t, *rest)[0] is NotImplemented


# --- per_channel_cast (a plain input) and cast (stochastic rounding) ---


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("npt", [32, 128])
@pytest.mark.parametrize("option", ["fp32", "round", "ue8m0"])
def test_per_channel_cast_plan(dtype, npt, option):
    round_sf, packed, _ = SF_OPTIONS[option]
    kernel = ManifestKernel(pcc.PerChannelCastVariant(IN[dtype], npt))
    clamp = config.get_amax_clamp_for_quant("e4m3", False)
    p = plans.per_channel_plan(kernel, 0, dtype, npt, round_sf, packed, clamp)
    for num_tokens, hidden in ((1, 16), (37, 272), (8001 % 1000, 48)):
        x = torch.randn(num_tokens, hidden).to(dtype)
        ref = tilebake.quant.per_channel_cast(x, "e4m3", npt, round_sf=round_sf, use_packed_ue8m0=packed)
        (data, sf), launches = trace(p, x)
        assert (layout(data), layout(sf)) == (layout(ref[0]), layout(ref[1]))
        want = dict(
            X=x.data_ptr(), Y=data.data_ptr(), S32=sf.data_ptr(), S8=sf.data_ptr(), amax_clamp=clamp,
            round_sf=int(round_sf), packed_sf=int(packed), num_tokens=num_tokens, hidden=hidden, x_stride=x.stride(0),
        )  # fmt: skip
        check_launch(kernel, launches, want)
    for bad in (torch.randn(4, 24).to(dtype), torch.randn(0, 64).to(dtype), misaligned(torch.randn(4, 64).to(dtype))):
        assert trace(p, bad)[0] is NotImplemented
    assert trace(p, (torch.randn(4, 64).to(torch.float8_e4m3fn), torch.ones(4, 2)))[0] is NotImplemented


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.bfloat16), (torch.float32, torch.float8_e4m3fn),
                                     (torch.bfloat16, torch.float8_e4m3fn)])  # fmt: skip
@pytest.mark.parametrize("shape", [(4,), (3, 20), (1, 5, 12), (2, 1, 3, 2)])
def test_stochastic_cast_plan(src, dst, shape):
    kernel = ManifestKernel(cast_mod.CastVariant(IN[src], {torch.bfloat16: "bf16"}.get(dst, "e4m3")))
    p = plans.stochastic_cast_plan(kernel, 0, src, dst, len(shape))
    for scale in (1, 3):
        x = torch.randn(*shape[:-1], shape[-1] * scale).to(src)
        ref = tilebake.quant.cast(x, dst, stochastic_rounding=True)
        y, launches = trace(p, x)
        assert layout(y) == layout(ref)
        check_launch(kernel, launches, dict(X=x.data_ptr(), Y=y.data_ptr(), num_groups=x.numel() // 4))
    x = torch.randn(shape).to(src)
    bad = [misaligned(x), torch.randn(*shape[:-1], 0).to(src), x.to(torch.float16)]
    if len(shape) > 1:
        bad.append(torch.randn(tuple(reversed(shape))).to(src).transpose(0, -1))  # not contiguous
    for t in bad:
        assert trace(p, t)[0] is NotImplemented
    assert trace(p, torch.randn(3, 5, 7, 9)[..., :1].to(src))[0] is NotImplemented  # rank or numel % 4


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("shape", [(1,), (3, 20), (1, 5, 12), (2, 1, 3, 2)])
def test_unpack_from_e2m1fn_x2_plan(shape, dtype, out_dtype):
    unpack = importlib.import_module("tilebake.quant.unpack_from_e2m1fn_x2")
    kernel = ManifestKernel(unpack.UnpackE2m1Variant({torch.float32: "fp32", torch.bfloat16: "bf16"}[out_dtype]))
    p = unpack._plan(kernel, 0, dtype, out_dtype, len(shape))
    for scale in (1, 3):
        x = torch.randint(0, 256, (*shape[:-1], shape[-1] * scale), dtype=torch.int32).to(torch.uint8).view(dtype)
        y, launches = trace(p, x)
        assert layout(y) == layout(tilebake.torch.unpack_from_e2m1fn_x2(x, out_dtype))
        check_launch(kernel, launches, dict(X=x.data_ptr(), Y=y.data_ptr(), num_bytes=x.numel()))
    x = torch.zeros(shape, dtype=dtype)
    bad = [misaligned(x), torch.zeros(*shape[:-1], 0, dtype=dtype), x.to(torch.int16)]
    if len(shape) > 1 and shape[0] > 1:
        bad.append(torch.zeros(tuple(reversed(shape)), dtype=dtype).transpose(0, -1))  # not contiguous
    for t in bad:
        assert trace(p, t)[0] is NotImplemented


# --- the fast paths: skipped while dynamo traces; int flags miss them ---


def test_planned_keys_still_trace_under_torch_compile(monkeypatch):
    """With a plan cached for the key (as after an eager CUDA call), a compiled (fullgraph) call
    does not reach the native call: it traces the op's torch.library node."""
    kernel = ptc_kernel(torch.bfloat16, "e2m1", 32, "fp32", False)[0]
    p = plans.per_token_plan(kernel, 0, torch.bfloat16, "e2m1", 32, torch.float32, False, False, False, 1e-4, "cast")
    monkeypatch.setitem(ptc._PLANS, (torch.bfloat16, "e2m1", 32, None, False, False, False, False, False, True), p)
    kernel = ManifestKernel(pbc.PerBlockCastVariant("fp32", "e4m3", 32, 128))
    p = plans.per_block_plan(kernel, 0, torch.float32, "e4m3", 32, 128, False, False, False, 1e-4, 0, False)
    monkeypatch.setitem(pbc._PLANS, (torch.float32, "e4m3", (32, 128), False, False, False, True, bool, bool, bool), p)
    kernel = ManifestKernel(pcc.PerChannelCastVariant("fp32", 32))
    p = plans.per_channel_plan(kernel, 0, torch.float32, 32, False, False, 1e-4)
    monkeypatch.setitem(pcc._PLANS, (torch.float32, "e4m3", 32, False, None, False, bool, bool), p)
    kernel = ManifestKernel(cast_mod.CastVariant("fp32", "bf16"))
    p = plans.stochastic_cast_plan(kernel, 0, torch.float32, torch.bfloat16, 2)
    monkeypatch.setitem(cast_mod._PLANS, (torch.float32, torch.bfloat16, True, 2), p)
    calls = [
        lambda t: tilebake.quant.per_token_cast(t.bfloat16(), "e2m1", 32),
        lambda t: tilebake.quant.per_block_cast(t, "e4m3", (32, 128)),
        lambda t: tilebake.quant.per_channel_cast(t, "e4m3", 32),
        lambda t: (tilebake.quant.cast(t, torch.bfloat16, stochastic_rounding=True),),
    ]
    x = torch.randn(33, 256)
    for call in calls:
        got = torch.compile(call, fullgraph=True, backend="eager")(x)
        for g, w in zip(got, call(x)):
            assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def test_no_plan_is_remembered_without_the_exchange_api(monkeypatch):
    """A key without a plan stays out of the cache: the fast path hands what it finds to plan.run,
    which takes only plans."""
    cache = {}
    plan.remember(cache, ("k",), lambda: "a plan")
    plan.remember(cache, ("k", []), lambda: pytest.fail("an unhashable key"))
    assert cache == {("k",): "a plan"}
    monkeypatch.setattr(plan, "available", lambda: False)
    plan.remember(cache, ("other",), lambda: pytest.fail("built"))
    assert ("other",) not in cache
    assert _native().run(None, torch.ones(4)) is NotImplemented  # where another op stored None


def test_int_flags_miss_the_bool_keys(monkeypatch):
    """per_block_cast and per_channel_cast want bools: 1 == True, but the key has the flags' types,
    so round_sf=1 misses the plan for round_sf=True and raises as before."""
    sentinel = object()
    monkeypatch.setitem(pbc._PLANS, (torch.float32, "e4m3", (32, 32), False, True, False, True, bool, bool, bool),
                        sentinel)  # fmt: skip
    monkeypatch.setitem(pcc._PLANS, (torch.float32, "e4m3", 32, True, None, False, bool, bool), sentinel)
    x = torch.randn(4, 64)
    with pytest.raises(TypeError, match="round_sf must be a bool"):
        tilebake.quant.per_block_cast(x, "e4m3", (32, 32), round_sf=1)
    with pytest.raises(TypeError, match="round_sf must be a bool"):
        tilebake.quant.per_channel_cast(x, "e4m3", 32, round_sf=1)


# --- on the GPU: writes into given tensors count, on the plan and the Python path ---


@pytest.mark.gpu
def test_gpu_given_outputs_bump_their_versions():
    x = torch.randn(37, 256, device="cuda")
    calls = [
        lambda d, s: tilebake.quant.per_token_cast(x, "e4m3", 32, out=(d, s)),
        lambda d, s: tilebake.quant.per_token_cast(x, "e2m1", 32, out=(d, s)),
        lambda d, s: tilebake.quant.per_block_cast(x, "e4m3", (32, 128), out=(d, s)),
    ]
    for call in calls:
        d, s = (torch.empty_like(t) for t in call(None, None))
        for _ in range(3):  # the Python path (which builds the plan), then the plan
            before = d._version, s._version
            call(d, s)
            assert (d._version, s._version) == (before[0] + 1, before[1] + 1)
    sf = torch.empty(37, 8, device="cuda")
    for _ in range(3):
        before = sf._version
        tilebake.quant.per_token_cast_with_sf_only(x, "e4m3", 32, out_sf=sf)
        assert sf._version == before + 1
