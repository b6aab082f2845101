"""The TileLang SR and e2m1/UE8M0 codec helpers (kernels_tl/quant/common.py) agree bit for bit with the torch reference
(tilebake.torch.stochastic, tilebake.torch.cast), checked on the CPU: the helpers are lowered through TVM's C target,
the loop body is compiled with the host C compiler and run through ctypes. Needs tilelang and a C
compiler (the build environment); skipped elsewhere. The GPU tests check the CUDA kernels."""

import ctypes
import re
import shutil
import subprocess

import pytest
import torch

from tilebake.torch.cast import e2m1_decode, e2m1_encode, ue8m0_to_fp32
from tilebake.torch.stochastic import (
    _fp32_bits,
    sr_float32_to_bfloat16_bits,
    sr_float32_to_e4m3_bits,
    sr_float32_to_e4m3_value,
    sr_random_bits,
)

tilelang = pytest.importorskip("tilelang")
CC = shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def helpers_lib(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler")
    import tilelang.language as T
    from tilelang import tvm

    from kernels_tl.quant.common import e2m1_code, e2m1_decode_float32, ue8m0_to_float32
    from kernels_tl.quant.common import sr_float32_to_bfloat16_bits as e_bf16
    from kernels_tl.quant.common import sr_float32_to_e4m3_value as e_e4m3

    n = T.dynamic("n")

    @T.prim_func
    def sr(
        X: T.Tensor((n,), "float32"),
        R: T.Tensor((n,), "uint32"),
        Y: T.Tensor((n,), "float32"),
        Z: T.Tensor((n,), "uint32"),
        C: T.Tensor((n,), "int32"),
        D: T.Tensor((n,), "float32"),
        U: T.Tensor((n,), "float32"),
    ):
        for i in T.serial(n):
            Y[i] = e_e4m3(X[i], R[i])
            Z[i] = e_bf16(X[i], R[i])
            C[i] = e2m1_code(X[i])
            D[i] = e2m1_decode_float32(T.cast(R[i] & T.uint32(15), "int32"))
            U[i] = ue8m0_to_float32(T.cast(R[i] & T.uint32(255), "uint8"))

    source = tvm.compile(sr, target="c").mod.inspect_source()
    # The loop over i, as TVM's C codegen printed it, inside a plain C function.
    start = source.index("for (int32_t i = 0; i < n; ++i) {")
    depth, end = 0, start
    for end in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[end], 0)
        if depth == 0 and source[end] == "}":
            break
    loop = source[start : end + 1]
    assert re.search(r"\bY\)\[i\]", loop) and re.search(r"\bZ\)\[i\]", loop), loop[:500]
    tmp = tmp_path_factory.mktemp("sr")
    (tmp / "sr.c").write_text(
        "#include <stdint.h>\n#include <stdbool.h>\n"
        "#include <math.h>\n"
        "void sr(void* X, void* R, void* Y, void* Z, void* C, void* D, void* U, int32_t n) {\n" + loop + "\n}\n"
    )
    subprocess.run(
        [CC, "-O1", "-fno-strict-aliasing", "-fPIC", "-shared", "-o", str(tmp / "sr.so"), str(tmp / "sr.c"), "-lm"],
        check=True,
    )
    return ctypes.CDLL(str(tmp / "sr.so"))


def run(lib, x, r):
    n = x.numel()
    z, c = (torch.zeros(n, dtype=torch.int32) for _ in range(2))
    y, d, u = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    r32 = r.to(torch.int64).bitwise_and(0xFFFFFFFF).to(torch.int32)  # same bits as the uint32
    x = x.contiguous()
    lib.sr(
        ctypes.c_void_p(x.data_ptr()),
        ctypes.c_void_p(r32.data_ptr()),
        ctypes.c_void_p(y.data_ptr()),
        ctypes.c_void_p(z.data_ptr()),
        ctypes.c_void_p(c.data_ptr()),
        ctypes.c_void_p(d.data_ptr()),
        ctypes.c_void_p(u.data_ptr()),
        ctypes.c_int32(n),
    )
    return y, z.to(torch.int64) & 0xFFFFFFFF, c, d, u


