"""Call plans of cast_back / per_token_cast_back, per_token_cast_and_cast_back,
per_block_cast_lossless and batched_transpose_weight_sf, traced on the CPU (every step but the
launch; tests/plan_helpers.py): the kernel arguments equal the Python path's for the same
tensors, the returned layouts equal the CPU path's, given tensors come back themselves and are
bumped, calls the Python path refuses (or an empty problem) return NotImplemented, and each op's
native path looks up exactly the key its Python path builds the plan under.
(unpack_from_e2m1fn_x2's plan: tests/test_plans_cast.py.)"""

import importlib
import itertools

import pytest
import torch

import tilebake
from tests.helpers import poison_
from tests.plan_helpers import ManifestKernel, needs_plans, params_of, trace
from tests.plan_recording import RecordingTable
from tests.quant.test_per_block_cast_lossless import make_fp4, poisoned_out, sf_kwargs
from tilebake import config
from tilebake._runtime import plan

pytestmark = needs_plans

cb = importlib.import_module("tilebake.quant.cast_back")
ptcacb = importlib.import_module("tilebake.quant.per_token_cast_and_cast_back")
pbcl = importlib.import_module("tilebake.quant.per_block_cast_lossless")
btws = importlib.import_module("tilebake.quant.batched_transpose_weight_sf")


def layout(t):
    return tuple(t.shape), t.stride(), t.dtype


class KeyLog(dict):
    """An op's _PLANS that records the keys its native path looks up."""

    def __init__(self):
        super().__init__()
        self.keys = []

    def __getitem__(self, key):
        self.keys.append(key)
        return super().__getitem__(key)


@pytest.fixture
def bumps(monkeypatch):
    """The slots each plan built from now on bumps (a trace does not call the bump)."""
    slots = []
    bump = plan.Builder.bump
    monkeypatch.setattr(plan.Builder, "bump", lambda self, ref: (slots.append(ref.slot), bump(self, ref))[1])
    return slots


def test_builder_counts_registers_not_names():
    """Aliases (let of a bare symbol) and repeated constants take no register of their own: the
    multi-weight plans below need them."""
    b = plan.Builder()
    b.tensor(0, torch.float32, ("n",), align=1)
    for i in range(2 * plan.MAX_REGS):
        b.let(f"alias{i}", "n")
        b.value(1)
        b.value("7")
    assert b.nregs == 3
    b.check("alias200 == n")
    b.returns(None)
    assert trace(b.build(), torch.empty(4))[0] is None


# --- cast_back ---

DATA_DTYPES = (torch.float8_e4m3fn, torch.int8, torch.uint8)
SF_DTYPES = (torch.float32, torch.float8_e4m3fn, torch.int32)
CB_CASES = list(itertools.product(DATA_DTYPES, SF_DTYPES, [(1, 32), (1, 128), (128, 128), (16, 1)], ("bf16", "fp32")))


