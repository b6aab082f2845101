"""mhc_pre_split_mixes_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_pre_split_mixes.MhcPreSplitMixesAscendVariant.

fwd: per token, y = mixes * scale[segment] + base over the m (m + 2) columns; pre = 1 / (1 +
exp(-y[:m])) + eps, post = 1 / (1 + exp(-y[m:2m])) * post_mult, comb = y[2m:]
(tilebake.torch.mhc.mhc_pre_split_mixes_ref; the exponential the one thing not bit-exact). A SIMT
thread a (token, column) item, on GM: a block per vector core, each taking steps core, core +
num_vec_cores, ... of THREADS items.
bwd: the CUDA kernels' two steps and layouts. Partial row b (a vector core the rows core, core +
num_vec_cores, ...) takes the tokens [b ceil(T / P), ...), a SIMT thread a column: gy (the
sigmoid's derivative s (1 - s) recomputed; the post gradient times post_mult first), mixes_grad =
gy * scale[segment], and in token order the column's sums of gy and gy * mix (in the unified
buffer; the token walk common.partial_row_summer's); the row: [the 3 segments' scale sums (columns
in order), the m3 base sums, zeros to num_cols]. bwd_reduce: the first vector core sums the rows in
order into scale_grad and base_grad.
Built and lowered here, never run on an NPU: checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.mhc.common import partial_row_summer
from tilebake.mhc._common import MAX_MHC_MULT
from tilebake.mhc.mhc_pre_split_mixes import MhcPreSplitMixesAscendVariant

THREADS = 128
MAX_COLS = MAX_MHC_MULT * (MAX_MHC_MULT + 2)  # 80 <= THREADS: a thread a column


def build(v: MhcPreSplitMixesAscendVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    cols = T.dynamic("mix_cols")  # m (m + 2)
    CORES = v.num_vec_cores
    if v.direction == "bwd":
        return _backward(n, m, cols, CORES)
    if v.direction == "bwd_reduce":
        return _reduce(cols, CORES)

    @T.prim_func
    def mhc_pre_split_mixes_fwd_kernel(
        MIX: T.Tensor((n, cols), "float32"),
        SCALE: T.Tensor((3,), "float32"),
        BASE: T.Tensor((cols,), "float32"),
        PRE: T.Tensor((n, m), "float32"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m * m), "float32"),
        post_mult: T.float32,
        pre_eps: T.float32,
    ):
        with T.Kernel(CORES) as core:
            for r in T.serial(T.ceildiv(T.ceildiv(n * cols, THREADS) - core, CORES)):
                with T.SimtVF(threads=THREADS):
                    i = (core + r * CORES) * THREADS + T.get_thread_binding()
                    y = T.alloc_var("float32")
                    if i < n * cols:
                        t = i // cols
                        c = i % cols
                        y = MIX[t, c] * SCALE[T.if_then_else(c < m, 0, T.if_then_else(c < 2 * m, 1, 2))] + BASE[c]
                        if c < m:
                            PRE[t, c] = T.float32(1) / (T.float32(1) + T.exp(-y)) + pre_eps
                        elif c < 2 * m:
                            POST[t, c - m] = T.float32(1) / (T.float32(1) + T.exp(-y)) * post_mult
                        else:
                            COMB[t, c - 2 * m] = y

    return mhc_pre_split_mixes_fwd_kernel


def _segment(c, m):
    return T.if_then_else(c < m, 0, T.if_then_else(c < 2 * m, 1, 2))


def _backward(n, m, cols, CORES):
    parts = T.dynamic("num_partials")
    width = T.dynamic("num_cols")

    @T.macro
    def gradient(t, c, y: T.Ref, gy: T.Ref, s: T.Ref, ds: T.Ref, PREG, POSTG, COMBG, post_mult):
        """gy: the pre / post columns' gradients times s (1 - s), s the sigmoid of y (post's times
        post_mult first); the comb columns' as they are."""
        if c < 2 * m:
            s = T.float32(1) / (T.float32(1) + T.exp(-y))
            ds = T.float32(1) - s
            ds = s * ds
            if c < m:
                gy = PREG[t, c] * ds
            else:
                gy = POSTG[t, c - m] * post_mult
                gy = gy * ds
        else:
            gy = COMBG[t, c - 2 * m]

    sum_row = partial_row_summer(THREADS, gradient, lambda c: _segment(c, m))

    @T.prim_func
    def mhc_pre_split_mixes_bwd_kernel(
        PREG: T.Tensor((n, m), "float32"),
        POSTG: T.Tensor((n, m), "float32"),
        COMBG: T.Tensor((n, m * m), "float32"),
        MIX: T.Tensor((n, cols), "float32"),
        SCALE: T.Tensor((3,), "float32"),
        BASE: T.Tensor((cols,), "float32"),
        MIXG: T.Tensor((n, cols), "float32"),
        PART: T.Tensor((parts, width), "float32"),
        post_mult: T.float32,
    ):
        with T.Kernel(CORES) as core:
            sums = T.alloc_shared((2, THREADS), "float32")  # a column's gy and gy * mix sums
            per = T.ceildiv(n, parts)
            for r in T.serial(T.ceildiv(parts - core, CORES)):
                b = core + r * CORES
                sum_row(b, per, MIX, MIXG, SCALE, BASE, sums, PREG, POSTG, COMBG, post_mult)
                with T.SimtVF(threads=THREADS):  # the row
                    c = T.get_thread_binding()
                    acc = T.alloc_var("float32")
                    if c < 3:  # segment c's columns in order
                        lo = T.if_then_else(c == 0, 0, T.if_then_else(c == 1, m, 2 * m))
                        hi = T.if_then_else(c == 0, m, T.if_then_else(c == 1, 2 * m, cols))
                        acc = sums[1, lo]
                        for j in T.serial(hi - lo - 1):
                            acc = acc + sums[1, lo + j + 1]
                        PART[b, c] = acc
                    for q in T.serial(T.ceildiv(width, THREADS)):
                        j = q * THREADS + c
                        if j >= 3 and j < width:
                            PART[b, j] = T.if_then_else(j < 3 + cols, sums[0, T.min(j - 3, THREADS - 1)], T.float32(0))

    return mhc_pre_split_mixes_bwd_kernel


def _reduce(cols, CORES):
    parts = T.dynamic("num_partials")
    width = T.dynamic("num_cols")

    @T.prim_func
    def mhc_pre_split_mixes_bwd_reduce_kernel(
        PART: T.Tensor((parts, width), "float32"),
        SG: T.Tensor((3,), "float32"),
        BG: T.Tensor((cols,), "float32"),
    ):
        with T.Kernel(CORES) as core:  # (the first does it all: 3 + m (m + 2) <= THREADS columns)
            with T.SimtVF(threads=THREADS):
                c = core * THREADS + T.get_thread_binding()
                acc = T.alloc_var("float32")
                if c < 3 + cols:
                    acc = PART[0, c]
                    for p in T.serial(parts - 1):
                        acc = acc + PART[p + 1, c]
                    if c < 3:
                        SG[c] = acc
                    else:
                        BG[c - 3] = acc

    return mhc_pre_split_mixes_bwd_reduce_kernel
