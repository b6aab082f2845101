"""Top-k expert selection, as a TileLang factory (build time only).

One warp per token, WARPS tokens a CTA. Lane l holds the scores of experts l, l + 32, ...
(SLOTS = max_experts / 32 registers; experts past num_experts hold -inf). Order: larger score
first, among equal scores the smaller expert index (a stable descending sort). Each lane keeps
the best (score, index) of its remaining experts; a round finds the warp's maximum score with
an xor butterfly and its smallest index (a ballot; a min butterfly only for exact ties between
lanes), every lane ending with the same winner; the owner lane
drops the winner (sets it to -inf) and rescans its slots. num_topk rounds; lane r keeps round
r's winner and the first num_topk lanes store the row with one coalesced write.

Non-finite scores: if any score of a row is NaN or +-inf, that row's output is -1 everywhere
(the original device-asserts; here nothing traps and nothing hangs). A finite score always
beats the -inf sentinel of an empty slot, and num_topk <= num_experts (checked on the host), so
a round always finds a real expert.
"""

import tilelang.language as T

from tilebake.moe.topk_gate import TopkGateVariant

WARPS = 4
THREADS = 32 * WARPS
NO_INDEX = 0x7FFFFFFF  # larger than any expert index: loses every tie


def build(v: TopkGateVariant):
    slots = v.max_experts // 32
    assert slots * 32 == v.max_experts, v

    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")
    scores_stride = T.dynamic("scores_stride")

    @T.prim_func
    def topk_gate_kernel(
        S: T.StridedTensor((num_tokens, num_experts), (scores_stride, 1), "float32"),
        Out: T.Tensor((num_tokens, num_topk), "int64"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            lane = tx % 32
            t = T.alloc_var("int32")
            t = b * WARPS + tx // 32
            vals = T.alloc_local((slots,), "float32")
            best_v = T.alloc_var("float32")
            best_i = T.alloc_var("int32")
            win_v = T.alloc_var("float32")
            win_i = T.alloc_var("int32")
            tied = T.alloc_var("uint32")
            bad = T.alloc_var("int32")
            result = T.alloc_var("int32")
            if t < num_tokens:  # uniform over the warp
                for j in T.unroll(slots):
                    if j * 32 + lane < num_experts:
                        vals[j] = S[t, j * 32 + lane]
                    else:
                        vals[j] = -T.infinity("float32")
                # Exponent bits all ones: inf or NaN (the padding -inf is not a score).
                bad = 0
                for j in T.unroll(slots):
                    if j * 32 + lane < num_experts:
                        if T.bitwise_and(T.reinterpret(vals[j], "uint32"), T.uint32(0x7F800000)) == T.uint32(
                            0x7F800000
                        ):
                            bad = 1
                result = -1
                if T.any_sync(bad != 0) == 0:
                    best_v = -T.infinity("float32")
                    best_i = NO_INDEX
                    for j in T.unroll(slots):
                        if vals[j] > best_v:  # strict: the earlier (smaller) index keeps a tie
                            best_v = vals[j]
                            best_i = j * 32 + lane
                    for r in T.serial(num_topk):
                        # The round's maximum (exact: every lane gets the same bits), then which
                        # lanes hold it. One lane (the rule without exact ties): its index, one
                        # shuffle. Several: the smallest of their indices, a min butterfly.
                        win_v = best_v
                        for s in T.unroll(5):
                            win_v = T.max(win_v, T.shfl_xor(win_v, 16 >> s))
                        tied = T.cast(T.ballot_sync(best_v == win_v), "uint32")
                        if T.bitwise_and(tied, tied - T.uint32(1)) == T.uint32(0):
                            win_i = T.shfl_sync(best_i, T.__ffs(T.cast(tied, "int32")) - 1)
                        else:
                            win_i = T.if_then_else(best_v == win_v, best_i, NO_INDEX)
                            for s in T.unroll(5):
                                win_i = T.min(win_i, T.shfl_xor(win_i, 16 >> s))
                        if lane == r:
                            result = win_i
                        if win_i % 32 == lane:  # this lane owned the winner: drop it, rescan
                            best_v = -T.infinity("float32")
                            best_i = NO_INDEX
                            for j in T.unroll(slots):
                                if j * 32 + lane == win_i:
                                    vals[j] = -T.infinity("float32")
                                if vals[j] > best_v:
                                    best_v = vals[j]
                                    best_i = j * 32 + lane
                if lane < num_topk:
                    Out[t, lane] = T.cast(result, "int64")

    return topk_gate_kernel
