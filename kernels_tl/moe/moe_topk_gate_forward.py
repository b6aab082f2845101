"""moe_topk_gate_forward (the MoE router forward) as a TileLang factory. Build time only.

Variants with max_experts <= 512: one warp per token, WARPS tokens per CTA. Lane l holds
experts l, l + 32, ... (slot j holds expert j * 32 + l), so each load instruction of a warp reads
128 consecutive bytes; slots come in chunks of 4, a chunk past the last expert skipped by a
warp-uniform branch. The token's scores go to a shared-memory row (the weights read the picked
experts' scores from it) and, if asked, to `Scores`. Then, by the token's mode (warp-uniform):
  - top-k (gate_parts.select_topk): per-lane top-2 caches of the selection keys, one expert per
    round by two redux.sync, ties to the smaller expert;
  - grouped (num_groups > 1): each group's top-2 sum (one pass over the slots when a group is
    whole slots, group size % 32 == 0; else one pass per group), the num_topk_groups best groups
    by redux rounds, and the other groups' keys cleared before the top-k;
  - fixed routing: the ids read from unmapped_topk_idx; force_random: gate_parts.random_slots.
A non-finite logit (a warp vote) makes the token unrouted before any selection. Every loop has a
fixed or argument bound (a random slot: at most 64 draws), so nothing can hang.
max_experts > 512: moe_topk_gate_forward_wide.py (one CTA per token).
CPU check without a GPU: build_tools/warp_emu.py, tests/moe/test_moe_topk_gate_forward_emulated.py.
Everything but the scoring function and the expert bound is a runtime argument (the FLAG_* bits
of `flags`; an absent tensor is given a valid dummy pointer and never read).

H200, 16384 tokens x 256 experts, top-8, bias: 27 us a call in CUDA-graph replay (the original:
38.0 us; the kernel before, whose rounds rescanned every slot with 115 registers: 66 us); 48
registers, 40 warps per SM. build()'s knobs (warps per CTA, tokens per warp with the next
token's logits prefetched, a branch-free softplus, a minimum of CTAs per SM) gave nothing beyond
the run-to-run spread (bench/results/2026-12-01-NVIDIA-H200/router, bench/gate_candidates.py).
"""

import tilelang.language as T

from kernels_tl.moe import moe_topk_gate_forward_wide as wide
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
    FAST_MAX_EXPERTS,
    FLAG_BIAS,
    FLAG_MAP,
    FLAG_SCORES,
    FLAG_UNMAPPED,
    MoeTopkGateForwardVariant,
)

# Every access is guarded by hand; a warp reads only its own shared row (after __syncwarp).
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}

WARPS = 4
TOKENS_PER_WARP = 1
SELECT_SOFTPLUS = False
CHUNK = 4  # slots per chunk: a chunk past the last expert is skipped by a warp-uniform branch


def _nan():
    return T.reinterpret(T.uint32(0x7FC00000), "float32")


