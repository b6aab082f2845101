"""Partially preallocated out=(data, sf) of the cast ops (per_token_cast, per_block_cast,
norm_forward_and_per_token_cast): either part may be None and is then allocated, as in the
original (whose own callers pass (data, None) with a column-major SF). Each call form returns
the given tensors themselves, every part with the shape, strides and bytes of the allocating
call; the given parts are checked (dtype, shape, device, no self-overlap, and with
use_tma_aligned_col_major_sf the TMA-aligned column-major layout). On the CPU the ops take the
references; the GPU tests run the same checks against the kernels."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.quant._common import alloc_sf

# (round_sf, use_packed_ue8m0, use_tma_aligned_col_major_sf)
SF_LAYOUTS = [
    (False, False, False),
    (False, False, True),
    (True, False, False),
    (True, True, True),
    (True, True, False),
]
SF_IDS = ["plain", "plain-col", "round", "packed-col", "packed"]
GIVE = [(True, False), (False, True), (True, True)]  # which parts of out= are preallocated


def like(t: torch.Tensor) -> torch.Tensor:
    """A 0xFF-poisoned tensor with t's shape, strides, dtype and device."""
    return poison_(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device))


def check_pair_forms(call) -> None:
    """call(out) -> (data, sf). out=None, then (data, None), (None, sf), (data, sf) with poisoned
    buffers laid out as the allocating call's result (and one list form)."""
    expected = call(None)
    forms = [tuple(like(e) if g else None for e, g in zip(expected, give)) for give in GIVE]
    forms.append([like(expected[0]), None])
    for out in forms:
        result = call(out)
        assert isinstance(result, tuple) and len(result) == 2
        for part, given, want, name in zip(result, out, expected, ("data", "sf")):
            tag = f"{name}, out=({'t' if out[0] is not None else None}, {'t' if out[1] is not None else None})"
            if given is not None:
                assert part is given, tag
            assert part.stride() == want.stride() or part.shape[-2] <= 1, (tag, part.stride(), want.stride())
            assert_bytes_equal(part, want, tag)


def make_x(num_tokens, hidden, dtype=torch.bfloat16, device="cpu", batch=None):
    shape = (num_tokens, hidden) if batch is None else (batch, num_tokens, hidden)
    x = torch.randn(shape, device=device) * torch.exp2(torch.randint(-6, 7, (*shape[:-1], 1), device=device).float())
    return x.to(dtype)


def sf_kwargs(layout):
    round_sf, packed, col = layout
    return dict(round_sf=round_sf, use_packed_ue8m0=packed, use_tma_aligned_col_major_sf=col)


def per_token_forms(x, layout, fmt="e4m3", npc=32, **extra):
    check_pair_forms(lambda out: tilebake.quant.per_token_cast(x, fmt, npc, out=out, **sf_kwargs(layout), **extra))


def per_block_forms(x, layout, fmt="e4m3", block=(32, 128)):
    check_pair_forms(lambda out: tilebake.quant.per_block_cast(x, fmt, block, out=out, **sf_kwargs(layout)))


def norm_forms(x, layout, npc=32, residual=None):
    weight = torch.randn(x.shape[-1], device=x.device).to(x.dtype)

    def call(out):
        (data, sf), *_ = tilebake.quant.norm_forward_and_per_token_cast(
            x, weight, 1e-6, "e4m3", npc, residual=residual, out=out, **sf_kwargs(layout)
        )
        return data, sf

    check_pair_forms(call)


# --- CPU: the call forms and the returned layouts ---


@pytest.mark.parametrize("layout", SF_LAYOUTS, ids=SF_IDS)
@pytest.mark.parametrize("npc", [32, 128])
def test_cpu_per_token_cast_forms(layout, npc):
    per_token_forms(make_x(37, 384), layout, npc=npc)


