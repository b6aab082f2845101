"""MoE routing backward (the gradient of moe_topk_gate_forward w.r.t. the logits), as a
TileLang factory (build time only).

Per token, with u = scores (the forward's score output), k routed slots j with expert idx_j
(valid: 0 <= idx_j < E), g = grad_topk_weights, w = topk_weights, s = routed_scaling_factor:
    D = 1e-20 + sum_valid u[idx_j]                       (as the forward's normalisation)
    route_j = (s * g_j - sum_valid g_j * w_j) / D        (w_j = s * u[idx_j] / D)
    grad_u[e] = sum_{j valid, idx_j = e} route_j
    + aux (grad_scores_sum given): h = grad_scores_sum[token // tokens_per_seq],
      S = sum_e u[e]:  grad_u[e] += (h[e] - <h, u> / S) / S  (the gradient of u / S)
then the scoring function's derivative, recovered from u (scoring argument):
    0 sqrtsoftplus: grad_logit = grad_u * (1 - exp(-u^2)) / (2u)   (0 where u == 0),
                    1 - exp(-u^2) computed as -expm1f(-u^2) (no cancellation for small u)
    1 sigmoid:      grad_logit = grad_u * u * (1 - u)
    2 softmax:      grad_logit = u * (grad_u - <u, grad_u>)
A token with mask False (has_mask) gets a zero row; a slot with an index outside [0, E) (-1:
masked) contributes nothing.

One warp per token, WARPS tokens a CTA; lane l holds experts l, l + 32, ... (SLOTS =
max_experts / 32). Lane j < k holds slot j. The route terms are scattered into a per-warp
shared row by shared-memory atomics (duplicate experts add, in an unspecified order), warp
sums are xor butterflies. All control flow is uniform over the CTA; only memory accesses are
guarded (a barrier inside a token-dependent branch could hang the last CTA).

General variant (max_experts > 1024, build_block): one CTA of BLOCK_THREADS threads per token;
thread x holds experts x, x + BLOCK_THREADS, ... The route row is in shared memory; warp 0's
lanes j < k scatter the route terms (every warp computes the same D and <g, w> from the same
loads, the same bits); the row sums (S, <h, u>, <u, grad_u>) are per-thread sums over the
slots, warp butterflies, then the 8 warps' partials added in warp order by every thread (one
barrier each), so every thread holds the same bits.
"""

import tilelang.language as T

from tilebake.moe.moe_topk_gate_backward import BLOCK_THREADS, MoeTopkGateBackwardVariant

WARPS = 4
THREADS = 32 * WARPS
BLOCK_WARPS = BLOCK_THREADS // 32
DENOMINATOR_START = 1e-20  # as the forward
SQRTSOFTPLUS, SIGMOID, SOFTMAX = 0, 1, 2  # the `scoring` argument (src/tilebake/moe/moe_topk_gate_backward.py)


@T.macro
def warp_sum_(acc):
    """acc[0] (a 1-element local buffer) = its sum over the warp, the same bits in every lane."""
    for s in T.unroll(5):
        acc[0] = acc[0] + T.shfl_xor(acc[0], 16 >> s)


@T.macro
def block_sum_(acc, buf, base, lane, w):
    """acc[0] = its sum over the CTA, the same bits in every thread. buf[base : base +
    BLOCK_WARPS]: shared floats that no other reduction uses (so posting needs no barrier)."""
    warp_sum_(acc)
    if lane == 0:
        buf[base + w] = acc[0]
    T.sync_threads()
    acc[0] = buf[base]
    for i in T.unroll(BLOCK_WARPS - 1):
        acc[0] = acc[0] + buf[base + i + 1]


@T.macro
def load_slot_(U, IDX, TW, G, token, lane, row_on: T.Ref, slot_on: T.Ref, e: T.Ref, g: T.Ref, tw: T.Ref, u_sel: T.Ref,
               idx64: T.Ref, den, dot, num_topk, num_experts):  # fmt: skip
    """Lane j < k (of a token whose row is on) loads slot j: slot_on, its expert e, g_j, w_j and
    u[e] (zeros for an off or invalid slot); then den[0] = D and dot[0] = <g, w> over the warp.
    token: (t,), a 1-tuple, so that a T.alloc_var t is read where it is used (a macro argument
    would be copied into a new variable, which changes the generated code)."""
    slot_on = False
    e = 0
    g = T.float32(0)
    tw = T.float32(0)
    u_sel = T.float32(0)
    if row_on and lane < num_topk:
        idx64 = IDX[token[0], lane]
        if idx64 >= T.int64(0) and idx64 < T.cast(num_experts, "int64"):
            slot_on = True
            e = T.cast(idx64, "int32")
            g = G[token[0], lane]
            tw = TW[token[0], lane]
            u_sel = U[token[0], e]
    den[0] = u_sel
    warp_sum_(den)
    den[0] = den[0] + T.float32(DENOMINATOR_START)
    dot[0] = g * tw
    warp_sum_(dot)


