"""RMSNorm forward (+ residual add), as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.
norm_forward_and_per_token_cast has its own kernel (kernels_tl/quant/norm_forward_and_per_token_cast.py)
with this thread mapping (CTA_THREADS x 8 per variant: 128 x 8 for bf16 without residual,
256 x 8 otherwise), so both compute the normalised value with the same fp32 operations, in
the same order.

Arithmetic, per row, all in fp32:
    v = x (+ residual, rounded to x.dtype: that is norm_input / residual_out)
    rstd = rsqrt(sum(v * v) / H + eps)
    y = round_to_x_dtype((v * rstd) * (w * out_scale))

Thread mapping (LaunchConfig): one CTA per row, THREADS threads, each owning VEC contiguous
elements per pass; PASSES passes cover MAX_HIDDEN elements. The whole row stays in registers (in x's
dtype), so x is read once; every load of the row (x and residual, all passes) is issued
before the first use, and MIN_CTAS CTAs (rows) share an SM, so an SM has
MIN_CTAS x hidden x (1 or 2) x sizeof(x) bytes of loads in flight (112 KB for bf16 with
residual at hidden 7168, with 256 threads x 8 elements and 4 CTAs). With w_ahead, each pass
loads the next pass's weight before its own arithmetic (pass 0's before the sum's barrier), so
no pass waits on its weight load. A pass starting beyond
`hidden` is skipped (the same for every thread of the CTA); inside a pass each thread's
VEC elements are all valid or all masked (the host checks hidden % 16 == 0, and VEC divides 16).
Masked elements are 0, so they add nothing to the sum of squares.

Measured on the H200 (bench/results/2026-12-01-NVIDIA-H200/norm2/), bf16 with weight at
16384 x 7168: 117.5 us without residual (128 x 8, 5 CTAs per SM, w_ahead; 256 x 8 before:
117.4-118.8 us), 231.2 us with residual (256 x 8 x 4, unchanged).
"""

import dataclasses

import tilelang.language as T

from kernels_tl.quant.common import TL_DTYPES
from tilebake.quant.norm_forward import MAX_HIDDEN  # the host's limit on hidden


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int  # one CTA per row
    vec: int  # contiguous elements per thread per pass (whole 16-byte vectors for bf16)
    min_ctas: int  # rows resident per SM: caps the registers
    w_ahead: bool = False  # load each pass's weight one pass ahead (pass 0's before the sum's barrier)


# Threads per CTA of both ops' kernels (this one and norm_forward_and_per_token_cast's), per
# (in_dtype, has_residual), each thread VEC = 8 contiguous elements a pass: the mapping fixes the
# order of the sum of squares, so the two ops take the same one. bf16 without residual: 128 x 8,
# so hidden 7168 is 7 whole passes, and the cast's persistent CTAs have the registers to load
# the next row while normalising one (bench/results/2026-12-01-NVIDIA-H200/norm2/); with
# residual and fp32: 256 x 8 (128 x 8 measured no faster for norm_forward with residual).
CTA_THREADS = {("bf16", False): 128, ("bf16", True): 256, ("fp32", False): 256, ("fp32", True): 256}
VEC = 8

# norm_forward's rows resident per SM and weight loads one pass ahead, per (in_dtype,
# has_residual), chosen on the H200 (bench/results/2026-12-01-NVIDIA-H200/norm2/). The 256 x 8
# x 4 configs are bench/tune.py's (bench/results/2026-11-30-NVIDIA-H200/perf/tune_norm_forward.log).
ROWS_PER_SM = {("bf16", False): 5, ("bf16", True): 4, ("fp32", False): 4, ("fp32", True): 4}
W_AHEAD = {("bf16", False): True, ("bf16", True): False, ("fp32", False): False, ("fp32", True): False}


def default_config(in_dtype: str, has_residual: bool) -> LaunchConfig:
    key = (in_dtype, has_residual)
    return LaunchConfig(threads=CTA_THREADS[key], vec=VEC, min_ctas=ROWS_PER_SM[key], w_ahead=W_AHEAD[key])