@T.macro
def keep_best_groups(keys, slots, lane, num_experts, num_groups, num_topk_groups):
    """DeepSeek-V3 groups: clear the keys of every group but the num_topk_groups of largest top-2
    sums (ties to the smaller group)."""
    gsize = T.alloc_var("int32")
    inv = T.alloc_var("uint32")
    gk = T.alloc_var("uint32")  # lane g < num_groups: group g's score as a key
    gmask = T.alloc_var("uint32")
    m = T.alloc_var("uint32")
    gi = T.alloc_var("uint32")
    a = T.alloc_local((2,), "uint32")
    gsize = num_experts // num_groups
    inv = T.uint32(0xFFFFFFFF) // T.cast(gsize, "uint32") + T.uint32(1)
    gk = T.uint32(0)
    a[0] = T.uint32(0)
    a[1] = T.uint32(0)
    if gsize % 32 == 0:
        # A group is whole slots (e.g. 256 experts in 8 groups): one pass, a butterfly per group.
        for c in T.unroll(slots // CHUNK):
            if c * CHUNK * 32 < num_experts:
                for jj in T.unroll(CHUNK):
                    j = c * CHUNK + jj
                    if j * 32 < num_experts:  # uniform: num_experts % 32 == 0 here
                        a[1] = T.max(a[1], T.min(a[0], keys[j]))
                        a[0] = T.max(a[0], keys[j])
                        if group_of((j + 1) * 32, inv) != group_of(j * 32, inv):  # the group ends
                            top2_merge_xor(a)
                            if lane == group_of(j * 32, inv):
                                gk = okey(key_value(a[0]) + key_value(a[1]))
                            a[0] = T.uint32(0)
                            a[1] = T.uint32(0)
    else:
        for g in T.serial(num_groups):
            for c in T.unroll(slots // CHUNK):
                if c * CHUNK * 32 < num_experts:
                    for jj in T.unroll(CHUNK):
                        j = c * CHUNK + jj
                        if j * 32 + lane < num_experts and group_of(j * 32 + lane, inv) == g:
                            a[1] = T.max(a[1], T.min(a[0], keys[j]))
                            a[0] = T.max(a[0], keys[j])
            top2_merge_xor(a)
            if lane == g:
                gk = okey(key_value(a[0]) + key_value(a[1]))
            a[0] = T.uint32(0)
            a[1] = T.uint32(0)
    gmask = T.uint32(0)
    for r in T.serial(num_topk_groups):
        m = redux_max(gk)
        gi = redux_min(T.if_then_else(gk == m and m != T.uint32(0), T.cast(lane, "uint32"), T.uint32(NONE)))
        if gi < T.uint32(32):
            gmask = gmask | T.shift_left(T.uint32(1), gi)
            if T.cast(lane, "uint32") == gi:
                gk = T.uint32(0)
    for c in T.unroll(slots // CHUNK):
        if c * CHUNK * 32 < num_experts:
            for jj in T.unroll(CHUNK):
                j = c * CHUNK + jj
                if j * 32 + lane < num_experts:
                    if (T.shift_right(gmask, T.cast(group_of(j * 32 + lane, inv), "uint32")) & T.uint32(1)) == 0:
                        keys[j] = T.uint32(0)


@T.macro
def pick_experts(keys, st, nst, sc, my_e, my_k, lost, slots, lane, t, fixed, rand, image, flags, Unmapped, Bias,
                 ImageBias, ep_rank, num_experts, num_topk, num_groups, num_topk_groups):  # fmt: skip
    """Lane r < num_topk gets the token's slot-r expert in my_e[0] (lost[0] = 1: not routable), by
    the token's mode: fixed routing, force_random, or the (grouped) top-k of score + bias."""
    bv = T.alloc_var("float32")
    u = T.alloc_var("int64")
    if fixed != 0:
        if lane < num_topk:
            u = Unmapped[t, lane]
            if u < T.int64(0) or u >= T.cast(num_experts, "int64"):
                lost[0] = 1
            else:
                my_e[0] = T.cast(u, "int32")
    elif rand != 0:
        random_slots(my_e, lane, t, ep_rank, num_experts, num_topk)
    else:
        # Selection keys of score + bias (image_bias for image tokens).
        for c in T.unroll(slots // CHUNK):
            if c * CHUNK * 32 < num_experts:
                for jj in T.unroll(CHUNK):
                    j = c * CHUNK + jj
                    keys[j] = T.uint32(0)
                    if j * 32 + lane < num_experts:
                        bv = T.float32(0)
                        if image != 0:
                            bv = ImageBias[j * 32 + lane]
                        elif (flags & FLAG_BIAS) != 0:
                            bv = Bias[j * 32 + lane]
                        keys[j] = okey(sc[j] + bv)
        if num_groups > 1:
            keep_best_groups(keys, slots, lane, num_experts, num_groups, num_topk_groups)
        select_topk(
            keys, st, nst, slots, CHUNK, lambda c: c * CHUNK * 32 < num_experts,
            lambda j: T.cast(j * 32 + lane, "uint32"), True, lane, num_topk, my_e, my_k, lost,
        )  # fmt: skip


def build(
    v: MoeTopkGateForwardVariant,
    warps: int = WARPS,
    tpw: int = TOKENS_PER_WARP,
    select_softplus: bool = SELECT_SOFTPLUS,
    min_blocks: int = 0,
):
    """The kernel of v. warps (per CTA), tpw (tokens per warp), select_softplus, min_blocks: tuning
    knobs (bench/gate_candidates.py)."""
    if v.max_experts > FAST_MAX_EXPERTS:
        return wide.build(v)
    func = v.scoring_func
    SLOTS = v.max_experts // 32
    CHUNKS = SLOTS // CHUNK
    NAN = _nan()
    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")
    width = T.dynamic("width")  # num_topk + shared slots
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
        with T.Kernel(T.ceildiv(num_tokens, warps * tpw), threads=warps * 32) as b:
            if min_blocks:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding(0)
            lane = T.alloc_var("int32")
            w = T.alloc_var("int32")
            t = T.alloc_var("int32")
            t0 = T.alloc_var("int32")
            lane = tx % 32
            w = tx // 32
            row = T.alloc_shared((warps, SLOTS * 32), "float32")  # each warp's token's scores
            sc = T.alloc_local((SLOTS,), "float32")
            nx = T.alloc_local((SLOTS,), "float32")  # tpw > 1: the next token's logits
            keys = T.alloc_local((SLOTS,), "uint32")
            st = T.alloc_local((4,), "uint32")
            nst = T.alloc_local((4,), "uint32")
            my_e = T.alloc_local((1,), "int32")  # lane r < num_topk: slot r's expert
            my_k = T.alloc_local((1,), "uint32")  # (unused here: the wide kernel merges keys)
            lost = T.alloc_local((1,), "int32")
            nonfinite = T.alloc_var("int32")
            bad = T.alloc_var("int32")
            routed = T.alloc_var("int32")
            rand = T.alloc_var("int32")
            fixed = T.alloc_var("int32")
            image = T.alloc_var("int32")
            zero_row = T.alloc_var("int32")
            lp = T.alloc_var("float32")
            m = T.alloc_var("float32")
            total = T.alloc_var("float32")
            my_s = T.alloc_var("float32")
            denom = T.alloc_var("float32")
            t0 = (b * warps + w) * tpw  # the warp's first token; it routes tpw consecutive tokens
            for i in T.serial(tpw):
                t = t0 + i
                if t < num_tokens:
                    if i == 0:  # the first token's logits (an absent expert: 0, never picked)
                        for c in T.unroll(CHUNKS):
                            if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                                for jj in T.unroll(CHUNK):
                                    sc[c * CHUNK + jj] = T.float32(0)
                                    if c * CHUNK * 32 + jj * 32 + lane < num_experts:
                                        sc[c * CHUNK + jj] = L[t, c * CHUNK * 32 + jj * 32 + lane]
                    if tpw > 1:
                        T.sync_warp()  # the previous token's row has been read
                        # Prefetch the next token's logits: their latency hides behind this token.
                        for c in T.unroll(CHUNKS):
                            if c * CHUNK * 32 < num_experts:
                                for jj in T.unroll(CHUNK):
                                    j = c * CHUNK + jj
                                    nx[j] = T.float32(0)
                                    if j * 32 + lane < num_experts and i + 1 < tpw and t + 1 < num_tokens:
                                        nx[j] = L[t + 1, j * 32 + lane]
                    # The token's mode: mask > force_random > fix_routing_mask > top-k.
                    token_mode(Mask, Random, FixMask, ImageMask, (t,), flags, routed, rand, fixed, image)
                    # Non-finite logits.
                    nonfinite = 0
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * 32 < num_experts:
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                if j * 32 + lane < num_experts and not T.isfinite(sc[j]):
                                    nonfinite = 1
                    bad = T.if_then_else(T.any_sync(nonfinite != 0) != 0, 1, 0)
                    # Scores (softmax: max and sum in slot order, then butterflies, as before).
                    m = T.float32(0)
                    total = T.float32(1)
                    if func == "softmax":
                        m = -T.infinity("float32")
                        for c in T.unroll(CHUNKS):
                            if c * CHUNK * 32 < num_experts:
                                for jj in T.unroll(CHUNK):
                                    j = c * CHUNK + jj
                                    if j * 32 + lane < num_experts:
                                        m = T.max(m, sc[j])
                        for k in T.unroll(5):
                            m = T.max(m, T.shfl_xor(m, 1 << k))
                        total = T.float32(0)
                        for c in T.unroll(CHUNKS):
                            if c * CHUNK * 32 < num_experts:
                                for jj in T.unroll(CHUNK):
                                    j = c * CHUNK + jj
                                    if j * 32 + lane < num_experts:
                                        total = total + T.exp(sc[j] - m)
                        for k in T.unroll(5):
                            total = total + T.shfl_xor(total, 1 << k)
                    zero_row = T.if_then_else(routed == 0 or rand != 0, 1, 0)  # such rows' scores are 0
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * 32 < num_experts:
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                if select_softplus and func == "sqrtsoftplus":
                                    # Both sides, then a select: no branch per element.
                                    lp = T.log1p(T.exp(sc[j]))
                                    sc[j] = T.sqrt(T.if_then_else(sc[j] > T.float32(20), sc[j], lp))
                                else:
                                    sc[j] = score_value(func, sc[j], m, total)
                                row[w, j * 32 + lane] = sc[j]  # (an absent expert's entry is never read)
                                if j * 32 + lane < num_experts:
                                    if (flags & FLAG_SCORES) != 0:
                                        Scores[t, j * 32 + lane] = T.if_then_else(
                                            zero_row != 0, T.float32(0), T.if_then_else(bad != 0, NAN, sc[j])
                                        )
                    T.sync_warp()
                    my_e[0] = 0
                    lost[0] = 0
                    denom = T.float32(1e-20)
                    my_s = T.float32(0)
                    if routed != 0 and bad == 0:
                        pick_experts(
                            keys, st, nst, sc, my_e, my_k, lost, SLOTS, lane, t, fixed, rand, image, flags, Unmapped,
                            Bias, ImageBias, ep_rank, num_experts, num_topk, num_groups, num_topk_groups,
                        )  # fmt: skip
                        if T.any_sync(lost[0] != 0 or (lane < num_topk and my_e[0] >= num_experts)) != 0:
                            bad = 1
                        if bad == 0:
                            if lane < num_topk:
                                my_s = row[w, my_e[0]]
                            for r in T.serial(num_topk):  # left to right in slot order
                                denom = denom + T.shfl_sync(my_s, r)
                    write_outputs(
                        OutIdx, OutW, Unmapped, Map, Count, t, lane, flags,
                        T.if_then_else(routed != 0 and bad == 0, 1, 0), rand, fixed, my_e[0], my_s, denom, scaling,
                        ep_rank, num_experts, num_topk, width, dup, FLAG_MAP, FLAG_UNMAPPED, PHYSICAL_STRIDE,
                    )  # fmt: skip
                    if tpw > 1:
                        for c in T.unroll(CHUNKS):
                            if c * CHUNK * 32 < num_experts:
                                for jj in T.unroll(CHUNK):
                                    sc[c * CHUNK + jj] = nx[c * CHUNK + jj]

    return moe_topk_gate_forward_kernel