@T.macro
def row_sum_(acc, r, buf, parts, lane, w):
    """acc[0] = its sum over the token's row: a warp's (buf None) or the CTA's (block_sum_ with
    the partial sums r of buf[parts ...])."""
    if buf is None:
        warp_sum_(acc)
    else:
        block_sum_(acc, buf, parts + r * BLOCK_WARPS, lane, w)


@T.macro
def logit_grad_(u, h, gu, slots, row_on: T.Ref, total, dot, inv: T.Ref, d: T.Ref, uu: T.Ref, has_aux, scoring, buf,
                parts, lane, w):  # fmt: skip
    """gu (grad_u from the route terms) += the aux term (has_aux), then gu = grad_logit by the
    scoring function's derivative, from u; h: the token's grad_scores_sum row. Row sums by row_sum_."""
    if has_aux != 0:
        total[0] = T.float32(0)
        dot[0] = T.float32(0)
        for j in T.unroll(slots):
            total[0] = total[0] + u[j]
            dot[0] = dot[0] + h[j] * u[j]
        row_sum_(total, 0, buf, parts, lane, w)
        row_sum_(dot, 1, buf, parts, lane, w)
        inv = T.float32(0)
        if row_on:
            inv = T.float32(1) / total[0]
        for j in T.unroll(slots):
            gu[j] = gu[j] + (h[j] - dot[0] * inv) * inv

    if scoring == SOFTMAX:
        dot[0] = T.float32(0)
        for j in T.unroll(slots):
            dot[0] = dot[0] + u[j] * gu[j]
        row_sum_(dot, 2, buf, parts, lane, w)
        for j in T.unroll(slots):
            gu[j] = u[j] * (gu[j] - dot[0])
    elif scoring == SIGMOID:
        for j in T.unroll(slots):
            gu[j] = gu[j] * (u[j] * (T.float32(1) - u[j]))
    else:
        for j in T.unroll(slots):
            uu = u[j]
            d = T.float32(0)
            if uu > T.float32(0):
                d = -T.call_extern("float32", "expm1f", -(uu * uu)) / (T.float32(2) * uu)
            gu[j] = gu[j] * d