@pytest.mark.parametrize("layout", SF_LAYOUTS[:3], ids=SF_IDS[:3])
@pytest.mark.parametrize(
    "extra", [dict(fmt="e2m1"), dict(stochastic_cast=True), dict(fmt="e2m1", npc=16)], ids=["e2m1", "sr", "e2m1-16"]
)
def test_cpu_per_token_cast_general_path_forms(layout, extra):
    per_token_forms(make_x(37, 384), layout, **extra)


@pytest.mark.parametrize("col", [False, True])
def test_cpu_per_token_cast_e4m3_sf_and_quantized_input_forms(col):
    x = make_x(37, 384, torch.float32)
    per_token_forms(x, (False, False, col), npc=16, use_e4m3_sf=True)
    quantized = tilebake.quant.per_token_cast(x, "e4m3", 128)
    per_token_forms(quantized, (True, True, col), x_block_size=(1, 128))


@pytest.mark.parametrize("layout", SF_LAYOUTS, ids=SF_IDS)
@pytest.mark.parametrize("fmt,block", [("e4m3", (32, 128)), ("e2m1", (128, 32))])
def test_cpu_per_block_cast_forms(layout, fmt, block):
    per_block_forms(make_x(130, 256, torch.float32), layout, fmt, block)


@pytest.mark.parametrize("layout", SF_LAYOUTS, ids=SF_IDS)
@pytest.mark.parametrize("batch", [None, 3])
def test_cpu_norm_forward_and_per_token_cast_forms(layout, batch):
    x = make_x(37, 256, batch=batch)
    norm_forms(x, layout)
    norm_forms(x, layout, npc=128, residual=make_x(37, 256, batch=batch))


@pytest.mark.parametrize("layout", SF_LAYOUTS, ids=SF_IDS)
@pytest.mark.parametrize("num_tokens", [0, 1])
def test_cpu_empty_and_single_token_forms(num_tokens, layout):
    x = make_x(num_tokens, 256)
    per_token_forms(x, layout)
    per_token_forms(x, layout, fmt="e2m1")
    per_block_forms(x, layout)
    norm_forms(x, layout)
    norm_forms(make_x(num_tokens, 256, batch=2), layout)


def test_cpu_col_major_sf_is_what_the_original_callers_get():
    """out=(y, None) with use_tma_aligned_col_major_sf: y itself and a freshly allocated
    TMA-aligned column-major SF (the token dim padded to 4 scales)."""
    x = make_x(37, 256)
    y = torch.empty(37, 256, dtype=torch.float8_e4m3fn)
    for data, sf in (
        tilebake.quant.per_token_cast(x, "e4m3", 32, use_tma_aligned_col_major_sf=True, out=(y, None)),
        tilebake.quant.norm_forward_and_per_token_cast(
            x, None, 1e-6, "e4m3", 32, use_tma_aligned_col_major_sf=True, out=(y, None)
        )[0],
    ):
        assert data is y and sf.shape == (37, 8) and sf.stride() == (1, 40)
    data, sf = tilebake.quant.per_block_cast(x, "e4m3", (32, 32), use_tma_aligned_col_major_sf=True, out=(y, None))
    assert data is y and sf.shape == (2, 8) and sf.stride() == (1, 4)


def test_cpu_packed_sf_keeps_its_storage():
    """A given packed UE8M0 SF (int32) is returned itself: same object, same data_ptr."""
    x = make_x(37, 256)
    sf = alloc_sf(x, 37, 8, True, True)
    data, got = tilebake.quant.per_token_cast(
        x, "e4m3", 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True, out=(None, sf)
    )
    assert got is sf and got.data_ptr() == sf.data_ptr() and got.dtype == torch.int32 and data.shape == (37, 256)


def _e4m3(*shape, device="cpu"):
    return torch.empty(*shape, dtype=torch.float8_e4m3fn, device=device)