def test_helpers_match_reference(helpers_lib):
    n = 1 << 16
    x = torch.randn(n) * torch.exp2(torch.randint(-140, 12, (n,)).float())
    specials = [448.0, 449.0, 464.0, 1e30, float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-45, -3e-39,
                2.0**-18, 2.0**-9, 3 * 2.0**-10, 3.3895313892515355e38, -3.39e38]  # fmt: skip
    x[: len(specials)] = torch.tensor(specials)
    r = torch.randint(0, 2**32, (n,), dtype=torch.int64)
    r[: 2 * len(specials) : 2] = 0xFFFFFFFF  # extremes of the random bits too (the low 16 are used)
    r[1 : 2 * len(specials) : 2] = 0
    r[2 * len(specials) : 4 * len(specials)] = 0xFFFF
    y, z, c, d, u = run(helpers_lib, x, r)
    # e4m3: the helper's fp32 value (what the kernels convert with satfinite) bit for bit, NaN as NaN.
    want_y = sr_float32_to_e4m3_value(x, r)
    nan = torch.isnan(x)
    assert torch.isnan(y[nan]).all() and not torch.isnan(y[~nan]).any()
    bad = (y.view(torch.int32) != want_y.view(torch.int32)).logical_and(~nan).nonzero()
    assert bad.numel() == 0, f"e4m3: {bad.numel()} differ, e.g. x={x[bad[:3, 0]].tolist()} got {y[bad[:3, 0]].tolist()}"
    # ... and the reference's code is that value's satfinite e4m3 conversion (torch's own
    # conversion, after the clamp it lacks; NaN -> 0x7F).
    codes = sr_float32_to_e4m3_bits(x, r)
    sat = want_y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)
    assert torch.equal(codes[~nan], sat[~nan]) and (codes[nan] == 0x7F).all()
    want_z = sr_float32_to_bfloat16_bits(x, r)
    bad = (z != want_z).nonzero()
    assert bad.numel() == 0, f"bf16: {bad.numel()} differ, e.g. x={x[bad[:3, 0]].tolist()} got {z[bad[:3, 0]].tolist()}"
    assert (_fp32_bits(x) >= 0).all()
    # The e2m1 codec (encode of x; decode of random codes) and the UE8M0 decode (random bytes).
    q = x * 4.0
    _, _, c, _, _ = run(helpers_lib, q, r)
    assert torch.equal(c, e2m1_encode(q).to(torch.int32)), (c != e2m1_encode(q).to(torch.int32)).nonzero()[:5]
    assert torch.equal(d.view(torch.int32), e2m1_decode(r & 15).view(torch.int32))
    assert torch.equal(u.view(torch.int32), ue8m0_to_fp32(r & 255).view(torch.int32))


def test_e2m1_code_ties_and_neighbours(helpers_lib):
    """e2m1_code (the kernels' one e2m1 encoder, a magic-number add) against the reference on
    every grid point and rounding tie of the e2m1 range, one fp32 ulp either side of each, both
    signs, the specials, and dense random values over [-8, 8]."""
    points = torch.cat([torch.arange(0, 6.75, 0.25), torch.tensor([7.0, 8.0, 1e30, float("inf"), 2.0**-126, 1e-45])])
    points = torch.cat([points, torch.nextafter(points, torch.tensor(0.0)), torch.nextafter(points, torch.tensor(9.0))])
    q = torch.cat([points, -points, torch.tensor([float("nan"), -float("nan")]), torch.rand(1 << 16) * 16 - 8])
    _, _, c, _, _ = run(helpers_lib, q, torch.zeros(q.shape, dtype=torch.int64))
    want = e2m1_encode(q).to(torch.int32)
    bad = (c != want).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} differ, e.g. q={q[bad[:4, 0]].tolist()} got {c[bad[:4, 0]].tolist()}"


@pytest.fixture(scope="module")
def e2m1_sr_lib(tmp_path_factory):
    """sr_float32_to_e2m1_code (per_token_cast's SR e2m1 encoder) through the C target, as above."""
    if CC is None:
        pytest.skip("no C compiler")
    import tilelang.language as T
    from tilelang import tvm

    from kernels_tl.quant.common import sr_float32_to_e2m1_code

    n = T.dynamic("n")

    @T.prim_func
    def sr_e2m1(X: T.Tensor((n,), "float32"), R: T.Tensor((n,), "uint32"), C: T.Tensor((n,), "int32")):
        for i in T.serial(n):
            C[i] = sr_float32_to_e2m1_code(X[i], R[i])

    source = tvm.compile(sr_e2m1, target="c").mod.inspect_source()
    start = source.index("for (int32_t i = 0; i < n; ++i) {")
    depth, end = 0, start
    for end in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[end], 0)
        if depth == 0 and source[end] == "}":
            break
    tmp = tmp_path_factory.mktemp("sr_e2m1")
    (tmp / "sr.c").write_text(
        "#include <stdint.h>\n#include <stdbool.h>\n#include <math.h>\n"
        "void sr_e2m1(void* X, void* R, void* C, int32_t n) {\n" + source[start : end + 1] + "\n}\n"
    )
    subprocess.run(
        [CC, "-O1", "-fno-strict-aliasing", "-fPIC", "-shared", "-o", str(tmp / "sr.so"), str(tmp / "sr.c"), "-lm"],
        check=True,
    )
    return ctypes.CDLL(str(tmp / "sr.so"))


