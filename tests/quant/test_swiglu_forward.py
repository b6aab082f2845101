"""swiglu_forward / swiglu_forward_and_per_token_cast: argument checks, the CPU path and 2.1.0's
semantics (CPU: every row computed, s only with the weights, e = w * s once per row), the
reference against float64 math, and bit-exact GPU results against the reference evaluated on
the same CUDA device (tilebake.torch.swiglu_forward + tilebake.torch.cast): outputs, SF and
clamp counts."""

import math

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.swiglu_inputs import division_domain_x, gpu_shapes, make_x, poison_allocator, psum_layout, shape_id

F = tilebake.quant


def reference(x, fmt, npc=None, psum=None, weights=None, scale=None, clamp=None, counts=None, sf_mode=(False, False),
              col=False):  # fmt: skip
    y = tilebake.torch.swiglu_forward(x, psum, weights, scale, clamp, counts, tilebake.config.get_token_alignment())
    if fmt in ("bf16", "fp32"):
        return y.to({"bf16": torch.bfloat16, "fp32": torch.float32}[fmt])
    return tilebake.torch.cast(
        y, "e4m3", (1, npc), round_sf=sf_mode[0], use_packed_ue8m0=sf_mode[1], use_tma_aligned_col_major_sf=col
    )


def run(x, fmt, npc=None, psum=None, weights=None, scale=None, clamp=None, counts=None, sf_mode=(False, False),
        col=False):  # fmt: skip
    if fmt in ("bf16", "fp32"):
        return F.swiglu_forward(x, fmt, psum, weights, scale, clamp, counts)
    return F.swiglu_forward_and_per_token_cast(
        x, fmt, npc, psum, weights, scale, col, sf_mode[0], sf_mode[1], clamp, counts
    )


def check(x, fmt, npc=None, psum=None, weights=None, scale=None, clamp=None, sf_mode=(False, False), col=False):
    """Kernel (or CPU path) against the reference; clamped_count is passed with psum or a clamp."""
    counts = torch.full((4,), 7, dtype=torch.int64, device=x.device)  # accumulated into, not overwritten
    expected_counts = counts.clone()
    with_counts = psum is not None or clamp is not None
    expected = reference(x, fmt, npc, psum, weights, scale, clamp, expected_counts if with_counts else None,
                         sf_mode, col)  # fmt: skip
    poison_allocator(x.device)
    got = run(x, fmt, npc, psum, weights, scale, clamp, counts if with_counts else None, sf_mode, col)
    if fmt in ("bf16", "fp32"):
        assert_bytes_equal(got, expected, "y")
    else:
        assert_bytes_equal(got[0], expected[0], "data")
        assert_bytes_equal(got[1], expected[1], "sf")
        assert got[1].stride() == expected[1].stride() or got[1].shape[0] <= 1, (got[1].stride(), expected[1].stride())
    assert_bytes_equal(counts, expected_counts, "clamped_count")
    return got


FORMATS = [
    ("bf16", None, (False, False), False),
    ("fp32", None, (False, False), False),
    ("e4m3", 32, (False, False), False),
    ("e4m3", 128, (False, False), True),
    ("e4m3", 128, (True, False), False),
    ("e4m3", 32, (True, True), True),
    ("e4m3", 128, (True, True), False),
]
FORMAT_IDS = [f"{f}{'' if n is None else n}{'-round' * r}{'-packed' * p}{'-col' * c}" for f, n, (r, p), c in FORMATS]


# --- CPU: the reference, the slow path and argument checks ---


def test_reference_matches_float64_formula():
    x = make_x(65, 2 * 192, torch.float32, "cpu")
    w = torch.rand(65)
    c, s = 3.0, 2.5
    y = tilebake.torch.swiglu_forward(x, None, w, s, c)
    x64 = x.double()
    left, right = x64[:, :192].clamp(max=c), x64[:, 192:].clamp(-c, c)
    y64 = torch.nn.functional.silu(left) * right * w.double()[:, None] * s
    torch.testing.assert_close(y.double(), y64, rtol=4e-6, atol=1e-30)


