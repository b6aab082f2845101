"""mhc_head_compute_mix, as TileLang factories (build time only); m (<= 8) and eps at run time.
s = 1 / (1 + exp(-(x * scale + base))) (T.ieee_*: the reference's roundings but the exponential).
Index math in int32 locals (one division a thread: TileLang's own index expressions of a runtime
divisor become int64 divisions).

Forward: a thread an element of the (tokens, m) mixes: out = s + eps.
Backward: num_partials CTAs, each a contiguous range of tokens, its threads as lanes x the m
columns (lane l takes tokens l, l + lanes, ...: each step reads a contiguous run; UNROLL steps'
loads before their use); x_grad = gy * scale for gy = g * s (1 - s); per column the sums of gy
and gy * x. Warp c adds column c's lane sums (its lane i those of lanes i, i + 32, ... in order,
then an xor butterfly over the 32); the row's scale sum adds the columns in order. Partial row b:
its CTA's tokens (a fixed order: two runs give the same bits).
"""

import tilelang.language as T

from tilebake.mhc.mhc_head_compute_mix import MhcHeadComputeMixVariant

THREADS = 256
UNROLL = 4  # backward steps a lane loads before using them
# every access is guarded below; barriers by hand
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}


def build(v: MhcHeadComputeMixVariant):
    return _forward() if v.direction == "fwd" else _backward()


def _sigmoid(y):
    return T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), T.exp(-y)))


def _forward():
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")

    @T.prim_func
    def mhc_head_compute_mix_fwd_kernel(
        X: T.Tensor((n, m), "float32"),
        SCALE: T.Tensor((1,), "float32"),
        BASE: T.Tensor((m,), "float32"),
        OUT: T.Tensor((n, m), "float32"),
        pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(n * m, THREADS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            X = T.view(X, shape=(n * m,), strides=(1,))  # flat: the element's index
            OUT = T.view(OUT, shape=(n * m,), strides=(1,))
            e = T.alloc_var("int32")
            c = T.alloc_var("int32")
            e = b * THREADS + tx
            c = e - T.truncdiv(e, m) * m
            if e < n * m:
                OUT[e] = T.ieee_add(_sigmoid(T.ieee_add(T.ieee_mul(X[e], SCALE[0]), BASE[c])), pre_eps)

    return mhc_head_compute_mix_fwd_kernel


def _backward():
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    parts = T.dynamic("num_partials")

    @T.prim_func
    def mhc_head_compute_mix_bwd_kernel(
        G: T.Tensor((n, m), "float32"),
        X: T.Tensor((n, m), "float32"),
        SCALE: T.Tensor((1,), "float32"),
        BASE: T.Tensor((m,), "float32"),
        XG: T.Tensor((n, m), "float32"),
        SP: T.Tensor((parts, 1), "float32"),
        BP: T.Tensor((parts, m), "float32"),
    ):
        with T.Kernel(parts, threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            # the lanes' gy and gy * x sums, then the columns' gy * x sums: one buffer (not merged)
            red = T.alloc_shared((3, THREADS), "float32")
            xs = T.alloc_local((UNROLL,), "float32")
            gs = T.alloc_local((UNROLL,), "float32")
            acc_b = T.alloc_var("float32")
            acc_s = T.alloc_var("float32")
            sc = T.alloc_var("float32")
            sg = T.alloc_var("float32")
            gy = T.alloc_var("float32")
            base = T.alloc_var("float32")
            lanes = T.alloc_var("int32")
            lane = T.alloc_var("int32")
            c = T.alloc_var("int32")
            per = T.alloc_var("int32")
            end = T.alloc_var("int32")
            t0 = T.alloc_var("int32")
            t = T.alloc_var("int32")
            w = tx // 32
            i = tx % 32
            lanes = T.truncdiv(THREADS, m)
            lane = T.truncdiv(tx, m)
            c = tx - lane * m
            per = T.truncdiv(n + parts - 1, parts)
            t0 = b * per + lane
            end = T.min(b * per + per, n)
            acc_b = T.float32(0)
            acc_s = T.float32(0)
            if lane < lanes:
                sc = SCALE[0]
                base = BASE[c]
                for k in T.serial(T.truncdiv(per + lanes * UNROLL - 1, lanes * UNROLL)):
                    for u in T.unroll(UNROLL):
                        t = t0 + (k * UNROLL + u) * lanes
                        if t < end:
                            xs[u] = X[t, c]
                            gs[u] = G[t, c]
                    for u in T.unroll(UNROLL):
                        t = t0 + (k * UNROLL + u) * lanes
                        if t < end:
                            sg = _sigmoid(T.ieee_add(T.ieee_mul(xs[u], sc), base))
                            gy = T.ieee_mul(gs[u], T.ieee_mul(sg, T.ieee_sub(T.float32(1), sg)))
                            XG[t, c] = T.ieee_mul(gy, sc)
                            acc_b = T.ieee_add(acc_b, gy)
                            acc_s = T.ieee_add(acc_s, T.ieee_mul(gy, xs[u]))
            red[0, tx] = acc_b
            red[1, tx] = acc_s
            T.sync_threads()
            if w < m:  # warp w: column w's sums over the lanes
                acc_b = T.float32(0)
                acc_s = T.float32(0)
                for j in T.serial(T.truncdiv(lanes - i + 31, 32)):
                    acc_b = T.ieee_add(acc_b, red[0, (i + j * 32) * m + w])
                    acc_s = T.ieee_add(acc_s, red[1, (i + j * 32) * m + w])
                for q in T.unroll(5):
                    acc_b = T.ieee_add(acc_b, T.shfl_xor(acc_b, 16 >> q))
                    acc_s = T.ieee_add(acc_s, T.shfl_xor(acc_s, 16 >> q))
                if i == 0:
                    red[2, w] = acc_s
                    BP[b, w] = acc_b
            T.sync_threads()
            if tx == 0:
                acc_s = red[2, 0]
                for q in T.serial(m - 1):
                    acc_s = T.ieee_add(acc_s, red[2, q + 1])
                SP[b, 0] = acc_s

    return mhc_head_compute_mix_bwd_kernel
