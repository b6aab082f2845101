"""mhc_pre_split_mixes, as TileLang factories (build time only); m (<= 8), post_mult and eps at
run time. y = mix * scale[segment] + base (T.ieee_*: the reference's roundings), the sigmoid as
1 / (1 + exp(-y)).

Forward: a thread an element of the (tokens, m (m + 2)) mixes (coalesced reads and writes).
Backward: num_partials CTAs, each a contiguous range of tokens; its threads as lanes x the m3
columns (lane l takes tokens l, l + lanes, ...: each step reads a contiguous run of the mixes),
writing input_mixes_grad and summing gy and gy * mix per column; the lanes' sums are added in
lane order through shared memory, and a partial row written: [the 3 scale sums (columns of a
segment added in order), the m3 base sums, zeros to num_cols]. bwd_reduce: one CTA sums the
rows in a fixed order (kernels_tl/common.py's sum_partial_rows) into scale_grad and base_grad.
"""

import tilelang.language as T

from kernels_tl.common import REDUCE_COLS, REDUCE_THREADS, REDUCE_UNROLL, REDUCE_VEC, REDUCE_WARPS, sum_partial_rows
from tilebake.mhc.mhc_pre_split_mixes import MhcPreSplitMixesVariant

THREADS = 256


def build(v: MhcPreSplitMixesVariant):
    return {"fwd": _forward, "bwd": _backward, "bwd_reduce": _reduce}[v.direction]()


def _sigmoid(y):
    return T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), T.exp(-y)))


def _forward():
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    m3 = T.dynamic("mix_cols")  # m (m + 2), passed: TileLang cannot bind m from it

    @T.prim_func
    def mhc_pre_split_mixes_fwd_kernel(
        MIX: T.Tensor((n, m3), "float32"),
        SCALE: T.Tensor((3,), "float32"),
        BASE: T.Tensor((m3,), "float32"),
        PRE: T.Tensor((n, m), "float32"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m * m), "float32"),
        post_mult: T.float32,
        pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(n * m3, THREADS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            e = b * THREADS + tx
            t = e // m3
            c = e % m3
            if e < n * m3:
                seg = T.if_then_else(c < m, 0, T.if_then_else(c < 2 * m, 1, 2))
                y = T.ieee_add(T.ieee_mul(MIX[t, c], SCALE[seg]), BASE[c])
                if c < m:
                    PRE[t, c] = T.ieee_add(_sigmoid(y), pre_eps)
                elif c < 2 * m:
                    POST[t, c - m] = T.ieee_mul(_sigmoid(y), post_mult)
                else:
                    COMB[t, c - 2 * m] = y

    return mhc_pre_split_mixes_fwd_kernel


def _backward():
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    m3 = T.dynamic("mix_cols")  # m (m + 2), passed: TileLang cannot bind m from it
    parts = T.dynamic("num_partials")
    cols = T.dynamic("num_cols")

    @T.prim_func
    def mhc_pre_split_mixes_bwd_kernel(
        PREG: T.Tensor((n, m), "float32"),
        POSTG: T.Tensor((n, m), "float32"),
        COMBG: T.Tensor((n, m * m), "float32"),
        MIX: T.Tensor((n, m3), "float32"),
        SCALE: T.Tensor((3,), "float32"),
        BASE: T.Tensor((m3,), "float32"),
        MIXG: T.Tensor((n, m3), "float32"),
        PART: T.Tensor((parts, cols), "float32"),
        post_mult: T.float32,
    ):
        with T.Kernel(parts, threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            red_b = T.alloc_shared((THREADS,), "float32")
            red_s = T.alloc_shared((THREADS,), "float32")
            acc_b = T.alloc_var("float32")
            acc_s = T.alloc_var("float32")
            lanes = THREADS // m3
            lane = tx // m3
            c = tx % m3
            per_cta = T.ceildiv(n, parts)
            start = b * per_cta
            acc_b = T.float32(0)
            acc_s = T.float32(0)
            seg = T.if_then_else(c < m, 0, T.if_then_else(c < 2 * m, 1, 2))
            if lane < lanes:
                sc = SCALE[seg]
                base = BASE[c]
                for k in T.serial(T.ceildiv(per_cta, lanes)):
                    t = start + k * lanes + lane
                    if t < n and k * lanes + lane < per_cta:
                        x = MIX[t, c]
                        gy = T.alloc_var("float32")
                        if c < 2 * m:
                            s = _sigmoid(T.ieee_add(T.ieee_mul(x, sc), base))
                            ds = T.ieee_mul(s, T.ieee_sub(T.float32(1), s))
                            if c < m:
                                gy = T.ieee_mul(PREG[t, c], ds)
                            else:
                                gy = T.ieee_mul(T.ieee_mul(POSTG[t, c - m], post_mult), ds)
                        else:
                            gy = COMBG[t, c - 2 * m]
                        MIXG[t, c] = T.ieee_mul(gy, sc)
                        acc_b = T.ieee_add(acc_b, gy)
                        acc_s = T.ieee_add(acc_s, T.ieee_mul(gy, x))
            red_b[tx] = acc_b
            red_s[tx] = acc_s
            T.sync_threads()
            # column c's sums over the lanes, in lane order (lane 0's thread holds them)
            if tx < m3:
                for q in T.serial(lanes - 1):
                    acc_b = T.ieee_add(acc_b, red_b[(q + 1) * m3 + tx])
                    acc_s = T.ieee_add(acc_s, red_s[(q + 1) * m3 + tx])
            T.sync_threads()
            if tx < m3:
                red_s[tx] = acc_s
                PART[b, 3 + tx] = acc_b
            elif tx >= m3 + 3 and tx < cols:
                PART[b, tx] = T.float32(0)
            T.sync_threads()
            # the segments' scale sums, columns in order
            if tx < 3:
                lo = T.if_then_else(tx == 0, 0, T.if_then_else(tx == 1, m, 2 * m))
                hi = T.if_then_else(tx == 0, m, T.if_then_else(tx == 1, 2 * m, m3))
                acc_s = red_s[lo]
                for q in T.serial(hi - lo - 1):
                    acc_s = T.ieee_add(acc_s, red_s[lo + q + 1])
                PART[b, tx] = acc_s

    return mhc_pre_split_mixes_bwd_kernel


def _reduce():
    parts = T.dynamic("num_partials")
    cols = T.dynamic("num_cols")
    m3 = T.dynamic("mix_cols")

    @T.prim_func
    def mhc_pre_split_mixes_bwd_reduce_kernel(
        PART: T.Tensor((parts, cols), "float32"),
        SG: T.Tensor((3,), "float32"),
        BG: T.Tensor((m3,), "float32"),
    ):
        with T.Kernel(T.ceildiv(cols, REDUCE_COLS), threads=REDUCE_THREADS) as b:  # one CTA for m <= 8's 84 columns
            tx = T.get_thread_binding(0)
            T.assume(cols % 4 == 0)
            acc = T.alloc_local((REDUCE_VEC,), "float32")
            rows = T.alloc_local((REDUCE_UNROLL, REDUCE_VEC), "float32")
            red = T.alloc_shared((REDUCE_WARPS, REDUCE_COLS), "float32")
            sum_partial_rows(PART, parts, cols, b * REDUCE_COLS, acc, rows, red, tx)
            if tx < 32:
                for j in T.unroll(REDUCE_VEC):
                    col = b * REDUCE_COLS + tx * REDUCE_VEC + j
                    if col < 3:
                        SG[col] = acc[j]
                    elif col < 3 + m3:
                        BG[col - 3] = acc[j]

    return mhc_pre_split_mixes_bwd_reduce_kernel