def test_reference_psum_padding_and_counts():
    """The psum layout only selects the rows clamped_count counts: every row's output is
    computed, padding rows and rows past the last expert included (2.1.0 does)."""
    psum, rows = psum_layout([3, 0, 130, 0, 5], extra_rows=7)
    mapping = tilebake.torch.get_mapping_from_psum(psum, rows, 128)
    assert mapping.tolist() == [0] * 3 + [-1] * 125 + [2] * 130 + [-1] * 126 + [4] * 5 + [-1] * (123 + 7)
    x = make_x(rows, 128, torch.float32, "cpu")
    w = torch.rand(rows)
    counts = torch.zeros(4, dtype=torch.int64)
    y = tilebake.torch.swiglu_forward(x, psum, w, 2.0, 1.0, counts)
    valid = mapping >= 0
    assert (y[~valid] != 0).any()
    assert torch.equal(y, tilebake.torch.swiglu_forward(x, None, w, 2.0, 1.0))
    left, right = x[valid, :64], x[valid, 64:]
    assert counts.tolist() == [(left > 1).sum(), (right > 1).sum(), (right < -1).sum(), int(valid.sum()) * 64]


def test_reference_arithmetic_is_2_1_0s():
    """out = (l / (1 + exp(-l))) * r, times e = w * s formed once per row; s is not applied
    without weights. ((act * w) * s, the old order, differs in some elements.)"""
    x = make_x(257, 2 * 192, torch.float32, "cpu")
    w, s = torch.rand(257) * 2 - 0.5, 1.7
    left, right = x[:, :192], x[:, 192:]
    act = left / (1 + torch.exp(-left)) * right
    e = (w * torch.tensor(s))[:, None]
    y = tilebake.torch.swiglu_forward(x, None, w, s)
    assert torch.equal(y, act * e)
    assert not torch.equal(y, act * w[:, None] * torch.tensor(s))
    assert torch.equal(tilebake.torch.swiglu_forward(x, None, None, s), act)
    assert torch.equal(tilebake.torch.swiglu_forward(x), act)


@pytest.mark.parametrize("cast", [False, True], ids=["plain", "cast"])
def test_cpu_op_semantics(cast):
    """The public ops (CPU path): padding rows computed, routed_scaling_factor ignored without
    topk_weights, clamped_count over the valid rows only."""
    psum, rows = psum_layout([5, 0, 130], extra_rows=3)
    x = make_x(rows, 2 * 128, torch.bfloat16, "cpu")
    counts, counts_all = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    with_psum = _call(cast, x, fmt="fp32" if not cast else None, psum=psum, clamp=0.5, counts=counts)
    no_psum = _call(cast, x, fmt="fp32" if not cast else None, clamp=0.5, counts=counts_all)
    for a, b in zip(torch.utils._pytree.tree_leaves(with_psum), torch.utils._pytree.tree_leaves(no_psum)):
        assert_bytes_equal(a, b, "output")
    assert counts[3] == (5 + 130) * 128 and counts_all[3] == rows * 128 and (counts <= counts_all).all()
    scaled = _call(cast, x, fmt="fp32" if not cast else None, scale=3.0)
    plain = _call(cast, x, fmt="fp32" if not cast else None)
    for a, b in zip(torch.utils._pytree.tree_leaves(scaled), torch.utils._pytree.tree_leaves(plain)):
        assert_bytes_equal(a, b, "output")
    if not cast:
        assert (with_psum[5:128] != 0).any()  # a padding row's output is computed


