"""mhc_pre_split_mixes, as TileLang factories (build time only); m (<= 8), post_mult and eps at
run time. y = mix * scale[segment] + base (T.ieee_*: the reference's roundings), the sigmoid as
1 / (1 + exp(-y)). Index math in int32 locals (one division a thread, none in a loop: TileLang's
own index expressions of a runtime divisor become int64 divisions).

Forward: a thread an element of the (tokens, m (m + 2)) mixes (its load from the flat index; the
token and column from one division).
Backward: num_partials CTAs, each a contiguous range of tokens; its threads as lanes x the m3
columns (lane l takes tokens l, l + lanes, ...: each step reads a contiguous run of the mixes),
UNROLL steps' loads issued before their use; writing input_mixes_grad and summing gy and gy * mix
per column. Column c's lane sums are added by 16 threads (thread i adds lanes i, i + 16, ... in
order, then an xor butterfly over the 16), and a partial row written: [the 3 scale sums (columns
of a segment added in order), the m3 base sums, zeros to num_cols]. bwd_reduce: one CTA of
RED_WARPS warps sums the rows in a fixed order (warp w rows w, w + RED_WARPS, ... in row order,
then the warps' sums in warp order) into scale_grad and base_grad. Every order is fixed: two runs
give the same bits.
"""

import tilelang.language as T

from tilebake.mhc.mhc_pre_split_mixes import MhcPreSplitMixesVariant

THREADS = 256  # forward
BWD_THREADS = 512
GROUPS = BWD_THREADS // 16  # backward: 16-thread groups adding a column's lane sums
UNROLL = 4  # backward steps a lane loads before using them
RED_WARPS = 32  # bwd_reduce: 1024 threads, 4 columns a lane (128 columns a CTA)
RED_UNROLL = 8  # rows a warp loads before adding them
# every access is guarded below; barriers by hand (the backward's column loop is per group)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}


def build(v: MhcPreSplitMixesVariant):
    return {"fwd": _forward, "bwd": _backward, "bwd_reduce": _reduce}[v.direction]()


def sigmoid(y):
    return T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), T.exp(-y)))