def candidate_configs():
    """The search space `python bench/tune.py build|run DIR norm_forward` times on a GPU."""
    return [
        LaunchConfig(128, 16, 4),
        LaunchConfig(128, 16, 5),
        LaunchConfig(128, 8, 6),
        LaunchConfig(256, 16, 2),
        LaunchConfig(256, 16, 3),
        LaunchConfig(256, 8, 3),
        LaunchConfig(256, 8, 4),
        LaunchConfig(512, 8, 1),
        LaunchConfig(512, 8, 2),
        LaunchConfig(512, 16, 1),
        LaunchConfig(1024, 8, 1),
        LaunchConfig(512, 8, 3),
        LaunchConfig(512, 16, 2),
        LaunchConfig(1024, 8, 2),
    ]


# Every access is guarded per thread-vector below; TileLang's per-element guards would
# split each 16-byte access into scalar ones.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def row_strides(name: str):
    """Runtime (batch, row) strides of a (batch, num_tokens, hidden) tensor, last dim contiguous."""
    return T.dynamic(f"{name}_batch_stride"), T.dynamic(f"{name}_stride")


def build_norm_forward(in_dtype_name: str, has_weight: bool, has_residual: bool, cfg: LaunchConfig | None = None):
    """The RMSNorm forward kernel: output in x's dtype."""
    cfg = cfg or default_config(in_dtype_name, has_residual)
    THREADS, VEC, MIN_CTAS, W_AHEAD = cfg.threads, cfg.vec, cfg.min_ctas, cfg.w_ahead and has_weight
    PASS = THREADS * VEC
    PASSES = -(-MAX_HIDDEN // PASS)
    WARPS = THREADS // 32
    in_dtype = TL_DTYPES[in_dtype_name]
    align = 16 // (2 if in_dtype_name == "bf16" else 4)  # elements in 16 bytes: what the host guarantees

    st = {name: row_strides(name) for name in ("x", "residual", "residual_out", "out")}

    x_bs, x_rs = st["x"]
    r_bs, r_rs = st["residual"]
    ro_bs, ro_rs = st["residual_out"]
    o_bs, o_rs = st["out"]

    def rows3(name, dtype):
        return T.StridedTensor((batch, num_tokens, hidden), (*st[name], 1), dtype)

    batch = T.dynamic("batch")
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")

    @T.prim_func
    def norm_forward_kernel(
        X: rows3("x", in_dtype),
        W: T.Tensor((hidden,), in_dtype),
        R: rows3("residual", in_dtype),
        RO: rows3("residual_out", in_dtype),
        Y: rows3("out", in_dtype),
        RSTD: T.Tensor((batch, num_tokens), "float32"),
        eps: T.float32,
        out_scale: T.float32,
        with_rstd: T.int32,
    ):
        with T.Kernel(batch * num_tokens, threads=THREADS) as b:
            # Rows in flight per SM: caps registers so MIN_CTAS rows fit on an SM.
            T.annotate_min_blocks_per_sm(MIN_CTAS)
            # Registers, so the divisions run once per CTA (not in every index).
            bi = T.alloc_var("int32")
            ti = T.alloc_var("int32")
            bi = b // num_tokens
            ti = b % num_tokens
            # The host checks these; they make every thread-vector access whole 16-byte vectors.
            T.assume(hidden % 16 == 0)
            T.assume(x_bs % align == 0)
            T.assume(x_rs % align == 0)
            T.assume(o_bs % align == 0)
            T.assume(o_rs % align == 0)
            if has_residual:
                T.assume(r_bs % align == 0)
                T.assume(r_rs % align == 0)
                T.assume(ro_bs % align == 0)
                T.assume(ro_rs % align == 0)
            tx = T.get_thread_binding(0)
            # The row (norm_input) in x's dtype: it is rounded to it anyway, and bf16 halves the
            # registers. All loads of the row are issued before any use, so a thread has its
            # whole row (x and residual) in flight at once; guarded loads of a later pass
            # cannot be hoisted above an earlier pass's uses by the compiler.
            xs = T.alloc_local((PASSES, VEC), in_dtype)
            rs = T.alloc_local((PASSES, VEC), in_dtype)
            wb = T.alloc_local((VEC,), in_dtype)
            wr = T.alloc_local((2, VEC), in_dtype)  # W_AHEAD: pass p's weight in wr[p % 2]
            yb = T.alloc_local((VEC,), in_dtype)
            red = T.alloc_shared((WARPS,), "float32")
            ss = T.alloc_var("float32")
            ss = T.float32(0)

            for p in T.unroll(PASSES):
                if p * PASS + tx * VEC < hidden:
                    for j in T.vectorized(VEC):
                        xs[p, j] = X[bi, ti, p * PASS + tx * VEC + j]
                    if has_residual:
                        for j in T.vectorized(VEC):
                            rs[p, j] = R[bi, ti, p * PASS + tx * VEC + j]
                else:
                    for j in T.unroll(VEC):
                        xs[p, j] = T.cast(0, in_dtype)
                        rs[p, j] = T.cast(0, in_dtype)
            # The add is unguarded (masked slots are 0 + 0), so the compiler cannot sink the
            # residual loads into the guarded store below.
            for p in T.unroll(PASSES):
                if has_residual:
                    for j in T.unroll(VEC):
                        xs[p, j] = T.cast(T.cast(xs[p, j], "float32") + T.cast(rs[p, j], "float32"), in_dtype)
                    if p * PASS + tx * VEC < hidden:
                        for j in T.vectorized(VEC):
                            RO[bi, ti, p * PASS + tx * VEC + j] = xs[p, j]
                for j in T.unroll(VEC):
                    ss = ss + T.cast(xs[p, j], "float32") * T.cast(xs[p, j], "float32")

            if W_AHEAD:
                if tx * VEC < hidden:
                    for j in T.vectorized(VEC):
                        wr[0, j] = W[tx * VEC + j]
            # Sum of squares over the CTA: a butterfly in each warp (every lane ends with the
            # same bits), then the WARPS partials in a fixed order.
            for s in T.unroll(5):
                ss = ss + T.shfl_xor(ss, 16 >> s)
            if tx % 32 == 0:
                red[tx // 32] = ss
            T.sync_threads()
            total = T.alloc_var("float32")
            total = red[0]
            for k in T.unroll(WARPS - 1):
                total = total + red[k + 1]
            rstd = T.alloc_var("float32")
            rstd = T.rsqrt(total / T.cast(hidden, "float32") + eps)
            if with_rstd != 0 and tx == 0:
                RSTD[bi, ti] = rstd

            for p in T.unroll(PASSES):
                if p * PASS < hidden:
                    if W_AHEAD and p + 1 < PASSES:
                        if (p + 1) * PASS + tx * VEC < hidden:
                            for j in T.vectorized(VEC):
                                wr[(p + 1) % 2, j] = W[(p + 1) * PASS + tx * VEC + j]
                    if p * PASS + tx * VEC < hidden:
                        if W_AHEAD:
                            for j in T.vectorized(VEC):
                                wb[j] = wr[p % 2, j]
                        elif has_weight:
                            for j in T.vectorized(VEC):
                                wb[j] = W[p * PASS + tx * VEC + j]
                        else:
                            for j in T.unroll(VEC):
                                wb[j] = T.cast(1, in_dtype)
                    else:
                        for j in T.unroll(VEC):
                            wb[j] = T.cast(0, in_dtype)
                    for j in T.unroll(VEC):
                        yb[j] = T.cast(
                            (T.cast(xs[p, j], "float32") * rstd) * (T.cast(wb[j], "float32") * out_scale), in_dtype
                        )
                    if p * PASS + tx * VEC < hidden:
                        for j in T.vectorized(VEC):
                            Y[bi, ti, p * PASS + tx * VEC + j] = yb[j]

    return norm_forward_kernel


def build(v, cfg: LaunchConfig | None = None):
    return build_norm_forward(v.in_dtype, v.has_weight, v.has_residual, cfg)