@pytest.mark.parametrize("fmt,npc,sf_mode,col", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_path_matches_reference(dtype, fmt, npc, sf_mode, col):
    psum, rows = psum_layout([5, 0, 130, 17], extra_rows=3)
    x = make_x(rows, 2 * 192, dtype, "cpu")
    check(x, fmt, npc, psum, torch.randn(rows), 0.75, 2.0, sf_mode, col)
    check(make_x(9, 128, dtype, "cpu"), fmt, npc, sf_mode=sf_mode, col=col)


def test_cpu_empty():
    x = torch.empty(0, 256, dtype=torch.bfloat16)
    assert F.swiglu_forward(x, "bf16").shape == (0, 128)
    data, sf = F.swiglu_forward_and_per_token_cast(x, "e4m3", 128)
    assert data.shape == (0, 128) and sf.shape == (0, 1)


X = torch.zeros(4, 256, dtype=torch.bfloat16)
BAD_CALLS = [
    (dict(x=torch.zeros(4, 256, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x="x"), TypeError, "x must be a torch.Tensor"),
    (dict(x=torch.zeros(4, 192, dtype=torch.bfloat16)), ValueError, "2 \\* hidden\\) must be a multiple of 128"),
    (dict(x=torch.zeros(4, 256, 1, dtype=torch.bfloat16)), ValueError, "x must be 2-D"),
    (dict(x=torch.zeros(256, 4, dtype=torch.bfloat16).t()), ValueError, "contiguous in its last dim"),
    (dict(x=torch.zeros(4, 260, dtype=torch.bfloat16)[:, :256]), ValueError, "row stride must be a multiple of 16"),
    (dict(psum=torch.tensor([4], dtype=torch.int64)), TypeError, "psum_num_tokens_per_expert must be torch.int32"),
    (dict(psum=torch.zeros(2, 2, dtype=torch.int32)), ValueError, "psum_num_tokens_per_expert must be 1-D"),
    (dict(psum=torch.zeros(4, dtype=torch.int32)[::2]), ValueError, "psum_num_tokens_per_expert must be contiguous"),
    (dict(weights=torch.ones(4, dtype=torch.bfloat16)), TypeError, "topk_weights must be torch.float32"),
    (dict(weights=torch.ones(5)), ValueError, "topk_weights must have shape \\(4,\\)"),
    (dict(weights=torch.ones(8)[::2]), ValueError, "topk_weights must be contiguous"),
    (dict(scale="2"), TypeError, "routed_scaling_factor must be None or a float"),
    (dict(scale=math.nan), ValueError, "routed_scaling_factor must be None or a finite float"),
    (dict(clamp=-1.0), ValueError, "clamp_value must be None or a positive finite float"),
    (dict(clamp=math.inf), ValueError, "clamp_value must be None or a positive finite float"),
    (dict(counts=torch.zeros(4, dtype=torch.int32)), ValueError, "clamped_count must be int64 of shape \\(4,\\)"),
    (dict(counts=torch.zeros(3, dtype=torch.int64)), ValueError, "clamped_count must be int64 of shape \\(4,\\)"),
    (dict(counts=[0, 0, 0, 0]), TypeError, "clamped_count must be None or a torch.Tensor"),
]
CAST_BAD_CALLS = [
    (dict(fmt="e5m2"), ValueError, "fmt must be one of"),
    (dict(npc=64), ValueError, "num_per_channels must be one of \\(32, 128\\)"),
    (dict(npc=True), ValueError, "num_per_channels must be one of"),
    (dict(sf_mode=(False, True)), ValueError, "needs round_sf=True"),
]


def _call(cast, x=X, fmt=None, npc=128, psum=None, weights=None, scale=None, clamp=None, counts=None,
          sf_mode=(False, False)):  # fmt: skip
    if cast:
        return F.swiglu_forward_and_per_token_cast(
            x, fmt or "e4m3", npc, psum, weights, scale, False, sf_mode[0], sf_mode[1], clamp, counts
        )
    return F.swiglu_forward(x, fmt or "bf16", psum, weights, scale, clamp, counts)


@pytest.mark.parametrize("cast", [False, True], ids=["plain", "cast"])
@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(cast, overrides, exc, message):
    with pytest.raises(exc, match=message):
        _call(cast, **overrides)


@pytest.mark.parametrize("overrides,exc,message", CAST_BAD_CALLS, ids=[m for _, _, m in CAST_BAD_CALLS])
def test_cast_rejects_bad_arguments(overrides, exc, message):
    with pytest.raises(exc, match=message):
        _call(True, **overrides)


def test_plain_rejects_bad_fmt():
    with pytest.raises(ValueError, match="fmt must be one of \\('bf16', 'fp32'\\)"):
        F.swiglu_forward(X, "e4m3")


# --- GPU: bit-exact against the reference ---


SHAPES = gpu_shapes(1)
SHAPE_IDS = [shape_id(s) for s in SHAPES]


@pytest.mark.gpu
@pytest.mark.parametrize("options", ["all", "none"])
@pytest.mark.parametrize("fmt,npc,sf_mode,col", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_gpu_bit_exact(shape, dtype, fmt, npc, sf_mode, col, options):
    """All options (psum, topk weights, s, clamp) or none, against the reference on the GPU."""
    rows, hidden, psum = shape
    x = make_x(rows, 2 * hidden, dtype, "cuda")
    if options == "all":
        weights = torch.rand(rows, device="cuda") * 2 - 0.5
        check(x, fmt, npc, psum.cuda(), weights, 1.5, 4.0, sf_mode, col)
    else:
        check(x, fmt, npc, sf_mode=sf_mode, col=col)


@pytest.mark.gpu
@pytest.mark.parametrize("sf_mode", [(False, False), (True, False), (True, True)], ids=["plain", "round", "packed"])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_every_cast_variant(dtype, npc, sf_mode):
    """Every (input dtype, block width, SF mode) kernel of the fused cast once (FORMATS leaves
    npc 32 with round_sf alone to no test)."""
    check(make_x(37, 512, dtype, "cuda"), "e4m3", npc, sf_mode=sf_mode)


OPTIONS = ["weights", "weights-scale", "scale", "clamp", "psum-clamp", "psum-weights-scale"]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,npc,sf_mode,col", FORMATS[:3] + FORMATS[-1:], ids=FORMAT_IDS[:3] + FORMAT_IDS[-1:])
@pytest.mark.parametrize("options", OPTIONS)
def test_gpu_option_subsets(options, fmt, npc, sf_mode, col):
    """Subsets of the optional arguments (the kernel's null-equivalents for the others; s alone
    is ignored), on strided rows (x sliced from a wider buffer)."""
    psum, rows = psum_layout([100, 0, 300, 1], extra_rows=5, device="cuda")
    x = make_x(rows, 2 * 1024 + 64, torch.bfloat16, "cuda")[:, : 2 * 1024]
    kwargs = dict(
        psum=psum if "psum" in options else None,
        weights=torch.randn(rows, device="cuda") if "weights" in options else None,
        scale=0.3 if "scale" in options else None,
        clamp=0.5 if "clamp" in options else None,
    )
    check(x, fmt, npc, sf_mode=sf_mode, col=col, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_act_exact_over_the_division_domain(dtype):
    """out = x / (1 + exp(-x)) bit for bit (x_right = 1) for every finite bf16 x_left, or 2^20 fp32
    values over all binades: the kernel's division without a slow path (|x| < 64) and its fallback."""
    check(division_domain_x(dtype, "cuda"), "fp32")


def infinite_group_x(device):
    """Rows whose SwiGLU output holds +inf, -inf or both in one group (x_right = +-inf next to
    a positive x_left), and a clean row."""
    x = make_x(4, 2 * 256, torch.float32, device)
    x[:, :256] = x[:, :256].abs() + 1  # silu > 0: the products keep the sign of x_right
    x[1, 256 + 3] = math.inf
    x[2, 256 + 200] = -math.inf
    x[3, 256 + 5], x[3, 256 + 6] = math.inf, -math.inf
    return x


def test_cpu_infinite_group_contract():
    """The reference's contract for a group holding inf (as tilebake.torch.cast's): its SF is
    inf and its inverse 0, so the inf itself becomes NaN and the group's finite values +-0."""
    for round_sf in (False, True):
        data, sf = F.swiglu_forward_and_per_token_cast(infinite_group_x("cpu"), "e4m3", 128, round_sf=round_sf)
        group = data[1, :128].float()
        assert sf[1, 0] == math.inf and torch.isfinite(sf[1, 1])
        assert group[3].isnan() and (group[torch.arange(128) != 3] == 0).all()
        assert torch.isfinite(sf[0]).all() and not data[0].float().isnan().any()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,npc,sf_mode,col", FORMATS[2:], ids=FORMAT_IDS[2:])
def test_gpu_infinite_group(fmt, npc, sf_mode, col):
    """Data and SF bytes equal the reference's where a group's output holds inf."""
    check(infinite_group_x("cuda"), fmt, npc, sf_mode=sf_mode, col=col)


@pytest.mark.gpu
def test_gpu_token_alignment_is_runtime():
    """The clamp counts take the runtime alignment's valid rows (10 + 70 + 64 of them)."""
    tilebake.config.set_token_alignment(64)
    psum, rows = psum_layout([10, 70, 0, 64], alignment=64, extra_rows=3, device="cuda")
    x = make_x(rows, 256, torch.bfloat16, "cuda")
    counts = torch.zeros(4, dtype=torch.int64, device="cuda")
    check(x, "bf16", psum=psum, clamp=1.0)
    F.swiglu_forward(x, "bf16", psum, clamp_value=1.0, clamped_count=counts)
    assert int(counts[3]) == (10 + 70 + 64) * 128


@pytest.mark.gpu
def test_gpu_empty_and_nan_free():
    x = torch.empty(0, 256, dtype=torch.bfloat16, device="cuda")
    assert F.swiglu_forward(x, "bf16").shape == (0, 128)
    data, sf = F.swiglu_forward_and_per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True)
    assert data.shape == (0, 128) and sf.shape == (0, 1)
    x = make_x(999, 2 * 7168, torch.bfloat16, "cuda")
    data, sf = F.swiglu_forward_and_per_token_cast(x, "e4m3", 128, clamp_value=10.0)
    assert not data.float().isnan().any() and not sf.isnan().any()


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    """The torch.library registrations (schemas + Meta shapes, clamped_count mutated in place)."""
    psum, rows = psum_layout([5, 0, 130], extra_rows=3)
    x, w = make_x(rows, 256, torch.bfloat16, "cpu"), torch.rand(rows)

    def f(x, psum, w, counts):
        y = F.swiglu_forward(x, "fp32", psum, w, 2.0, 1.0, counts)
        q = F.swiglu_forward_and_per_token_cast(x, "e4m3", 32, psum, w, 2.0, True, True, True, 1.0, counts)
        return y, q

    counts = torch.zeros(4, dtype=torch.int64)
    y, (data, sf) = torch.compile(f, fullgraph=True, backend="aot_eager")(x, psum, w, counts)
    expected_counts = torch.zeros(4, dtype=torch.int64)
    assert_bytes_equal(y, reference(x, "fp32", None, psum, w, 2.0, 1.0, expected_counts), "y")
    expected = reference(x, "e4m3", 32, psum, w, 2.0, 1.0, expected_counts, (True, True), True)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert sf.stride() == expected[1].stride()
    assert_bytes_equal(counts, expected_counts, "clamped_count")


@pytest.mark.gpu
def test_gpu_torch_compile_and_cuda_graph():
    """torch.compile(fullgraph=True) with inductor, then the same call captured in a CUDA graph
    (clamped_count accumulated in place in both)."""
    psum, rows = psum_layout([300, 0, 129], extra_rows=3, device="cuda")
    x, w = make_x(rows, 2 * 2048, torch.bfloat16, "cuda"), torch.rand(rows, device="cuda")

    def f(x, counts):
        return F.swiglu_forward_and_per_token_cast(x, "e4m3", 128, psum, w, 2.0, True, True, True, 3.0, counts)

    expected_counts = torch.zeros(4, dtype=torch.int64, device="cuda")
    expected = reference(x, "e4m3", 128, psum, w, 2.0, 3.0, expected_counts, (True, True), True)
    counts = torch.zeros(4, dtype=torch.int64, device="cuda")
    data, sf = torch.compile(f, fullgraph=True)(x, counts)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert_bytes_equal(counts, expected_counts, "clamped_count")
    f(x, counts)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        data, sf = f(x, counts)
    counts.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_bytes_equal(data, expected[0], "data (graph)")
    assert_bytes_equal(sf, expected[1], "sf (graph)")
    assert_bytes_equal(counts, expected_counts, "clamped_count (graph)")
