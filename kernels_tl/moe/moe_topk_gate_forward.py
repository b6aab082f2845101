"""moe_topk_gate_forward (the MoE router forward) as a TileLang factory. Build time only.

One warp per token, 4 tokens per CTA. Lane l holds experts l, l + 32, ..., l + 480 (slot j holds
expert j * 32 + l; up to 512 experts), so each load instruction of a warp reads 128 consecutive
bytes. The token's routed experts are picked one slot at a time, every lane ending with the same
(warp-uniform) expert id e, whose unbiased score is then fetched from its owner lane e % 32:
  - top-k: the selection values as order-preserving uint32 keys (-0 as +0); each lane's best
    available key (not taken, in a kept group; the first of equal keys is its smaller expert),
    then __reduce_max_sync of the keys and __reduce_min_sync of the experts holding the max:
    ties go to the smaller expert, and every lane gets the same answer;
  - grouped (num_groups > 1): first each group's top-2 sum by a butterfly on (max, second) (one
    pass over the slots when a group is whole slots, group size % 32 == 0), then
    num_topk_groups rounds of a (score, -group) argmax butterfly over the group lanes;
  - fixed routing: the ids read from unmapped_topk_idx;
  - force_random: hashed draws (tilebake.torch.gate.random_experts), a taken draw redrawn, the
    argmax round with all values 0 (the smallest free expert) as the fallback.
Slots come in chunks of 4 (128 experts); a chunk past the last expert is skipped by a warp-uniform
branch. A non-finite logit (a warp vote) makes the token unrouted before any selection, so the
selection never sees a NaN. Every loop has a fixed or argument bound (the random draws: 64 per
slot), so nothing can hang. CPU check without a GPU: build_tools/warp_emu.py and
tests/moe/test_moe_topk_gate_forward_emulated.py.
Everything but the scoring function is a runtime argument (the FLAG_* bits of `flags`; an
absent tensor is given a valid dummy pointer and never read).
"""

import tilelang.language as T

from kernels_tl.quant.common import fmix32
from tilebake.moe.moe_topk_gate_forward import (
    DRAWS_PER_SLOT,
    FLAG_BIAS,
    FLAG_FIX,
    FLAG_IMAGE,
    FLAG_MAP,
    FLAG_MASK,
    FLAG_RANDOM,
    FLAG_SCORES,
    FLAG_UNMAPPED,
    GOLDEN,
    PHYSICAL_STRIDE,
    MoeTopkGateForwardVariant,
)

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded by hand

WARPS = 4
SLOTS = 16  # experts per lane: 512 / 32
CHUNK = 4  # slots per chunk: a chunk past the last expert is skipped by a warp-uniform branch
CHUNKS = SLOTS // CHUNK
NO_EXPERT = 1 << 30  # the argmax sentinel's id
FULL = 0xFFFFFFFF  # every lane of the warp
ZERO_KEY = 0x80000000  # the key of 0.0


def bit_set(word, j):
    """Bit j of the uint32 `word` is 1."""
    return (T.shift_right(word, T.cast(j, "uint32")) & T.uint32(1)) != T.uint32(0)


def group_of(expert, inv):
    """expert // group size, with inv = ceil(2^32 / group size): umulhi is exact for experts < 2^16."""
    return T.cast(T.call_extern("uint32", "__umulhi", T.cast(expert, "uint32"), inv), "int32")


def _nan():
    return T.reinterpret(T.uint32(0x7FC00000), "float32")


