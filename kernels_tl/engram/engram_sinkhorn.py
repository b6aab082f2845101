"""The Engram Sinkhorn optimizer helpers, as TileLang factories (build time only), one per stage:

- momentum: flat, VEC elements a thread. s = g * (1 - beta1), m = s + m * beta1 (stored back in
  the buffer's dtype), out = m * beta1 + s (nesterov) or m, every product and sum rounded on its
  own (T.ieee_*: nvcc contracts nothing), as the reference's separate torch ops.
- step: persistent, num_ctas CTAs, CTA c taking rows c, c + num_ctas, ...; a row's THREADS x 4
  column chunks (PASSES of them cover MAX_COLS) in registers, the next rows on their way through
  cp.async into shared memory (STEP_CONFIG.stages), it = (row_scale * M) * col_scale,
  norm = sqrt(sum(it^2)) (a butterfly in each warp, the warps' partials in order),
  row_scale /= norm + eps, and each thread adds ((row_scale * M) * col_scale)^2 of its columns to
  registers, written once to the CTA's row of the partials: the sums run in a fixed order.
- step_reduce: kernels_tl/common.py's sum_partial_rows (a fixed order: 8 warps take
  every 8th row, then the warps' sums in warp order), 32 columns a CTA.
- finalize: one CTA per row: alpha * (row_scale / (norm + eps)) * M * col_scale.
"""

import dataclasses

import tilelang.language as T

from kernels_tl.common import REDUCE_THREADS, REDUCE_UNROLL, REDUCE_WARPS, sum_partial_rows
from tilebake.engram.engram_sinkhorn import MAX_COLS, STEP_CTAS_PER_SM, EngramSinkhornVariant

THREADS = 256
VEC = 4  # fp32 columns a thread owns per pass (one 16-byte vector)
PASS = THREADS * VEC
PASSES = MAX_COLS // PASS
WARPS = THREADS // 32
FLAT_VEC = 8  # momentum: elements a thread
# Vectors guarded by hand; no automatic barriers: the step's staged rows are thread-private (each
# thread reads back only what it copied) and every other shared buffer is synchronised by hand.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}

_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


@dataclasses.dataclass(frozen=True)
class MomentumConfig:
    threads: int = THREADS
    vec: int = FLAT_VEC  # elements a thread


# 4 warps, 4 elements a thread (one 16-byte load of each fp32 input): the H200 sweep of
# bench/tune_engram.py (bench/results/2026-12-01-NVIDIA-H200/session3/call7/tune_engram.log), fp32 at
# 512M elements: 1948.0 us, 98.9% of copy bandwidth, against 2298.7 for 256 threads x 8 and 2.9 ms x 16.
MOMENTUM_CONFIG = MomentumConfig(threads=128, vec=4)


def candidate_configs():
    """The momentum update's search space (python bench/tune_engram.py build|run DIR)."""
    return [MomentumConfig(t, e) for t in (128, 256, 512) for e in (4, 8, 16)]


def build(v: EngramSinkhornVariant, cfg=None):
    if v.stage == "momentum":
        return _momentum(v, cfg or MOMENTUM_CONFIG)
    if v.stage == "step":
        return _step(v, cfg)
    return {"step_reduce": _step_reduce, "finalize": _finalize}[v.stage](v)


