"""topk_gate for Ascend 950 (build time only), read from
tilebake.moe.topk_gate.TopkGateAscendVariant: each row's num_topk largest scores' indices in
descending order of value, equal values by the smaller index first (tilebake.torch.stable_topk's
order); a row holding a NaN or an infinity gets -1 in every column, as the CUDA kernels.

A block per vector core, each taking rows core, core + num_vec_cores, ...: the row DMA'd to the
unified buffer whole (at most max_experts scores), PARTS SIMT threads each keeping the sorted top
k of every PARTS-th score (insertion; later equal values after earlier ones, so ties keep index
order), one thread merging the PARTS lists (value descending, then index ascending), the indices
DMA'd out. Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from tilebake.moe.topk_gate import MAX_TOPK, TopkGateAscendVariant

PARTS = 32  # threads scanning a row, each over every PARTS-th score


def build(v: TopkGateAscendVariant):
    n = T.dynamic("num_tokens")
    e = T.dynamic("num_experts")
    k = T.dynamic("num_topk")
    stride = T.dynamic("scores_stride")
    CORES = v.num_vec_cores
    E = v.max_experts

    @T.prim_func
    def topk_gate_kernel(
        S: T.StridedTensor((n, e), (stride, 1), "float32"),
        Out: T.Tensor((n, k), "int64"),
    ):
        with T.Kernel(CORES) as core:
            ss = T.alloc_shared((E,), "float32")
            cv = T.alloc_shared((PARTS, MAX_TOPK), "float32")  # each thread's sorted top k
            ci = T.alloc_shared((PARTS, MAX_TOPK), "int32")
            bad = T.alloc_shared((PARTS,), "int32")
            outs = T.alloc_shared((MAX_TOPK,), "int64")
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                T.copy(S[row, 0:E], ss)
                with T.SimtVF(threads=PARTS):
                    t = T.get_thread_binding()
                    cnt = T.alloc_var("int32")
                    last = T.alloc_var("int32")
                    placed = T.alloc_var("int32")
                    non_finite = T.alloc_var("int32")
                    cnt = 0
                    non_finite = 0
                    # (the same trip count on every thread: no barrier the compiler adds is skipped)
                    for q in T.serial(T.ceildiv(e, PARTS)):
                        idx = t + q * PARTS
                        val = ss[T.min(idx, E - 1)]
                        if idx < e and (T.reinterpret(val, "int32") & 0x7F800000) == 0x7F800000:  # NaN, +-inf
                            non_finite = 1
                        if idx < e and (cnt < k or val > cv[t, k - 1]):
                            last = T.min(cnt, k - 1)  # the slot it enters from, moving up past smaller values
                            placed = 0
                            for s in T.serial(k):
                                p = k - 1 - s
                                if placed == 0 and p <= last:
                                    if p > 0 and val > cv[t, T.max(p - 1, 0)]:
                                        cv[t, p] = cv[t, T.max(p - 1, 0)]
                                        ci[t, p] = ci[t, T.max(p - 1, 0)]
                                    else:
                                        cv[t, p] = val
                                        ci[t, p] = idx
                                        placed = 1
                            cnt = T.min(cnt + 1, k)
                    bad[t] = non_finite
                with T.SimtVF(threads=1):
                    heads = T.alloc_local((PARTS,), "int32")
                    best = T.alloc_var("int32")
                    bv = T.alloc_var("float32")
                    bi = T.alloc_var("int32")
                    any_bad = T.alloc_var("int32")
                    any_bad = 0
                    for p in T.serial(PARTS):
                        heads[p] = 0
                        any_bad = any_bad | bad[p]
                    for j in T.serial(k):
                        best = -1
                        bv = T.float32(0)
                        bi = 0
                        for p in T.serial(PARTS):
                            h = heads[p]
                            if h < T.min(T.max(T.ceildiv(e - p, PARTS), 0), k):
                                if best < 0 or cv[p, h] > bv or (cv[p, h] == bv and ci[p, h] < bi):
                                    best = p
                                    bv = cv[p, h]
                                    bi = ci[p, h]
                        outs[j] = T.if_then_else(any_bad != 0, T.int64(-1), T.cast(bi, "int64"))
                        heads[T.max(best, 0)] = heads[T.max(best, 0)] + 1
                T.copy(outs[0:MAX_TOPK], Out[row, 0:MAX_TOPK])

    return topk_gate_kernel
