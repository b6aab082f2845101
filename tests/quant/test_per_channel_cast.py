"""per_channel_cast: argument checks (CPU), the CPU path, and bit-exact GPU results against
the reference (tilebake.torch.cast with block (num_per_tokens, 1))."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tilebake.torch.cast import to_tma_aligned_col_major, unpack_ue8m0

SF_MODES = [(False, False), (True, False), (True, True)]  # (round_sf, packed UE8M0)
# (input kind, num_per_tokens, round_sf, packed); input kinds: bf16, fp32, and e4m3 QuantTensors
# with (1, npc) SF as fp32 / packed UE8M0, row-major / column-major
INPUTS = [
    "bf16",
    "fp32",
    "e4m3-fp32sf-npc128",
    "e4m3-ue8m0sf-npc32",
    "e4m3-fp32sf-col-npc32",
    "e4m3-ue8m0sf-col-npc128",
]
LAYOUTS = [(kind, npt, rs, p) for kind, npt, (rs, p) in itertools.product(INPUTS, (32, 128), SF_MODES)]


def layout_id(layout):
    kind, npt, rs, p = layout
    return f"{kind}-npt{npt}-{'round' if rs else 'plain'}{'-packed' if p else ''}"


def make_input(kind, num_tokens, hidden, device, row_stride=None):
    """A plain tensor, or (x, npc): a QuantTensor made by the per-token reference. Values over
    many binades (each column and each row get a random exponent)."""
    width = row_stride or hidden
    base = (
        torch.randn(num_tokens, width, device=device)
        * torch.exp2(torch.randint(-10, 11, (1, width), device=device).float())
        * torch.exp2(torch.randint(-4, 5, (num_tokens, 1), device=device).float())
    )
    if kind in ("bf16", "fp32"):
        return base.to(torch.bfloat16 if kind == "bf16" else torch.float32)[:, :hidden], None
    npc = int(kind.split("npc")[1])
    packed = "ue8m0" in kind
    data, sf = tilebake.torch.cast(base[:, :hidden], "e4m3", (1, npc), round_sf=packed, use_packed_ue8m0=packed)
    if "-col" in kind:
        sf = to_tma_aligned_col_major(sf)
    if row_stride:  # strided data rows
        wide = torch.empty(num_tokens, row_stride, dtype=data.dtype, device=device)
        wide[:, :hidden] = data
        data = wide[:, :hidden]
    return (data, sf), npc


def check_against_reference(x, npc, npt, round_sf, packed):
    expected = tilebake.torch.cast(
        x,
        "e4m3",
        (npt, 1),
        x_block_size=(1, npc) if npc else None,
        round_sf=round_sf,
        use_packed_ue8m0=packed,
    )
    data, sf = tilebake.quant.per_channel_cast(
        x, "e4m3", npt, round_sf=round_sf, num_per_channels=npc, use_packed_ue8m0=packed
    )
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert sf.is_contiguous()


# --- CPU ---


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout_id(v) for v in LAYOUTS])
def test_cpu_path_matches_reference(layout):
    kind, npt, rs, packed = layout
    check_against_reference(*make_input(kind, 37, 192, "cpu"), npt, rs, packed)
    check_against_reference(*make_input(kind, 300, 256, "cpu", row_stride=320), npt, rs, packed)


def test_reference_scales_columns_over_row_blocks():
    x = torch.ones(40, 16)
    x[33, 5] = 448.0 * 4  # row block 1 (rows 32..39), column 5
    data, sf = tilebake.quant.per_channel_cast(x, "e4m3", 32)
    assert sf.shape == (2, 16)
    one = torch.tensor(1.0) / torch.tensor(448.0)
    assert sf[1, 5] == 4.0 and torch.all(sf[0] == one) and torch.all(sf[1, :5] == one)
    data, sf = tilebake.quant.per_channel_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True)
    assert sf.shape == (1, 16) and sf.dtype == torch.int32
    assert unpack_ue8m0(sf.t(), 2).t()[:, 5].tolist() == [119, 129]  # packed along tokens


def test_cpu_empty():
    data, sf = tilebake.quant.per_channel_cast(torch.empty(0, 256), "e4m3", 128)
    assert data.shape == (0, 256) and sf.shape == (0, 256)


BAD_CALLS = [
    (dict(x=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x="x"), TypeError, "x must be a torch.Tensor or a QuantTensor"),
    (dict(x=torch.zeros(4, 120)), ValueError, "multiple of 16"),
    (dict(x=torch.zeros(4, 128, 1)), ValueError, "x must be 2-D"),
    (dict(x=torch.zeros(128, 4).t()), ValueError, "contiguous in its last dim"),
    (dict(x=torch.zeros(4, 128, device="meta")), ValueError, "x must be on a CUDA device, an NPU or the CPU"),
    (dict(fmt="e2m1"), ValueError, "fmt must be one of"),
    (dict(num_per_tokens=64), ValueError, "num_per_tokens must be one of"),
    (dict(num_per_tokens=True), ValueError, "num_per_tokens must be one of"),
    (dict(round_sf=None), TypeError, "round_sf must be a bool"),
    (dict(use_packed_ue8m0=True), ValueError, "needs round_sf=True"),
    (dict(num_per_channels=128), ValueError, "num_per_channels must be None for a plain tensor"),
    (
        dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 1))),
        ValueError,
        "num_per_channels \\(the SF block width",
    ),
    (
        dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 1)), num_per_channels=48),
        ValueError,
        "num_per_channels \\(the SF block width",
    ),
    (
        dict(x=(torch.zeros(4, 128), torch.ones(4, 1)), num_per_channels=128),
        TypeError,
        "x\\[0\\] \\(the data of a QuantTensor\\) must be torch.float8_e4m3fn",
    ),
    (
        dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 2)), num_per_channels=128),
        ValueError,
        "x\\[1\\] must have shape \\(4, 1\\)",
    ),
    (
        dict(
            x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 2, dtype=torch.int32)), num_per_channels=32
        ),
        ValueError,
        "x\\[1\\] must have shape \\(4, 1\\)",
    ),
    (
        dict(x=(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 1)), num_per_channels=32),
        ValueError,
        "x\\[1\\] must have shape \\(4, 4\\)",
    ),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(4, 128), fmt="e4m3", num_per_tokens=128)
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.per_channel_cast(**args)


# --- GPU ---

GPU_SHAPES = [(1, 128), (127, 7168), (8001, 384), (256, 7168 + 16), (256, 208)]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout_id(v) for v in LAYOUTS])
@pytest.mark.parametrize("num_tokens,hidden", GPU_SHAPES)
def test_gpu_bit_exact(num_tokens, hidden, layout):
    """T = 1, 127, 8001: partial row blocks (and packed SF words); H = 7184, 208: partial
    CTA column tiles and input SF groups."""
    kind, npt, rs, packed = layout
    check_against_reference(*make_input(kind, num_tokens, hidden, "cuda"), npt, rs, packed)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", INPUTS)
def test_gpu_strided_rows_and_special_values(kind):
    x, npc = make_input(kind, 300, 512, "cuda", row_stride=640)
    if npc is None:
        x[5, 7] = float("nan")
        x[40, 300] = float("inf")
        x[:, 64:80] = 0  # zero columns: their scale is the clamp
    for npt, (rs, packed) in itertools.product((32, 128), SF_MODES):
        check_against_reference(x, npc, npt, rs, packed)


@pytest.mark.gpu
def test_gpu_amax_clamp_is_runtime():
    x = make_input("bf16", 256, 512, "cuda")[0] * 1e-9
    tilebake.set_amax_clamp_for_quant("e4m3", False, 1e-3)
    expected = tilebake.torch.cast(x, "e4m3", (128, 1), amax_clamp=1e-3)
    data, sf = tilebake.quant.per_channel_cast(x, "e4m3", 128)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")


@pytest.mark.gpu
def test_gpu_empty_and_sliced_tokens():
    data, sf = tilebake.quant.per_channel_cast(torch.empty(0, 256, device="cuda"), "e4m3", 32)
    assert data.shape == (0, 256) and sf.shape == (0, 256)
    # A QuantTensor sliced along tokens (its column-major SF view sliced with it).
    (data, sf), npc = make_input("e4m3-ue8m0sf-col-npc128", 512, 384, "cuda")
    check_against_reference((data[100:300], sf[100:300]), npc, 128, True, True)


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    for kind in ("bf16", "e4m3-ue8m0sf-col-npc128"):
        x, npc = make_input(kind, 200, 256, "cpu")

        def f(x):
            return tilebake.quant.per_channel_cast(
                x, "e4m3", 128, round_sf=True, num_per_channels=npc, use_packed_ue8m0=True
            )

        data, sf = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
        expected = tilebake.torch.cast(
            x, "e4m3", (128, 1), x_block_size=(1, npc) if npc else None, round_sf=True, use_packed_ue8m0=True
        )
        assert_bytes_equal(data, expected[0], "data")
        assert_bytes_equal(sf, expected[1], "sf")
