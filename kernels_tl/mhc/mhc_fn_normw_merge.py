"""mhc_fn_normw_merge, as TileLang factories (build time only); every size at run time.

forward   OUT[n, k] = FN[n, k] * W[k]: a thread a 4-column vector of the flattened (N, K) fn (its
          weight's column from one division), every CTA's loads in flight at once.
backward  FG[n, k] = OG[n, k] * W[k] and WG[k] = sum over n in order of OG[n, k] * FN[n, k]: a CTA
          32 columns, its threads ROWS rows x 8 vectors; per pass of ROWS * RPT rows each thread
          loads its RPT rows' vectors, writes FG and leaves the products in shared memory, then
          thread c of warp 0 adds column c's products in row order (the CPU path's order and bits).
"""

import tilelang.language as T

from tilebake.mhc.mhc_fn_normw_merge import MhcFnNormwMergeVariant

THREADS = 128
VEC = 4
ROWS = THREADS // 8  # backward: row slots of a pass (8 vectors: 32 columns a CTA)
RPT = 2  # backward: rows a thread loads in a pass (ROWS apart)
# whole vectors: the host checks K % 4 and 16-byte alignment; barriers by hand
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}


def build(v: MhcFnNormwMergeVariant):
    return _forward() if v.direction == "fwd" else _backward()


def _forward():
    num_mixes = T.dynamic("num_mixes")
    num_cols = T.dynamic("num_cols")

    @T.prim_func
    def mhc_fn_normw_merge_fwd_kernel(
        FN: T.Tensor((num_mixes, num_cols), "float32"),
        W: T.Tensor((num_cols,), "float32"),
        OUT: T.Tensor((num_mixes, num_cols), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_mixes * num_cols, THREADS * VEC), threads=THREADS) as b:
            T.assume(num_cols % VEC == 0)
            FN = T.view(FN, shape=(num_mixes * num_cols,), strides=(1,))
            OUT = T.view(OUT, shape=(num_mixes * num_cols,), strides=(1,))
            e = T.alloc_var("int32")  # the thread's vector: elements 4 e ... of the flat fn
            k = T.alloc_var("int32")  # and of the weight
            ws = T.alloc_local((VEC,), "float32")
            fs = T.alloc_local((VEC,), "float32")
            e = b * THREADS + T.get_thread_binding(0)
            k = e - T.truncdiv(e, num_cols // VEC) * (num_cols // VEC)
            if e < num_mixes * (num_cols // VEC):
                for j in T.vectorized(VEC):
                    fs[j] = FN[e * VEC + j]
                for j in T.vectorized(VEC):
                    ws[j] = W[k * VEC + j]
                for j in T.unroll(VEC):
                    fs[j] = T.ieee_mul(fs[j], ws[j])
                for j in T.vectorized(VEC):
                    OUT[e * VEC + j] = fs[j]

    return mhc_fn_normw_merge_fwd_kernel


def _backward():
    num_mixes = T.dynamic("num_mixes")
    num_cols = T.dynamic("num_cols")

    @T.prim_func
    def mhc_fn_normw_merge_bwd_kernel(
        FN: T.Tensor((num_mixes, num_cols), "float32"),
        W: T.Tensor((num_cols,), "float32"),
        OG: T.Tensor((num_mixes, num_cols), "float32"),
        FG: T.Tensor((num_mixes, num_cols), "float32"),
        WG: T.Tensor((num_cols,), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_cols, 8 * VEC), threads=THREADS) as b:
            T.assume(num_cols % VEC == 0)
            tx = T.get_thread_binding(0)
            prod = T.alloc_shared((RPT * ROWS, 8 * VEC), "float32")
            ws = T.alloc_local((VEC,), "float32")
            fs = T.alloc_local((RPT, VEC), "float32")
            gs = T.alloc_local((RPT, VEC), "float32")
            acc = T.alloc_var("float32")
            r = tx // 8
            v = tx % 8
            k = b * (8 * VEC) + v * VEC
            acc = T.float32(0)
            if k < num_cols:
                for j in T.vectorized(VEC):
                    ws[j] = W[k + j]
            for p in T.serial(T.ceildiv(num_mixes, RPT * ROWS)):
                for q in T.unroll(RPT):
                    if p * (RPT * ROWS) + q * ROWS + r < num_mixes and k < num_cols:
                        for j in T.vectorized(VEC):
                            fs[q, j] = FN[p * (RPT * ROWS) + q * ROWS + r, k + j]
                        for j in T.vectorized(VEC):
                            gs[q, j] = OG[p * (RPT * ROWS) + q * ROWS + r, k + j]
                for q in T.unroll(RPT):
                    if p * (RPT * ROWS) + q * ROWS + r < num_mixes and k < num_cols:
                        for j in T.unroll(VEC):
                            fs[q, j] = T.ieee_mul(gs[q, j], fs[q, j])
                            gs[q, j] = T.ieee_mul(gs[q, j], ws[j])
                        for j in T.vectorized(VEC):
                            FG[p * (RPT * ROWS) + q * ROWS + r, k + j] = gs[q, j]
                        for j in T.vectorized(VEC):
                            prod[q * ROWS + r, v * VEC + j] = fs[q, j]
                T.sync_threads()
                if tx < 8 * VEC:  # column tx of the CTA: the pass's rows in order
                    for q in T.serial(T.min(RPT * ROWS, num_mixes - p * (RPT * ROWS))):
                        acc = T.ieee_add(acc, prod[q, tx])
                T.sync_threads()
            if tx < 8 * VEC and b * (8 * VEC) + tx < num_cols:
                WG[b * (8 * VEC) + tx] = acc

    return mhc_fn_normw_merge_bwd_kernel