def cb_inputs(num_tokens, hidden, data_dtype, sf_dtype, block, col_major=False, row_pad=0):
    cols = hidden if data_dtype == torch.float8_e4m3fn else hidden // 2
    if data_dtype == torch.float8_e4m3fn:
        data = torch.randn(num_tokens, cols + row_pad).to(data_dtype)[:, :cols]
    else:
        data = torch.randint(0, 256, (num_tokens, cols + row_pad), dtype=torch.uint8).view(data_dtype)[:, :cols]
    rows, groups = -(-num_tokens // block[0]), -(-hidden // block[1])
    if sf_dtype == torch.int32:
        shape = (-(-rows // 4), groups) if block[1] == 1 else (rows, -(-groups // 4))
        sf = torch.randint(100, 140, shape, dtype=torch.int32) * 0x01010101
    else:
        sf = (torch.rand(rows, groups) + 0.5).to(sf_dtype)
    if col_major:  # TMA-aligned column-major
        padded = -(-sf.shape[0] // 4) * 4
        sf = torch.empty_strided(sf.shape, (1, padded), dtype=sf.dtype).copy_(sf)
    return data, sf


@pytest.mark.parametrize("data_dtype,sf_dtype,block,fmt", CB_CASES)
def test_cast_back_plan(data_dtype, sf_dtype, block, fmt):
    in_fmt = "e4m3" if data_dtype == torch.float8_e4m3fn else "e2m1"
    sf_kind = {torch.float32: "fp32", torch.float8_e4m3fn: "e4m3", torch.int32: "ue8m0"}[sf_dtype]
    kernel = ManifestKernel(cb.CastBackVariant(in_fmt, fmt, sf_kind, block[1] == 1))
    p = cb._plan(kernel, 0, data_dtype, sf_dtype, fmt, *block)
    layouts = [(False, 0), (True, 0), (False, 32)] if block[1] != 1 else [(False, 0), (False, 32)]
    for (num_tokens, hidden), (col_major, row_pad) in itertools.product(((1, 16), (5, 272), (37, 1024)), layouts):
        x = cb_inputs(num_tokens, hidden, data_dtype, sf_dtype, block, col_major, row_pad)
        want = tilebake.quant.cast_back(x, fmt, block)
        y, launches = trace(p, x)
        assert layout(y) == layout(want)
        scale = 4 if sf_dtype == torch.int32 else 1
        data, sf = x
        assert [launch[0] for launch in launches] == [0]
        assert params_of(kernel, launches[0]) == dict(
            X=data.data_ptr(), S=sf.data_ptr(), Y=y.data_ptr(), block_m=block[0], block_k=block[1],
            num_tokens=num_tokens, x_cols=data.shape[1], x_stride=data.stride(0),
            sf_stride_0=sf.stride(0) * scale, sf_stride_1=sf.stride(1) * scale,
        )  # fmt: skip
    # what the Python path refuses, or an empty problem, the plan leaves to it
    data, sf = cb_inputs(5, 272, data_dtype, sf_dtype, block)
    assert trace(p, cb_inputs(0, 272, data_dtype, sf_dtype, block))[0] is NotImplemented
    assert trace(p, (data, sf[:-1]))[0] is NotImplemented  # the SF's shape
    assert trace(p, [data, sf])[0] is NotImplemented  # a list: the Python path
    assert trace(p, (data.float(), sf))[0] is NotImplemented
    misaligned = torch.empty(5 * data.shape[1] + 4, dtype=data.dtype)[4:].view(5, -1)
    assert trace(p, (misaligned, sf))[0] is NotImplemented
    if block[1] == 1:  # no column-major per-channel SF (with more than one row and column of them)
        data, sf = cb_inputs(160, 272, data_dtype, sf_dtype, block)
        col = torch.empty_strided(sf.shape, (1, sf.shape[0]), dtype=sf.dtype).copy_(sf)
        assert trace(p, (data, sf))[0] is not NotImplemented and trace(p, (data, col))[0] is NotImplemented


def test_cast_back_looks_up_the_key_it_builds(monkeypatch):
    monkeypatch.setattr(cb, "_PLANS", KeyLog())
    x = cb_inputs(3, 64, torch.int8, torch.int32, (1, 32))
    tilebake.quant.cast_back(x, "bf16", (1, 32))
    tilebake.quant.per_token_cast_back(x, "bf16", 32)
    assert cb._PLANS.keys == [("bf16", (1, 32), None, torch.int8, torch.int32)] * 2  # the build site's tuple


# --- per_token_cast_and_cast_back ---

FLAGS = [(False, False), (True, False), (False, True)]  # (round_sf, use_e4m3_sf)
PTCACB_CASES = list(itertools.product((torch.bfloat16, torch.float32), ("e4m3", "e2m1"), (16, 128), FLAGS))


@pytest.mark.parametrize("dtype,fmt,npc,flags", PTCACB_CASES)
def test_per_token_cast_and_cast_back_plan(dtype, fmt, npc, flags, bumps):
    round_sf, use_e4m3_sf = flags
    in_dtype = "bf16" if dtype == torch.bfloat16 else "fp32"
    kernel = ManifestKernel(ptcacb.PerTokenCastAndCastBackVariant(in_dtype, fmt, npc))
    clamp = config.get_amax_clamp_for_quant(fmt, use_e4m3_sf)
    p = ptcacb._plan(kernel, 0, dtype, clamp, round_sf, use_e4m3_sf)
    assert bumps == [0]  # x, as torch's in-place ops do
    for num_tokens, hidden, pad in ((1, 16, 0), (5, 7168, 0), (37, 272, 32)):
        x = torch.randn(num_tokens, hidden + pad).to(dtype)[:, :hidden]
        result, launches = trace(p, x)
        assert result is None and [launch[0] for launch in launches] == [0]
        assert params_of(kernel, launches[0]) == dict(
            X=x.data_ptr(), amax_clamp=pytest.approx(clamp, rel=1e-7), round_sf=int(round_sf),
            use_e4m3_sf=int(use_e4m3_sf), num_tokens=num_tokens, hidden=hidden, x_stride=x.stride(0),
        )  # fmt: skip
    assert trace(p, torch.randn(4, 24).to(dtype))[0] is NotImplemented  # H % 16
    assert trace(p, torch.randn(0, 64).to(dtype))[0] is NotImplemented  # no rows: the Python path
    assert trace(p, torch.randn(4, 66).to(dtype)[:, :64])[0] is NotImplemented  # rows not 16-byte multiples
    assert trace(p, torch.randn(4 * 64 + 1).to(dtype)[1:].view(4, 64))[0] is NotImplemented  # misaligned


def test_per_token_cast_and_cast_back_key_and_cpu_bump(monkeypatch):
    monkeypatch.setattr(ptcacb, "_PLANS", KeyLog())
    x = torch.randn(3, 64).bfloat16()
    version = x._version
    tilebake.quant.per_token_cast_and_cast_back(x, "e2m1", 32, True, False)
    assert ptcacb._PLANS.keys == [(torch.bfloat16, "e2m1", 32, True, False)] and x._version > version


# --- per_block_cast_lossless ---

# (x_block_size, input SF packed, column-major, out_block_size, packed, column-major)
PBCL_CASES = [
    ((1, 32), True, False, (1, 128), False, False),
    ((1, 32), True, False, (1, 128), True, True),
    ((1, 16), False, False, (32, 32), True, False),
    ((32, 32), False, True, (128, 128), False, True),
    ((1, 32), True, True, (16, 128), True, True),
    ((1, 16), False, False, (1, 16), False, False),
]


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("case", PBCL_CASES)
def test_per_block_cast_lossless_plan(case, given, bumps):
    inb, in_packed, in_col, outb, packed, col = case
    kernel = ManifestKernel(pbcl.PerBlockCastLosslessVariant("e4m3"))
    sf_dtype = torch.int32 if in_packed else torch.float32
    p = pbcl._plan(kernel, 0, torch.int8, sf_dtype, inb, outb, col, packed, given)
    assert bumps == ([2, 3] if given else [])  # out= parts, as torch's out= ops do
    kwargs = sf_kwargs(packed, col)
    for num_tokens, hidden in ((1, 128), (5, 288), (37, 416)):
        x = make_fp4(num_tokens, hidden, inb, in_packed, in_col, "cpu")
        out = poisoned_out(num_tokens, hidden, outb, packed, col, "cpu") if given else None
        want = pbcl.per_block_cast_lossless(x, "e4m3", inb, outb, **kwargs)
        (y, sf), launches = trace(p, x, out)
        if given:
            assert y is out[0] and sf is out[1]
        assert layout(y) == layout(want[0]) and layout(sf) == layout(want[1])
        expected = RecordingTable(pbcl.PerBlockCastLosslessVariant)
        pbcl.launch(x[0], x[1], y, sf, inb, outb, packed, kernels=expected)
        assert [params_of(kernel, launch) for launch in launches] == expected.calls
    x = make_fp4(5, 288, inb, in_packed, in_col, "cpu")
    out = poisoned_out(5, 288, outb, packed, col, "cpu") if given else None
    empty = (torch.empty(0, 144, dtype=torch.int8), torch.empty(0, x[1].shape[1], dtype=sf_dtype))
    assert trace(p, empty, out)[0] is NotImplemented  # no rows: the Python path
    assert trace(p, (x[0], x[1][:, :-1]), out)[0] is NotImplemented  # the input SF's shape
    assert trace(p, (x[0][:, :128], x[1]), out)[0] is NotImplemented  # H does not match the SF
    if given:  # out[0]'s rows closer than their length
        close = (torch.empty(5, 288, dtype=torch.float8_e4m3fn).as_strided((5, 288), (16, 1)), out[1])
        assert trace(p, x, close)[0] is NotImplemented
        assert trace(p, x, (out[0], None))[0] is NotImplemented  # a part to allocate: the Python path


def test_per_block_cast_lossless_looks_up_the_key_it_builds(monkeypatch):
    monkeypatch.setattr(pbcl, "_PLANS", KeyLog())
    x = make_fp4(3, 64, (1, 32), True, False, "cpu")
    out = poisoned_out(3, 64, (1, 128), False, False, "cpu")
    for given in (None, out):
        pbcl.per_block_cast_lossless(x, "e4m3", (1, 32), (1, 128), out=given)
        assert pbcl._PLANS.keys[-1] == pbcl._plan_key(x, "e4m3", (1, 32), (1, 128), False, False, False, False, given)
    # 1 for True is an equal value but not an equal key: the Python path refuses it
    assert pbcl._plan_key(x, "e4m3", (1, 32), (1, 128), False, 1, False, False, None) != pbcl._PLANS.keys[0]
    assert pbcl._plan_key(x, "e4m3", [1, 32], (1, 128), False, False, False, False, None) is None


# --- batched_transpose_weight_sf ---


def make_sf(shape, transposed=False):
    """Power-of-two scales; transposed: a strided view of the same shape."""
    if transposed:
        return torch.exp2(torch.randint(-20, 11, shape[:-2] + shape[:-3:-1]).float()).transpose(-1, -2)
    return torch.exp2(torch.randint(-20, 11, shape).float())


BT_CASES = [
    [(1, 1)],
    [(3, 5)],
    [(2, 3, 5)],
    [(7, 9), (1, 4, 3)],
    [(56, 16), (3, 5), (8, 56, 16), (2, 6)],
]


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize("shapes", BT_CASES, ids=str)
def test_batched_transpose_weight_sf_plans(shapes, bs, given, bumps):
    kernel = ManifestKernel(btws.BatchedTransposeWeightSfVariant("fp32"))
    for flags in {tuple(i % 2 == 0 for i in range(len(shapes))), tuple(i % 2 == 1 for i in range(len(shapes)))}:
        bumps.clear()
        ranks = tuple(len(s) for s in shapes)
        call = btws._plans(kernel, 0, bs, ranks, flags, given)
        n = len(shapes)
        assert bumps == ([s for i in range(n) for s in (3 * i + 1, 3 * i + 2)] if given else [])
        sfs = [make_sf(shape, transposed=i % 2 == 1) for i, shape in enumerate(shapes)]
        want = tilebake.torch.batched_transpose_weight_sf(sfs, bs, list(flags))
        outs = [tuple(poison_(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)) for t in w) for w in want]
        args = (*sfs, *outs) if given else sfs
        (result, bad), launches = trace(call, *args)
        assert type(result) is tuple and len(result) == n
        assert bad.dtype == torch.int32 and bad.shape == (1,)  # the flag the kernels set
        expected = RecordingTable(btws.BatchedTransposeWeightSfVariant)
        for (sf0, sf1), (w0, w1), s, flag, out in zip(result, want, sfs, flags, outs):
            if given:
                assert sf0 is out[0] and sf1 is out[1]
            assert layout(sf0) == layout(w0) and layout(sf1) == layout(w1)
            btws.transform(s, bs, flag, (sf0, sf1), kernels=expected, bad=bad)
        assert [launch[0] for launch in launches] == list(range(2 * n))
        assert [params_of(kernel, launch) for launch in launches] == expected.calls
        # what the Python path refuses, or an empty weight, the plans leave to it
        # (another shape is another weight, but not of the given outs)
        for bad in [torch.ones(0, *shapes[0][1:]), sfs[0].double()] + ([sfs[0][..., :-1]] if given else []):
            bad_args = (bad, *args[1:])
            assert trace(call, *bad_args)[0] is NotImplemented
        if given:  # an out part to allocate, an out of another shape
            assert trace(call, *sfs, (outs[0][0], None), *outs[1:])[0] is NotImplemented
            assert trace(call, *sfs, (outs[0][0], outs[0][1][..., :-1]), *outs[1:])[0] is NotImplemented


def test_batched_transpose_weight_sf_plans_cover_four_weights():
    kernel = ManifestKernel(btws.BatchedTransposeWeightSfVariant("fp32"))
    for given in (False, True):
        assert btws._plans(kernel, 0, 128, (3, 3, 3, 3), (True, False, True, False), given) is not None


def test_batched_transpose_weight_sf_looks_up_the_key_it_builds(monkeypatch):
    monkeypatch.setattr(btws, "_PLANS", KeyLog())
    sfs = [make_sf((3, 5)), make_sf((2, 4, 3))]
    want = tilebake.torch.batched_transpose_weight_sf(sfs, 32, [True, False])
    outs = [tuple(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype) for t in w) for w in want]
    for given in (None, outs):
        btws.batched_transpose_weight_sf(sfs, 32, [True, False], given)
        assert btws._PLANS.keys[-1] == btws._plan_key(sfs, 32, [True, False], given)
    assert btws._plan_key(sfs, 32, [1, False], None) != btws._PLANS.keys[0]  # 1 for True: the Python path
    flags = (t for t in [True, False])  # a generator: the key raises before consuming it
    with pytest.raises(TypeError):
        btws._plan_key(sfs, 32, flags, None)
    assert list(flags) == [True, False]


def test_given_outs_are_bumped_on_the_cpu_path_too():
    x = make_fp4(3, 64, (1, 32), True, False, "cpu")
    out = poisoned_out(3, 64, (1, 128), False, False, "cpu")
    versions = [t._version for t in out]
    pbcl.per_block_cast_lossless(x, "e4m3", (1, 32), (1, 128), out=out)
    assert all(t._version > v for t, v in zip(out, versions))
    sf = make_sf((3, 5))
    ((e0, e1),) = tilebake.torch.batched_transpose_weight_sf([sf], 32, [True])
    outs = [(torch.empty_like(e0), torch.empty_like(e1))]
    versions = [t._version for t in outs[0]]
    btws.batched_transpose_weight_sf([sf], 32, [True], outs)
    assert all(t._version > v for t, v in zip(outs[0], versions))


def test_torch_compile_traces_past_a_plan(monkeypatch):
    """With a plan for the call's key (as after an eager CUDA call), torch.compile(fullgraph=True)
    still traces the torch.library op: the native call is not traceable."""
    x = cb_inputs(3, 64, torch.float8_e4m3fn, torch.float32, (1, 32))
    kernel = ManifestKernel(cb.CastBackVariant("e4m3", "bf16", "fp32", False))
    cast_back_plan = cb._plan(kernel, 0, *(t.dtype for t in x), "bf16", 1, 32)
    monkeypatch.setitem(cb._PLANS, ("bf16", (1, 32), None, *(t.dtype for t in x)), cast_back_plan)
    compiled = torch.compile(lambda d, s: tilebake.quant.cast_back((d, s), "bf16", (1, 32)), fullgraph=True,
                             backend="aot_eager")  # fmt: skip
    assert torch.equal(compiled(*x), tilebake.quant.cast_back(x, "bf16", (1, 32)))
    y = torch.randn(3, 64).bfloat16()
    kernel = ManifestKernel(ptcacb.PerTokenCastAndCastBackVariant("bf16", "e4m3", 32))
    ptcacb_plan = ptcacb._plan(kernel, 0, torch.bfloat16, 1e-4, False, False)
    monkeypatch.setitem(ptcacb._PLANS, (torch.bfloat16, "e4m3", 32, False, False), ptcacb_plan)
    want = y.clone()
    tilebake.quant.per_token_cast_and_cast_back(want, "e4m3", 32)
    torch.compile(lambda t: tilebake.quant.per_token_cast_and_cast_back(t, "e4m3", 32), fullgraph=True,
                  backend="aot_eager")(y)  # fmt: skip
    assert torch.equal(y, want)


def test_batched_transpose_weight_sf_reads_the_kernels_flag():
    """_raise_if_bad: nothing for a clear flag; check_power_of_two_scales's error for the first
    weight holding a bad scale when the kernels set it."""
    good = make_sf((4, 8))
    bad = good.clone()
    bad[2, 3] = 0.75
    btws._raise_if_bad(torch.zeros(1, dtype=torch.int32), [good, bad])  # a clear flag: no read of the scales
    with pytest.raises(ValueError, match="sf\\[1\\]\\[2, 3\\] = 0.75"):
        btws._raise_if_bad(torch.ones(1, dtype=torch.int32), [good, bad, -good])
    with pytest.raises(AssertionError, match="flagged a scale the host check accepts"):
        btws._raise_if_bad(torch.ones(1, dtype=torch.int32), [good])
