"""swiglu_backward / swiglu_backward_and_per_token_cast: argument checks, the CPU path and 2.1.0's
semantics (CPU: the returned tuples, empty inputs), and GPU results against the reference evaluated
on the same CUDA device (tilebake.torch.swiglu_backward + tilebake.torch.cast): x_grad, its FP8 copy
and SF, act_out bit-exact; weight_grad, a reduction summed in another order, within rtol 1e-5 of
sum_h |g * act| * |s|. The reference itself (float64 autograd, padding rows, the exact fma
emulation): test_swiglu_backward_reference.py."""

import math

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.swiglu_inputs import division_domain_x, gpu_shapes, make_x, poison_allocator, psum_layout, shape_id

F = tilebake.quant
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def quantize(x, npc):
    """An e4m3 forward input with fp32 (1, npc) scales, as the forward cast would produce."""
    return tilebake.torch.cast(x, "e4m3", (1, npc))


def reference(x, g, fmt, npc=None, psum=None, weights=None, scale=None, clamp=None, recompute=False,
              sf_mode=(False, False), col=False):  # fmt: skip
    """The expected outputs in the op's return order (weight_grad as the fp64-summed reference)."""
    outs = tilebake.torch.swiglu_backward(x, g, psum, weights, scale, clamp, tilebake.config.get_token_alignment(), npc)
    dx, wg, act = (outs[0], None, outs[1]) if weights is None else outs
    if npc is None:
        out = (dx.to(DTYPES[fmt]),)
    else:
        q = tilebake.torch.cast(
            dx, "e4m3", (1, npc), round_sf=sf_mode[0], use_packed_ue8m0=sf_mode[1], use_tma_aligned_col_major_sf=col
        )
        out = (dx.to(torch.bfloat16), q)
    if weights is not None:
        out += (wg,)
    if recompute:
        out += (act.to(g.dtype),)
    return out


def run(x, g, fmt, npc=None, psum=None, weights=None, scale=None, clamp=None, recompute=False,
        sf_mode=(False, False), col=False):  # fmt: skip
    if npc is None:
        return F.swiglu_backward(x, g, fmt, psum, weights, scale, clamp, recompute)
    return F.swiglu_backward_and_per_token_cast(
        x, g, fmt, npc, psum, weights, scale, col, sf_mode[0], sf_mode[1], clamp, recompute
    )


def weight_grad_bound(x, g, npc, psum, scale, clamp):
    """|kernel - exact| <= 1e-5 * |s| * sum_h |t * g| per row: fp32 summation of at most
    7168 / 64 = 112 terms a thread plus 6 shuffle/shared-memory levels has relative error at
    most (112 + 6) * 2^-24 < 1e-5 of the sum of magnitudes (and one rounding for * s)."""
    x32 = x.float() if isinstance(x, torch.Tensor) else x[0].float() * x[1].repeat_interleave(npc, dim=1)
    t = tilebake.torch.swiglu_forward(x32, psum, None, None, clamp, None, tilebake.config.get_token_alignment())
    return 1e-5 * abs(1.0 if scale is None else scale) * (t.double().abs() * g.double().abs()).sum(dim=1) + 1e-38


def check(x, g, fmt, npc=None, psum=None, weights=None, scale=None, clamp=None, recompute=False,
          sf_mode=(False, False), col=False):  # fmt: skip
    expected = reference(x, g, fmt, npc, psum, weights, scale, clamp, recompute, sf_mode, col)
    poison_allocator(g.device)
    got = run(x, g, fmt, npc, psum, weights, scale, clamp, recompute, sf_mode, col)
    assert isinstance(got, tuple) and len(got) == len(expected), (len(got), len(expected))
    assert_bytes_equal(got[0], expected[0], "x_grad")
    i = 1
    if npc is not None:
        assert_bytes_equal(got[1][0], expected[1][0], "x_grad_fp8")
        assert_bytes_equal(got[1][1], expected[1][1], "x_grad_fp8_sf")
        assert got[1][1].stride() == expected[1][1].stride() or got[1][1].shape[0] <= 1
        i = 2
    if weights is not None:
        wg, wg_ref = got[i], expected[i]
        assert wg.dtype == torch.float32 and wg.shape == wg_ref.shape
        assert not wg.isnan().any(), "weight_grad has NaN"
        bound = weight_grad_bound(x, g, npc, psum, scale, clamp)
        err = (wg.double() - wg_ref.double()).abs()
        ratio = err / bound
        assert torch.all(ratio <= 1), f"weight_grad: row {int(ratio.argmax())} is {float(ratio.max())}x the bound"
        assert torch.all(wg[wg_ref == 0] == 0), "weight_grad of padding rows must be 0"
        i += 1
    if recompute:
        assert_bytes_equal(got[i], expected[i], "act_out")
    return got


