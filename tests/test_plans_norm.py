"""The norm ops' call plans (tilebake/quant/_norm_plans.py), traced on the CPU (every step but
the launch): for 2-D and 3-D x, with and without weight, residual, rstd and out=, the kernel
arguments equal those the Python path computes from the same tensors, the returned layouts
equal the CPU path's, given tensors come back themselves, and calls the Python path rejects
(or that a plan leaves to it) return NotImplemented. The GPU test checks that a second call
of a key takes its plan and writes the same bytes as the first."""

import importlib
import itertools

import pytest
import torch

import tilebake
from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace

nf = importlib.import_module("tilebake.quant.norm_forward")
nfc = importlib.import_module("tilebake.quant.norm_forward_and_per_token_cast")
nb = importlib.import_module("tilebake.quant.norm_backward")
plans = importlib.import_module("tilebake.quant._norm_plans")

pytestmark = needs_plans
EPS, NUM_SMS = 1e-6, 132
FMT = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def approx(v):
    return pytest.approx(v, rel=1e-7)


def make_x(shape, dtype, row_pad=0):
    """Random rows, sliced from wider ones when row_pad > 0 (a real row stride)."""
    *lead, hidden = shape
    return torch.randn(*lead, hidden + row_pad).to(dtype)[..., :hidden]