def build(v: MoeTopkGateBackwardVariant):
    if v.max_experts > 32 * 32:
        return build_block(v)
    slots = v.max_experts // 32
    assert slots * 32 == v.max_experts, v

    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")
    num_seqs = T.dynamic("num_seqs")
    u_stride = T.dynamic("scores_stride")
    idx_stride = T.dynamic("idx_stride")
    w_stride = T.dynamic("w_stride")
    g_stride = T.dynamic("g_stride")
    h_stride = T.dynamic("h_stride")
    out_stride = T.dynamic("out_stride")

    @T.prim_func
    def moe_topk_gate_backward_kernel(
        U: T.StridedTensor((num_tokens, num_experts), (u_stride, 1), "float32"),
        IDX: T.StridedTensor((num_tokens, num_topk), (idx_stride, 1), "int64"),
        TW: T.StridedTensor((num_tokens, num_topk), (w_stride, 1), "float32"),
        G: T.StridedTensor((num_tokens, num_topk), (g_stride, 1), "float32"),
        MASK: T.Tensor((num_tokens,), "uint8"),
        H: T.StridedTensor((num_seqs, num_experts), (h_stride, 1), "float32"),
        DX: T.StridedTensor((num_tokens, num_experts), (out_stride, 1), "float32"),
        routed_scaling_factor: T.float32,
        scoring: T.int32,
        has_mask: T.int32,
        has_aux: T.int32,
        tokens_per_seq: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            lane = tx % 32
            w = tx // 32
            t = T.alloc_var("int32")
            t = b * WARPS + w
            route = T.alloc_shared((WARPS, v.max_experts), "float32")
            u = T.alloc_local((slots,), "float32")
            h = T.alloc_local((slots,), "float32")
            gu = T.alloc_local((slots,), "float32")
            row_on = T.alloc_var("bool")
            slot_on = T.alloc_var("bool")
            e = T.alloc_var("int32")
            g = T.alloc_var("float32")
            tw = T.alloc_var("float32")
            u_sel = T.alloc_var("float32")
            den = T.alloc_local((1,), "float32")
            dot = T.alloc_local((1,), "float32")
            total = T.alloc_local((1,), "float32")
            inv = T.alloc_var("float32")
            d = T.alloc_var("float32")
            uu = T.alloc_var("float32")
            idx64 = T.alloc_var("int64")

            # A token past the end (the last CTA) runs the same code with everything masked.
            row_on = t < num_tokens
            if row_on and has_mask != 0:
                row_on = MASK[t] != T.uint8(0)
            for j in T.unroll(slots):
                route[w, j * 32 + lane] = T.float32(0)
                u[j] = T.float32(0)
                h[j] = T.float32(0)
                if t < num_tokens and j * 32 + lane < num_experts:
                    u[j] = U[t, j * 32 + lane]
                    if has_aux != 0:
                        h[j] = H[t // tokens_per_seq, j * 32 + lane]

            # Lane j < k: slot j.
            load_slot_(U, IDX, TW, G, (t,), lane, row_on, slot_on, e, g, tw, u_sel, idx64, den, dot, num_topk, num_experts)
            T.sync_warp()  # the zeroed route row is visible to every lane
            if slot_on:
                T.atomic_add(route[w, e], (routed_scaling_factor * g - dot[0]) / den[0])
            T.sync_warp()
            for j in T.unroll(slots):
                gu[j] = route[w, j * 32 + lane]

            logit_grad_(u, h, gu, slots, row_on, total, dot, inv, d, uu, has_aux, scoring, None, 0, lane, w)

            for j in T.unroll(slots):
                if t < num_tokens and j * 32 + lane < num_experts:
                    if row_on:
                        DX[t, j * 32 + lane] = gu[j]
                    else:
                        DX[t, j * 32 + lane] = T.float32(0)

    return moe_topk_gate_backward_kernel


def build_block(v: MoeTopkGateBackwardVariant):
    slots = v.max_experts // BLOCK_THREADS
    assert slots * BLOCK_THREADS == v.max_experts, v
    parts = v.max_experts  # buf[parts + 8 r : ...]: reduction r's partial sums, after the route row

    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")
    num_seqs = T.dynamic("num_seqs")
    u_stride = T.dynamic("scores_stride")
    idx_stride = T.dynamic("idx_stride")
    w_stride = T.dynamic("w_stride")
    g_stride = T.dynamic("g_stride")
    h_stride = T.dynamic("h_stride")
    out_stride = T.dynamic("out_stride")

    @T.prim_func
    def moe_topk_gate_backward_block_kernel(
        U: T.StridedTensor((num_tokens, num_experts), (u_stride, 1), "float32"),
        IDX: T.StridedTensor((num_tokens, num_topk), (idx_stride, 1), "int64"),
        TW: T.StridedTensor((num_tokens, num_topk), (w_stride, 1), "float32"),
        G: T.StridedTensor((num_tokens, num_topk), (g_stride, 1), "float32"),
        MASK: T.Tensor((num_tokens,), "uint8"),
        H: T.StridedTensor((num_seqs, num_experts), (h_stride, 1), "float32"),
        DX: T.StridedTensor((num_tokens, num_experts), (out_stride, 1), "float32"),
        routed_scaling_factor: T.float32,
        scoring: T.int32,
        has_mask: T.int32,
        has_aux: T.int32,
        tokens_per_seq: T.int32,
    ):
        with T.Kernel(num_tokens, threads=BLOCK_THREADS) as t:
            tx = T.get_thread_binding(0)
            lane = tx % 32
            w = tx // 32
            # The route row, then the partial sums: one buffer, as the lowering may overlay
            # separate buffers whose uses it sees apart, with no barrier between.
            buf = T.alloc_shared((v.max_experts + 3 * BLOCK_WARPS,), "float32")
            u = T.alloc_local((slots,), "float32")
            h = T.alloc_local((slots,), "float32")
            gu = T.alloc_local((slots,), "float32")
            row_on = T.alloc_var("bool")
            slot_on = T.alloc_var("bool")
            e = T.alloc_var("int32")
            g = T.alloc_var("float32")
            tw = T.alloc_var("float32")
            u_sel = T.alloc_var("float32")
            den = T.alloc_local((1,), "float32")
            dot = T.alloc_local((1,), "float32")
            total = T.alloc_local((1,), "float32")
            inv = T.alloc_var("float32")
            d = T.alloc_var("float32")
            uu = T.alloc_var("float32")
            idx64 = T.alloc_var("int64")

            row_on = True
            if has_mask != 0:
                row_on = MASK[t] != T.uint8(0)
            for j in T.unroll(slots):
                buf[j * BLOCK_THREADS + tx] = T.float32(0)
                u[j] = T.float32(0)
                h[j] = T.float32(0)
                if j * BLOCK_THREADS + tx < num_experts:
                    u[j] = U[t, j * BLOCK_THREADS + tx]
                    if has_aux != 0:
                        h[j] = H[t // tokens_per_seq, j * BLOCK_THREADS + tx]

            # Lane j < k of every warp: slot j (so every warp sums D and <g, w> itself).
            load_slot_(U, IDX, TW, G, (t,), lane, row_on, slot_on, e, g, tw, u_sel, idx64, den, dot, num_topk, num_experts)
            T.sync_threads()  # the zeroed route row is visible
            if slot_on and w == 0:
                T.atomic_add(buf[e], (routed_scaling_factor * g - dot[0]) / den[0])
            T.sync_threads()
            for j in T.unroll(slots):
                gu[j] = buf[j * BLOCK_THREADS + tx]

            logit_grad_(u, h, gu, slots, row_on, total, dot, inv, d, uu, has_aux, scoring, buf, parts, lane, w)

            for j in T.unroll(slots):
                if j * BLOCK_THREADS + tx < num_experts:
                    if row_on:
                        DX[t, j * BLOCK_THREADS + tx] = gu[j]
                    else:
                        DX[t, j * BLOCK_THREADS + tx] = T.float32(0)

    return moe_topk_gate_backward_block_kernel
