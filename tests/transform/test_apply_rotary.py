"""tilebake.transform.apply_rotary: argument checks and the CPU path (CI), and the kernel
against tilebake.torch.rotary_embedding_ref on CUDA, bit for bit (both compute
fma(x1, cos, -fp32(x2 sin)) and fma(x2, cos, fp32(x1 sin)) in fp32)."""

import math

import pytest
import torch

import tilebake
from tilebake.torch import rotary_embedding_ref
from tilebake.transform import apply_rotary
from tilebake.transform.apply_rotary import ApplyRotaryVariant


def make_cache(rows: int, rot: int, device="cpu") -> torch.Tensor:
    freqs = 10000.0 ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=1).float().to(device)


def wide_binades(shape, dtype, device="cpu") -> torch.Tensor:
    """Normal values scaled by 2^e, e uniform in [-20, 20]: many binades, no overflow."""
    scale = torch.exp2(torch.randint(-20, 21, shape, device=device).float())
    return (torch.randn(shape, device=device) * scale).to(dtype)


def first_difference(actual: torch.Tensor, expected: torch.Tensor, name: str) -> str:
    """'' when the bytes are equal, else which (token..., head, col) differs first and how."""
    a = actual.contiguous().view(-1).view(torch.uint8).view(actual.shape[:-1] + (-1,))
    e = expected.contiguous().view(-1).view(torch.uint8).view(expected.shape[:-1] + (-1,))
    bad = (a != e).view(*actual.shape[:-1], actual.shape[-1], -1).any(-1).nonzero()
    if bad.numel() == 0:
        return ""
    where = tuple(bad[0].tolist())
    return (
        f"{name}: {bad.shape[0]} of {actual.numel()} elements differ; first at (token..., head, col) {where}: "
        f"got {actual[where].item()!r}, expected {expected[where].item()!r}"
    )


