"""moe_topk_gate_forward for more than 512 experts (up to max_experts, 8192): one CTA of 8 warps
per token. Build time only; moe_topk_gate_forward.build dispatches here.

Thread x holds experts j * 256 + x (slot j < max_experts / 256), so a warp's loads read 128
consecutive bytes. Reductions over the token (non-finite vote, softmax max and sum) go through
__syncthreads; the sums add the 8 warps' partials in warp order, so the result is deterministic.
Selection: each warp picks the num_topk best of its own experts (gate_parts.select_topk), writes
them (key, id) to shared memory, and warp 0 picks the num_topk best of those 8 x num_topk: the
same experts, in the same order (key desc, id asc), as one selection over all. Grouped routing
stages the keys in shared memory so that a warp scans each group's consecutive experts. Warp 0
then does fixed and random routing, recomputes the picked experts' scores from their logits (the
same arithmetic, so the same bits as the scores row) and writes the outputs.
The general fallback, not tuned: on the H200, top-8 with bias, 631 us at 16384 tokens x 1024
experts, 555 us at 4096 x 8192 (bench/results/2026-12-01-NVIDIA-H200/router).
"""

import tilelang.language as T

from kernels_tl.moe.gate_parts import (
    NONE,
    group_of,
    key_value,
    okey,
    random_slots,
    redux_max,
    redux_min,
    score_value,
    select_topk,
    token_mode,
    top2_merge_xor,
    write_outputs,
)
from tilebake.moe._router import PHYSICAL_STRIDE
from tilebake.moe.moe_topk_gate_forward import (
    FLAG_BIAS,
    FLAG_MAP,
    FLAG_SCORES,
    FLAG_UNMAPPED,
    MoeTopkGateForwardVariant,
)

WARPS = 8
THREADS = WARPS * 32
CHUNK = 4  # slots per chunk: a chunk past the last expert is skipped by a CTA-uniform branch


