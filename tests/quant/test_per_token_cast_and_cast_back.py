"""per_token_cast_and_cast_back: argument checks, the CPU path, bit-exact GPU results against
cast_back(cast(x)) (tilebake.torch.per_token_cast_and_cast_back_ref), strided rows in place."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.per_token_cast_helpers import make_input

# (dtype, fmt, npc, round_sf, use_e4m3_sf)
CASES = [
    (dt, fmt, npc, rs, e4)
    for dt, fmt, npc, (rs, e4) in itertools.product(
        (torch.bfloat16, torch.float32),
        ("e4m3", "e2m1"),
        (16, 32, 64, 128),
        [(False, False), (True, False), (False, True)],
    )
]
IDS = [f"{str(d)[6:]}-{f}-npc{n}{'-round' if r else ''}{'-e4m3sf' if e else ''}" for d, f, n, r, e in CASES]


def check(num_tokens, hidden, case, device, row_stride=None):
    dtype, fmt, npc, rs, e4 = case
    x = make_input(num_tokens, hidden, dtype, device, row_stride)
    expected = tilebake.torch.per_token_cast_and_cast_back_ref(
        x, fmt, npc, rs, e4, tilebake.config.get_amax_clamp_for_quant(fmt, e4)
    )
    if row_stride is not None:  # the bytes between rows must stay untouched
        base = x.as_strided((num_tokens, row_stride), (row_stride, 1)) if num_tokens else None
        before = base.clone() if num_tokens else None
    out = tilebake.quant.per_token_cast_and_cast_back(x, fmt, npc, round_sf=rs, use_e4m3_sf=e4)
    assert out is None
    assert_bytes_equal(x, expected, "x")
    assert not x.isnan().any()
    if row_stride is not None and num_tokens:
        assert_bytes_equal(base[:, hidden:], before[:, hidden:], "the gap between rows")


def test_reference_is_cast_then_cast_back():
    x = make_input(9, 256, torch.bfloat16, "cpu")
    q = tilebake.torch.cast(x, "e2m1", (1, 32), round_sf=True)
    y = tilebake.torch.cast_back(q, "e2m1", (1, 32), out_dtype=torch.bfloat16)
    assert_bytes_equal(tilebake.torch.per_token_cast_and_cast_back_ref(x, "e2m1", 32, True), y, "ref")


@pytest.mark.parametrize("case", CASES[::5], ids=IDS[::5])
def test_cpu_path_matches_reference(case):
    check(19, 320, case, "cpu")
    check(5, 128, case, "cpu", row_stride=160)


BAD = [
    (dict(fmt="bf16"), ValueError, "fmt must be one of"),
    (dict(num_per_channels=48), ValueError, "num_per_channels must be one of"),
    (dict(round_sf=True, use_e4m3_sf=True), ValueError, "use_e4m3_sf=True is incompatible with round_sf=True"),
    (dict(round_sf=1), TypeError, "round_sf must be a bool"),
    (dict(x=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x=torch.zeros(4, 120)), ValueError, "multiple of 16"),
    (dict(x=torch.zeros(128, 4).t()), ValueError, "contiguous in its last dim"),
    (dict(x=[1.0]), TypeError, "x must be a torch.Tensor"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD, ids=[m for _, _, m in BAD])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(x=torch.zeros(4, 128), fmt="e4m3", num_per_channels=32)
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.per_token_cast_and_cast_back(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("num_tokens,hidden", [(1, 128), (127, 2064), (8001, 7168), (3, 208), (0, 256)])
def test_gpu_bit_exact(num_tokens, hidden, case):
    check(num_tokens, hidden, case, "cuda")
    if num_tokens:
        check(num_tokens, hidden, case, "cuda", row_stride=hidden + 64)


@pytest.mark.gpu
def test_gpu_amax_clamp_is_a_runtime_argument():
    tilebake.config.set_amax_clamp_for_quant("e4m3", False, 0.5)
    check(64, 512, (torch.bfloat16, "e4m3", 128, False, False), "cuda")


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    x = make_input(8, 256, torch.bfloat16, "cpu")
    expected = tilebake.torch.per_token_cast_and_cast_back_ref(x, "e2m1", 32)

    def f(t):
        tilebake.quant.per_token_cast_and_cast_back(t, "e2m1", 32)
        return t * 1

    y = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    assert_bytes_equal(y, expected, "compiled")