def test_sr_e2m1_helper_matches_reference(e2m1_sr_lib):
    from tilebake.torch.stochastic import sr_float32_to_e2m1_codes

    n = 1 << 16
    x = torch.randn(n) * torch.exp2(torch.randint(-140, 5, (n,)).float())
    x[: n // 4] = torch.rand(n // 4) * 16 - 8  # dense over the e2m1 range
    specials = [0.0, -0.0, 0.25, 0.5, 1.75, 2.5, 3.5, 5.0, 5.999999, 6.0, 6.5, -7.0, float("inf"), -float("inf"),
                float("nan"), 1e-45, -3e-39, 2.0**-33, 3.0 * 2.0**-34]  # fmt: skip
    x[: len(specials)] = torch.tensor(specials)
    r = torch.randint(0, 2**32, (n,), dtype=torch.int64)
    r[: 2 * len(specials) : 2] = 0xFFFFFFFF
    r[1 : 2 * len(specials) : 2] = 0
    c = torch.zeros(n, dtype=torch.int32)
    r32 = r.bitwise_and(0xFFFFFFFF).to(torch.int32)
    x = x.contiguous()
    e2m1_sr_lib.sr_e2m1(
        ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(r32.data_ptr()), ctypes.c_void_p(c.data_ptr()), ctypes.c_int32(n)
    )
    want = sr_float32_to_e2m1_codes(x, r)
    bad = (c.to(torch.int64) != want).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} differ, e.g. x={x[bad[:3, 0]].tolist()} got {c[bad[:3, 0]].tolist()}"


def test_pair_hash_matches_reference(tmp_path):
    """sr_pair_word + sr_random_pair_into (the kernels' hash of a pair of elements) through the C
    target against tilebake.torch.stochastic.sr_random_bits, which splits it into 16 bits each."""
    if CC is None:
        pytest.skip("no C compiler")
    import tilelang.language as T
    from tilelang import tvm

    from kernels_tl.quant.common import sr_pair_word, sr_random_pair_into

    n = T.dynamic("n")

    @T.prim_func
    def pair_hash(V: T.Tensor((n, 2), "uint32"), P: T.Tensor((n,), "uint32"), H: T.Tensor((n,), "uint32")):
        h = T.alloc_buffer((1,), "uint32", scope="local")
        for i in T.serial(n):
            sr_random_pair_into(h, sr_pair_word(V[i, 0], V[i, 1]), P[i])
            H[i] = h[0]

    source = tvm.compile(pair_hash, target="c").mod.inspect_source()
    start = source.index("for (int32_t i = 0; i < n; ++i) {")
    depth, end = 0, start
    for end in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[end], 0)
        if depth == 0 and source[end] == "}":
            break
    (tmp_path / "h.c").write_text(
        "#include <stdint.h>\nvoid pair_hash(void* V, void* P, void* H, int32_t n) {\n  uint32_t h[1];\n"
        + source[start : end + 1]
        + "\n}\n"
    )
    subprocess.run([CC, "-O1", "-fPIC", "-shared", "-o", str(tmp_path / "h.so"), str(tmp_path / "h.c")], check=True)
    lib = ctypes.CDLL(str(tmp_path / "h.so"))
    npairs = 1 << 14
    x = torch.randn(2 * npairs) * torch.exp2(torch.randint(-30, 30, (2 * npairs,)).float())
    x[: 2 * npairs // 4] = x[: 2 * npairs // 4].bfloat16().float()  # widened bf16 values too
    bits = _fp32_bits(x)
    index = torch.arange(2 * npairs, dtype=torch.int64) + (1 << 32) - 4096  # across the 2^32 wrap
    v32 = bits.to(torch.int32).contiguous()  # same bits as the uint32
    p32 = ((index[0::2] & 0xFFFFFFFF) >> 1).to(torch.int32).contiguous()
    out = torch.zeros(npairs, dtype=torch.int32)
    lib.pair_hash(
        ctypes.c_void_p(v32.data_ptr()),
        ctypes.c_void_p(p32.data_ptr()),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_int32(npairs),
    )
    h = out.to(torch.int64) & 0xFFFFFFFF
    want = sr_random_bits(bits, index)
    assert torch.equal(h & 0xFFFF, want[0::2]) and torch.equal(h >> 16, want[1::2])
    assert (want >= 0).all() and (want <= 0xFFFF).all()
