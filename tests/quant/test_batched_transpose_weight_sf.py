"""batched_transpose_weight_sf: the layouts (api.md 1.2.4 and 1.12: sf0 and sf1 for every weight,
sf1 the buffer itself or its transposed view), outs (filled and returned themselves, either part
None), argument checks, the CPU path, and bit-exact GPU results against the reference.
tests/quant/test_batched_transpose_weight_sf_emulated.py runs the kernel's C++ on the CPU (opt-in)."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.cast import unpack_ue8m0
from tilebake.torch.weight_sf import sf1_layout, weight_sf_layout


def make_sf(shape, device):
    """Power-of-two scales 2^-20 .. 2^10."""
    return torch.exp2(torch.randint(-20, 11, shape, device=device).float())


def expected_bytes(sf2d, bs):
    """(n/bs, k/bs) scales -> (n, k/bs) exponent bytes, rows repeated bs times."""
    return (torch.log2(sf2d).round().to(torch.int32) + 127).repeat_interleave(bs, dim=0)


def check_layout(sf0, sf1, sf, bs, transpose):
    """Shapes and strides as the original returns them; the words hold the scales they must."""
    nb, kb = sf.shape
    n, k, w0, w1 = nb * bs, kb * bs, -(-kb // 4), -(-nb // 4)
    assert sf0.dtype == sf1.dtype == torch.int32
    assert sf0.shape == (n, w0) and sf0.stride() == (1, n)  # MN-major: a (w0, n) buffer's transposed view
    assert torch.equal(unpack_ue8m0(sf0, kb), expected_bytes(sf, bs))
    if transpose:  # the (w1, k) buffer itself
        assert sf1.shape == (w1, k) and sf1.stride() == (k, 1)
        sf1 = sf1.t()
    else:  # its transposed view
        assert sf1.shape == (k, w1) and sf1.stride() == (1, k)
    assert torch.equal(unpack_ue8m0(sf1, nb), expected_bytes(sf.t(), bs))


@pytest.mark.parametrize("bs", [32, 128])
def test_reference_layout(bs):
    sfs = [make_sf((4, 8), "cpu"), make_sf((6, 3), "cpu"), make_sf((2, 5), "cpu").t(), make_sf((7, 9), "cpu")]
    flags = [True, False, True, False]
    results = tilebake.torch.batched_transpose_weight_sf(sfs, bs, flags)
    for (sf0, sf1), sf, t in zip(results, sfs, flags):
        check_layout(sf0, sf1, sf, bs, t)
    # Unused bytes of the last word are zero: 3 K blocks use bytes 0..2 only, 6 N blocks 0..1 of word 1.
    assert torch.all((results[1][0] >> 24) == 0)
    assert torch.all((results[1][1][:, 1] >> 16) == 0)


@pytest.mark.parametrize("bs", [32, 128])
def test_sf1_with_and_without_transpose_are_the_same_words(bs):
    sf = make_sf((7, 5), "cpu")
    ((a0, a1), (b0, b1)) = tilebake.quant.batched_transpose_weight_sf([sf, sf], bs, [True, False])
    assert torch.equal(a0, b0) and torch.equal(a1, b1.t())


@pytest.mark.parametrize("transpose", [True, False])
def test_grouped_and_cpu_path_match_reference(transpose):
    sfs = [make_sf((3, 4, 6), "cpu"), make_sf((4, 8), "cpu")]
    results = tilebake.quant.batched_transpose_weight_sf(sfs, 128, [transpose, True])
    expected = tilebake.torch.batched_transpose_weight_sf(sfs, 128, [transpose, True])
    for got, exp in zip(results, expected):
        for a, b in zip(got, exp):
            assert_bytes_equal(a, b, "sf")
            assert a.stride() == b.stride()
    sf0, sf1 = results[0]
    # Per group: sf0 (512, 2) of a (2, 512) buffer; sf1 of a (1, 768) buffer.
    assert sf0.shape == (3, 512, 2) and sf0.stride() == (1024, 1, 512)
    if transpose:
        assert sf1.shape == (3, 1, 768) and sf1.stride() == (768, 768, 1)
    else:
        assert sf1.shape == (3, 768, 1) and sf1.stride() == (768, 1, 768)
    for g in range(3):
        check_layout(sf0[g], sf1[g], sfs[0][g], 128, transpose)


@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("which", ["both", "sf0", "sf1"])
def test_cpu_outs_are_filled_and_returned_themselves(transpose, which):
    sf = make_sf((4, 8), "cpu")
    given = (poison_(weight_sf_layout(128, 8, None, "cpu")), poison_(sf1_layout(4, 256, None, transpose, "cpu")))
    out = (given[0] if which != "sf1" else None, given[1] if which != "sf0" else None)
    ((sf0, sf1),) = tilebake.quant.batched_transpose_weight_sf([sf], 32, [transpose], [out])
    assert (sf0 is given[0]) == (out[0] is not None) and (sf1 is given[1]) == (out[1] is not None)
    check_layout(sf0, sf1, sf, 32, transpose)


def test_cpu_outs_of_other_strides():
    """outs may have any strides (the original insists on its own): they are filled in place."""
    sf = make_sf((2, 3, 5), "cpu")
    out = (poison_(torch.empty(2, 384, 2, dtype=torch.int32)), poison_(torch.empty(2, 640, 1, dtype=torch.int32)))
    ((sf0, sf1),) = tilebake.quant.batched_transpose_weight_sf([sf], 128, [False], [out])
    ((e0, e1),) = tilebake.torch.batched_transpose_weight_sf([sf], 128, [False])
    assert sf0 is out[0] and sf1 is out[1]
    assert_bytes_equal(sf0, e0, "sf0")
    assert_bytes_equal(sf1, e1, "sf1")


def _outs(sf0_shape=(128, 2), sf1_shape=(1, 256), dtype=torch.int32):
    return [(torch.empty(sf0_shape, dtype=dtype), torch.empty(sf1_shape, dtype=dtype))]


BAD_CALLS = [
    (dict(block_size=64), ValueError, "block_size must be one of"),
    (dict(transpose_sf1s=[True, False]), ValueError, "transpose_sf1s must have one flag per weight"),
    (dict(transpose_sf1s=[1]), TypeError, "transpose_sf1s\\[0\\] must be a bool"),
    (dict(outs=[None, None]), ValueError, "outs must have one entry"),
    (dict(sf=[torch.ones(4, 8, dtype=torch.float64)]), TypeError, "sf\\[0\\] must be torch.float32"),
    (dict(sf=[torch.ones(4)]), ValueError, "sf\\[0\\] must be \\(n/bs, k/bs\\)"),
    (dict(sf=["x"]), TypeError, "sf\\[0\\] must be a torch.Tensor"),
    (dict(sf=[torch.full((4, 8), 3.0)]), ValueError, "sf\\[0\\] must hold positive normal fp32 powers of two"),
    (dict(sf=[-torch.ones(4, 8)]), ValueError, "powers of two"),
    (dict(sf=[torch.zeros(4, 8)]), ValueError, "powers of two"),
    (dict(sf=[torch.full((4, 8), float("inf"))]), ValueError, "powers of two"),
    (dict(sf=[torch.ones(4, 8, device="meta")]), ValueError, "must be on a CUDA device, an NPU or the CPU"),
    (dict(outs=_outs(sf0_shape=(128, 3))), ValueError, "outs\\[0\\]\\[0\\] must have shape \\(128, 2\\)"),
    (dict(outs=_outs(sf1_shape=(256, 1))), ValueError, "outs\\[0\\]\\[1\\] must have shape \\(1, 256\\)"),
    (dict(outs=_outs(), transpose_sf1s=[False]), ValueError, "outs\\[0\\]\\[1\\] must have shape \\(256, 1\\)"),
    (dict(outs=_outs(dtype=torch.float32)), TypeError, "outs\\[0\\]\\[0\\] must be torch.int32"),
    (dict(outs=[(None, "x")]), TypeError, "outs\\[0\\]\\[1\\] must be a torch.Tensor \\(or None\\)"),
    (dict(outs=[torch.empty(128, 2)]), TypeError, "outs\\[0\\] must be None or a \\(sf0, sf1\\) pair"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(sf=[torch.ones(4, 8)], block_size=32, transpose_sf1s=[True])
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.batched_transpose_weight_sf(**args)


def test_empty_list_and_empty_weight():
    assert tilebake.quant.batched_transpose_weight_sf([], 128, []) == []
    (a, b) = tilebake.quant.batched_transpose_weight_sf([torch.ones(0, 8), torch.ones(0, 8)], 128, [True, False])
    assert a[0].shape == (0, 2) and a[1].shape == (0, 1024) and b[1].shape == (1024, 0)


# --- GPU ---

GPU_SHAPES = [(1, 1), (56, 56), (7168 // 128, 2048 // 128), (8, 56, 16), (3, 5, 7), (2, 7168 // 32, 384 // 32)]


def gpu_inputs(shape):
    """Each shape twice (the second a strided view), each with both sf1 layouts."""
    a, b = make_sf(shape, "cuda"), make_sf(shape[:-2] + shape[:-3:-1], "cuda").transpose(-1, -2)
    return [a, b, a, b], [True, False, False, True]


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_bit_exact(shape, bs):
    sfs, flags = gpu_inputs(shape)
    expected = tilebake.torch.batched_transpose_weight_sf(sfs, bs, flags)
    results = tilebake.quant.batched_transpose_weight_sf(sfs, bs, flags)
    for (a0, a1), (b0, b1) in zip(results, expected):
        assert_bytes_equal(a0, b0, "sf0")
        assert_bytes_equal(a1, b1, "sf1")
        assert a0.stride() == b0.stride() and a1.stride() == b1.stride()


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("which", ["both", "sf0", "sf1"])
def test_gpu_poisoned_outs_are_filled_and_returned_themselves(shape, bs, which):
    """Every word of a given output is written; the given tensors come back, None parts are allocated."""
    sfs, flags = gpu_inputs(shape)
    expected = tilebake.torch.batched_transpose_weight_sf(sfs, bs, flags)
    wanted = {"both": (0, 1), "sf0": (0,), "sf1": (1,)}[which]
    outs = [tuple(poison_(torch.empty_like(t)) if j in wanted else None for j, t in enumerate(p)) for p in expected]
    results = tilebake.quant.batched_transpose_weight_sf(sfs, bs, flags, outs)
    for got, exp, out in zip(results, expected, outs):
        for j in range(2):
            if out[j] is not None:
                assert got[j] is out[j]
            assert_bytes_equal(got[j], exp[j], f"sf{j}")
            assert got[j].stride() == exp[j].stride()


@pytest.mark.gpu
def test_gpu_outs_of_other_strides():
    sf = make_sf((2, 3, 5), "cuda")
    out = tuple(poison_(torch.empty(shape, dtype=torch.int32, device="cuda")) for shape in [(2, 384, 2), (2, 640, 1)])
    ((sf0, sf1),) = tilebake.quant.batched_transpose_weight_sf([sf], 128, [False], [out])
    ((e0, e1),) = tilebake.torch.batched_transpose_weight_sf([sf], 128, [False])
    assert sf0 is out[0] and sf1 is out[1]
    assert_bytes_equal(sf0, e0, "sf0")
    assert_bytes_equal(sf1, e1, "sf1")


@pytest.mark.gpu
@pytest.mark.parametrize("value", [0.75, float("inf"), float("nan"), -1.0, 0.0, 2.0**-127, 3.0 * 2.0**100])
def test_gpu_rejects_non_power_of_two(value):
    """The kernels flag the scale, the host reads the flag: from the Python path (first call) and
    from the plan (second call, also with outs given), the error names the weight and the entry."""
    good = make_sf((2, 3), "cuda")
    sf = make_sf((4, 8), "cuda")
    sf[2, 3] = value
    ((w0, w1),) = tilebake.torch.batched_transpose_weight_sf([make_sf((4, 8), "cuda")], 32, [True])
    outs = [None, (torch.empty_like(w0), torch.empty_like(w1))]
    for given in (None, None, outs, outs):
        with pytest.raises(ValueError, match="sf\\[1\\]\\[2, 3\\] = "):
            tilebake.quant.batched_transpose_weight_sf([good, sf], 32, [False, True], given)
    ((w0, w1),) = tilebake.torch.batched_transpose_weight_sf([good], 32, [False])
    (g0, g1), _ = tilebake.quant.batched_transpose_weight_sf([good, good], 32, [False, True])  # a good call still passes
    assert_bytes_equal(g0, w0, "sf0")


@pytest.mark.gpu
def test_gpu_kernel_flags_exactly_what_the_host_check_refuses():
    """Every exponent byte with sign and mantissa patterns, and random bits, as one weight's
    scales: the kernels' flag is set, and each output byte is 0xFF exactly where
    check_power_of_two_scales's rule refuses the scale (the exponent byte elsewhere)."""
    import importlib

    op = importlib.import_module("tilebake.quant.batched_transpose_weight_sf")
    exponents = torch.arange(256, dtype=torch.int32) << 23
    patterns = torch.tensor([0, 1, 0x400000, 0x7FFFFF, -(2**31), -(2**31) + 1], dtype=torch.int32)
    bits = torch.cat([(exponents[:, None] | patterns[None, :]).flatten(), torch.randint(-(2**31), 2**31 - 1, (4096,))])
    bits = bits[: bits.numel() // 4 * 4].to(torch.int32)
    exponent = (bits >> 23) & 0xFF
    refused = ((bits & 0x807FFFFF) != 0) | (exponent == 0) | (exponent == 255)
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    sf0, _ = op.transform(bits.view(torch.float32).view(1, -1).cuda(), 32, True, None, bad=flag)
    got = sf0[0].cpu().view(torch.uint8)  # row 0: the scales' bytes in column order
    want = torch.where(refused, 0xFF, exponent).to(torch.uint8)
    assert flag.item() == 1
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_gpu_graph_capture_marks_a_bad_scale_as_nan():
    """Under CUDA-graph capture the flag cannot be read back: the kernel writes 0xFF (UE8M0 NaN)
    for the bad scale's byte, and the right bytes everywhere else."""
    sf = make_sf((4, 8), "cuda")
    good = sf.clone()
    sf[2, 3] = 0.75
    ((e0, e1),) = tilebake.torch.batched_transpose_weight_sf([good], 128, [False])
    outs = [(torch.empty_like(e0), torch.empty_like(e1))]
    tilebake.quant.batched_transpose_weight_sf([good], 128, [False], outs)  # loads the kernel before capture
    with pytest.raises(ValueError, match="powers of two"):
        tilebake.quant.batched_transpose_weight_sf([sf], 128, [False], outs)  # outside a graph: the flag, read
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilebake.quant.batched_transpose_weight_sf([sf], 128, [False], outs)
    graph.replay()
    want0, want1 = e0.clone(), e1.clone()
    # Scale [2, 3]: in sf0 byte 3 (the top byte) of word 0 in the 128 rows of block row 2; in sf1
    # byte 2 of word 0 in the 128 rows (of k) of block column 3.
    want0[2 * 128 : 3 * 128, 0] = (want0[2 * 128 : 3 * 128, 0] & 0x00FFFFFF) | -0x1000000
    want1[3 * 128 : 4 * 128, 0] = (want1[3 * 128 : 4 * 128, 0] & -0xFF0001) | 0xFF0000
    assert_bytes_equal(outs[0][0], want0, "sf0")
    assert_bytes_equal(outs[0][1], want1, "sf1")
