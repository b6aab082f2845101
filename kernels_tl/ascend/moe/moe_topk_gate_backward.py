"""moe_topk_gate_backward (the router's gradient w.r.t. the logits) for Ascend 950 (build time
only), read from tilebake.moe.moe_topk_gate_backward.MoeTopkGateBackwardAscendVariant: the
arithmetic of the CUDA kernels (kernels_tl/moe/moe_topk_gate_backward.py's docstring), every
scoring function and option at run time, any expert count up to max_experts.

A block per vector core, each taking tokens core, core + num_vec_cores, ...: the token's scores
row (and its sequence's grad_scores_sum row) DMA'd to the unified buffer; PARTS SIMT threads,
each over every PARTS-th expert: (A) zero grad_u, partial sums of u and h * u; (B) one thread:
the route terms of the k slots (read from GM by the SIMT thread; a slot outside [0, E) adds
nothing), added into grad_u in slot order (duplicates add up); (C) the aux term, then the
scoring function's derivative (softmax: the partial sums of u * grad_u); (D) softmax's final
step, a masked-out row zeroed; the row DMA'd out. Sums over the threads' partials go in thread
order. Built and lowered here, never run on an NPU: checked on the CPU by
tests/ascend/test_emulated_gate.py.
"""

import tilelang.ascend.language as T

from tilebake.moe.moe_topk_gate_backward import SCORING_CODES, MoeTopkGateBackwardAscendVariant

PARTS = 32
SIGMOID, SOFTMAX = SCORING_CODES["sigmoid"], SCORING_CODES["softmax"]
DENOMINATOR_START = 1e-20  # as the forward


def build(v: MoeTopkGateBackwardAscendVariant):
    n = T.dynamic("num_tokens")
    e = T.dynamic("num_experts")
    k = T.dynamic("num_topk")
    num_seqs = T.dynamic("num_seqs")
    u_stride = T.dynamic("scores_stride")
    idx_stride = T.dynamic("idx_stride")
    w_stride = T.dynamic("w_stride")
    g_stride = T.dynamic("g_stride")
    h_stride = T.dynamic("h_stride")
    out_stride = T.dynamic("out_stride")
    CORES = v.num_vec_cores
    E = v.max_experts
    STEPS = (E + PARTS - 1) // PARTS

    @T.macro
    def row_sum(part, col, acc: T.Ref):
        """acc = the threads' partials part[0..PARTS, col] added in thread order."""
        acc = T.float32(0)
        for p in T.serial(PARTS):
            acc = acc + part[p, col]

    @T.prim_func
    def moe_topk_gate_backward_kernel(
        U: T.StridedTensor((n, e), (u_stride, 1), "float32"),
        IDX: T.StridedTensor((n, k), (idx_stride, 1), "int64"),
        TW: T.StridedTensor((n, k), (w_stride, 1), "float32"),
        G: T.StridedTensor((n, k), (g_stride, 1), "float32"),
        MASK: T.Tensor((n,), "int8"),
        H: T.StridedTensor((num_seqs, e), (h_stride, 1), "float32"),
        DX: T.StridedTensor((n, e), (out_stride, 1), "float32"),
        routed_scaling_factor: T.float32,
        scoring: T.int32,
        has_mask: T.int32,
        has_aux: T.int32,
        tokens_per_seq: T.int32,
    ):
        with T.Kernel(CORES) as core:
            us = T.alloc_shared((E,), "float32")
            hs = T.alloc_shared((E,), "float32")
            gu = T.alloc_shared((E,), "float32")
            part = T.alloc_shared((PARTS, 4), "float32")  # a thread's sums of u, h * u, u * grad_u
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                T.copy(U[row, 0:E], us)
                if has_aux != 0:
                    T.copy(H[row // tokens_per_seq, 0:E], hs)
                with T.SimtVF(threads=PARTS):  # (A) grad_u = 0; sums of u and h * u
                    t = T.get_thread_binding()
                    total = T.alloc_var("float32")
                    dot = T.alloc_var("float32")
                    total = T.float32(0)
                    dot = T.float32(0)
                    for q in T.serial(STEPS):
                        idx = t + q * PARTS
                        if idx < e:
                            gu[idx] = T.float32(0)
                            total = total + us[idx]
                            if has_aux != 0:
                                dot = dot + hs[idx] * us[idx]
                    part[t, 0] = total
                    part[t, 1] = dot
                with T.SimtVF(threads=1):  # (B) the route terms, in slot order
                    den = T.alloc_var("float32")
                    gw = T.alloc_var("float32")
                    x = T.alloc_var("int64")
                    den = T.float32(0)
                    gw = T.float32(0)
                    for j in T.serial(k):
                        x = IDX[row, j]
                        if x >= T.int64(0) and x < T.cast(e, "int64"):
                            den = den + us[T.cast(x, "int32")]
                            gw = gw + G[row, j] * TW[row, j]
                    den = den + T.float32(DENOMINATOR_START)
                    for j in T.serial(k):
                        x = IDX[row, j]
                        if x >= T.int64(0) and x < T.cast(e, "int64"):
                            gu[T.cast(x, "int32")] = gu[T.cast(x, "int32")] + (routed_scaling_factor * G[row, j] - gw) / den
                with T.SimtVF(threads=PARTS):  # (C) the aux term, the scoring function's derivative
                    t = T.get_thread_binding()
                    on = T.alloc_var("int32")
                    total = T.alloc_var("float32")
                    dot = T.alloc_var("float32")
                    inv = T.alloc_var("float32")
                    d = T.alloc_var("float32")
                    acc = T.alloc_var("float32")
                    on = 1
                    if has_mask != 0:
                        on = T.if_then_else(MASK[row] != T.int8(0), 1, 0)
                    row_sum(part, 0, total)
                    row_sum(part, 1, dot)
                    inv = T.if_then_else(on != 0, T.float32(1) / total, T.float32(0))
                    acc = T.float32(0)
                    for q in T.serial(STEPS):
                        idx = t + q * PARTS
                        if idx < e:
                            if has_aux != 0:
                                gu[idx] = gu[idx] + (hs[idx] - dot * inv) * inv
                            if scoring == SOFTMAX:
                                acc = acc + us[idx] * gu[idx]
                            elif scoring == SIGMOID:
                                gu[idx] = gu[idx] * (us[idx] * (T.float32(1) - us[idx]))
                            else:
                                d = T.float32(0)
                                if us[idx] > T.float32(0):
                                    d = -T.call_extern("float32", "expm1f", -(us[idx] * us[idx])) / (T.float32(2) * us[idx])
                                gu[idx] = gu[idx] * d
                    part[t, 2] = acc
                with T.SimtVF(threads=PARTS):  # (D) softmax's last step; a masked-out row is 0
                    t = T.get_thread_binding()
                    on = T.alloc_var("int32")
                    dot = T.alloc_var("float32")
                    on = 1
                    if has_mask != 0:
                        on = T.if_then_else(MASK[row] != T.int8(0), 1, 0)
                    row_sum(part, 2, dot)
                    for q in T.serial(STEPS):
                        idx = t + q * PARTS
                        if idx < e:
                            if scoring == SOFTMAX:
                                gu[idx] = us[idx] * (gu[idx] - dot)
                            if on == 0:
                                gu[idx] = T.float32(0)
                T.copy(gu[0:E], DX[row, 0:E])

    return moe_topk_gate_backward_kernel
