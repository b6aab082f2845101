"""per_token_cast, e4m3 output with fp32 or UE8M0 (rounded, packed) scale factors in row- or
column-major layout: argument checks (CPU), the CPU path, torch.compile, and bit-exact GPU results
against the reference (tilebake.torch.cast, written to ../shared/spec/numerics.md), odd shapes,
poisoned outputs, NaN / inf blocks, CUDA graphs; and the kernel variant set.

The other options live beside it: e2m1 output, e4m3 SF and quantized inputs in
test_per_token_cast_formats.py, stochastic_cast in test_per_token_cast_stochastic.py, and the
sibling ops in test_per_token_cast_with_sf_only.py and test_per_token_cast_with_precomputed_sf.py."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tests.quant.per_token_cast_helpers import make_input
from tilebake.quant._common import alloc_sf
from tilebake.utils import ceil_div

# (in dtype, num_per_channels, round_sf, packed UE8M0, TMA-aligned column-major SF)
SF_MODES = [(False, False), (True, False), (True, True)]
LAYOUTS = [
    (dtype, npc, rs, packed, col)
    for dtype, npc, (rs, packed), col in itertools.product(
        (torch.bfloat16, torch.float32), (32, 128), SF_MODES, (False, True)
    )
]
LAYOUT_IDS = [
    f"{str(d)[6:]}-npc{n}-{'round' if r else 'plain'}{'-packed' if p else ''}{'-colmajor' if c else ''}"
    for d, n, r, p, c in LAYOUTS
]


def reference(x, npc, round_sf, packed, col):
    return tilebake.torch.cast(
        x, "e4m3", (1, npc), round_sf=round_sf, use_packed_ue8m0=packed, use_tma_aligned_col_major_sf=col
    )


def check_against_reference(x, npc, round_sf, packed, col, use_out=False):
    expected = reference(x, npc, round_sf, packed, col)
    out = None
    if use_out:
        num_tokens, hidden = x.shape
        out = (
            poison_(torch.empty(num_tokens, hidden, dtype=torch.float8_e4m3fn, device=x.device)),
            poison_(alloc_sf(x, num_tokens, ceil_div(hidden, npc), packed, col)),
        )
    data, sf = tilebake.quant.per_token_cast(
        x, "e4m3", npc, use_tma_aligned_col_major_sf=col, round_sf=round_sf, use_packed_ue8m0=packed, out=out
    )
    if out is not None:
        assert data is out[0] and sf is out[1]
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert sf.stride() == expected[1].stride() or sf.shape[0] <= 1, (sf.stride(), expected[1].stride())


# --- CPU: the slow path and argument checks ---


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_cpu_path_matches_reference(layout):
    dtype, npc, rs, packed, col = layout
    check_against_reference(make_input(37, 384, dtype, "cpu"), npc, rs, packed, col)
    check_against_reference(make_input(5, 256, dtype, "cpu", row_stride=320), npc, rs, packed, col, use_out=True)


def test_cpu_empty():
    data, sf = tilebake.quant.per_token_cast(torch.empty(0, 256, dtype=torch.bfloat16), "e4m3", 128)
    assert data.shape == (0, 256) and sf.shape == (0, 2) and sf.dtype == torch.float32


BAD_CALLS = [
    (dict(x=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x=torch.zeros(4, 128, 2, dtype=torch.bfloat16)), ValueError, "x must be 2-D"),
    (dict(x=torch.zeros(4, 120, dtype=torch.bfloat16)), ValueError, "multiple of 16"),
    (dict(x=torch.zeros(128, 4, dtype=torch.bfloat16).t()), ValueError, "contiguous in its last dim"),
    (
        dict(x=torch.zeros(4, 132, dtype=torch.bfloat16)[:, :128]),
        ValueError,
        "row stride must be a multiple of 16 bytes",
    ),
    (
        dict(x=torch.zeros(4, 128, dtype=torch.bfloat16, device="meta")),
        ValueError,
        "x must be on a CUDA device, an NPU or the CPU",
    ),
    (
        dict(out=(torch.empty(4, 128, dtype=torch.float8_e4m3fn, device="meta"), torch.empty(4, 1))),
        ValueError,
        "out\\[0\\] must be on cpu, got meta",  # x on the CPU: a given output on another device
    ),
    (dict(fmt="e5m2"), ValueError, "fmt must be one of"),
    (dict(num_per_channels=48), ValueError, "num_per_channels must be one of"),
    (dict(use_packed_ue8m0=True), ValueError, "needs round_sf=True"),
    (dict(fmt="e2m1", num_per_channels=24), ValueError, "num_per_channels must be one of"),
    (
        dict(stochastic_cast=True, x=torch.zeros(4, 120, dtype=torch.bfloat16)),
        ValueError,
        "hidden\\) must be a multiple of 16, got 120",
    ),
    (dict(x="not a tensor"), TypeError, "x must be a torch.Tensor"),
    (
        dict(out=(torch.empty(4, 128, dtype=torch.bfloat16), torch.empty(4, 1))),
        TypeError,
        "out\\[0\\] must be torch.float8_e4m3fn",
    ),
    (
        dict(out=(torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 2))),
        ValueError,
        "out\\[1\\] must have shape \\(4, 1\\)",
    ),
    (
        dict(out=(torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 1, dtype=torch.int32))),
        TypeError,
        "out\\[1\\] must be torch.float32",
    ),
    (
        dict(out=(torch.empty(3, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 1))),
        ValueError,
        "out\\[0\\] must have shape",
    ),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(4, 128, dtype=torch.bfloat16), fmt="e4m3", num_per_channels=128)
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.per_token_cast(**args)


# --- GPU: bit-exact against the reference ---

TOKENS = [1, 127, 512, 8001, 16384]
HIDDEN = [128, 2048, 4096, 7168]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_gpu_bit_exact(num_tokens, hidden, layout):
    dtype, npc, rs, packed, col = layout
    check_against_reference(make_input(num_tokens, hidden, dtype, "cuda"), npc, rs, packed, col)


@pytest.mark.gpu
@pytest.mark.parametrize("npc", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sf_mode", SF_MODES, ids=["plain", "round", "packed"])
@pytest.mark.parametrize("num_tokens,hidden", [(1, 16), (3, 48), (8001, 208), (333, 192), (65, 7168 + 16)])
def test_gpu_odd_shapes_poisoned_out(num_tokens, hidden, dtype, npc, sf_mode):
    """Hidden sizes that are not multiples of the group or the tile (partial last groups,
    partial SF words), strided rows, and preallocated poisoned outputs."""
    rs, packed = sf_mode
    for col in (False, True):
        check_against_reference(make_input(num_tokens, hidden, dtype, "cuda"), npc, rs, packed, col, use_out=True)
        check_against_reference(
            make_input(num_tokens, hidden, dtype, "cuda", row_stride=hidden + 64), npc, rs, packed, col
        )


@pytest.mark.gpu
def test_gpu_rejects_misaligned_pointers():
    x = torch.zeros(4 * 128 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(4, 128)
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address"):
        tilebake.quant.per_token_cast(x, "e4m3", 128)
    data = torch.empty(4 * 128 + 8, dtype=torch.float8_e4m3fn, device="cuda")[8:].view(4, 128)
    with pytest.raises(ValueError, match="out\\[0\\] must start at a 16-byte aligned address"):
        tilebake.quant.per_token_cast(
            torch.zeros(4, 128, dtype=torch.bfloat16, device="cuda"),
            "e4m3",
            128,
            out=(data, torch.empty(4, 1, device="cuda")),
        )
    q = torch.empty(4 * 128 + 8, dtype=torch.float8_e4m3fn, device="cuda")[8:].view(4, 128)
    with pytest.raises(ValueError, match="x\\[0\\] must start at a 16-byte aligned address"):
        tilebake.quant.cast_back((q, torch.ones(4, 1, device="cuda")), "bf16", (1, 128))


@pytest.mark.gpu
def test_gpu_amax_clamp_is_runtime():
    x = make_input(64, 512, torch.bfloat16, "cuda") * 1e-6
    tilebake.set_amax_clamp_for_quant("e4m3", False, 1e-3)
    expected = tilebake.torch.cast(x, "e4m3", (1, 128), amax_clamp=1e-3)
    data, sf = tilebake.quant.per_token_cast(x, "e4m3", 128)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    # Every row is below the clamp, so every scale is fp32(1e-3) / 448 in fp32.
    assert torch.all(sf == torch.tensor(1e-3) / torch.tensor(448.0))


@pytest.mark.gpu
def test_gpu_empty_and_nan_free():
    data, sf = tilebake.quant.per_token_cast(torch.empty(0, 256, dtype=torch.bfloat16, device="cuda"), "e4m3", 128)
    assert data.shape == (0, 256) and sf.shape == (0, 2)
    x = make_input(999, 7168, torch.bfloat16, "cuda")
    data, sf = tilebake.quant.per_token_cast(x, "e4m3", 128)
    assert not data.float().isnan().any() and not sf.isnan().any()


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    x = make_input(300, 1024, torch.bfloat16, "cuda")

    def f(x):
        data, sf = tilebake.quant.per_token_cast(
            x, "e4m3", 128, round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True
        )
        return data, sf

    data, sf = torch.compile(f, fullgraph=True)(x)
    expected = reference(x, 128, True, True, True)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert sf.stride() == expected[1].stride()


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x = make_input(256, 2048, torch.bfloat16, "cuda")
    out = (torch.empty(256, 2048, dtype=torch.float8_e4m3fn, device="cuda"), torch.empty(256, 16, device="cuda"))
    tilebake.quant.per_token_cast(x, "e4m3", 128, out=out)  # load the kernel outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilebake.quant.per_token_cast(x, "e4m3", 128, out=out)
    x.copy_(make_input(256, 2048, torch.bfloat16, "cuda"))
    poison_(out[0]), poison_(out[1])
    graph.replay()
    torch.cuda.synchronize()
    expected = reference(x, 128, False, False, False)
    assert_bytes_equal(out[0], expected[0], "data")
    assert_bytes_equal(out[1], expected[1], "sf")


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    """The torch.library registration (schema + Meta shapes), checked where CI runs."""
    x = make_input(33, 256, torch.bfloat16, "cpu")

    def f(x):
        return tilebake.quant.per_token_cast(
            x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True
        )

    data, sf = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    expected = reference(x, 32, True, True, True)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert sf.stride() == expected[1].stride()
    out = (poison_(torch.empty(33, 256, dtype=torch.float8_e4m3fn)), poison_(torch.empty(33, 8)))
    torch.compile(
        lambda x, d, s: tilebake.quant.per_token_cast(x, "e4m3", 32, out=(d, s)), fullgraph=True, backend="aot_eager"
    )(x, *out)
    expected = reference(x, 32, False, False, False)
    assert_bytes_equal(out[0], expected[0], "out data")
    assert_bytes_equal(out[1], expected[1], "out sf")


@pytest.mark.gpu
@pytest.mark.parametrize("sf_mode", SF_MODES, ids=["plain", "round", "packed"])
def test_gpu_e4m3_nan_inf_blocks(sf_mode):
    """Blocks holding NaN or +-inf: the reference's data and scales, in every SF mode (with
    round_sf an inf block's exponent is 128, whose inverse must clamp to 0, not wrap to -inf)."""
    round_sf, packed = sf_mode
    x = make_input(4, 256, torch.bfloat16, "cuda")
    x[0, 3], x[1, 130], x[2, 0], x[3, 255] = float("nan"), float("inf"), float("-inf"), float("inf")
    check_against_reference(x, 128, round_sf, packed, False)


def test_variant_set():
    """The hot path keeps one binary per SF mode, the e2m1 hot path one per (input, npc) (8);
    everything else shares 32 runtime-SF kernels (the budget for per_token_cast + _with_sf_only +
    _with_precomputed_sf is 96)."""
    from tilebake.quant.per_token_cast import PerTokenCastVariant

    ids = {v.id for v in PerTokenCastVariant.all()}
    assert len(ids) == 64
    assert "per_token_cast.in_dtype-bf16.fmt-e4m3.num_per_channels-128.sf_mode-fp32" in ids
    assert "per_token_cast.in_dtype-bf16.fmt-e2m1.num_per_channels-16.sf_mode-rne" in ids
    assert sum(v.sf_mode == "runtime" for v in PerTokenCastVariant.all()) == 32
    assert sum(v.sf_mode == "rne" for v in PerTokenCastVariant.all()) == 8
