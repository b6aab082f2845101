"""Top-k expert selection, as a TileLang factory (build time only).

Fast variants (max_experts <= 1024): one warp per token, WARPS tokens a CTA. Lane l holds the
scores of experts l, l + 32, ... (SLOTS = max_experts / 32 registers; experts past num_experts
hold -inf). Order: larger score first, among equal scores the smaller expert index (a stable
descending sort). Each lane keeps the best (score, index) of its remaining experts; a round
finds the warp's maximum score with an xor butterfly and its smallest index (a ballot; a min
butterfly only for exact ties between lanes), every lane ending with the same winner; the owner
lane drops the winner (sets it to -inf) and rescans its slots. num_topk rounds; lane r keeps round
r's winner and the first num_topk lanes store the row with one coalesced write.

Non-finite scores: if any score of a row is NaN or +-inf, that row's output is -1 everywhere
(the original device-asserts; here nothing traps and nothing hangs). A finite score always
beats the -inf sentinel of an empty slot, and num_topk <= num_experts (checked on the host), so
a round always finds a real expert.

General variant (max_experts > 1024): one CTA of BLOCK_THREADS threads per token; thread x holds
experts x, x + BLOCK_THREADS, ... (max_experts / BLOCK_THREADS registers). A round is the warp
step above (each warp's best, the same bits in every lane), then lane 0 of each warp posts it
to shared memory, one __syncthreads, and every thread merges the 8 posts in warp order (larger
score, then smaller index: the same winner everywhere); the owner thread drops it and rescans.
The posts alternate between two buffers by round parity, so one barrier a round suffices: a
warp can only overwrite a buffer after the next round's barrier, which every reader of this
round passes after reading. A row with a non-finite score: the warps' any_sync flags meet in
shared memory the same way, and the whole CTA skips the rounds (every branch is CTA-uniform).
"""

import tilelang.language as T

from tilebake.moe.topk_gate import BLOCK_THREADS, TopkGateVariant

WARPS = 4
THREADS = 32 * WARPS
BLOCK_WARPS = BLOCK_THREADS // 32
NO_INDEX = 0x7FFFFFFF  # larger than any expert index: loses every tie
# The block kernel synchronises by hand (the fast kernels have no shared memory).
PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}


@T.macro
def load_scores_(vals, bad: T.Ref, S, token, slots, expert, num_experts):
    """vals[j] = the score of expert(j) of row token[0] (-inf past num_experts); bad = 1 if one
    is non-finite (exponent bits all ones: inf or NaN; the padding -inf is not a score).
    token: (t,), a 1-tuple, so that a T.alloc_var t is read in place (a macro argument would be
    copied into a new variable, which changes the generated code)."""
    for j in T.unroll(slots):
        if expert(j) < num_experts:
            vals[j] = S[token[0], expert(j)]
        else:
            vals[j] = -T.infinity("float32")
    bad = 0
    for j in T.unroll(slots):
        if expert(j) < num_experts:
            if T.bitwise_and(T.reinterpret(vals[j], "uint32"), T.uint32(0x7F800000)) == T.uint32(0x7F800000):
                bad = 1


@T.macro
def scan_best_(vals, best_v: T.Ref, best_i: T.Ref, slots, expert, dropped):
    """(best_v, best_i) = this thread's best (score, expert(j)) of vals; dropped: None, or
    (win_i,), the expert whose score is first set to -inf (a round's winner)."""
    best_v = -T.infinity("float32")
    best_i = NO_INDEX
    for j in T.unroll(slots):
        if dropped is not None:
            if expert(j) == dropped[0]:
                vals[j] = -T.infinity("float32")
        if vals[j] > best_v:  # strict: the earlier (smaller) index keeps a tie
            best_v = vals[j]
            best_i = expert(j)


@T.macro
def warp_best_(best_v: T.Ref, best_i: T.Ref, win_v: T.Ref, win_i: T.Ref, tied: T.Ref):
    """(win_v, win_i) = the warp's best of the lanes' (best_v, best_i), in every lane: the
    maximum (exact: every lane gets the same bits), then which lanes hold it. One lane (the rule
    without exact ties): its index, one shuffle. Several: the smallest of their indices, a min
    butterfly."""
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


