"""batched_transpose_weight_sf: the layout (an interpretation, see tilebake.torch.weight_sf),
argument checks, the CPU path, and bit-exact GPU results against the reference."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.cast import unpack_ue8m0
from tilebake.torch.weight_sf import weight_sf_layout


def make_sf(shape, device):
    """Power-of-two scales 2^-20 .. 2^10."""
    return torch.exp2(torch.randint(-20, 11, shape, device=device).float())


def expected_bytes(sf2d, bs):
    """(n/bs, k/bs) scales -> (n, k/bs) exponent bytes, rows repeated bs times."""
    return (torch.log2(sf2d).round().to(torch.int32) + 127).repeat_interleave(bs, dim=0)


def check_layout(sf0, sf1, sf, bs, transpose):
    """Unpack the words and compare with the scales they must hold; MN-major TMA-aligned strides."""
    nb, kb = sf.shape
    assert sf0.shape == (nb * bs, -(-kb // 4)) and sf0.dtype == torch.int32
    assert sf0.stride() == (1, -(-nb * bs // 4) * 4)
    assert torch.equal(unpack_ue8m0(sf0, kb), expected_bytes(sf, bs))
    if transpose:
        assert sf1.shape == (kb * bs, -(-nb // 4)) and sf1.stride() == (1, -(-kb * bs // 4) * 4)
        assert torch.equal(unpack_ue8m0(sf1, nb), expected_bytes(sf.t(), bs))
    else:
        assert sf1 is None


@pytest.mark.parametrize("bs", [32, 128])
def test_reference_layout(bs):
    sfs = [make_sf((4, 8), "cpu"), make_sf((6, 3), "cpu"), make_sf((2, 5), "cpu").t()]
    results = tilebake.torch.batched_transpose_weight_sf(sfs, bs, [True, False, True])
    for (sf0, sf1), sf, t in zip(results, sfs, [True, False, True]):
        check_layout(sf0, sf1, sf, bs, t)
    # Unused bytes of the last word are zero: 3 K blocks use bytes 0..2 only.
    assert torch.all((results[1][0] >> 24) == 0)


def test_grouped_and_cpu_path_match_reference():
    sfs = [make_sf((3, 4, 6), "cpu"), make_sf((4, 8), "cpu")]
    results = tilebake.quant.batched_transpose_weight_sf(sfs, 128, [True, True])
    expected = tilebake.torch.batched_transpose_weight_sf(sfs, 128, [True, True])
    for got, exp in zip(results, expected):
        for a, b in zip(got, exp):
            assert_bytes_equal(a, b, "sf")
            assert a.stride() == b.stride()
    sf0, sf1 = results[0]
    assert sf0.shape == (3, 512, 2) and sf0.stride() == (1024, 1, 512)
    for g in range(3):
        check_layout(sf0[g], sf1[g], sfs[0][g], 128, True)


def test_cpu_outs_are_written_in_place():
    sf = make_sf((4, 8), "cpu")
    out = (poison_(weight_sf_layout(128, 8, None, "cpu")), poison_(weight_sf_layout(256, 4, None, "cpu")))
    ((sf0, sf1),) = tilebake.quant.batched_transpose_weight_sf([sf], 32, [True], [out])
    assert sf0 is out[0] and sf1 is out[1]
    check_layout(sf0, sf1, sf, 32, True)


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
    (dict(sf=[torch.ones(4, 8, device="meta")]), ValueError, "must be on a CUDA device or the CPU"),
    (
        dict(outs=[(torch.empty(128, 2, dtype=torch.int32), torch.empty(256, 1, dtype=torch.int32))]),
        ValueError,
        "outs\\[0\\]\\[1\\] must be None",
    ),
    (dict(outs=[(torch.empty(128, 3, dtype=torch.int32), None)]), ValueError, "outs\\[0\\]\\[0\\] must have shape"),
    (dict(outs=[(torch.empty(128, 2), None)]), TypeError, "outs\\[0\\]\\[0\\] must be torch.int32"),
    (dict(outs=[torch.empty(128, 2)]), TypeError, "outs\\[0\\] must be None or a \\(sf0, sf1\\) pair"),
]


@pytest.mark.parametrize("overrides,exc,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_rejects_bad_arguments(overrides, exc, message):
    args = dict(sf=[torch.ones(4, 8)], block_size=32, transpose_sf1s=[False])
    args.update(overrides)
    with pytest.raises(exc, match=message):
        tilebake.quant.batched_transpose_weight_sf(**args)


def test_empty_list_and_empty_weight():
    assert tilebake.quant.batched_transpose_weight_sf([], 128, []) == []
    ((sf0, sf1),) = tilebake.quant.batched_transpose_weight_sf([torch.ones(0, 8)], 128, [True])
    assert sf0.shape == (0, 2) and sf1.shape == (1024, 0)


# --- GPU ---


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize(
    "shape", [(1, 1), (56, 56), (7168 // 128, 2048 // 128), (8, 56, 16), (3, 5, 7), (2, 7168 // 32, 384 // 32)]
)
def test_gpu_bit_exact(shape, bs):
    sfs = [make_sf(shape, "cuda"), make_sf(shape, "cuda").transpose(-1, -2)]  # also a strided input
    flags = [True, False]
    expected = tilebake.torch.batched_transpose_weight_sf(sfs, bs, flags)
    results = tilebake.quant.batched_transpose_weight_sf(sfs, bs, flags)
    for (a0, a1), (b0, b1) in zip(results, expected):
        assert_bytes_equal(a0, b0, "sf0")
        assert a0.stride() == b0.stride()
        if b1 is None:
            assert a1 is None
        else:
            assert_bytes_equal(a1, b1, "sf1")
            assert a1.stride() == b1.stride()
    # Poisoned preallocated outputs: every word is written.
    outs = [tuple(poison_(t) if t is not None else None for t in pair) for pair in expected]
    results = tilebake.quant.batched_transpose_weight_sf(sfs, bs, flags, outs)
    for (a0, a1), (b0, b1), out in zip(results, tilebake.torch.batched_transpose_weight_sf(sfs, bs, flags), outs):
        assert a0 is out[0]
        assert_bytes_equal(a0, b0, "sf0 (out)")
        if b1 is not None:
            assert_bytes_equal(a1, b1, "sf1 (out)")


@pytest.mark.gpu
def test_gpu_rejects_non_power_of_two():
    sf = make_sf((4, 8), "cuda")
    sf[2, 3] = 0.75
    with pytest.raises(ValueError, match="sf\\[0\\]\\[2, 3\\] = 0.75"):
        tilebake.quant.batched_transpose_weight_sf([sf], 128, [True])


@pytest.mark.gpu
def test_gpu_graph_capture_marks_a_bad_scale_as_nan():
    """Under CUDA-graph capture the host check cannot sync: the kernel writes 0xFF (UE8M0 NaN)
    for the bad scale's byte, and the right bytes everywhere else."""
    sf = make_sf((4, 8), "cuda")
    good = sf.clone()
    sf[2, 3] = 0.75
    expected = tilebake.torch.batched_transpose_weight_sf([good], 128, [False])[0][0]
    outs = [(torch.empty_like(expected), None)]
    tilebake.quant.batched_transpose_weight_sf([good], 128, [False], outs)  # loads the kernel before capture
    with pytest.raises(ValueError, match="powers of two"):
        tilebake.quant.batched_transpose_weight_sf([sf], 128, [False], outs)  # outside a graph: the host check
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilebake.quant.batched_transpose_weight_sf([sf], 128, [False], outs)
    graph.replay()
    want = expected.clone()
    # Scale [2, 3] is byte 3 (the top byte) of word 0 in the 128 rows of block row 2.
    want[2 * 128 : 3 * 128, 0] = (want[2 * 128 : 3 * 128, 0] & 0x00FFFFFF) | -0x1000000
    assert_bytes_equal(outs[0][0], want, "sf0")