def like(t, dtype=None):
    """An uninitialised tensor of t's layout (shape and strides)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=dtype or t.dtype)


def assert_same_layouts(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_layouts(g, w)
    elif want is None:
        assert got is None
    else:
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)


def rows_of(x):
    return (1, x.shape[0]) if x.dim() == 2 else tuple(x.shape[:2])


def forward_params(x, weight, residual, out, residual_out, rstd, out_scale):
    """What _launch_forward passes the kernel for these tensors."""
    batch, num_tokens = rows_of(x)
    (xb, xs), (ob, os) = nf.rows_strides(x), nf.rows_strides(out)
    p = dict(
        X=x.data_ptr(), Y=out.data_ptr(), RSTD=(rstd if rstd is not None else x).data_ptr(), eps=approx(EPS),
        out_scale=approx(out_scale), with_rstd=int(rstd is not None), batch=batch, num_tokens=num_tokens,
        hidden=x.shape[-1], x_batch_stride=xb, x_stride=xs, out_batch_stride=ob, out_stride=os,
    )  # fmt: skip
    if weight is not None:
        p["W"] = weight.data_ptr()
    if residual is not None:
        (rb, rs), (rob, ros) = nf.rows_strides(residual), nf.rows_strides(residual_out)
        p.update(R=residual.data_ptr(), RO=residual_out.data_ptr(), residual_batch_stride=rb, residual_stride=rs,
                 residual_out_batch_stride=rob, residual_out_stride=ros)  # fmt: skip
    return p


FORWARD_SHAPES = {2: [(1, 16), (37, 272), (5, 7168)], 3: [(1, 1, 16), (3, 1, 128), (2, 37, 640)]}
FORWARD_CASES = list(itertools.product((torch.bfloat16, torch.float32), (2, 3), (False, True), (False, True),
                                       (False, True), (False, True)))  # fmt: skip


@pytest.mark.parametrize("dtype,ndim,has_weight,has_residual,given,with_rstd", FORWARD_CASES)
def test_norm_forward_plan(dtype, ndim, has_weight, has_residual, given, with_rstd):
    variant = nf.NormForwardVariant(FMT[dtype], has_weight, has_residual)
    kernel = ManifestKernel(variant)
    out_scale = 0.75
    for given_ro in (given, False) if has_residual and given else (given,):
        p = plans.forward_plan(kernel, 0, dtype, ndim, has_weight, has_residual, EPS, out_scale, given, given_ro,
                               with_rstd)  # fmt: skip
        for i, shape in enumerate(FORWARD_SHAPES[ndim]):
            x = make_x(shape, dtype, row_pad=16 * i)
            weight = torch.randn(shape[-1]).to(dtype) if has_weight else None
            residual = make_x(shape, dtype, row_pad=32) if has_residual else None
            want = nf.norm_forward(x, weight, EPS, residual, out_scale, with_rstd=with_rstd)
            out = like(want[0]) if given else None
            residual_out = like(want[2]) if given_ro else None
            got, launches = trace(p, x, weight, residual, out, residual_out)
            assert_same_layouts(got, want)
            y, rstd, norm_input = got
            assert (y is out) if given else (y is not x)
            if not has_residual:
                assert norm_input is x
            elif given_ro:
                assert norm_input is residual_out
            assert [(k, grid) for k, grid, *_ in launches] == [(0, (x.shape[:-1].numel(), 1, 1))]
            ro = norm_input if has_residual else None
            assert params_of(kernel, launches[0]) == forward_params(x, weight, residual, y, ro, rstd, out_scale)
        # what the Python path rejects or a plan leaves to it
        x = make_x(FORWARD_SHAPES[ndim][1], dtype)
        weight = torch.randn(x.shape[-1]).to(dtype) if has_weight else None
        residual = torch.randn(x.shape).to(dtype) if has_residual else None
        out = torch.empty_like(x) if given else None
        residual_out = torch.empty_like(x) if given_ro else None
        args = [x, weight, residual, out, residual_out]
        assert trace(p, *args)[0] is not NotImplemented
        for i, bad in enumerate(bad_like_x(x)):
            assert trace(p, bad, *args[1:])[0] is NotImplemented, i
        if has_weight:
            other = weight.float() if dtype == torch.bfloat16 else weight.bfloat16()
            assert trace(p, x, other, *args[2:])[0] is NotImplemented
        if given:
            overlapping = torch.empty(x.shape[-1], dtype=dtype).expand(x.shape)
            assert trace(p, *args[:3], overlapping, residual_out)[0] is NotImplemented


def bad_like_x(x):
    """Variants of x the plans must refuse: misaligned data, a row stride not a multiple of 16
    bytes, no rows, hidden not a multiple of 16 or above 8192, the other dtype, a 2-D x for a
    3-D plan and the other way round."""
    dtype, shape = x.dtype, tuple(x.shape)
    units = 16 // x.element_size()
    yield torch.empty(x.numel() + 1, dtype=dtype)[1:].view(shape)
    yield torch.empty(*shape[:-1], shape[-1] + units // 2, dtype=dtype)[..., : shape[-1]]
    yield torch.empty(*shape[:-2], 0, shape[-1], dtype=dtype)
    yield torch.empty(*shape[:-1], 24, dtype=dtype)
    yield torch.empty(*shape[:-1], 8192 + 16, dtype=dtype)
    yield x.float() if dtype == torch.bfloat16 else x.bfloat16()
    yield x[0] if x.dim() == 3 else x[None]


# --- norm_forward_and_per_token_cast ---

SF_MODES = [(False, False, False), (True, False, False), (True, True, False), (False, False, True), (True, True, True)]
CAST_SHAPES = {2: [(1, 128), (37, 640), (6, 7168)], 3: [(1, 1, 128), (3, 5, 384), (2, 37, 640)]}
CAST_CASES = list(itertools.product((torch.bfloat16, torch.float32), (2, 3), (32, 128), SF_MODES, (False, True)))


def sf_for_out(want_sf, col_major, i):
    """A given SF: the CPU path's layout, or (row-major mode, every other shape) column-major."""
    if col_major or i % 2 == 0 or want_sf.dim() == 3:
        return like(want_sf)
    return torch.empty(tuple(reversed(want_sf.shape)), dtype=want_sf.dtype).t()