def build(v: TopkGateVariant):
    if v.max_experts > 32 * 32:
        return build_block(v)
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
                load_scores_(vals, bad, S, (t,), slots, lambda j: j * 32 + lane, num_experts)
                result = -1
                if T.any_sync(bad != 0) == 0:
                    scan_best_(vals, best_v, best_i, slots, lambda j: j * 32 + lane, None)
                    for r in T.serial(num_topk):
                        warp_best_(best_v, best_i, win_v, win_i, tied)
                        if lane == r:
                            result = win_i
                        if win_i % 32 == lane:  # this lane owned the winner: drop it, rescan
                            scan_best_(vals, best_v, best_i, slots, lambda j: j * 32 + lane, (win_i,))
                if lane < num_topk:
                    Out[t, lane] = T.cast(result, "int64")

    return topk_gate_kernel


def build_block(v: TopkGateVariant):
    slots = v.max_experts // BLOCK_THREADS
    assert slots * BLOCK_THREADS == v.max_experts, v

    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")
    scores_stride = T.dynamic("scores_stride")

    @T.prim_func
    def topk_gate_block_kernel(
        S: T.StridedTensor((num_tokens, num_experts), (scores_stride, 1), "float32"),
        Out: T.Tensor((num_tokens, num_topk), "int64"),
    ):
        with T.Kernel(num_tokens, threads=BLOCK_THREADS) as t:
            tx = T.get_thread_binding(0)
            lane = tx % 32
            w = tx // 32
            # Two halves of posts, then the warps' non-finite flags: one buffer, as the lowering
            # may overlay separate buffers whose uses it sees apart, with no barrier between.
            post_v = T.alloc_shared((2 * BLOCK_WARPS,), "float32")
            post_i = T.alloc_shared((3 * BLOCK_WARPS,), "int32")
            vals = T.alloc_local((slots,), "float32")
            best_v = T.alloc_var("float32")
            best_i = T.alloc_var("int32")
            win_v = T.alloc_var("float32")
            win_i = T.alloc_var("int32")
            cand_v = T.alloc_var("float32")
            cand_i = T.alloc_var("int32")
            tied = T.alloc_var("uint32")
            bad = T.alloc_var("int32")
            result = T.alloc_var("int32")
            half = T.alloc_var("int32")
            load_scores_(vals, bad, S, (t,), slots, lambda j: j * BLOCK_THREADS + tx, num_experts)
            bad = T.any_sync(bad != 0)
            if lane == 0:
                post_i[2 * BLOCK_WARPS + w] = bad
            T.sync_threads()
            bad = 0
            for i in T.unroll(BLOCK_WARPS):
                bad = T.bitwise_or(bad, post_i[2 * BLOCK_WARPS + i])
            result = -1
            if bad == 0:  # CTA-uniform: the barriers below are reached by every thread
                scan_best_(vals, best_v, best_i, slots, lambda j: j * BLOCK_THREADS + tx, None)
                for r in T.serial(num_topk):
                    warp_best_(best_v, best_i, win_v, win_i, tied)  # this warp's best
                    half = (r % 2) * BLOCK_WARPS
                    if lane == 0:
                        post_v[half + w] = win_v
                        post_i[half + w] = win_i
                    T.sync_threads()
                    # The CTA's best: larger score, then smaller index.
                    win_v = post_v[half]
                    win_i = post_i[half]
                    for i in T.unroll(BLOCK_WARPS - 1):
                        cand_v = post_v[half + i + 1]
                        cand_i = post_i[half + i + 1]
                        if cand_v > win_v or (cand_v == win_v and cand_i < win_i):
                            win_v = cand_v
                            win_i = cand_i
                    if tx == r:
                        result = win_i
                    if win_i % BLOCK_THREADS == tx:  # this thread owned the winner: drop it, rescan
                        scan_best_(vals, best_v, best_i, slots, lambda j: j * BLOCK_THREADS + tx, (win_i,))
            if tx < num_topk:
                Out[t, tx] = T.cast(result, "int64")

    return topk_gate_block_kernel