# --- CPU: the slow path and argument checks ---


CAST_MODES = [
    (32, (False, False), False),
    (128, (True, False), True),
    (128, (True, True), False),
    (32, (True, True), True),
]
CAST_IDS = [f"npc{n}{'-round' * r}{'-packed' * p}{'-col' * c}" for n, (r, p), c in CAST_MODES]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
def test_cpu_path_matches_reference(fmt, dtype):
    psum, rows = psum_layout([5, 0, 130], extra_rows=3)
    x, g = make_x(rows, 2 * 192, DTYPES[dtype], "cpu"), make_x(rows, 192, DTYPES[dtype], "cpu")
    check(x, g, fmt, None, psum, torch.randn(rows), 0.5, 3.0, True)
    check(x[:4], g[:4], fmt)


@pytest.mark.parametrize("npc,sf_mode,col", CAST_MODES, ids=CAST_IDS)
@pytest.mark.parametrize("grad_dtype", ["bf16", "fp32"])
def test_cpu_cast_path_matches_reference(grad_dtype, npc, sf_mode, col):
    psum, rows = psum_layout([5, 0, 130], extra_rows=3)
    x = quantize(make_x(rows, 2 * 192, torch.bfloat16, "cpu"), npc)
    g = make_x(rows, 192, DTYPES[grad_dtype], "cpu")
    check(x, g, "e4m3", npc, psum, torch.randn(rows), 0.5, 3.0, True, sf_mode, col)
    check(x, g, "e4m3", npc, sf_mode=sf_mode, col=col)


def test_cpu_empty():
    x, g = torch.empty(0, 256, dtype=torch.bfloat16), torch.empty(0, 128, dtype=torch.bfloat16)
    (dx,) = F.swiglu_backward(x, g, "bf16")
    assert dx.shape == (0, 256)
    dx, (q, sf), wg = F.swiglu_backward_and_per_token_cast(
        (x.to(torch.float8_e4m3fn), torch.empty(0, 2)), g, "e4m3", 128, topk_weights=torch.empty(0)
    )
    assert dx.shape == (0, 256) and q.shape == (0, 256) and sf.shape == (0, 2) and wg.shape == (0,)


@pytest.mark.parametrize("recompute", [False, True], ids=["", "recompute"])
@pytest.mark.parametrize("with_weights", [False, True], ids=["", "weights"])
def test_cpu_returned_tuples(with_weights, recompute):
    """api.md 1.2.2: x_grad, [(x_grad_fp8, sf)], [weight_grad if topk_weights], [act_out if
    do_recompute]."""
    x, g = make_x(5, 256, torch.bfloat16, "cpu"), make_x(5, 128, torch.bfloat16, "cpu")
    w = torch.rand(5) if with_weights else None
    plain = F.swiglu_backward(x, g, "fp32", None, w, 2.0, None, recompute)
    cast = F.swiglu_backward_and_per_token_cast(quantize(x, 32), g, "e4m3", 32, None, w, 2.0, do_recompute=recompute)
    assert len(plain) == 1 + with_weights + recompute and len(cast) == 2 + with_weights + recompute
    assert plain[0].dtype == torch.float32 and plain[0].shape == (5, 256)
    assert cast[0].dtype == torch.bfloat16 and cast[1][0].dtype == torch.float8_e4m3fn and cast[1][1].shape == (5, 8)
    for outs in (plain, cast):
        if with_weights:
            assert outs[-1 - recompute].dtype == torch.float32 and outs[-1 - recompute].shape == (5,)
        if recompute:
            assert outs[-1].dtype == torch.bfloat16 and outs[-1].shape == (5, 128)