def build(v: MoeTopkGateForwardVariant):
    func = v.scoring_func
    SLOTS = v.max_experts // THREADS
    CHUNKS = SLOTS // CHUNK
    assert SLOTS % CHUNK == 0 and v.max_experts < 2**16, v
    NAN = T.reinterpret(T.uint32(0x7FC00000), "float32")
    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")
    width = T.dynamic("width")
    dup = T.dynamic("dup")
    l_stride = T.dynamic("l_stride")
    s_stride = T.dynamic("s_stride")
    u_stride = T.dynamic("u_stride")
    map_stride = T.dynamic("map_stride")

    @T.prim_func
    def moe_topk_gate_forward_kernel(
        L: T.StridedTensor((num_tokens, num_experts), (l_stride, 1), "float32"),
        Bias: T.Tensor((num_experts,), "float32"),
        ImageBias: T.Tensor((num_experts,), "float32"),
        Mask: T.Tensor((num_tokens,), "int8"),
        ImageMask: T.Tensor((num_tokens,), "int8"),
        FixMask: T.Tensor((num_tokens,), "int8"),
        Random: T.Tensor((num_tokens,), "int8"),
        Map: T.StridedTensor((num_experts + 2, dup), (map_stride, 1), "int32"),
        Count: T.Tensor((num_experts + 2,), "int32"),
        Unmapped: T.StridedTensor((num_tokens, num_topk), (u_stride, 1), "int64"),
        OutIdx: T.Tensor((num_tokens, width), "int64"),
        OutW: T.Tensor((num_tokens, width), "float32"),
        Scores: T.StridedTensor((num_tokens, num_experts), (s_stride, 1), "float32"),
        flags: T.int32,
        scaling: T.float32,
        ep_rank: T.int32,
        num_groups: T.int32,
        num_topk_groups: T.int32,
    ):
        with T.Kernel(num_tokens, threads=THREADS) as t:
            tx = T.get_thread_binding(0)
            lane = T.alloc_var("int32")
            w = T.alloc_var("int32")
            lane = tx % 32
            w = tx // 32
            staged = T.alloc_shared((v.max_experts,), "uint32")  # grouped routing: every key
            cand_k = T.alloc_shared((THREADS,), "uint32")  # warp w's round r: [w * 32 + r]
            cand_e = T.alloc_shared((THREADS,), "uint32")
            red = T.alloc_shared((WARPS,), "float32")
            gscore = T.alloc_shared((32,), "uint32")
            x = T.alloc_local((SLOTS,), "float32")
            keys = T.alloc_local((SLOTS,), "uint32")
            mkeys = T.alloc_local((WARPS,), "uint32")
            mids = T.alloc_local((WARPS,), "uint32")
            st = T.alloc_local((4,), "uint32")
            nst = T.alloc_local((4,), "uint32")
            my_e = T.alloc_local((1,), "int32")
            my_k = T.alloc_local((1,), "uint32")
            lost = T.alloc_local((1,), "int32")
            a = T.alloc_local((2,), "uint32")
            nonfinite = T.alloc_var("int32")
            bad = T.alloc_var("int32")
            routed = T.alloc_var("int32")
            rand = T.alloc_var("int32")
            fixed = T.alloc_var("int32")
            image = T.alloc_var("int32")
            zero_row = T.alloc_var("int32")
            bv = T.alloc_var("float32")
            m = T.alloc_var("float32")
            total = T.alloc_var("float32")
            part = T.alloc_var("float32")
            my_s = T.alloc_var("float32")
            denom = T.alloc_var("float32")
            u = T.alloc_var("int64")
            gsize = T.alloc_var("int32")
            inv = T.alloc_var("uint32")
            gk = T.alloc_var("uint32")
            gmask = T.alloc_var("uint32")
            mg = T.alloc_var("uint32")
            gi = T.alloc_var("uint32")
            token_mode(Mask, Random, FixMask, ImageMask, (t,), flags, routed, rand, fixed, image)
            nonfinite = 0
            for c in T.unroll(CHUNKS):
                if c * CHUNK * THREADS < num_experts:
                    for jj in T.unroll(CHUNK):
                        j = c * CHUNK + jj
                        x[j] = T.float32(0)
                        if j * THREADS + tx < num_experts:
                            x[j] = L[t, j * THREADS + tx]
                            if not T.isfinite(x[j]):
                                nonfinite = 1
            bad = T.if_then_else(T.syncthreads_or(nonfinite != 0) != 0, 1, 0)
            m = T.float32(0)
            total = T.float32(1)
            if func == "softmax":
                part = -T.infinity("float32")
                for c in T.unroll(CHUNKS):
                    if c * CHUNK * THREADS < num_experts:
                        for jj in T.unroll(CHUNK):
                            j = c * CHUNK + jj
                            if j * THREADS + tx < num_experts:
                                part = T.max(part, x[j])
                for k in T.unroll(5):
                    part = T.max(part, T.shfl_xor(part, 1 << k))
                if lane == 0:
                    red[w] = part
                T.sync_threads()
                m = red[0]
                for i in T.unroll(WARPS - 1):
                    m = T.max(m, red[i + 1])
                T.sync_threads()
                part = T.float32(0)
                for c in T.unroll(CHUNKS):
                    if c * CHUNK * THREADS < num_experts:
                        for jj in T.unroll(CHUNK):
                            j = c * CHUNK + jj
                            if j * THREADS + tx < num_experts:
                                part = part + T.exp(x[j] - m)
                for k in T.unroll(5):
                    part = part + T.shfl_xor(part, 1 << k)
                if lane == 0:
                    red[w] = part
                T.sync_threads()
                total = red[0]
                for i in T.unroll(WARPS - 1):
                    total = total + red[i + 1]
                T.sync_threads()  # red shares its bytes with later buffers (merged shared memory)
            zero_row = T.if_then_else(routed == 0 or rand != 0, 1, 0)
            if (flags & FLAG_SCORES) != 0:
                for c in T.unroll(CHUNKS):
                    if c * CHUNK * THREADS < num_experts:
                        for jj in T.unroll(CHUNK):
                            j = c * CHUNK + jj
                            if j * THREADS + tx < num_experts:
                                Scores[t, j * THREADS + tx] = T.if_then_else(
                                    zero_row != 0,
                                    T.float32(0),
                                    T.if_then_else(bad != 0, NAN, score_value(func, x[j], m, total)),
                                )
            my_e[0] = 0
            lost[0] = 0
            if routed != 0 and bad == 0 and fixed == 0 and rand == 0:
                for c in T.unroll(CHUNKS):
                    if c * CHUNK * THREADS < num_experts:
                        for jj in T.unroll(CHUNK):
                            j = c * CHUNK + jj
                            keys[j] = T.uint32(0)
                            if j * THREADS + tx < num_experts:
                                bv = T.float32(0)
                                if image != 0:
                                    bv = ImageBias[j * THREADS + tx]
                                elif (flags & FLAG_BIAS) != 0:
                                    bv = Bias[j * THREADS + tx]
                                keys[j] = okey(score_value(func, x[j], m, total) + bv)
                if num_groups > 1:
                    # Stage the keys; warp w scores groups w, w + 8, ... over their consecutive experts.
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * THREADS < num_experts:
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                if j * THREADS + tx < num_experts:
                                    staged[j * THREADS + tx] = keys[j]
                    T.sync_threads()
                    gsize = num_experts // num_groups
                    inv = T.uint32(0xFFFFFFFF) // T.cast(gsize, "uint32") + T.uint32(1)
                    for gg in T.unroll(32 // WARPS):
                        if gg * WARPS + w < num_groups:
                            a[0] = T.uint32(0)
                            a[1] = T.uint32(0)
                            for i in T.serial(T.ceildiv(gsize, 32)):
                                if i * 32 + lane < gsize:
                                    gk = staged[(gg * WARPS + w) * gsize + i * 32 + lane]
                                    a[1] = T.max(a[1], T.min(a[0], gk))
                                    a[0] = T.max(a[0], gk)
                            top2_merge_xor(a)
                            if lane == 0:
                                gscore[gg * WARPS + w] = okey(key_value(a[0]) + key_value(a[1]))
                    T.sync_threads()
                    # Every warp ranks the groups (the same answer) and clears the others' keys.
                    gk = T.uint32(0)
                    if lane < num_groups:
                        gk = gscore[lane]
                    gmask = T.uint32(0)
                    for r in T.serial(num_topk_groups):
                        mg = redux_max(gk)
                        gi = redux_min(
                            T.if_then_else(gk == mg and mg != T.uint32(0), T.cast(lane, "uint32"), T.uint32(NONE))
                        )
                        if gi < T.uint32(32):
                            gmask = gmask | T.shift_left(T.uint32(1), gi)
                            if T.cast(lane, "uint32") == gi:
                                gk = T.uint32(0)
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * THREADS < num_experts:
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                if j * THREADS + tx < num_experts:
                                    if (
                                        T.shift_right(gmask, T.cast(group_of(j * THREADS + tx, inv), "uint32"))
                                        & T.uint32(1)
                                    ) == 0:
                                        keys[j] = T.uint32(0)
                # Each warp's own top-k, then warp 0 merges the 8 lists.
                my_k[0] = T.uint32(0)
                select_topk(
                    keys, st, nst, SLOTS, CHUNK, lambda c: c * CHUNK * THREADS < num_experts,
                    lambda j: T.cast(j * THREADS + tx, "uint32"), True, lane, num_topk, my_e, my_k, lost,
                )  # fmt: skip
                cand_k[tx] = T.if_then_else(lane < num_topk, my_k[0], T.uint32(0))
                cand_e[tx] = T.cast(my_e[0], "uint32")
                T.sync_threads()
                if w == 0:
                    for j in T.unroll(WARPS):
                        mkeys[j] = cand_k[j * 32 + lane]
                        mids[j] = cand_e[j * 32 + lane]
                    lost[0] = 0
                    select_topk(
                        mkeys, st, nst, WARPS, WARPS, lambda c: True, lambda j: mids[j], False, lane, num_topk,
                        my_e, my_k, lost,
                    )  # fmt: skip
            if w == 0:
                denom = T.float32(1e-20)
                my_s = T.float32(0)
                if routed != 0 and bad == 0:
                    if fixed != 0:
                        if lane < num_topk:
                            u = Unmapped[t, lane]
                            if u < T.int64(0) or u >= T.cast(num_experts, "int64"):
                                lost[0] = 1
                            else:
                                my_e[0] = T.cast(u, "int32")
                    elif rand != 0:
                        random_slots(my_e, lane, t, ep_rank, num_experts, num_topk)
                    if T.any_sync(lost[0] != 0 or (lane < num_topk and my_e[0] >= num_experts)) != 0:
                        bad = 1
                    if bad == 0:
                        if lane < num_topk:
                            my_s = score_value(func, L[t, my_e[0]], m, total)
                        for r in T.serial(num_topk):  # left to right in slot order
                            denom = denom + T.shfl_sync(my_s, r)
                write_outputs(
                    OutIdx, OutW, Unmapped, Map, Count, t, lane, flags, T.if_then_else(routed != 0 and bad == 0, 1, 0),
                    rand, fixed, my_e[0], my_s, denom, scaling, ep_rank, num_experts, num_topk, width, dup, FLAG_MAP,
                    FLAG_UNMAPPED, PHYSICAL_STRIDE,
                )  # fmt: skip

    return moe_topk_gate_forward_kernel