def cast_params(x, weight, residual, data, sf, out_bf16, residual_out, rstd, npc, round_sf, packed, mega=None,
                mega_block_m=0):  # fmt: skip
    p = forward_params(x, weight, residual, data, residual_out, rstd, 1.5)
    rows = x.shape[:-1].numel()
    per_sm = nfc.CAST_CTAS_PER_SM[FMT[x.dtype], residual is not None]
    sf_bs, sf_ts, sf_gs = nfc._sf_strides3(sf, packed)
    ob_bs, ob_rs = nf.rows_strides(out_bf16) if out_bf16 is not None else (0, 0)
    p.update(
        num_ctas=rows if per_sm is None else min(rows, per_sm * NUM_SMS),
        YB=(out_bf16 if out_bf16 is not None else x).data_ptr(), S=sf.data_ptr(), SP=sf.data_ptr(),
        amax_clamp=approx(tilebake.config.get_amax_clamp_for_quant("e4m3", False)), round_sf=int(round_sf),
        packed=int(packed), with_out_bf16=int(out_bf16 is not None), out_bf16_batch_stride=ob_bs,
        out_bf16_stride=ob_rs, sf_batch_stride=sf_bs, sf_stride_t=sf_ts, sf_stride_g=sf_gs,
        MM=(mega if mega is not None else sf).data_ptr(), mm_rows=mega.stride(1) if mega is not None else 0,
        mega_block_m=mega_block_m, mega_aligned_block_m=-(-mega_block_m // 128) * 128,
    )  # fmt: skip
    return p


def cast_plan(dtype, ndim, has_weight, has_residual, npc, sf_mode, given, with_bf16, given_ro, with_rstd,
              mega_block_m=0):  # fmt: skip
    round_sf, packed, col_major = sf_mode
    kernel = ManifestKernel(nfc.NormForwardCastVariant(FMT[dtype], has_weight, has_residual, npc))
    amax_clamp = tilebake.config.get_amax_clamp_for_quant("e4m3", False)
    p = plans.cast_plan(kernel, 0, dtype, ndim, has_weight, has_residual, EPS, 1.5, npc, col_major, round_sf,
                        packed, with_bf16, given, given and with_bf16, given_ro, mega_block_m, with_rstd, amax_clamp,
                        NUM_SMS)  # fmt: skip
    return kernel, p


@pytest.mark.parametrize("dtype,ndim,npc,sf_mode,given", CAST_CASES)
def test_norm_forward_and_per_token_cast_plan(dtype, ndim, npc, sf_mode, given):
    round_sf, packed, col_major = sf_mode
    for flags in ((True, True, True, True), (False, False, False, False), (True, False, True, False)):
        has_weight, has_residual, with_bf16, with_rstd = flags
        given_ro = given and has_residual
        kernel, p = cast_plan(dtype, ndim, has_weight, has_residual, npc, sf_mode, given, with_bf16, given_ro,
                              with_rstd)  # fmt: skip
        for i, shape in enumerate(CAST_SHAPES[ndim]):
            x = make_x(shape, dtype, row_pad=16 * i)
            weight = torch.randn(shape[-1]).to(dtype) if has_weight else None
            residual = make_x(shape, dtype) if has_residual else None
            kwargs = dict(residual=residual, out_scale=1.5, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
                          use_packed_ue8m0=packed, with_out_bf16=with_bf16, with_rstd=with_rstd)  # fmt: skip
            want = nfc.norm_forward_and_per_token_cast(x, weight, EPS, "e4m3", npc, **kwargs)
            out = (like(want[0][0]), sf_for_out(want[0][1], col_major, i)) if given else None
            out_bf16 = like(want[1]) if given and with_bf16 else None
            residual_out = like(want[3]) if given_ro else None
            args = [weight, residual, out, out_bf16, residual_out, None]
            got, launches = trace(p, x, *args)
            if given and out[1].stride() != want[0][1].stride():
                want = ((want[0][0], out[1]), *want[1:])
            assert_same_layouts(got, want)
            (data, sf), y_bf16, rstd, norm_input = got
            if given:
                assert data is out[0] and sf is out[1] and y_bf16 is (out_bf16 if with_bf16 else None)
            if not has_residual:
                assert norm_input is x
            elif given_ro:
                assert norm_input is residual_out
            ro = norm_input if has_residual else None
            want_params = cast_params(x, weight, residual, data, sf, y_bf16, ro, rstd, npc, round_sf, packed)
            assert params_of(kernel, launches[0]) == want_params
            assert launches[0][1] == (want_params["num_ctas"], 1, 1)
            if i != 1:
                continue
            for k, bad in enumerate(bad_like_x(x)):
                assert trace(p, bad, *args)[0] is NotImplemented, k
            if given:  # a part of out= None (the Python path allocates it), or a list
                assert trace(p, x, weight, residual, (out[0], None), *args[3:])[0] is NotImplemented
                assert trace(p, x, weight, residual, [*out], *args[3:])[0] is NotImplemented


def test_cast_plan_refuses_what_the_python_path_refuses():
    for sf_mode in SF_MODES:
        _, p = cast_plan(torch.bfloat16, 2, False, False, 128, sf_mode, True, False, False, False)
        x = make_x((5, 384), torch.bfloat16)
        data = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
        sf = nfc._alloc_sf_rows(x, 3, sf_mode[1], sf_mode[2])
        assert trace(p, x, None, None, (data, sf), None, None, None)[0] is not NotImplemented
        x320 = make_x((5, 320), torch.bfloat16)  # hidden % 128
        assert trace(p, x320, None, None, (data, sf), None, None, None)[0] is NotImplemented
        other_dtype = sf.view(torch.int32 if sf.dtype == torch.float32 else torch.float32)
        bad_sfs = [sf[:1].expand(sf.shape), other_dtype]
        if sf_mode[2] and sf.shape[1] > 1:  # column-major SF with columns not 16 bytes apart
            bad_sfs.append(torch.empty(sf.shape[1], 6, dtype=sf.dtype).t()[:5])
        for bad in bad_sfs:
            assert trace(p, x, None, None, (data, bad), None, None, None)[0] is NotImplemented
        bad_data = torch.empty(5, 384 + 8, dtype=torch.float8_e4m3fn)[:, :384]
        assert trace(p, x, None, None, (bad_data, sf), None, None, None)[0] is NotImplemented


def mega_buffer(num_tokens, hidden, block_m, rows_extra=0):
    """An M-major int32 (T, H // 128) view of a (H // 128, padded rows) buffer."""
    rows = -(-num_tokens // block_m) * (-(-block_m // 128) * 128) + rows_extra
    return torch.full((hidden // 128, rows), -1, dtype=torch.int32).t()[:num_tokens]


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("packed", (False, True))
def test_cast_plan_with_mega_moe_sf(dtype, packed):
    sf_mode = (True, packed, False)
    for num_tokens, block_m in ((1, 64), (127, 64), (300, 200)):
        kernel, p = cast_plan(dtype, 2, False, False, 32, sf_mode, False, True, False, False, block_m)
        x = make_x((num_tokens, 1024), dtype)
        mega = mega_buffer(num_tokens, 1024, block_m)
        want = nfc.norm_forward_and_per_token_cast(
            x, None, EPS, "e4m3", 32, out_scale=1.5, round_sf=True, use_packed_ue8m0=packed, with_out_bf16=True,
            mega_moe_sf=mega_buffer(num_tokens, 1024, block_m), mega_moe_block_m=block_m,
        )  # fmt: skip
        got, launches = trace(p, x, None, None, None, None, None, mega)
        assert_same_layouts(got, want)
        (data, sf), y_bf16, rstd, _ = got
        assert params_of(kernel, launches[0]) == cast_params(
            x, None, None, data, sf, y_bf16, None, rstd, 32, True, packed, mega, block_m
        )
        too_few_rows = torch.empty(8, mega.stride(1) - 1, dtype=torch.int32).t()[:num_tokens]
        assert trace(p, x, None, None, None, None, None, too_few_rows)[0] is NotImplemented
        assert trace(p, x, None, None, None, None, None, None)[0] is NotImplemented
        assert trace(p, make_x((num_tokens, 1088), dtype), None, None, None, None, None, mega)[0] is NotImplemented


# --- norm_backward ---

BACKWARD_CASES = list(itertools.product((torch.bfloat16, torch.float32), (False, True), (False, True), (False, True)))


@pytest.mark.parametrize("dtype,has_weight,has_rog,given_wg", BACKWARD_CASES)
def test_norm_backward_plan(dtype, has_weight, has_rog, given_wg):
    if given_wg and not has_weight:
        pytest.skip("weight_grad needs a weight (the Python path raises)")
    kernel = ManifestKernel(nb.NormBackwardVariant(FMT[dtype], has_weight, has_rog))
    wg_dtype = torch.float32 if given_wg else None
    reduce = ManifestKernel(nb.NormBackwardReduceVariant(FMT[wg_dtype or dtype]))
    p = plans.backward_plan(kernel, reduce, 0, dtype, has_weight, has_rog, 1.25, wg_dtype, NUM_SMS)
    for i, (num_tokens, hidden) in enumerate(((1, 32), (7, 4096), (300, 256))):
        x, g = make_x((num_tokens, hidden), dtype, 16 * i), make_x((num_tokens, hidden), dtype, 32)
        weight = torch.randn(hidden).to(dtype) if has_weight else None
        rstd = torch.rand(num_tokens) + 0.5
        rog = make_x((num_tokens, hidden), dtype) if has_rog else None
        wg = torch.zeros(hidden) if given_wg else None
        (x_grad, dw), launches = trace(p, g, x, weight, rstd, rog, wg)
        want = nb.norm_backward(g, x, weight, rstd, rog, 1.25)
        assert_same_layouts(x_grad, want[0])
        num_ctas = min(nb.CTAS_PER_SM[dtype] * NUM_SMS, num_tokens)
        assert len(launches) == (2 if has_weight else 1)
        if has_weight:  # the partials' sum into the given buffer (in place) or a new one in the weight's dtype
            partials = launches[0][4][kernel.spec[0].index("P")]
            assert dw is wg if given_wg else (dw.dtype, dw.shape, dw.stride()) == (dtype, (hidden,), (1,))
            assert params_of(reduce, launches[1]) == dict(
                P=partials, OUT=dw.data_ptr(), num_partials=num_ctas, num_cols=hidden, accumulate=int(given_wg)
            )
        else:
            assert dw is None
        want_params = dict(
            G=g.data_ptr(), X=x.data_ptr(), RSTD=rstd.data_ptr(), DX=x_grad.data_ptr(), out_scale=approx(1.25),
            num_tokens=num_tokens, hidden=hidden, num_ctas=num_ctas, out_grad_stride=nf.rows_strides(g)[1],
            x_stride=nf.rows_strides(x)[1], x_grad_stride=nf.rows_strides(x_grad)[1],
        )  # fmt: skip
        if has_weight:
            want_params.update(W=weight.data_ptr(), P=partials)
        if has_rog:
            want_params.update(ROG=rog.data_ptr(), residual_out_grad_stride=nf.rows_strides(rog)[1])
        assert params_of(kernel, launches[0]) == want_params
        assert launches[0][1] == (num_ctas, 1, 1)
    args = [g, x, weight, rstd, rog, wg]
    assert trace(p, *args)[0] is not NotImplemented
    for i, bad in enumerate(bad_like_x(x)):
        if bad.dim() == 2 and bad.shape[-1] % 32 == 0 and bad.shape[0] == x.shape[0]:
            assert trace(p, g, bad, *args[2:])[0] is NotImplemented, i
    assert trace(p, g, make_x((300, 240), dtype), *args[2:])[0] is NotImplemented  # hidden % 32
    assert trace(p, g, x, weight, rstd[:-1], *args[4:])[0] is NotImplemented
    assert trace(p, g, x, weight, torch.rand(2 * 300)[::2], *args[4:])[0] is NotImplemented
    if given_wg:
        assert trace(p, *args[:5], torch.zeros(hidden // 2))[0] is NotImplemented


# --- on a GPU: the second call of a key takes its plan, with the first call's bytes ---


class _Lookups(dict):
    """An op's plan cache recording whether each lookup found a plan."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __getitem__(self, key):
        self.found.append(key in self)
        return super().__getitem__(key)


@pytest.mark.gpu
def test_gpu_second_calls_take_their_plans(monkeypatch):
    from tilebake._runtime import plan

    def twice(module, cache, fn):
        lookups, ran = _Lookups(), []
        monkeypatch.setattr(module, cache, lookups)
        first = fn()  # the Python path, which builds the plan (and sets plan.run to the native call)
        native_run = plan.run
        monkeypatch.setattr(plan, "run", lambda *a: ran.append(native_run(*a)) or ran[-1])
        second = fn()
        assert lookups.found == [False, True], lookups.found
        assert len(ran) == 1 and ran[0] is not NotImplemented, "the plan sent the call to the Python path"
        for a, b in zip(torch.utils._pytree.tree_leaves(first), torch.utils._pytree.tree_leaves(second)):
            if a is None or b is None:
                assert a is b
                continue
            assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
            if a.dtype == torch.float8_e4m3fn:
                a, b = a.view(torch.uint8), b.view(torch.uint8)
            assert torch.equal(a, b)

    x = make_x((37, 640), torch.bfloat16).cuda()
    weight, residual = torch.randn(640).bfloat16().cuda(), make_x((37, 640), torch.bfloat16).cuda()
    twice(nf, "_FORWARD_PLANS", lambda: nf.norm_forward(x, weight, EPS, residual, 0.5, with_rstd=True))
    x3 = x.view(1, 37, 640)
    out = torch.empty_like(x3)
    twice(nf, "_FORWARD_PLANS", lambda: nf.norm_forward(x3, None, EPS, out=out)[:2])
    twice(nfc, "_CAST_PLANS", lambda: nfc.norm_forward_and_per_token_cast(
        x, weight, EPS, "e4m3", 32, residual, use_tma_aligned_col_major_sf=True, round_sf=True,
        use_packed_ue8m0=True, with_out_bf16=True, with_rstd=True))  # fmt: skip
    _, rstd, _ = nf.norm_forward(x, weight, EPS, with_rstd=True)
    twice(nb, "_PLANS", lambda: nb.norm_backward(residual, x, weight, rstd, residual, 1.5))


def test_planned_keys_still_trace_under_torch_compile(monkeypatch):
    """With a plan for each call's key (as after eager CUDA calls), the lookups find them (the
    keys are those the functions compute) and fullgraph=True still traces the torch.library nodes."""
    dtype = torch.bfloat16
    x, w, r = make_x((33, 256), dtype), torch.randn(256).to(dtype), make_x((33, 256), dtype)
    fw = ManifestKernel(nf.NormForwardVariant("bf16", True, False))
    bw = ManifestKernel(nb.NormBackwardVariant("bf16", True, False))
    bw_reduce = ManifestKernel(nb.NormBackwardReduceVariant("bf16"))
    caches = {name: _Lookups() for name in ("fw", "cast", "bw")}
    monkeypatch.setattr(nf, "_FORWARD_PLANS", caches["fw"])
    monkeypatch.setattr(nfc, "_CAST_PLANS", caches["cast"])
    monkeypatch.setattr(nb, "_PLANS", caches["bw"])
    caches["fw"][dtype, 2, False, EPS, float, True, 1.0, float, True, True, True] = plans.forward_plan(
        fw, 0, dtype, 2, True, False, EPS, 1.0, False, False, True
    )
    caches["cast"][dtype, 2, False, EPS, float, "e4m3", 32, False, 0.5, float, True, True, True, True, True, True,
                   True, True, 0, int, False] = cast_plan(dtype, 2, True, True, 32, (True, True, True), False, True,
                                                          False, False)[1]  # fmt: skip
    caches["bw"][dtype, False, True, 1.5, float, True] = plans.backward_plan(
        bw, bw_reduce, 0, dtype, True, False, 1.5, None, NUM_SMS
    )

    def ops(x, w, r):
        y, rstd, _ = nf.norm_forward(x, w, EPS, with_rstd=True)
        q = nfc.norm_forward_and_per_token_cast(x, w, EPS, "e4m3", 32, r, 0.5, True, True, True, with_out_bf16=True)
        return y, q, nb.norm_backward(r, x, w, rstd, None, 1.5)

    eager = ops(x, w, r)
    assert [c.found for c in caches.values()] == [[True], [True], [True]]  # CPU tensors: the Python path
    for module, name, key in ((nf, "_FORWARD_PLANS", "fw"), (nfc, "_CAST_PLANS", "cast"), (nb, "_PLANS", "bw")):
        monkeypatch.setattr(module, name, dict(caches[key]))  # plain dicts: no side effects for dynamo
    compiled = torch.compile(ops, fullgraph=True, backend="aot_eager")(x, w, r)
    for a, b in zip(torch.utils._pytree.tree_leaves(eager), torch.utils._pytree.tree_leaves(compiled)):
        if a is None or b is None:
            assert a is b
            continue
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        if a.dtype == torch.float8_e4m3fn:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b)