X = torch.zeros(4, 256, dtype=torch.bfloat16)
G = torch.zeros(4, 128, dtype=torch.bfloat16)
Q = (torch.zeros(4, 256, dtype=torch.float8_e4m3fn), torch.ones(4, 2))
BAD_CALLS = [
    (dict(x=torch.zeros(4, 256, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x=torch.zeros(4, 192, dtype=torch.bfloat16)), ValueError, "2 \\* hidden\\) must be a multiple of 128"),
    (dict(g=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "act_x_grad must be bfloat16 or float32"),
    (dict(g=torch.zeros(4, 128, dtype=torch.float32)), TypeError, "act_x_grad must have x's dtype"),
    (dict(g=torch.zeros(4, 64, dtype=torch.bfloat16)), ValueError, "act_x_grad must have shape \\(4, 128\\)"),
    (dict(g=torch.zeros(4, 132, dtype=torch.bfloat16)[:, :128]), ValueError, "act_x_grad's row stride"),
    (dict(g="g"), TypeError, "act_x_grad must be a torch.Tensor"),
    (dict(fmt="e4m3"), ValueError, "fmt must be one of \\('bf16', 'fp32'\\)"),
    (dict(psum=torch.tensor([4], dtype=torch.int64)), TypeError, "psum_num_tokens_per_expert must be torch.int32"),
    (dict(weights=torch.ones(3)), ValueError, "topk_weights must have shape \\(4,\\)"),
    (dict(scale=math.inf), ValueError, "routed_scaling_factor must be None or a finite float"),
    (dict(clamp=0.0), ValueError, "clamp_value must be None or a positive finite float"),
]
CAST_BAD_CALLS = [
    (dict(x=X), TypeError, "x must be a \\(data, sf\\) tuple"),
    (dict(x=(X, Q[1])), TypeError, "x\\[0\\] must be torch.float8_e4m3fn"),
    (dict(x=(Q[0], torch.ones(4, 2, dtype=torch.int32))), NotImplementedError, "packed UE8M0"),
    (dict(x=(Q[0], torch.ones(4, 2, dtype=torch.bfloat16))), TypeError, "x\\[1\\] must be torch.float32"),
    (dict(x=(Q[0], torch.ones(4, 8))), ValueError, "x\\[1\\] must have shape \\(4, 2\\)"),
    (dict(x=(Q[0][:, :192], Q[1])), ValueError, "x\\[0\\].shape\\[1\\] \\(2 \\* hidden\\)"),
    (dict(fmt="bf16"), ValueError, "fmt must be one of \\('e4m3',\\)"),
    (dict(npc=16), ValueError, "num_per_channels must be one of \\(32, 128\\)"),
    (dict(sf_mode=(False, True)), ValueError, "needs round_sf=True"),
    (dict(g=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "act_x_grad must be bfloat16 or float32"),
    (dict(weights=torch.ones(4, dtype=torch.float64)), TypeError, "topk_weights must be torch.float32"),
    (dict(clamp="1"), TypeError, "clamp_value must be None or a float"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    a = dict(x=X, g=G, fmt="bf16", psum=None, weights=None, scale=None, clamp=None)
    a.update(overrides)
    with pytest.raises(exc, match=message):
        F.swiglu_backward(a["x"], a["g"], a["fmt"], a["psum"], a["weights"], a["scale"], a["clamp"])


@pytest.mark.parametrize("overrides,exc,message", CAST_BAD_CALLS, ids=[m for _, _, m in CAST_BAD_CALLS])
def test_cast_rejects_bad_arguments(overrides, exc, message):
    a = dict(x=Q, g=G, fmt="e4m3", npc=128, weights=None, clamp=None, sf_mode=(False, False))
    a.update(overrides)
    with pytest.raises(exc, match=message):
        F.swiglu_backward_and_per_token_cast(
            a["x"], a["g"], a["fmt"], a["npc"], None, a["weights"], None, False, *a["sf_mode"], a["clamp"]
        )


# --- GPU ---


SHAPES = gpu_shapes(2)
SHAPE_IDS = [shape_id(s) for s in SHAPES]


def all_or_none(options, rows, psum):
    """Keyword arguments: psum, topk weights, s, clamp and do_recompute, or none of them."""
    if options == "none":
        return {}
    weights = torch.rand(rows, device="cuda") * 2 - 0.5
    return dict(psum=psum.cuda(), weights=weights, scale=1.5, clamp=4.0, recompute=True)


@pytest.mark.gpu
@pytest.mark.parametrize("options", ["all", "none"])
@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_gpu_plain_bit_exact(shape, dtype, fmt, options):
    rows, hidden, psum = shape
    x, g = make_x(rows, 2 * hidden, DTYPES[dtype], "cuda"), make_x(rows, hidden, DTYPES[dtype], "cuda")
    check(x, g, fmt, None, **all_or_none(options, rows, psum))


@pytest.mark.gpu
@pytest.mark.parametrize("options", ["all", "none"])
@pytest.mark.parametrize("npc,sf_mode,col", CAST_MODES, ids=CAST_IDS)
@pytest.mark.parametrize("grad_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_gpu_cast_bit_exact(shape, grad_dtype, npc, sf_mode, col, options):
    rows, hidden, psum = shape
    x = quantize(make_x(rows, 2 * hidden, torch.bfloat16, "cuda"), npc)
    g = make_x(rows, hidden, DTYPES[grad_dtype], "cuda")
    check(x, g, "e4m3", npc, **all_or_none(options, rows, psum), sf_mode=sf_mode, col=col)


@pytest.mark.gpu
@pytest.mark.parametrize("sf_mode", [(False, False), (True, False), (True, True)], ids=["plain", "round", "packed"])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("grad_dtype", ["bf16", "fp32"])
def test_gpu_every_cast_variant(grad_dtype, npc, sf_mode):
    """Every (gradient dtype, block width, SF mode) kernel of the quantized-input backward once
    (CAST_MODES leaves three to no test)."""
    x = quantize(make_x(37, 512, torch.bfloat16, "cuda"), npc)
    check(x, make_x(37, 256, DTYPES[grad_dtype], "cuda"), "e4m3", npc, sf_mode=sf_mode)


OPTIONS = ["weights", "weights-scale", "scale", "clamp", "psum", "recompute", "psum-weights-recompute", "psum-clamp"]


@pytest.mark.gpu
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("cast", [False, True], ids=["plain", "cast"])
def test_gpu_option_subsets(cast, options):
    """Subsets of the optional arguments (s and psum alone are unused); strided rows of x and
    act_x_grad; a column-major input SF."""
    psum, rows = psum_layout([100, 0, 300, 1], extra_rows=5, device="cuda")
    hidden = 1024
    g = make_x(rows, hidden + 64, torch.bfloat16, "cuda")[:, :hidden]
    kwargs = dict(
        psum=psum if "psum" in options else None,
        weights=torch.randn(rows, device="cuda") if "weights" in options else None,
        scale=0.3 if "scale" in options else None,
        clamp=0.5 if "clamp" in options else None,
        recompute="recompute" in options,
    )
    if cast:
        data, sf = quantize(make_x(rows, 2 * hidden, torch.bfloat16, "cuda"), 128)
        wide = torch.empty(rows, 2 * hidden + 64, dtype=torch.float8_e4m3fn, device="cuda")[:, : 2 * hidden]
        wide.copy_(data)
        sf_col = torch.empty(sf.shape[1], rows, device="cuda").t()
        sf_col.copy_(sf)
        check((wide, sf_col), g, "e4m3", 128, sf_mode=(True, True), **kwargs)
    else:
        x = make_x(rows, 2 * hidden + 64, torch.bfloat16, "cuda")[:, : 2 * hidden]
        check(x, g, "bf16", **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gpu_exact_over_the_division_domain(dtype):
    """d x_left = sig * fma(x, 1 - sig, 1), d x_right = sig * x and act_out = x / t bit for bit
    (x_right = 1, act_x_grad = 1) for every finite bf16 x_left, or 2^20 fp32 values over all
    binades: the kernel's divisions (l / t and sig = 1 / t) without a slow path (|x| < 64) and
    their fallback."""
    x = division_domain_x(DTYPES[dtype], "cuda")
    g = torch.ones(x.shape[0], x.shape[1] // 2, dtype=DTYPES[dtype], device="cuda")
    check(x, g, "fp32", recompute=True)


@pytest.mark.gpu
def test_gpu_empty():
    x = torch.empty(0, 256, dtype=torch.bfloat16, device="cuda")
    g = torch.empty(0, 128, dtype=torch.bfloat16, device="cuda")
    dx, act = F.swiglu_backward(x, g, "bf16", do_recompute=True)
    assert dx.shape == (0, 256) and act.shape == (0, 128)


@pytest.mark.parametrize("with_options", [False, True], ids=["bare", "weights-recompute"])
def test_cpu_torch_compile_fullgraph_traces_without_breaks(with_options):
    """The torch.library registrations: fixed-arity ops whose optional outputs the public
    functions drop again."""
    psum, rows = psum_layout([5, 0, 130], extra_rows=3)
    x, g = make_x(rows, 256, torch.float32, "cpu"), make_x(rows, 128, torch.float32, "cpu")
    q = quantize(x, 128)
    w = torch.rand(rows) if with_options else None

    def f(x, q, g, psum, w):
        plain = F.swiglu_backward(x, g, "bf16", psum, w, 0.5, 2.0, with_options)
        cast = F.swiglu_backward_and_per_token_cast(
            q, g, "e4m3", 128, psum, w, 0.5, True, True, True, 2.0, with_options
        )
        return plain, cast

    plain, cast = torch.compile(f, fullgraph=True, backend="aot_eager")(x, q, g, psum, w)
    for got, expected in (
        (plain, reference(x, g, "bf16", None, psum, w, 0.5, 2.0, with_options)),
        (cast, reference(q, g, "e4m3", 128, psum, w, 0.5, 2.0, with_options, (True, True), True)),
    ):
        assert len(got) == len(expected)
        for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)):
            assert_bytes_equal(a, b, "output")
            assert a.stride() == b.stride() or a.dim() == 1


@pytest.mark.gpu
def test_gpu_torch_compile_and_cuda_graph():
    """torch.compile(fullgraph=True) with inductor, then the same calls captured in a CUDA graph."""
    psum, rows = psum_layout([300, 0, 129], extra_rows=3, device="cuda")
    q = quantize(make_x(rows, 2 * 2048, torch.bfloat16, "cuda"), 128)
    g = make_x(rows, 2048, torch.bfloat16, "cuda")
    w = torch.rand(rows, device="cuda")

    def f(q, g):
        return F.swiglu_backward_and_per_token_cast(q, g, "e4m3", 128, psum, w, 2.0, True, True, True, 3.0, True)

    expected = reference(q, g, "e4m3", 128, psum, w, 2.0, 3.0, True, (True, True), True)
    for got in (torch.compile(f, fullgraph=True)(q, g), f(q, g)):
        assert_bytes_equal(got[0], expected[0], "x_grad")
        assert_bytes_equal(got[1][0], expected[1][0], "x_grad_fp8")
        assert_bytes_equal(got[1][1], expected[1][1], "x_grad_fp8_sf")
        assert_bytes_equal(got[3], expected[3], "act_out")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = f(q, g)
    graph.replay()
    torch.cuda.synchronize()
    assert_bytes_equal(captured[0], expected[0], "x_grad (graph)")
    assert_bytes_equal(captured[1][0], expected[1][0], "x_grad_fp8 (graph)")