def scaled(x, c, m, SCALE, BASE):
    """y = x * scale[segment of column c] + base[c] (the segment's scale by selects: its three loads
    need no division). Also kernels_tl/mhc/mhc_pre_big_fuse.py's."""
    sc = T.if_then_else(c < m, SCALE[0], T.if_then_else(c < 2 * m, SCALE[1], SCALE[2]))
    return T.ieee_add(T.ieee_mul(x, sc), BASE[c])


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
            MIX = T.view(MIX, shape=(n * m3,), strides=(1,))  # flat: its load needs no division
            e = T.alloc_var("int32")
            t = T.alloc_var("int32")
            c = T.alloc_var("int32")
            x = T.alloc_var("float32")
            y = T.alloc_var("float32")
            e = b * THREADS + tx
            t = T.truncdiv(e, m3)
            c = e - t * m3
            if e < n * m3:
                x = MIX[e]
                y = scaled(x, c, m, SCALE, BASE)
                if c < 2 * m:  # one sigmoid path a warp for the pre and post columns
                    sg = sigmoid(y)
                    if c < m:
                        PRE[t, c] = T.ieee_add(sg, pre_eps)
                    else:
                        POST[t, c - m] = T.ieee_mul(sg, post_mult)
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
        with T.Kernel(parts, threads=BWD_THREADS) as b:
            tx = T.get_thread_binding(0)
            # the lanes' gy and gy * x sums, then the columns' gy * x sums: one buffer (not merged)
            red = T.alloc_shared((3, BWD_THREADS), "float32")
            xs = T.alloc_local((UNROLL,), "float32")
            gs = T.alloc_local((UNROLL,), "float32")
            acc_b = T.alloc_var("float32")
            acc_s = T.alloc_var("float32")
            gy = T.alloc_var("float32")
            sc = T.alloc_var("float32")
            base = T.alloc_var("float32")
            lanes = T.alloc_var("int32")
            lane = T.alloc_var("int32")
            c = T.alloc_var("int32")
            seg = T.alloc_var("int32")
            per = T.alloc_var("int32")
            end = T.alloc_var("int32")
            t0 = T.alloc_var("int32")
            t = T.alloc_var("int32")
            lo = T.alloc_var("int32")
            g = tx // 16
            i = tx % 16
            lanes = T.truncdiv(BWD_THREADS, m3)
            lane = T.truncdiv(tx, m3)
            c = tx - lane * m3
            seg = T.if_then_else(c < m, 0, T.if_then_else(c < 2 * m, 1, 2))
            per = T.truncdiv(n + parts - 1, parts)
            t0 = b * per + lane
            end = T.min(b * per + per, n)
            acc_b = T.float32(0)
            acc_s = T.float32(0)
            if lane < lanes:
                sc = SCALE[seg]
                base = BASE[c]
                for k in T.serial(T.truncdiv(per + lanes * UNROLL - 1, lanes * UNROLL)):
                    for u in T.unroll(UNROLL):
                        t = t0 + (k * UNROLL + u) * lanes
                        if t < end:
                            xs[u] = MIX[t, c]
                            if seg == 0:
                                gs[u] = PREG[t, c]
                            elif seg == 1:
                                gs[u] = POSTG[t, c - m]
                            else:
                                gs[u] = COMBG[t, c - 2 * m]
                    for u in T.unroll(UNROLL):
                        t = t0 + (k * UNROLL + u) * lanes
                        if t < end:
                            if seg == 2:
                                gy = gs[u]
                            else:
                                s = sigmoid(T.ieee_add(T.ieee_mul(xs[u], sc), base))
                                ds = T.ieee_mul(s, T.ieee_sub(T.float32(1), s))
                                if seg == 0:
                                    gy = T.ieee_mul(gs[u], ds)
                                else:
                                    gy = T.ieee_mul(T.ieee_mul(gs[u], post_mult), ds)
                            MIXG[t, c] = T.ieee_mul(gy, sc)
                            acc_b = T.ieee_add(acc_b, gy)
                            acc_s = T.ieee_add(acc_s, T.ieee_mul(gy, xs[u]))
            red[0, tx] = acc_b
            red[1, tx] = acc_s
            T.sync_threads()
            # column cc's sums over the lanes, by a group of 16 threads (group g takes cc = g,
            # g + GROUPS, ...): thread i adds lanes i, i + 16, ... in order, then an xor butterfly
            # adds the group's 16 sums (every thread of the group gets the same bits). The loop
            # runs as often in both groups of a warp (the shuffles' warp is whole).
            for r in T.serial(T.truncdiv(m3 - (g - g % 2) + GROUPS - 1, GROUPS)):
                cc = g + r * GROUPS
                acc_b = T.float32(0)
                acc_s = T.float32(0)
                if cc < m3:
                    for j in T.serial(T.truncdiv(lanes - i + 15, 16)):
                        acc_b = T.ieee_add(acc_b, red[0, (i + j * 16) * m3 + cc])
                        acc_s = T.ieee_add(acc_s, red[1, (i + j * 16) * m3 + cc])
                for q in T.unroll(4):
                    acc_b = T.ieee_add(acc_b, T.shfl_xor(acc_b, 8 >> q))
                    acc_s = T.ieee_add(acc_s, T.shfl_xor(acc_s, 8 >> q))
                if i == 0 and cc < m3:
                    red[2, cc] = acc_s
                    PART[b, 3 + cc] = acc_b
            if tx >= m3 + 3 and tx < cols:
                PART[b, tx] = T.float32(0)
            T.sync_threads()
            # the segments' scale sums, columns in order
            if tx < 3:
                lo = tx * m  # the segments start at 0, m and 2 m; comb's has m * m columns
                acc_s = red[2, lo]
                for q in T.serial(T.if_then_else(tx == 2, m * m, m) - 1):
                    acc_s = T.ieee_add(acc_s, red[2, lo + q + 1])
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
        with T.Kernel(T.ceildiv(cols, 128), threads=RED_WARPS * 32) as b:  # one CTA for m <= 8's 84 columns
            tx = T.get_thread_binding(0)
            T.assume(cols % 4 == 0)
            acc = T.alloc_local((4,), "float32")
            rows = T.alloc_local((RED_UNROLL, 4), "float32")
            red = T.alloc_shared((RED_WARPS, 128), "float32")
            w = tx // 32
            col = b * 128 + (tx % 32) * 4
            for j in T.unroll(4):
                acc[j] = T.float32(0)
            if col < cols:
                for k in T.serial(T.truncdiv(parts - w + RED_WARPS * RED_UNROLL - 1, RED_WARPS * RED_UNROLL)):
                    for u in T.unroll(RED_UNROLL):
                        if w + (k * RED_UNROLL + u) * RED_WARPS < parts:
                            for j in T.vectorized(4):
                                rows[u, j] = PART[w + (k * RED_UNROLL + u) * RED_WARPS, col + j]
                        else:
                            for j in T.unroll(4):
                                rows[u, j] = T.float32(0)
                    for u in T.unroll(RED_UNROLL):
                        for j in T.unroll(4):
                            acc[j] = T.ieee_add(acc[j], rows[u, j])
            for j in T.vectorized(4):
                red[w, (tx % 32) * 4 + j] = acc[j]
            T.sync_threads()
            if tx < 32 and col < cols:
                for j in T.unroll(4):
                    acc[j] = red[0, tx * 4 + j]
                for v in T.unroll(RED_WARPS - 1):
                    for j in T.unroll(4):
                        acc[j] = T.ieee_add(acc[j], red[v + 1, tx * 4 + j])
                for j in T.unroll(4):
                    if col + j < 3:
                        SG[col + j] = acc[j]
                    elif col + j < 3 + m3:
                        BG[col + j - 3] = acc[j]

    return mhc_pre_split_mixes_bwd_reduce_kernel