def assert_same(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
    message = first_difference(actual, expected, name)
    assert not message, message


# --- CPU: variants, argument checks, the CPU path ---


def test_variants_are_dtype_by_rot_dim():
    assert {(v.dtype, v.rot_dim) for v in ApplyRotaryVariant.all()} == {
        ("bf16", 64),
        ("bf16", 128),
        ("fp32", 64),
        ("fp32", 128),
    }
    assert tilebake.transform.apply_rotary is apply_rotary


def test_rejects_bad_arguments():
    cs = make_cache(16, 64)
    q = torch.randn(4, 2, 64)
    with pytest.raises(TypeError, match="query must be torch.bfloat16 or torch.float32, got torch.float16"):
        apply_rotary(q.half(), cs)
    with pytest.raises(TypeError, match="query must be a torch.Tensor, got list"):
        apply_rotary([1.0], cs)
    with pytest.raises(
        ValueError, match=r"query must be \[T, H, rot_dim\] or \[B, S, H, rot_dim\], got shape \(4, 64\)"
    ):
        apply_rotary(torch.randn(4, 64), cs)
    with pytest.raises(ValueError, match=r"rot_dim\) must be one of \(64, 128\), got 96"):
        apply_rotary(torch.randn(4, 2, 96), make_cache(16, 96))
    with pytest.raises(ValueError, match="query must be contiguous in its last dim"):
        apply_rotary(torch.randn(4, 2, 128)[..., ::2], cs)
    with pytest.raises(TypeError, match="cos_sin_cache must be torch.float32, got torch.float64"):
        apply_rotary(q, cs.double())
    with pytest.raises(ValueError, match=r"cos_sin_cache must be \[max_positions, 64\].*got shape \(16, 128\)"):
        apply_rotary(q, make_cache(16, 128))
    with pytest.raises(ValueError, match=r"cos_sin_cache must be \[max_positions, 64\].*got shape \(1024,\)"):
        apply_rotary(q, cs.view(-1))
    with pytest.raises(ValueError, match="cos_sin_cache must be contiguous in its last dim"):
        apply_rotary(q, make_cache(16, 128)[:, ::2])
    with pytest.raises(TypeError, match="key must have query's dtype torch.float32, got torch.bfloat16"):
        apply_rotary(q, cs, key=q.bfloat16())
    with pytest.raises(ValueError, match=r"key must be \(4,\) \+ \(heads, 64\)"):
        apply_rotary(q, cs, key=torch.randn(5, 2, 64))
    with pytest.raises(ValueError, match=r"key must be \(4,\) \+ \(heads, 64\)"):
        apply_rotary(q, cs, key=torch.randn(1, 4, 2, 64))
    with pytest.raises(TypeError, match="positions must be torch.int32 or torch.int64, got torch.float32"):
        apply_rotary(q, cs, positions=torch.zeros(4))
    with pytest.raises(ValueError, match=r"positions must have shape \(4,\) \(query's tokens\), got \(1, 4\)"):
        apply_rotary(q, cs, positions=torch.zeros(1, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="interleaved must be a bool, got float"):
        apply_rotary(q, cs, interleaved=1.0)
    with pytest.raises(TypeError, match="conjugate must be a bool, got str"):
        apply_rotary(q, cs, conjugate="yes")
    with pytest.raises(TypeError, match="seqlen_offset must be a Python int, got float"):
        apply_rotary(q, cs, seqlen_offset=1.0)
    with pytest.raises(TypeError, match="seqlen_offset must be a Python int, got Tensor"):
        apply_rotary(q, cs, seqlen_offset=torch.tensor(1))
    with pytest.raises(ValueError, match="seqlen_offset must fit in int64"):
        apply_rotary(q, cs, seqlen_offset=2**63)


def test_int_flags_and_numpy_offset_are_accepted():
    np = pytest.importorskip("numpy")
    cs = make_cache(64, 64)
    q = torch.randn(4, 2, 64)
    want, _ = rotary_embedding_ref(q, cs, interleaved=True, conjugate=True, seqlen_offset=3)
    apply_rotary(q, cs, interleaved=1, conjugate=1, seqlen_offset=np.int64(3))
    assert_same(q, want, "query")


def test_rejects_device_mismatch():
    q = torch.randn(4, 2, 64)
    cs = make_cache(16, 64)
    with pytest.raises(ValueError, match="cos_sin_cache must be on cpu \\(as query\\), got meta"):
        apply_rotary(q, cs.to("meta"))
    with pytest.raises(ValueError, match="key must be on cpu \\(as query\\), got meta"):
        apply_rotary(q, cs, key=torch.empty(4, 1, 64, device="meta"))
    with pytest.raises(ValueError, match="positions must be on cpu \\(as query\\), got meta"):
        apply_rotary(q, cs, positions=torch.empty(4, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="query must be on a CUDA device, an NPU or the CPU, got meta"):
        apply_rotary(q.to("meta"), cs.to("meta"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_cpu_path_is_the_reference_in_place(dtype, interleaved):
    cs = make_cache(300, 128)
    qkv = wide_binades((37, 5 + 3 + 2, 128), dtype)  # a fused buffer: q, k, v heads
    before = qkv.clone()
    q, k = qkv[:, :5], qkv[:, 5:8]
    positions = torch.randint(0, 290, (37,), dtype=torch.int32)
    want_q, want_k = rotary_embedding_ref(q.clone(), cs, k.clone(), positions, interleaved, False, 9)
    assert apply_rotary(q, cs, k, positions, interleaved, False, 9) is None
    assert_same(qkv[:, :5], want_q, "query")
    assert_same(qkv[:, 5:8], want_k, "key")
    assert_same(qkv[:, 8:], before[:, 8:], "the v heads (not rotated)")
    assert not torch.equal(qkv[:, :8], before[:, :8])


def test_cpu_batched_default_positions_and_int64():
    cs = make_cache(64, 64)
    q = torch.randn(2, 7, 3, 64)
    q_default, q_int64 = q.clone(), q.clone()
    apply_rotary(q_default, cs, seqlen_offset=5)
    apply_rotary(q_int64, cs, positions=(torch.arange(7) + 5).expand(2, 7).contiguous())
    assert_same(q_default, q_int64, "default positions vs explicit int64")
    assert_same(q_default, rotary_embedding_ref(q, cs, seqlen_offset=5)[0], "reference")


def test_cpu_out_of_range_tokens_are_left_unchanged():
    cs = make_cache(10, 64)
    q = torch.randn(6, 2, 64)
    k = torch.randn(6, 1, 64)
    positions = torch.tensor([0, -1, 9, 10, 3, -(2**40)])
    q0, k0 = q.clone(), k.clone()
    apply_rotary(q, cs, k, positions)
    outside = torch.tensor([False, True, False, True, False, True])
    assert torch.equal(q[outside], q0[outside]) and torch.equal(k[outside], k0[outside])
    assert torch.equal(q[0], q0[0])  # row 0: cos 1, sin 0
    assert not torch.equal(q[2], q0[2]) and not torch.equal(q[4], q0[4])
    want_q, want_k = rotary_embedding_ref(q0, cs, k0, positions)
    assert_same(q, want_q, "query")
    assert_same(k, want_k, "key")


def test_cpu_conjugate_undoes_the_rotation():
    cs = make_cache(128, 128)
    q = torch.randn(20, 4, 128)
    q0 = q.clone()
    apply_rotary(q, cs, seqlen_offset=100)
    assert (q - q0).abs().max() > 0.1
    apply_rotary(q, cs, seqlen_offset=100, conjugate=True)
    torch.testing.assert_close(q, q0, rtol=1e-6, atol=1e-6)


def test_cpu_empty_and_zero_heads():
    cs = make_cache(8, 64)
    apply_rotary(torch.empty(0, 4, 64), cs)
    apply_rotary(torch.empty(2, 0, 3, 64), cs, key=torch.empty(2, 0, 1, 64))
    q = torch.randn(3, 0, 64)
    apply_rotary(q, cs, key=torch.randn(3, 2, 64))


def test_cpu_torch_compile_fullgraph_traces():
    cs = make_cache(32, 64)

    def f(q, k, positions):
        apply_rotary(q, cs, k, positions, seqlen_offset=1)
        return q * 1, k * 1

    q, k = torch.randn(5, 2, 64), torch.randn(5, 1, 64)
    positions = torch.randint(0, 30, (5,))
    want_q, want_k = rotary_embedding_ref(q, cs, k, positions, seqlen_offset=1)
    got_q, got_k = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, positions)
    assert_same(got_q, want_q, "query")
    assert_same(got_k, want_k, "key")


# --- GPU: the kernel against the reference, bit for bit ---

DTYPES = [torch.bfloat16, torch.float32]
# (leading dims, query heads, key heads or None, positions: None | torch dtype, seqlen_offset)
GPU_CASES = [
    ((1,), 1, None, None, 0),
    ((1,), 5, 3, torch.int64, 17),
    ((8001,), 5, 3, torch.int32, 0),
    ((8001,), 32, 8, torch.int64, 3),
    ((8001,), 3, None, None, 11),
    ((3, 1000), 7, 1, None, 5),
    ((3, 1000), 4, 9, torch.int32, 2),
    ((2, 1), 1, 1, torch.int64, 0),
]


def run_both(q, k, cs, positions, interleaved, conjugate, offset):
    """(kernel q, kernel k), (reference q, reference k) from the same inputs."""
    want_q, want_k = rotary_embedding_ref(q, cs, k, positions, interleaved, conjugate, offset)
    apply_rotary(q, cs, k, positions, interleaved, conjugate, offset)
    return (q, k), (want_q, want_k)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}-h{c[1]}-k{c[2]}-{c[3]}-off{c[4]}")
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("rot", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
def test_gpu_matches_reference(dtype, rot, interleaved, case):
    lead, q_heads, k_heads, pos_dtype, offset = case
    seq = lead[-1]
    cs = make_cache(seq + 64, rot, "cuda")
    q = wide_binades((*lead, q_heads, rot), dtype, "cuda")
    k = None if k_heads is None else wide_binades((*lead, k_heads, rot), dtype, "cuda")
    positions = None
    if pos_dtype is not None:
        positions = torch.randint(0, seq + 64 - offset, lead, device="cuda", dtype=pos_dtype)
    conjugate = bool(seq % 2)  # both, across the cases
    (got_q, got_k), (want_q, want_k) = run_both(q, k, cs, positions, interleaved, conjugate, offset)
    assert not got_q.isnan().any(), "NaN in the rotated query (inputs are finite)"
    assert_same(got_q, want_q, "query")
    if k is not None:
        assert_same(got_k, want_k, "key")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
def test_gpu_exactly_fma_ordered(dtype):
    """fp32 inputs whose naive (unfused) products differ from the fma result in the last bit
    somewhere: the kernel must match the fma reference, not the naive formula."""
    cs = make_cache(4096, 128, "cuda")
    q = wide_binades((2048, 4, 128), dtype, "cuda")
    positions = torch.randint(0, 4096, (2048,), device="cuda")
    rows = cs[positions][:, None, :]
    x1, x2 = q.float()[..., :64], q.float()[..., 64:]
    naive = torch.cat((x1 * rows[..., :64] - x2 * rows[..., 64:], x2 * rows[..., :64] + x1 * rows[..., 64:]), -1)
    (got_q, _), (want_q, _) = run_both(q, None, cs, positions, False, False, 0)
    assert_same(got_q, want_q, "query")
    if dtype == torch.float32:
        assert not torch.equal(naive, want_q), "the inputs do not tell fma from the naive formula"


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_gpu_fused_qkv_views_and_partial_rotation(interleaved):
    """q and k as views of a fused [T, heads, 192] buffer, rotating the last 64 of each head:
    token/head strides are runtime; everything outside the views stays bit for bit."""
    buf = wide_binades((777, 6 + 2 + 2, 192), torch.bfloat16, "cuda")
    before = buf.clone()
    cs = make_cache(2000, 64, "cuda")
    q, k = buf[:, :6, -64:], buf[:, 6:8, -64:]
    positions = torch.randint(0, 2000, (777,), device="cuda", dtype=torch.int32)
    want_q, want_k = rotary_embedding_ref(q, cs, k, positions, interleaved)
    apply_rotary(q, cs, k, positions, interleaved)
    assert_same(buf[:, :6, -64:], want_q, "query view")
    assert_same(buf[:, 6:8, -64:], want_k, "key view")
    assert_same(buf[:, :8, :128], before[:, :8, :128], "the unrotated part of each head")
    assert_same(buf[:, 8:], before[:, 8:], "the v heads")


@pytest.mark.gpu
def test_gpu_transposed_and_strided_layouts():
    """[B, S, H, rot] with S and H swapped in memory, a strided cache and strided positions."""
    base = wide_binades((2, 5, 300, 128), torch.float32, "cuda")  # (B, H, S, rot) in memory
    q = base.transpose(1, 2)  # (B, S, H, rot) view
    wide_cache = torch.randn(400, 256, device="cuda")
    wide_cache[:, :128] = make_cache(400, 128, "cuda")
    cs = wide_cache[:, :128]  # row stride 256
    positions = torch.randint(0, 400, (2, 300, 2), device="cuda")[..., 0]  # strided int64
    want_q, _ = rotary_embedding_ref(q, cs, None, positions, True, True, 0)
    apply_rotary(q, cs, None, positions, True, True, 0)
    assert_same(q, want_q, "query")


@pytest.mark.gpu
def test_gpu_unaligned_strides_take_the_torch_path():
    """Head stride 68 bf16 elements (not 16 bytes): the torch path, same bits."""
    buf = wide_binades((50, 3, 68), torch.bfloat16, "cuda")
    before = buf.clone()
    q = buf[..., 4:]  # 8-byte offset, stride 68
    cs = make_cache(64, 64, "cuda")
    want_q, _ = rotary_embedding_ref(q, cs)
    apply_rotary(q, cs)
    assert_same(q, want_q, "query")
    assert_same(buf[..., :4], before[..., :4], "the columns before the view")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
def test_gpu_out_of_range_rows_are_skipped(dtype):
    cs = make_cache(100, 128, "cuda")
    q = wide_binades((500, 3, 128), dtype, "cuda")
    k = wide_binades((500, 2, 128), dtype, "cuda")
    positions = torch.randint(-150, 250, (500,), device="cuda")
    positions[0], positions[1] = 2**40, -(2**40)
    q0, k0 = q.clone(), k.clone()
    (got_q, got_k), (want_q, want_k) = run_both(q, k, cs, positions, False, False, -20)
    assert_same(got_q, want_q, "query")
    assert_same(got_k, want_k, "key")
    outside = ((positions - 20) < 0) | ((positions - 20) >= 100)
    assert outside.any() and (~outside).any()
    assert torch.equal(got_q[outside], q0[outside]) and torch.equal(got_k[outside], k0[outside])


@pytest.mark.gpu
def test_gpu_conjugate_round_trip_fp32():
    cs = make_cache(9000, 128, "cuda")
    q = torch.randn(8001, 7, 128, device="cuda")
    k = torch.randn(8001, 2, 128, device="cuda")
    q0, k0 = q.clone(), k.clone()
    apply_rotary(q, cs, k, seqlen_offset=900)
    apply_rotary(q, cs, k, seqlen_offset=900, conjugate=True)
    torch.testing.assert_close(q, q0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, k0, rtol=1e-5, atol=1e-5)
    # the original's metric, calc_diff = sum((x - y)^2) / sum(x^2 + y^2)
    diff = ((q.double() - q0.double()) ** 2).sum() / (q.double() ** 2 + q0.double() ** 2).sum()
    assert diff <= 1e-8 and math.isfinite(diff.item())


@pytest.mark.gpu
def test_gpu_empty_and_nan_propagation():
    cs = make_cache(16, 64, "cuda")
    apply_rotary(torch.empty(0, 3, 64, device="cuda"), cs)
    apply_rotary(torch.empty(2, 0, 3, 64, device="cuda"), cs)
    q = torch.randn(4, 2, 64, device="cuda")
    q[1, 0, 5] = float("nan")
    apply_rotary(q, cs, seqlen_offset=1)
    assert q[1, 0, 5].isnan() and q[1, 0, 5 + 32].isnan()  # NeoX partner of column 5
    assert not q[0].isnan().any() and not q[1, 1].isnan().any()


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph_and_cuda_graph():
    """No host sync anywhere (positions are checked on the device): compiles with fullgraph and
    captures into a CUDA graph."""
    cs = make_cache(64, 128, "cuda")
    q = wide_binades((300, 4, 128), torch.bfloat16, "cuda")
    k = wide_binades((300, 2, 128), torch.bfloat16, "cuda")
    positions = torch.randint(-5, 70, (300,), device="cuda", dtype=torch.int32)
    want_q, want_k = rotary_embedding_ref(q, cs, k, positions, seqlen_offset=1)

    def f(q, k):
        apply_rotary(q, cs, k, positions, seqlen_offset=1)
        return q * 1, k * 1

    got_q, got_k = torch.compile(f, fullgraph=True)(q.clone(), k.clone())
    assert_same(got_q, want_q, "query (torch.compile)")
    assert_same(got_k, want_k, "key (torch.compile)")

    gq, gk = q.clone(), k.clone()
    apply_rotary(gq.clone(), cs, gk.clone(), positions, seqlen_offset=1)  # load the kernel outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        apply_rotary(gq, cs, gk, positions, seqlen_offset=1)
    gq.copy_(q)
    gk.copy_(k)
    graph.replay()
    assert_same(gq, want_q, "query (CUDA graph)")
    assert_same(gk, want_k, "key (CUDA graph)")
