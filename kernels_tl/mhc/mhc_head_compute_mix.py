"""mhc_head_compute_mix, as TileLang factories (build time only); m (<= 8) and eps at run time.
s = 1 / (1 + exp(-(x * scale + base))) (T.ieee_*: the reference's roundings but the exponential).

Forward: a thread an element of the (tokens, m) mixes: out = s + eps.
Backward: num_partials CTAs, each a contiguous range of tokens, its threads as lanes x the m
columns (lane l takes tokens l, l + lanes, ...: each step reads a contiguous run); x_grad =
gy * scale for gy = g * s (1 - s); per column the sums of gy and gy * x, the lanes' sums added
in lane order through shared memory; the row's scale sum adds the columns in order. Partial row
b: its CTA's tokens (a fixed order: two runs give the same bits).
"""

import tilelang.language as T

from tilebake.mhc.mhc_head_compute_mix import MhcHeadComputeMixVariant

THREADS = 256


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
            e = b * THREADS + tx
            if e < n * m:
                t = e // m
                c = e % m
                OUT[t, c] = T.ieee_add(_sigmoid(T.ieee_add(T.ieee_mul(X[t, c], SCALE[0]), BASE[c])), pre_eps)

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
            red_b = T.alloc_shared((THREADS,), "float32")
            red_s = T.alloc_shared((THREADS,), "float32")
            acc_b = T.alloc_var("float32")
            acc_s = T.alloc_var("float32")
            lanes = THREADS // m
            lane = tx // m
            c = tx % m
            per_cta = T.ceildiv(n, parts)
            start = b * per_cta
            acc_b = T.float32(0)
            acc_s = T.float32(0)
            if lane < lanes:
                sc = SCALE[0]
                base = BASE[c]
                for k in T.serial(T.ceildiv(per_cta, lanes)):
                    t = start + k * lanes + lane
                    if t < n and k * lanes + lane < per_cta:
                        x = X[t, c]
                        s = _sigmoid(T.ieee_add(T.ieee_mul(x, sc), base))
                        gy = T.ieee_mul(G[t, c], T.ieee_mul(s, T.ieee_sub(T.float32(1), s)))
                        XG[t, c] = T.ieee_mul(gy, sc)
                        acc_b = T.ieee_add(acc_b, gy)
                        acc_s = T.ieee_add(acc_s, T.ieee_mul(gy, x))
            red_b[tx] = acc_b
            red_s[tx] = acc_s
            T.sync_threads()
            if tx < m:
                for q in T.serial(lanes - 1):
                    acc_b = T.ieee_add(acc_b, red_b[(q + 1) * m + tx])
                    acc_s = T.ieee_add(acc_s, red_s[(q + 1) * m + tx])
                BP[b, tx] = acc_b
            T.sync_threads()
            if tx < m:
                red_s[tx] = acc_s
            T.sync_threads()
            if tx == 0:
                acc_s = red_s[0]
                for q in T.serial(m - 1):
                    acc_s = T.ieee_add(acc_s, red_s[q + 1])
                SP[b, 0] = acc_s

    return mhc_head_compute_mix_bwd_kernel
