"""norm_forward_and_per_token_cast: argument checks and the CPU path (CI), and the kernels against
the reference on a GPU: every SF mode and block width, a weight or a residual alone, 3-D strided
inputs with poisoned outputs, the runtime amax clamp, the plain SF at the ends of its range, and
the mega MoE SF layout (also on the CPU).

Tolerances (../shared/spec/testing.md): the normalised output against the reference as
norm_forward's (test_norm_forward.py); rstd rtol=2e-6, atol=1e-7; norm_input bit-exact; quantised
data and SF bit-exact against tilebake.torch.cast of the kernel's own normalised output.
"""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tests.quant.norm_forward_helpers import DTYPES, EPS, assert_rstd_close, make_input, make_weight
from tilebake.torch import cast, norm_forward_ref

# --- CPU: argument checks and the slow path ---


def mega_buffer(num_tokens, hidden, block_m, device="cpu"):
    """A poisoned mega MoE SF buffer and its (num_tokens, hidden // 128) M-major int32 view."""
    rows = -(-num_tokens // block_m) * (-(-block_m // 128) * 128)
    return poison_(torch.empty(hidden // 128, rows, dtype=torch.int32, device=device)).t()[:num_tokens]


def expected_mega_rows(num_tokens, block_m):
    """Each token's row, spelled out: chunk c of block_m tokens starts at row c * align(block_m, 128);
    inside it, 128-token tiles are stored transposed as 4 x 32 (token i of a tile -> row (i % 32) * 4 + i // 32)."""
    rows = []
    aligned = -(-block_m // 128) * 128
    for t in range(num_tokens):
        chunk, i = divmod(t, block_m)
        tile, j = divmod(i, 128)
        rows.append(chunk * aligned + tile * 128 + (j % 32) * 4 + j // 32)
    return rows


def check_mega_moe_sf(x, block_m, **kwargs):
    """The mega MoE SF bytes equal the packed UE8M0 SF of the normalised output, at the rows the
    layout gives; every other row of the buffer is untouched (still poisoned)."""
    num_tokens, hidden = x.shape
    mega = mega_buffer(num_tokens, hidden, block_m, x.device)
    (data, sf), y_bf16, _, _ = tilebake.quant.norm_forward_and_per_token_cast(
        x, None, EPS, "e4m3", 32, round_sf=True, with_out_bf16=True, mega_moe_sf=mega, mega_moe_block_m=block_m,
        **kwargs,
    )  # fmt: skip
    own = y_bf16 if x.dtype == torch.bfloat16 else tilebake.quant.norm_forward(x, None, EPS)[0]
    words = cast(own, "e4m3", (1, 32), round_sf=True, use_packed_ue8m0=True)[1]
    physical = torch.as_strided(mega, (hidden // 128, mega.stride(1)), (mega.stride(1), 1)).t()
    rows = expected_mega_rows(num_tokens, block_m)
    assert_bytes_equal(physical[rows], words, "mega_moe_sf rows")
    untouched = torch.ones(physical.shape[0], dtype=torch.bool)
    untouched[rows] = False
    assert (physical[untouched.to(x.device)] == -1).all(), "mega_moe_sf padding rows were written"


def _cast_args(**overrides):
    args = dict(x=torch.zeros(4, 256, dtype=torch.bfloat16), weight=None, eps=EPS, fmt="e4m3", num_per_channels=32)
    args.update(overrides)
    return args


BAD_CAST = [
    (dict(fmt="e2m1"), ValueError, "fmt must be one of"),
    (dict(num_per_channels=64), ValueError, "num_per_channels must be one of \\(32, 128\\)"),
    (dict(num_per_channels=128, x=torch.zeros(4, 192, dtype=torch.bfloat16)), ValueError, "multiple of num_per_chan"),
    (dict(use_packed_ue8m0=True), ValueError, "needs round_sf=True"),
    (dict(mega_moe_sf=mega_buffer(4, 256, 64)), ValueError, "mega_moe_sf and mega_moe_block_m > 0 go together"),
    (dict(mega_moe_block_m=64), ValueError, "mega_moe_sf and mega_moe_block_m > 0 go together"),
    (dict(mega_moe_sf=mega_buffer(4, 256, 64), mega_moe_block_m=64), ValueError, "needs num_per_channels=32 and round"),
    (
        dict(mega_moe_sf=mega_buffer(4, 256, 64), mega_moe_block_m=64, round_sf=True, num_per_channels=128),
        ValueError,
        "needs num_per_channels=32 and round_sf=True",
    ),
    (
        dict(
            x=torch.zeros(4, 192, dtype=torch.bfloat16),
            mega_moe_sf=mega_buffer(4, 192, 64),
            mega_moe_block_m=64,
            round_sf=True,
        ),
        ValueError,
        "mega_moe_sf needs hidden % 128 == 0",
    ),  # fmt: skip
    (
        dict(
            x=torch.zeros(1, 4, 256, dtype=torch.bfloat16),
            mega_moe_sf=mega_buffer(4, 256, 64),
            mega_moe_block_m=64,
            round_sf=True,
        ),
        ValueError,
        "mega_moe_sf needs a 2-D x",
    ),  # fmt: skip
    (
        dict(mega_moe_sf=torch.zeros(4, 2, dtype=torch.int32), mega_moe_block_m=64, round_sf=True),
        ValueError,
        "mega_moe_sf must be M-major",
    ),
    (
        dict(mega_moe_sf=mega_buffer(4, 256, 64).float(), mega_moe_block_m=64, round_sf=True),
        TypeError,
        "mega_moe_sf must be torch.int32",
    ),
    (
        dict(mega_moe_sf=torch.zeros(2, 64, dtype=torch.int32).t()[:4], mega_moe_block_m=64, round_sf=True),
        ValueError,
        "mega_moe_sf has 64 rows \\(its stride\\(1\\)\\); 4 tokens in blocks of 64 need 128",
    ),
    (dict(out_bf16=torch.zeros(4, 256, dtype=torch.bfloat16)), ValueError, "with_out_bf16=False"),
    (
        dict(with_out_bf16=True, out_bf16=torch.zeros(4, 256, dtype=torch.float32)),
        TypeError,
        "out_bf16 must be torch.bfloat16",
    ),
    (
        dict(out=(torch.zeros(4, 256, dtype=torch.bfloat16), torch.zeros(4, 8))),
        TypeError,
        "out\\[0\\] must be torch.float8_e4m3fn",
    ),
    (
        dict(out=(torch.zeros(4, 256, dtype=torch.float8_e4m3fn), torch.zeros(4, 4))),
        ValueError,
        "out\\[1\\] must have shape \\(4, 8\\)",
    ),
    (
        dict(
            out=(torch.zeros(4, 256, dtype=torch.float8_e4m3fn), torch.zeros(4, 8)),
            round_sf=True,
            use_packed_ue8m0=True,
        ),
        TypeError,
        "out\\[1\\] must be torch.int32",
    ),  # fmt: skip
    (dict(x=torch.zeros(4, 120, dtype=torch.bfloat16)), ValueError, "multiple of 16"),
    (dict(weight=torch.zeros(256)), TypeError, "weight must have x's dtype"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CAST, ids=[m for _, _, m in BAD_CAST])
def test_norm_forward_and_per_token_cast_rejects_bad_arguments(overrides, exc, message):
    with pytest.raises(exc, match=message):
        tilebake.quant.norm_forward_and_per_token_cast(**_cast_args(**overrides))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize(
    "sf_mode", [(False, False, False), (True, False, True), (True, True, False), (True, True, True)]
)
def test_cpu_cast_is_cast_of_norm_forward(dtype, npc, sf_mode):
    round_sf, packed, col_major = sf_mode
    for shape in ((37, 256), (3, 5, 512)):
        x = make_input(shape, dtype, "cpu")
        weight = make_weight(shape[-1], dtype, "cpu")
        residual = make_input(shape, dtype, "cpu")
        (data, sf), out_bf16, rstd, norm_input = tilebake.quant.norm_forward_and_per_token_cast(
            x, weight, EPS, "e4m3", npc, residual, 0.5, col_major, round_sf, packed, with_out_bf16=True, with_rstd=True
        )
        y, expected_rstd, expected_input = norm_forward_ref(x, weight, EPS, residual, 0.5)
        assert_bytes_equal(out_bf16, y.to(torch.bfloat16), "out_bf16")
        assert_bytes_equal(rstd, expected_rstd, "rstd")
        assert_bytes_equal(norm_input, expected_input, "norm_input")
        for b in range(x.shape[0] if x.dim() == 3 else 1):
            pick = (lambda t: t[b]) if x.dim() == 3 else (lambda t: t)  # noqa: B023
            q, s = cast(pick(y), "e4m3", (1, npc), round_sf=round_sf, use_packed_ue8m0=packed,
                        use_tma_aligned_col_major_sf=col_major)  # fmt: skip
            assert_bytes_equal(pick(data), q, "data")
            assert_bytes_equal(pick(sf), s, "sf")
            assert pick(sf).stride() == s.stride(), (pick(sf).stride(), s.stride())


@pytest.mark.parametrize("num_tokens,block_m", [(1, 64), (130, 64), (300, 128), (300, 200), (7, 256)])
def test_cpu_mega_moe_sf(num_tokens, block_m):
    check_mega_moe_sf(make_input((num_tokens, 512), torch.bfloat16, "cpu"), block_m)


# --- GPU: the kernels against the reference ---


def check_cast(x, weight, residual, npc, round_sf, packed, col_major, out_scale=1.0, use_out=False):
    """Quantised bytes against tilebake.torch.cast of the kernel's own normalised output
    (out_bf16 for bf16 x; norm_forward's output for fp32 x, which computes it with the same
    kernel code), and that output against the reference."""
    num_groups = x.shape[-1] // npc
    out = out_bf16 = residual_out = None
    if use_out:
        sf_cols = num_groups // 4 + (num_groups % 4 > 0) if packed else num_groups
        out = (
            poison_(torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)),
            poison_(torch.empty((*x.shape[:-1], sf_cols), dtype=torch.int32 if packed else torch.float32,
                                device=x.device)),
        )  # fmt: skip
        out_bf16 = poison_(torch.empty(x.shape, dtype=torch.bfloat16, device=x.device))
        residual_out = poison_(torch.empty_like(x)) if residual is not None else None
    (data, sf), y_bf16, rstd, norm_input = tilebake.quant.norm_forward_and_per_token_cast(
        x, weight, EPS, "e4m3", npc, residual=residual, out_scale=out_scale,
        use_tma_aligned_col_major_sf=col_major and not use_out, round_sf=round_sf, use_packed_ue8m0=packed,
        with_out_bf16=True, out=out, out_bf16=out_bf16, residual_out=residual_out, with_rstd=True,
    )  # fmt: skip
    if use_out:
        assert data is out[0] and sf is out[1] and y_bf16 is out_bf16
    y, expected_rstd, expected_input = norm_forward_ref(x, weight, EPS, residual, out_scale)
    assert_rstd_close(rstd, expected_rstd)
    assert_bytes_equal(norm_input, expected_input, "norm_input")
    if x.dtype == torch.bfloat16:
        own = y_bf16
    else:
        own, own_rstd, _ = tilebake.quant.norm_forward(x, weight, EPS, residual, out_scale, with_rstd=True)
        assert_bytes_equal(own_rstd, rstd, "rstd of norm_forward vs the cast op")
        assert_bytes_equal(y_bf16, own.to(torch.bfloat16), "out_bf16 vs norm_forward's output")
    torch.testing.assert_close(own, y)
    for b in range(x.shape[0] if x.dim() == 3 else 1):
        pick = (lambda t: t[b]) if x.dim() == 3 else (lambda t: t)  # noqa: B023
        q, s = cast(pick(own), "e4m3", (1, npc), round_sf=round_sf, use_packed_ue8m0=packed,
                    use_tma_aligned_col_major_sf=col_major and not use_out)  # fmt: skip
        assert_bytes_equal(pick(data), q, f"data[{b}]")
        assert_bytes_equal(pick(sf), s, f"sf[{b}]")


SF_MODES = [(False, False, False), (True, False, False), (True, True, False), (False, False, True), (True, True, True)]
SF_IDS = ["plain", "round", "packed", "plain-colmajor", "packed-colmajor"]


@pytest.mark.gpu
@pytest.mark.parametrize("sf_mode", SF_MODES, ids=SF_IDS)
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,hidden", [(1, 128), (127, 4096), (8001, 7168), (300, 384), (65, 8192)])
def test_gpu_norm_forward_and_per_token_cast(num_tokens, hidden, dtype, npc, sf_mode):
    round_sf, packed, col_major = sf_mode
    x = make_input((num_tokens, hidden), dtype, "cuda")
    weight = make_weight(hidden, dtype, "cuda")
    residual = make_input((num_tokens, hidden), dtype, "cuda")
    check_cast(x, weight, residual, npc, round_sf, packed, col_major)
    check_cast(x, None, None, npc, round_sf, packed, col_major, out_scale=3.0)


@pytest.mark.gpu
@pytest.mark.parametrize("has_weight,has_residual", [(True, False), (False, True)])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_cast_with_weight_or_residual_alone(dtype, npc, has_weight, has_residual):
    """The kernels of a weight without a residual and a residual without a weight (the test above
    takes both or neither)."""
    x = make_input((37, 384), dtype, "cuda")
    weight = make_weight(384, dtype, "cuda") if has_weight else None
    residual = make_input((37, 384), dtype, "cuda") if has_residual else None
    check_cast(x, weight, residual, npc, True, True, False)


@pytest.mark.gpu
@pytest.mark.parametrize("sf_mode", SF_MODES, ids=SF_IDS)
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_norm_forward_and_per_token_cast_3d_strided_out(dtype, npc, sf_mode):
    """3-D strided inputs, poisoned preallocated outputs (row-major SF), SF words only partly
    filled (hidden / npc not a multiple of 4 with packed UE8M0)."""
    round_sf, packed, col_major = sf_mode
    for shape in ((3, 77, 640), (2, 5, 7168)):
        x = make_input(shape, dtype, "cuda", row_stride=shape[-1] + 128)
        weight = make_weight(shape[-1], dtype, "cuda")
        residual = make_input(shape, dtype, "cuda")
        check_cast(x, weight, residual, npc, round_sf, packed, col_major)
        check_cast(x, weight, residual, npc, round_sf, packed, col_major, use_out=True)


@pytest.mark.gpu
def test_gpu_cast_amax_clamp_is_runtime():
    x = make_input((64, 512), torch.bfloat16, "cuda")
    weight = torch.full((512,), 1e-9, dtype=torch.bfloat16, device="cuda")  # every group below the clamp
    tilebake.set_amax_clamp_for_quant("e4m3", False, 1e-3)
    (data, sf), y, _, _ = tilebake.quant.norm_forward_and_per_token_cast(
        x, weight, EPS, "e4m3", 128, with_out_bf16=True
    )
    expected = cast(y, "e4m3", (1, 128), amax_clamp=1e-3)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert torch.all(sf == torch.tensor(1e-3) / torch.tensor(448.0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_plain_sf_at_the_ends_of_its_range(dtype):
    """The plain SF c / 448 (in the kernel an FMA-corrected product where that is exact, c in
    [2^-120, inf), the division elsewhere): groups of 32 whose weights step through 2^-130 .. 2^-67
    (subnormal and normal amax, across 2^-120, in fp32 and bf16 alike) under a clamp of 2^-149,
    and a group holding inf."""
    tilebake.set_amax_clamp_for_quant("e4m3", False, 2.0**-149)
    x = make_input((16, 64 * 32), dtype, "cuda")
    scales = torch.exp2(torch.arange(-130, -66, device="cuda").float())
    weight = ((torch.rand(64, 32, device="cuda") + 0.5) * scales[:, None]).flatten().to(dtype)
    weight[-32] = float("inf")
    (data, sf), y, _, _ = tilebake.quant.norm_forward_and_per_token_cast(x, weight, EPS, "e4m3", 32, with_out_bf16=True)
    if dtype != torch.bfloat16:  # the normalised values in x's dtype: norm_forward's (the same kernel code)
        y = tilebake.quant.norm_forward(x, weight, EPS)[0]
    expected = cast(y, "e4m3", (1, 32), amax_clamp=2.0**-149)
    assert_bytes_equal(data, expected[0], "data")
    assert_bytes_equal(sf, expected[1], "sf")
    assert torch.isinf(sf[:, -1]).all()
    assert (sf[:, :5] < 2.0**-120 / 448).all() and (sf[:, 20:-1] > 2.0**-120 / 448).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,block_m", [(1, 64), (127, 64), (300, 128), (8001, 200), (1000, 256)])
def test_gpu_mega_moe_sf(num_tokens, block_m, dtype):
    check_mega_moe_sf(make_input((num_tokens, 7168), dtype, "cuda"), block_m)
    check_mega_moe_sf(make_input((num_tokens, 1024), dtype, "cuda"), block_m, use_packed_ue8m0=True)