def _momentum(v, cfg):
    THREADS, FLAT_VEC = cfg.threads, cfg.vec
    n = T.dynamic("numel")
    g_dtype, m_dtype = _DTYPES[v.grad_dtype], _DTYPES[v.momentum_dtype]

    @T.macro
    def update(G, MB, OUT, i, beta1, one_minus_beta1, nesterov):
        g = T.cast(G[i], "float32")
        s = T.ieee_mul(g, one_minus_beta1)
        m = T.ieee_add(s, T.ieee_mul(T.cast(MB[i], "float32"), beta1))
        MB[i] = T.cast(m, m_dtype)
        OUT[i] = T.if_then_else(nesterov != 0, T.ieee_add(T.ieee_mul(m, beta1), s), m)

    @T.prim_func
    def momentum_kernel(
        G: T.Tensor((n,), g_dtype),
        MB: T.Tensor((n,), m_dtype),
        OUT: T.Tensor((n,), "float32"),
        beta1: T.float32,
        one_minus_beta1: T.float32,
        nesterov: T.int32,
    ):
        with T.Kernel(T.ceildiv(n, THREADS * FLAT_VEC), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            gs = T.alloc_local((FLAT_VEC,), g_dtype)
            ms = T.alloc_local((FLAT_VEC,), m_dtype)
            ys = T.alloc_local((FLAT_VEC,), "float32")
            base = (b * THREADS + tx) * FLAT_VEC
            if base + FLAT_VEC <= n:
                for j in T.vectorized(FLAT_VEC):
                    gs[j] = G[base + j]
                for j in T.vectorized(FLAT_VEC):
                    ms[j] = MB[base + j]
                for j in T.unroll(FLAT_VEC):
                    s = T.ieee_mul(T.cast(gs[j], "float32"), one_minus_beta1)
                    m = T.ieee_add(s, T.ieee_mul(T.cast(ms[j], "float32"), beta1))
                    ms[j] = T.cast(m, m_dtype)
                    ys[j] = T.if_then_else(nesterov != 0, T.ieee_add(T.ieee_mul(m, beta1), s), m)
                for j in T.vectorized(FLAT_VEC):
                    MB[base + j] = ms[j]
                for h in T.unroll(FLAT_VEC // 4):
                    for j in T.vectorized(4):
                        OUT[base + h * 4 + j] = ys[h * 4 + j]
            else:
                for j in T.serial(FLAT_VEC):
                    if base + j < n:
                        update(G, MB, OUT, base + j, beta1, one_minus_beta1, nesterov)

    return momentum_kernel


@dataclasses.dataclass(frozen=True)
class StepConfig:
    ctas_per_sm: int  # resident CTAs a SM (tilebake.engram.engram_sinkhorn.STEP_CTAS_PER_SM)
    # Row buffers a CTA: 1, a row loaded straight into registers when its turn comes; S > 1, the
    # next S - 1 rows in flight through cp.async into shared memory while a row is computed (each
    # thread copies and later reads only its own columns' slots: no barrier for the data).
    stages: int
    max_cols: int = MAX_COLS  # the longest row a CTA's registers and row buffers hold


# The H200 sweeps (bench/results/2026-12-02-NVIDIA-H200/session5/, bench/tune_engram.py ... step): at
# 100001 x 5120, 3 stages 473.6 us against 569.8 unstaged (2 stages 509.4; 512 threads or 1 or 3
# CTAs a SM slower); at 8001 x 8192 69.9 against 76.5. Rows of at most 6144 columns (smaller buffers: 4
# stages at 2 CTAs a SM, 2-3 at 3) measured no faster: 476.7-485.3 us against 477.5 (session8/call1).
# Rows staged by the bulk-copy engine (one cp.async.bulk a row on an mbarrier, git 63c147a) were within
# 1%: 468.4-472.0 us against 472.4, 500.0 at 1 CTA x 6 stages (2026-12-03 session10/call1, where Nsight
# Compute put this kernel at 91% of DRAM peak, 4.38 TB/s): not worth the extra machinery.
STEP_CONFIG = StepConfig(ctas_per_sm=STEP_CTAS_PER_SM, stages=3)


def step_candidate_configs():
    """The step's search space (python bench/tune_engram.py build|run DIR step)."""
    return [StepConfig(STEP_CTAS_PER_SM, s) for s in (1, 2, 3)] + [
        StepConfig(c, s, 6144) for c, s in ((2, 4), (3, 3), (3, 2))
    ]


def _step(v, cfg=None):
    cfg = cfg or STEP_CONFIG
    STAGES = cfg.stages
    PASSES = cfg.max_cols // PASS
    rows = T.dynamic("num_rows")
    cols = T.dynamic("num_cols")
    num_ctas = T.dynamic("num_ctas")

    @T.macro
    def fetch(M, buf, r, slot, tx, num_rows, num_cols):
        """cp.async of row r's columns of this thread into buf[slot] (zeros past the matrix)."""
        for p in T.unroll(PASSES):
            col = p * PASS + tx * VEC
            T.ptx_cp_async(
                T.access_ptr(buf[slot, col], "w", VEC), T.access_ptr(M[r, col], "r", VEC), VEC,
                predicate=r < num_rows and col < num_cols,
            )  # fmt: skip
        T.ptx_commit_group()

    @T.macro
    def load(M, buf, r, slot, tx, ms, num_rows, num_cols):
        """Row r's columns of this thread into ms (from buf[slot] when staged; 0 past the matrix)."""
        for p in T.unroll(PASSES):
            if STAGES > 1:
                for j in T.vectorized(VEC):
                    ms[p, j] = buf[slot, p * PASS + tx * VEC + j]
            elif r < num_rows and p * PASS + tx * VEC < num_cols:
                for j in T.vectorized(VEC):
                    ms[p, j] = M[r, p * PASS + tx * VEC + j]
            else:
                for j in T.unroll(VEC):
                    ms[p, j] = T.float32(0)

    @T.prim_func
    def step_kernel(
        M: T.Tensor((rows, cols), "float32"),
        RS: T.Tensor((rows,), "float32"),
        CS: T.Tensor((cols,), "float32"),
        NORM: T.Tensor((rows,), "float32"),
        P: T.Tensor((num_ctas, cols), "float32"),
        eps: T.float32,
    ):
        with T.Kernel(num_ctas, threads=THREADS) as c:
            T.annotate_min_blocks_per_sm(cfg.ctas_per_sm)  # all num_ctas CTAs resident at once
            tx = T.get_thread_binding(0)
            T.assume(cols % 4 == 0)
            ms = T.alloc_local((PASSES, VEC), "float32")
            cs = T.alloc_local((PASSES, VEC), "float32")
            acc = T.alloc_local((PASSES, VEC), "float32")
            buf = T.alloc_shared((STAGES if STAGES > 1 else 1, PASSES * PASS if STAGES > 1 else 1), "float32")
            red = T.alloc_shared((2, WARPS), "float32")
            ss = T.alloc_var("float32")
            rs = T.alloc_var("float32")
            norm = T.alloc_var("float32")
            for p in T.unroll(PASSES):
                for j in T.unroll(VEC):
                    acc[p, j] = T.float32(0)
                if p * PASS + tx * VEC < cols:
                    for j in T.vectorized(VEC):
                        cs[p, j] = CS[p * PASS + tx * VEC + j]
                else:
                    for j in T.unroll(VEC):
                        cs[p, j] = T.float32(0)
            # Rows k = 0, 1, ... of this CTA: c + k * num_ctas. Staged: rows 0 .. S - 1 in flight
            # first; row k + S is fetched into row k's slot once row k is in registers.
            if STAGES > 1:
                for s in T.unroll(STAGES):
                    fetch(M, buf, c + s * num_ctas, s, tx, rows, cols)
                T.ptx_wait_group(STAGES - 1)
                T.sync_threads()  # a compiler barrier: the reads below follow the wait
            load(M, buf, c, 0, tx, ms, rows, cols)
            rs_next = T.alloc_var("float32")
            rs_next = RS[c]
            for k in T.serial(T.ceildiv(rows - c, num_ctas)):
                r = c + k * num_ctas
                # The next row's scale loaded a row ahead, as its columns are: on the critical path.
                rs = rs_next
                rs_next = T.if_then_else(r + num_ctas < rows, RS[T.min(r + num_ctas, rows - 1)], T.float32(0))
                ss = T.float32(0)
                for p in T.unroll(PASSES):
                    for j in T.unroll(VEC):
                        it = T.ieee_mul(T.ieee_mul(rs, ms[p, j]), cs[p, j])
                        ss = T.ieee_fmaf(it, it, ss)
                # The CTA's sum of squares: a butterfly in each warp, then the warps' partials in
                # order (red by row parity: one barrier a row).
                for s in T.unroll(5):
                    ss = ss + T.shfl_xor(ss, 16 >> s)
                if tx % 32 == 0:
                    red[k % 2, tx // 32] = ss
                if STAGES > 1:
                    T.ptx_wait_group(STAGES - 2)  # row k + 1 has landed (read after the barrier)
                T.sync_threads()
                norm = red[k % 2, 0]
                for w in T.unroll(WARPS - 1):
                    norm = norm + red[k % 2, w + 1]
                norm = T.sqrt(norm)
                rs = rs / (norm + eps)
                if tx == 0:
                    NORM[r] = norm
                    RS[r] = rs
                for p in T.unroll(PASSES):
                    for j in T.unroll(VEC):
                        it = T.ieee_mul(T.ieee_mul(rs, ms[p, j]), cs[p, j])
                        acc[p, j] = T.ieee_fmaf(it, it, acc[p, j])
                if STAGES > 1:  # row k's slot was read before the barrier: refill it
                    fetch(M, buf, r + STAGES * num_ctas, k % STAGES, tx, rows, cols)
                load(M, buf, r + num_ctas, (k + 1) % STAGES, tx, ms, rows, cols)
            for p in T.unroll(PASSES):
                if p * PASS + tx * VEC < cols:
                    for j in T.vectorized(VEC):
                        P[c, p * PASS + tx * VEC + j] = acc[p, j]

    return step_kernel


# step_reduce: a lane's columns, and so the CTA's (32 lanes). 1: at 5120 columns 160 CTAs pull the
# partials from every SM: 6.1 us at 396 x 5120 against 6.8 with 4 (40 CTAs; reading 8 rows a lane
# ahead instead of 4 gained nothing there, session8/call4). H200, 2026-12-03 session10/call2. Each
# column's order of additions is the same for any width.
STEP_REDUCE_VEC = 1
STEP_REDUCE_COLS = 32 * STEP_REDUCE_VEC


def _step_reduce(v):
    parts = T.dynamic("num_partials")
    cols = T.dynamic("num_cols")

    @T.prim_func
    def step_reduce_kernel(
        P: T.Tensor((parts, cols), "float32"),
        OUT: T.Tensor((cols,), "float32"),
    ):
        with T.Kernel(T.ceildiv(cols, STEP_REDUCE_COLS), threads=REDUCE_THREADS) as b:
            tx = T.get_thread_binding(0)
            T.assume(cols % 4 == 0)
            acc = T.alloc_local((STEP_REDUCE_VEC,), "float32")
            rows = T.alloc_local((REDUCE_UNROLL, STEP_REDUCE_VEC), "float32")
            red = T.alloc_shared((REDUCE_WARPS, STEP_REDUCE_COLS), "float32")
            sum_partial_rows(P, parts, cols, b * STEP_REDUCE_COLS, acc, rows, red, tx, STEP_REDUCE_VEC)
            c = b * STEP_REDUCE_COLS + tx * STEP_REDUCE_VEC
            if tx < 32 and c < cols:
                for j in T.vectorized(STEP_REDUCE_VEC):
                    OUT[c + j] = acc[j]

    return step_reduce_kernel


def _finalize(v):
    rows = T.dynamic("num_rows")
    cols = T.dynamic("num_cols")

    @T.prim_func
    def finalize_kernel(
        M: T.Tensor((rows, cols), "float32"),
        RS: T.Tensor((rows,), "float32"),
        CS: T.Tensor((cols,), "float32"),
        OUT: T.Tensor((rows, cols), "float32"),
        eps: T.float32,
        alpha: T.float32,
    ):
        with T.Kernel(rows, threads=THREADS) as r:
            tx = T.get_thread_binding(0)
            T.assume(cols % 4 == 0)
            ms = T.alloc_local((PASSES, VEC), "float32")
            cs = T.alloc_local((PASSES, VEC), "float32")
            ys = T.alloc_local((VEC,), "float32")
            red = T.alloc_shared((2, WARPS), "float32")
            ss = T.alloc_var("float32")
            rs = T.alloc_var("float32")
            rs = RS[r]
            ss = T.float32(0)
            for p in T.unroll(PASSES):
                if p * PASS + tx * VEC < cols:
                    for j in T.vectorized(VEC):
                        ms[p, j] = M[r, p * PASS + tx * VEC + j]
                    for j in T.vectorized(VEC):
                        cs[p, j] = CS[p * PASS + tx * VEC + j]
                else:
                    for j in T.unroll(VEC):
                        ms[p, j] = T.float32(0)
                        cs[p, j] = T.float32(0)
            for p in T.unroll(PASSES):
                for j in T.unroll(VEC):
                    it = T.ieee_mul(T.ieee_mul(rs, ms[p, j]), cs[p, j])
                    ss = T.ieee_fmaf(it, it, ss)
            for s in T.unroll(5):
                ss = ss + T.shfl_xor(ss, 16 >> s)
            if tx % 32 == 0:
                red[0, tx // 32] = ss
            T.sync_threads()
            norm = T.alloc_var("float32")
            norm = red[0, 0]
            for w in T.unroll(WARPS - 1):
                norm = norm + red[0, w + 1]
            rs = rs / (T.sqrt(norm) + eps)
            for p in T.unroll(PASSES):
                if p * PASS + tx * VEC < cols:
                    for j in T.unroll(VEC):
                        ys[j] = T.ieee_mul(T.ieee_mul(T.ieee_mul(alpha, rs), ms[p, j]), cs[p, j])
                    for j in T.vectorized(VEC):
                        OUT[r, p * PASS + tx * VEC + j] = ys[j]

    return finalize_kernel