OP_CALLS = {
    "per_token": lambda out, **kw: tilebake.quant.per_token_cast(torch.zeros(4, 128), "e4m3", 32, out=out, **kw),
    "per_token_e2m1": lambda out, **kw: tilebake.quant.per_token_cast(torch.zeros(4, 128), "e2m1", 32, out=out, **kw),
    "per_block": lambda out, **kw: tilebake.quant.per_block_cast(torch.zeros(64, 128), "e4m3", (32, 32), out=out, **kw),
    "norm": lambda out, **kw: tilebake.quant.norm_forward_and_per_token_cast(
        torch.zeros(4, 128), None, 1e-6, "e4m3", 32, out=out, **kw
    ),
}
COL = dict(use_tma_aligned_col_major_sf=True)
BAD_OUTS = [
    ("per_token", _e4m3(4, 128), {}, TypeError, "out must be a \\(data, sf\\) pair \\(either part may be None"),
    ("per_token", (None, None, None), {}, TypeError, "out must be a \\(data, sf\\) pair"),
    ("per_token", (torch.empty(4, 128), None), {}, TypeError, "out\\[0\\] must be torch.float8_e4m3fn"),
    ("per_token", (None, torch.empty(4, 3)), {}, ValueError, "out\\[1\\] must have shape \\(4, 4\\)"),
    ("per_token", (None, torch.empty(4, 4, dtype=torch.int32)), {}, TypeError, "out\\[1\\] must be torch.float32"),
    ("per_token", (_e4m3(1, 128).expand(4, 128), None), {}, ValueError, "out\\[0\\] must not overlap itself"),
    ("per_token", (None, torch.empty(1, 4).expand(4, 4)), {}, ValueError, "out\\[1\\] must not overlap itself"),
    ("per_token", (None, torch.empty(4, 4)), COL, ValueError, "out\\[1\\] must be TMA-aligned column-major"),
    ("per_token", (None, torch.empty(4, 6)[:, :4].t()), COL, ValueError, "stride\\(-1\\) a multiple of 16 bytes"),
    ("per_token", (None, torch.empty(4, 8)[:, 1:5].t()), COL, ValueError, "out\\[1\\] must start at a 16-byte"),
    ("per_token", (_e4m3(4, 128, device="meta"), None), {}, ValueError, "out\\[0\\] must be on cpu, got meta"),
    ("per_token", (None, torch.empty(4, 4, device="meta")), {}, ValueError, "out\\[1\\] must be on cpu"),
    ("per_token_e2m1", (_e4m3(4, 128), None), {}, TypeError, "out\\[0\\] must be torch.int8"),
    ("per_token_e2m1", (None, torch.empty(4, 4)), COL, ValueError, "out\\[1\\] must be TMA-aligned column-major"),
    ("per_block", (_e4m3(64, 64), None), {}, ValueError, "out\\[0\\] must have shape \\(64, 128\\)"),
    ("per_block", (None, torch.empty(2, 4)), COL, ValueError, "out\\[1\\] must be TMA-aligned column-major"),
    ("per_block", (None, torch.empty(1, 4).expand(2, 4)), {}, ValueError, "out\\[1\\] must not overlap itself"),
    ("norm", (torch.empty(4, 128), None), {}, TypeError, "out\\[0\\] must be torch.float8_e4m3fn"),
    ("norm", (None, torch.empty(4, 4)), COL, ValueError, "out\\[1\\] must be TMA-aligned column-major"),
    ("norm", (None, torch.empty(4, 2)), {}, ValueError, "out\\[1\\] must have shape \\(4, 4\\)"),
    ("norm", [_e4m3(4, 128), None, None], {}, TypeError, "out must be a \\(data, sf\\) pair"),
]