def build(v: MoeTopkGateForwardVariant):
    func = v.scoring_func
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
        with T.Kernel(T.ceildiv(num_tokens, WARPS), threads=WARPS * 32) as b:
            tx = T.get_thread_binding(0)
            lane = T.alloc_var("int32")
            t = T.alloc_var("int32")
            lane = tx % 32
            t = b * WARPS + tx // 32
            sc = T.alloc_local((SLOTS,), "float32")  # unbiased scores
            sel = T.alloc_local((SLOTS,), "float32")  # selection values: score + bias
            keys = T.alloc_local((SLOTS,), "uint32")  # sel as order-preserving integers
            kb = T.alloc_var("uint32")
            lk = T.alloc_var("uint32")
            li = T.alloc_var("int32")
            mk = T.alloc_var("uint32")
            bu = T.alloc_var("uint32")
            gid = T.alloc_local((SLOTS,), "int32")  # group of each held expert
            nonfinite = T.alloc_var("int32")
            bad = T.alloc_var("int32")
            routed = T.alloc_var("int32")
            rand = T.alloc_var("int32")
            fixed = T.alloc_var("int32")
            image = T.alloc_var("int32")
            allow = T.alloc_var("uint32")  # bit j: slot j's expert may be picked
            taken = T.alloc_var("uint32")  # bit j: slot j's expert is picked
            gmask = T.alloc_var("uint32")  # bit g: group g is kept
            my_g = T.alloc_var("float32")  # group `lane`'s score
            g_taken = T.alloc_var("int32")
            a1 = T.alloc_var("float32")
            a2 = T.alloc_var("float32")
            b1 = T.alloc_var("float32")
            b2 = T.alloc_var("float32")
            bv = T.alloc_var("float32")
            bi = T.alloc_var("int32")
            ov = T.alloc_var("float32")
            oi = T.alloc_var("int32")
            e = T.alloc_var("int32")
            ex = T.alloc_var("int32")
            found = T.alloc_var("int32")
            seed = T.alloc_var("uint32")
            h = T.alloc_var("uint32")
            cand = T.alloc_var("int32")
            v = T.alloc_var("float32")
            s = T.alloc_var("float32")
            denom = T.alloc_var("float32")
            my_e = T.alloc_var("int32")
            my_s = T.alloc_var("float32")
            m = T.alloc_var("float32")
            total = T.alloc_var("float32")
            gsize = T.alloc_var("int32")
            inv = T.alloc_var("uint32")
            le = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            phys = T.alloc_var("int64")
            w = T.alloc_var("float32")
            if t < num_tokens:
                # Load the logits (an absent expert: 0, never picked) and find non-finite ones.
                nonfinite = 0
                for c in T.unroll(CHUNKS):
                    if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                        for jj in T.unroll(CHUNK):
                            j = c * CHUNK + jj
                            sc[j] = T.float32(0)
                            if j * 32 + lane < num_experts:
                                sc[j] = L[t, j * 32 + lane]
                                if not T.isfinite(sc[j]):
                                    nonfinite = 1
                for k in T.unroll(5):
                    nonfinite = T.max(nonfinite, T.shfl_xor(nonfinite, 1 << k))
                bad = nonfinite
                # Scores.
                if func == "softmax":
                    m = -T.infinity("float32")
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                if j * 32 + lane < num_experts:
                                    m = T.max(m, sc[j])
                    for k in T.unroll(5):
                        m = T.max(m, T.shfl_xor(m, 1 << k))
                    total = T.float32(0)
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                if j * 32 + lane < num_experts:
                                    sc[j] = T.exp(sc[j] - m)
                                    total = total + sc[j]
                    for k in T.unroll(5):
                        total = total + T.shfl_xor(total, 1 << k)
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                sc[j] = sc[j] / total
                elif func == "sigmoid":
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                sc[j] = T.float32(1) / (T.float32(1) + T.exp(-sc[j]))
                else:
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                sc[j] = T.sqrt(T.if_then_else(sc[j] > T.float32(20), sc[j], T.log1p(T.exp(sc[j]))))
                if (flags & FLAG_SCORES) != 0:
                    for c in T.unroll(CHUNKS):
                        if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                            for jj in T.unroll(CHUNK):
                                j = c * CHUNK + jj
                                if j * 32 + lane < num_experts:
                                    Scores[t, j * 32 + lane] = T.if_then_else(bad != 0, NAN, sc[j])
                # The token's mode: mask > force_random > fix_routing_mask > top-k.
                routed = 1
                if (flags & FLAG_MASK) != 0:
                    routed = T.if_then_else(Mask[t] != T.int8(0), 1, 0)
                rand = 0
                if (flags & FLAG_RANDOM) != 0:
                    rand = T.if_then_else(Random[t] != T.int8(0), routed, 0)
                fixed = 0
                if (flags & FLAG_FIX) != 0:
                    fixed = T.if_then_else(FixMask[t] != T.int8(0), routed * (1 - rand), 0)
                image = 0
                if (flags & FLAG_IMAGE) != 0:
                    image = T.if_then_else(ImageMask[t] != T.int8(0), 1, 0)
                allow = T.uint32(0)
                for c in T.unroll(CHUNKS):
                    if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                        for jj in T.unroll(CHUNK):
                            j = c * CHUNK + jj
                            sel[j] = sc[j]
                            if j * 32 + lane < num_experts:
                                allow = allow | T.shift_left(T.uint32(1), T.uint32(j))
                                if image != 0:
                                    sel[j] = sc[j] + ImageBias[j * 32 + lane]
                                elif (flags & FLAG_BIAS) != 0:
                                    sel[j] = sc[j] + Bias[j * 32 + lane]
                                else:
                                    sel[j] = sc[j] + T.float32(0)
                                # The order-preserving integer key of sel[j] (-0 as +0).
                                kb = T.reinterpret(sel[j], "uint32")
                                if kb == T.uint32(0x80000000):
                                    kb = T.uint32(0)
                                if kb >= T.uint32(0x80000000):
                                    keys[j] = ~kb
                                else:
                                    keys[j] = kb | T.uint32(0x80000000)
                taken = T.uint32(0)
                denom = T.float32(1e-20)
                my_e = 0
                my_s = T.float32(0)
                if routed != 0 and bad == 0:
                    # DeepSeek-V3 groups: keep the num_topk_groups groups of largest top-2 sums.
                    if num_groups > 1 and rand == 0 and fixed == 0:
                        gsize = num_experts // num_groups
                        # x // gsize for x < 2^16 as umulhi(x, ceil(2^32 / gsize)): exact (x * gsize < 2^32).
                        inv = T.uint32(0xFFFFFFFF) // T.cast(gsize, "uint32") + T.uint32(1)
                        for c in T.unroll(CHUNKS):
                            if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                                for jj in T.unroll(CHUNK):
                                    j = c * CHUNK + jj
                                    gid[j] = group_of(j * 32 + lane, inv)
                        my_g = -T.infinity("float32")
                        if gsize % 32 == 0:
                            # A group is whole slots (e.g. 256 experts in 8 groups): one pass over the
                            # slots, a top-2 butterfly at the end of each group.
                            a1 = -T.infinity("float32")
                            a2 = -T.infinity("float32")
                            for c in T.unroll(CHUNKS):
                                if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                                    for jj in T.unroll(CHUNK):
                                        j = c * CHUNK + jj
                                        if j * 32 < num_experts:  # uniform: num_experts % 32 == 0 here
                                            if sel[j] > a1:
                                                a2 = a1
                                                a1 = sel[j]
                                            elif sel[j] > a2:
                                                a2 = sel[j]
                                            if group_of((j + 1) * 32, inv) != group_of(j * 32, inv):  # group ends
                                                for k in T.unroll(5):
                                                    b1 = T.shfl_xor(a1, 1 << k)
                                                    b2 = T.shfl_xor(a2, 1 << k)
                                                    a2 = T.max(T.min(a1, b1), T.max(a2, b2))
                                                    a1 = T.max(a1, b1)
                                                if lane == group_of(j * 32, inv):
                                                    my_g = a1 + a2
                                                a1 = -T.infinity("float32")
                                                a2 = -T.infinity("float32")
                        else:
                            for g in T.serial(num_groups):
                                a1 = -T.infinity("float32")
                                a2 = -T.infinity("float32")
                                for c in T.unroll(CHUNKS):
                                    if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                                        for jj in T.unroll(CHUNK):
                                            j = c * CHUNK + jj
                                            if j * 32 + lane < num_experts and gid[j] == g:
                                                if sel[j] > a1:
                                                    a2 = a1
                                                    a1 = sel[j]
                                                elif sel[j] > a2:
                                                    a2 = sel[j]
                                for k in T.unroll(5):
                                    b1 = T.shfl_xor(a1, 1 << k)
                                    b2 = T.shfl_xor(a2, 1 << k)
                                    a2 = T.max(T.min(a1, b1), T.max(a2, b2))
                                    a1 = T.max(a1, b1)
                                if lane == g:
                                    my_g = a1 + a2
                        gmask = T.uint32(0)
                        g_taken = 0
                        for r in T.serial(num_topk_groups):
                            bv = -T.infinity("float32")
                            bi = NO_EXPERT
                            if lane < num_groups and g_taken == 0:
                                bv = my_g
                                bi = lane
                            for k in T.unroll(5):
                                ov = T.shfl_xor(bv, 1 << k)
                                oi = T.shfl_xor(bi, 1 << k)
                                if ov > bv or (ov == bv and oi < bi):
                                    bv = ov
                                    bi = oi
                            if bi < 32:
                                gmask = gmask | T.shift_left(T.uint32(1), T.cast(bi, "uint32"))
                                if lane == bi:
                                    g_taken = 1
                        for c in T.unroll(CHUNKS):
                            if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                                for jj in T.unroll(CHUNK):
                                    j = c * CHUNK + jj
                                    if j * 32 + lane < num_experts:
                                        if not bit_set(gmask, gid[j]):
                                            allow = allow & ~T.shift_left(T.uint32(1), T.uint32(j))
                    seed = T.cast(ep_rank, "uint32")
                    seed = fmix32(seed)
                    seed = seed ^ T.cast(t, "uint32")
                    seed = fmix32(seed)
                    for r in T.serial(num_topk):
                        e = -1
                        if fixed != 0:
                            phys = Unmapped[t, r]
                            if phys < T.int64(0) or phys >= T.cast(num_experts, "int64"):
                                bad = 1
                                e = 0
                            else:
                                e = T.cast(phys, "int32")
                        else:
                            if rand != 0:
                                found = 0
                                for a in T.serial(DRAWS_PER_SLOT):
                                    if found == 0:
                                        h = seed + T.cast(r * DRAWS_PER_SLOT + a + 1, "uint32") * T.uint32(GOLDEN)
                                        h = fmix32(h)
                                        cand = T.cast(h % T.cast(num_experts, "uint32"), "int32")
                                        h = T.shfl_sync(taken, cand % 32)
                                        h = T.shift_right(h, T.cast(cand // 32, "uint32"))
                                        if (h & T.uint32(1)) == T.uint32(0):
                                            found = 1
                                            e = cand
                            if e < 0:
                                # One argmax round (all keys equal for a random token: the smallest free
                                # expert): the lane's best (key, expert), the first of equal keys being the
                                # smaller expert; then the warp's largest key and, among the lanes holding
                                # it, the smallest expert (two redux.sync).
                                lk = T.uint32(0)  # 0: no candidate (every float's key exceeds it)
                                li = NO_EXPERT
                                for c in T.unroll(CHUNKS):
                                    if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                                        for jj in T.unroll(CHUNK):
                                            j = c * CHUNK + jj
                                            if bit_set(allow & ~taken, j):
                                                kv = T.if_then_else(rand != 0, T.uint32(ZERO_KEY), keys[j])
                                                if kv > lk:
                                                    lk = kv
                                                    li = j * 32 + lane
                                mk = T.call_extern("uint32", "__reduce_max_sync", T.uint32(FULL), lk)
                                bu = T.if_then_else(lk == mk, T.cast(li, "uint32"), T.uint32(NO_EXPERT))
                                bi = T.cast(T.call_extern("uint32", "__reduce_min_sync", T.uint32(FULL), bu), "int32")
                                if mk != T.uint32(0) and bi < num_experts:
                                    e = bi
                                else:
                                    bad = 1
                                    e = 0
                        if lane == e % 32:
                            taken = taken | T.shift_left(T.uint32(1), T.cast(e // 32, "uint32"))
                        ex = e // 32
                        v = T.float32(0)
                        for c in T.unroll(CHUNKS):
                            if c * CHUNK * 32 < num_experts:  # uniform: skips whole chunks past the experts
                                for jj in T.unroll(CHUNK):
                                    j = c * CHUNK + jj
                                    if j == ex:
                                        v = sc[j]
                        s = T.shfl_sync(v, e % 32)
                        denom = denom + s
                        if lane == r:
                            my_e = e
                            my_s = s
                # Outputs: lane i writes slot i.
                if lane < width:
                    le = -1
                    w = T.float32(0)
                    if routed != 0 and bad == 0:
                        if lane < num_topk:
                            le = my_e
                            w = my_s / denom * scaling
                        else:
                            le = num_experts + lane - num_topk
                            w = T.float32(1)
                    phys = T.cast(le, "int64")
                    if le >= 0 and (flags & FLAG_MAP) != 0:
                        cnt = Count[le]
                        phys = T.int64(-1)
                        if cnt >= 1 and cnt <= dup:
                            phys = T.cast(
                                Map[le, (T.cast(ep_rank, "int64") + T.cast(t, "int64") * PHYSICAL_STRIDE) % cnt],
                                "int64",
                            )
                    OutIdx[t, lane] = phys
                    OutW[t, lane] = w
                    if (flags & FLAG_UNMAPPED) != 0 and lane < num_topk and fixed == 0:
                        Unmapped[t, lane] = T.if_then_else(
                            routed != 0 and bad == 0 and rand == 0, T.cast(my_e, "int64"), T.int64(-1)
                        )

    return moe_topk_gate_forward_kernel