@pytest.mark.parametrize("op,out,kwargs,exc,message", BAD_OUTS, ids=[f"{b[0]}-{b[4]}" for b in BAD_OUTS])
def test_cpu_rejects_bad_out_parts(op, out, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        OP_CALLS[op](out, **kwargs)


# --- torch.compile: a partial out= traces, the missing part laid out as in eager mode ---


def _compiled(fn):
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def check_compiled_forms(device):
    x = make_x(37, 256, device=device)
    kw = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    ops = {
        "per_token": lambda x, d, s: tilebake.quant.per_token_cast(x, "e4m3", 32, out=(d, s), **kw),
        "per_block": lambda x, d, s: tilebake.quant.per_block_cast(x, "e4m3", (32, 32), out=(d, s), **kw),
        "norm": lambda x, d, s: tilebake.quant.norm_forward_and_per_token_cast(
            x, None, 1e-6, "e4m3", 32, out=(d, s), **kw
        )[0],
    }
    for name, op in ops.items():
        expected = op(x, None, None)
        for give in GIVE:
            torch._dynamo.reset()
            out = [like(e) if g else None for e, g in zip(expected, give)]
            result = _compiled(op)(x, *out)
            for part, given, want in zip(result, out, expected):
                tag = f"{name} give={give}"
                assert part.stride() == want.stride(), (tag, part.stride(), want.stride())
                assert_bytes_equal(part, want, tag)
                if given is not None:
                    assert_bytes_equal(given, want, f"{tag} (the given buffer)")


def test_cpu_compiled_partial_out():
    check_compiled_forms("cpu")


# --- GPU: the kernels write the given parts, byte for byte as the allocating call ---

GPU_SHAPES = [(0, 256), (1, 128), (129, 7168), (8001, 384)]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", SF_LAYOUTS, ids=SF_IDS)
@pytest.mark.parametrize("num_tokens,hidden", GPU_SHAPES)
def test_gpu_per_token_cast_forms(num_tokens, hidden, layout):
    x = make_x(num_tokens, hidden, device="cuda")
    per_token_forms(x, layout, npc=128)
    if not layout[1]:
        per_token_forms(x, layout, fmt="e2m1")
        per_token_forms(x, layout, npc=16, stochastic_cast=True)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", SF_LAYOUTS, ids=SF_IDS)
@pytest.mark.parametrize("num_tokens,hidden", GPU_SHAPES)
def test_gpu_per_block_cast_forms(num_tokens, hidden, layout):
    x = make_x(num_tokens, hidden, torch.float32, device="cuda")
    per_block_forms(x, layout, "e4m3", (128, 128))
    per_block_forms(x, layout, "e2m1", (32, 32))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", SF_LAYOUTS, ids=SF_IDS)
@pytest.mark.parametrize(
    "batch,num_tokens,hidden", [(None, 0, 256), (None, 1, 128), (None, 8001, 384), (None, 129, 7168), (3, 37, 256)]
)
def test_gpu_norm_forward_and_per_token_cast_forms(batch, num_tokens, hidden, layout):
    x = make_x(num_tokens, hidden, device="cuda", batch=batch)
    norm_forms(x, layout)
    norm_forms(x, layout, npc=128, residual=make_x(num_tokens, hidden, device="cuda", batch=batch))


@pytest.mark.gpu
def test_gpu_rejects_misaligned_given_parts():
    x = make_x(4, 128, device="cuda")
    data = torch.empty(4 * 128 + 1, dtype=torch.float8_e4m3fn, device="cuda")[1:].view(4, 128)
    with pytest.raises(ValueError, match="out\\[0\\] must start at a 16-byte aligned address"):
        tilebake.quant.per_token_cast(x, "e4m3", 32, out=(data, None))
    sf = torch.empty(4, 8, device="cuda")[:, 1:5].t()  # column-major, columns 32 bytes apart, 4 bytes off
    with pytest.raises(ValueError, match="out\\[1\\] must start at a 16-byte aligned address"):
        tilebake.quant.norm_forward_and_per_token_cast(
            x, None, 1e-6, "e4m3", 32, use_tma_aligned_col_major_sf=True, out=(None, sf)
        )


@pytest.mark.gpu
def test_gpu_compiled_partial_out():
    check_compiled_forms("cuda")
