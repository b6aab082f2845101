"""moe_topk_gate_forward (the MoE router forward) for Ascend 950 (build time only), read from
tilebake.moe.moe_topk_gate_forward.MoeTopkGateForwardAscendVariant: the semantics of
tilebake.torch.gate.moe_topk_gate_forward_ref, every scoring function, option and expert count
up to max_experts at run time (`func`, the FLAG_* bits of `flags`; an absent tensor's pointer is
never read).

A block per vector core, each taking tokens core, core + num_vec_cores, ...: the bias rows DMA'd
to the unified buffer once, then per token its logits row, and PARTS SIMT threads, each over
every PARTS-th expert, in steps: (A) a non-finite vote and the row max; (B) the scores (softmax:
exp(x - max) and partial sums); (C) softmax's division, the scores row to output (0 for tokens
masked out or random, NaN for a non-finite row); grouped routing only: (D) thread g the top-2 sum
of group g, (E) one thread keeps the num_topk_groups best groups; (F) each thread the sorted top
k of its own experts' selection values (score + bias; ties keep the smaller expert first); (G)
one thread: the token's mode (mask > force_random > fix_routing_mask > top-k), the merge of the
PARTS lists, the random draws, the weights (left-to-right sum), shared slots, the physical map
(read from GM by the SIMT thread), unmapped_topk_idx (written by it); the slots DMA'd out. Sums
over the threads' partials go in thread order (deterministic). Built and lowered here, never
run on an NPU: checked on the CPU by tests/ascend/test_emulated.py.
"""

import tilelang.ascend.language as T

from kernels_tl.quant.common import fmix32
from tilebake._hash import GOLDEN
from tilebake.moe._router import DRAWS_PER_SLOT, MAX_GROUPS, MAX_SLOTS, PHYSICAL_STRIDE
from tilebake.moe.moe_topk_gate_forward import (
    FLAG_BIAS,
    FLAG_FIX,
    FLAG_IMAGE,
    FLAG_MAP,
    FLAG_MASK,
    FLAG_RANDOM,
    FLAG_SCORES,
    FLAG_UNMAPPED,
    SCORING_CODES,
    MoeTopkGateForwardAscendVariant,
)

PARTS = 32  # threads over a row's experts; also one a group in step D
assert PARTS >= MAX_GROUPS
SOFTMAX, SIGMOID = SCORING_CODES["softmax"], SCORING_CODES["sigmoid"]


def build(v: MoeTopkGateForwardAscendVariant):
    n = T.dynamic("num_tokens")
    e = T.dynamic("num_experts")
    k = T.dynamic("num_topk")
    width = T.dynamic("width")
    dup = T.dynamic("dup")
    l_stride = T.dynamic("l_stride")
    s_stride = T.dynamic("s_stride")
    u_stride = T.dynamic("u_stride")
    map_stride = T.dynamic("map_stride")
    CORES = v.num_vec_cores
    E = v.max_experts
    K = MAX_SLOTS
    STEPS = (E + PARTS - 1) // PARTS  # a thread's experts at most

    @T.macro
    def flag(Tensor, bit, flags, row, result: T.Ref):
        """result = Tensor[row] != 0 where the tensor is given (bit of flags), else 0."""
        result = 0
        if (flags & bit) != 0:
            result = T.if_then_else(Tensor[row] != T.int8(0), 1, 0)

    @T.prim_func
    def moe_topk_gate_forward_kernel(
        L: T.StridedTensor((n, e), (l_stride, 1), "float32"),
        Bias: T.Tensor((e,), "float32"),
        ImageBias: T.Tensor((e,), "float32"),
        Mask: T.Tensor((n,), "int8"),
        ImageMask: T.Tensor((n,), "int8"),
        FixMask: T.Tensor((n,), "int8"),
        Random: T.Tensor((n,), "int8"),
        Map: T.StridedTensor((e + 2, dup), (map_stride, 1), "int32"),
        Count: T.Tensor((e + 2,), "int32"),
        Unmapped: T.StridedTensor((n, k), (u_stride, 1), "int64"),
        OutIdx: T.Tensor((n, width), "int64"),
        OutW: T.Tensor((n, width), "float32"),
        Scores: T.StridedTensor((n, e), (s_stride, 1), "float32"),
        flags: T.int32,
        func: T.int32,
        scaling: T.float32,
        ep_rank: T.int32,
        num_groups: T.int32,
        num_topk_groups: T.int32,
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((E,), "float32")  # the logits, then the scores row to output
            sc = T.alloc_shared((E,), "float32")  # the scores (the weights read them)
            bs = T.alloc_shared((E,), "float32")
            ibs = T.alloc_shared((E,), "float32")
            part = T.alloc_shared((PARTS, 4), "float32")  # a thread's non-finite vote, max, exp-sum, group sum
            kept = T.alloc_shared((PARTS,), "int32")  # grouped routing: group g kept
            cv = T.alloc_shared((PARTS, K), "float32")  # each thread's sorted top k: values
            ci = T.alloc_shared((PARTS, K), "int32")  # and experts
            cn = T.alloc_shared((PARTS,), "int32")  # and their count
            oi = T.alloc_shared((K,), "int64")
            ow = T.alloc_shared((K,), "float32")
            if (flags & FLAG_BIAS) != 0:
                T.copy(Bias[0:E], bs)
            if (flags & FLAG_IMAGE) != 0:
                T.copy(ImageBias[0:E], ibs)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                T.copy(L[row, 0:E], xs)
                with T.SimtVF(threads=PARTS):  # (A) non-finite vote, max
                    t = T.get_thread_binding()
                    bad = T.alloc_var("int32")
                    m = T.alloc_var("float32")
                    bad = 0
                    m = T.float32(-3.0e38)
                    for q in T.serial(STEPS):
                        idx = t + q * PARTS
                        x = xs[T.min(idx, E - 1)]
                        if idx < e:
                            if (T.reinterpret(x, "int32") & 0x7F800000) == 0x7F800000:  # NaN, +-inf
                                bad = 1
                            else:
                                m = T.max(m, x)
                    part[t, 0] = T.cast(bad, "float32")
                    part[t, 1] = m
                with T.SimtVF(threads=PARTS):  # (B) scores, softmax's partial sums
                    t = T.get_thread_binding()
                    bad = T.alloc_var("float32")
                    m = T.alloc_var("float32")
                    total = T.alloc_var("float32")
                    bad = T.float32(0)
                    m = T.float32(-3.0e38)
                    total = T.float32(0)
                    for p in T.serial(PARTS):
                        bad = bad + part[p, 0]
                        m = T.max(m, part[p, 1])
                    for q in T.serial(STEPS):
                        idx = t + q * PARTS
                        if idx < e and bad == T.float32(0):
                            x = xs[idx]
                            if func == SOFTMAX:
                                sc[idx] = T.exp(x - m)
                                total = total + sc[idx]
                            elif func == SIGMOID:
                                sc[idx] = T.float32(1) / (T.float32(1) + T.exp(-x))
                            else:
                                sc[idx] = T.sqrt(T.if_then_else(x > T.float32(20), x, T.log1p(T.exp(x))))
                    part[t, 2] = total
                with T.SimtVF(threads=PARTS):  # (C) softmax's division, the scores row to output
                    t = T.get_thread_binding()
                    bad = T.alloc_var("float32")
                    total = T.alloc_var("float32")
                    routed = T.alloc_var("int32")
                    rand = T.alloc_var("int32")
                    bad = T.float32(0)
                    total = T.float32(0)
                    for p in T.serial(PARTS):
                        bad = bad + part[p, 0]
                        total = total + part[p, 2]
                    routed = 1
                    if (flags & FLAG_MASK) != 0:
                        routed = T.if_then_else(Mask[row] != T.int8(0), 1, 0)
                    flag(Random, FLAG_RANDOM, flags, row, rand)
                    for q in T.serial(STEPS):
                        idx = t + q * PARTS
                        if idx < e:
                            if bad != T.float32(0):
                                sc[idx] = T.reinterpret(T.uint32(0x7FC00000), "float32")
                            elif func == SOFTMAX:
                                sc[idx] = sc[idx] / total
                            xs[idx] = T.if_then_else(routed == 0 or rand != 0, T.float32(0), sc[idx])
                if num_groups > 1:
                    with T.SimtVF(threads=PARTS):  # (D) group t's top-2 sum of selection values
                        t = T.get_thread_binding()
                        image = T.alloc_var("int32")
                        a0 = T.alloc_var("float32")
                        a1 = T.alloc_var("float32")
                        flag(ImageMask, FLAG_IMAGE, flags, row, image)
                        a0 = T.float32(-3.0e38)
                        a1 = T.float32(-3.0e38)
                        gsize = e // num_groups
                        for j in T.serial(gsize):
                            idx = T.min(t * gsize + j, E - 1)
                            s = sc[idx] + T.if_then_else(
                                image != 0, ibs[idx], T.if_then_else((flags & FLAG_BIAS) != 0, bs[idx], T.float32(0))
                            )
                            if s > a0:
                                a1 = a0
                                a0 = s
                            elif s > a1:
                                a1 = s
                        part[t, 3] = a0 + a1
                    with T.SimtVF(threads=1):  # (E) the num_topk_groups best groups (ties: the smaller)
                        best = T.alloc_var("int32")
                        for g in T.serial(PARTS):
                            kept[g] = 0
                        for _ in T.serial(num_topk_groups):
                            best = -1
                            for g in T.serial(num_groups):
                                if kept[g] == 0 and (best < 0 or part[g, 3] > part[T.max(best, 0), 3]):
                                    best = g
                            kept[T.max(best, 0)] = 1
                with T.SimtVF(threads=PARTS):  # (F) each thread's sorted top k (insertion, ties in index order)
                    t = T.get_thread_binding()
                    image = T.alloc_var("int32")
                    cnt = T.alloc_var("int32")
                    last = T.alloc_var("int32")
                    placed = T.alloc_var("int32")
                    flag(ImageMask, FLAG_IMAGE, flags, row, image)
                    cnt = 0
                    for q in T.serial(STEPS):
                        idx = t + q * PARTS
                        i = T.min(idx, E - 1)
                        s = sc[i] + T.if_then_else(
                            image != 0, ibs[i], T.if_then_else((flags & FLAG_BIAS) != 0, bs[i], T.float32(0))
                        )
                        eligible = idx < e and (num_groups <= 1 or kept[T.min(idx // T.max(e // num_groups, 1), PARTS - 1)] != 0)
                        if eligible and (cnt < k or s > cv[t, k - 1]):
                            last = T.min(cnt, k - 1)  # the slot it enters from, moving up past smaller values
                            placed = 0
                            for u in T.serial(k):
                                p = k - 1 - u
                                if placed == 0 and p <= last:
                                    if p > 0 and s > cv[t, T.max(p - 1, 0)]:
                                        cv[t, p] = cv[t, T.max(p - 1, 0)]
                                        ci[t, p] = ci[t, T.max(p - 1, 0)]
                                    else:
                                        cv[t, p] = s
                                        ci[t, p] = idx
                                        placed = 1
                            cnt = T.min(cnt + 1, k)
                    cn[t] = cnt
                with T.SimtVF(threads=1):  # (G) the token's slots
                    chosen = T.alloc_local((K,), "int32")
                    heads = T.alloc_local((PARTS,), "int32")
                    routed = T.alloc_var("int32")
                    rand = T.alloc_var("int32")
                    fixed = T.alloc_var("int32")
                    bad = T.alloc_var("int32")
                    best = T.alloc_var("int32")
                    bv = T.alloc_var("float32")
                    bi = T.alloc_var("int32")
                    u = T.alloc_var("int64")
                    seed = T.alloc_var("uint32")
                    h = T.alloc_var("uint32")
                    pick = T.alloc_var("int32")
                    taken = T.alloc_var("int32")
                    d = T.alloc_var("float32")
                    logical = T.alloc_var("int32")
                    count = T.alloc_var("int64")
                    phys = T.alloc_var("int64")
                    routed = 1
                    if (flags & FLAG_MASK) != 0:
                        routed = T.if_then_else(Mask[row] != T.int8(0), 1, 0)
                    flag(Random, FLAG_RANDOM, flags, row, rand)
                    rand = rand * routed
                    flag(FixMask, FLAG_FIX, flags, row, fixed)
                    fixed = fixed * routed * (1 - rand)
                    bad = 0
                    for p in T.serial(PARTS):
                        bad = T.if_then_else(part[p, 0] != T.float32(0), 1, bad)
                        heads[p] = 0
                    for j in T.serial(k):
                        chosen[j] = 0
                    if rand != 0:  # tilebake.torch.gate.random_experts
                        seed = fmix32(T.cast(ep_rank, "uint32"))
                        seed = seed ^ T.cast(row, "uint32")
                        seed = fmix32(seed)
                        for s in T.serial(k):
                            pick = -1
                            for a in T.serial(DRAWS_PER_SLOT):
                                h = seed + T.cast(s * DRAWS_PER_SLOT + a + 1, "uint32") * T.uint32(GOLDEN)
                                h = fmix32(h)
                                h = h % T.cast(e, "uint32")
                                taken = 0
                                for j in T.serial(s):
                                    taken = T.if_then_else(chosen[j] == T.cast(h, "int32"), 1, taken)
                                if pick < 0 and taken == 0:
                                    pick = T.cast(h, "int32")
                            for c in T.serial(K + 1):  # all draws taken: the smallest free expert
                                taken = 0
                                for j in T.serial(s):
                                    taken = T.if_then_else(chosen[j] == c, 1, taken)
                                if pick < 0 and taken == 0 and c < e:
                                    pick = c
                            chosen[s] = pick
                    elif fixed != 0:
                        for j in T.serial(k):
                            u = Unmapped[row, j]
                            if u < T.int64(0) or u >= T.cast(e, "int64"):
                                bad = 1
                            chosen[j] = T.cast(T.max(T.min(u, T.cast(e - 1, "int64")), T.int64(0)), "int32")
                    elif bad == 0:  # the merge of the threads' lists: value desc, then expert asc
                        for j in T.serial(k):
                            best = -1
                            bv = T.float32(0)
                            bi = 0
                            for p in T.serial(PARTS):
                                if heads[p] < cn[p]:
                                    if best < 0 or cv[p, heads[p]] > bv or (cv[p, heads[p]] == bv and ci[p, heads[p]] < bi):
                                        best = p
                                        bv = cv[p, heads[p]]
                                        bi = ci[p, heads[p]]
                            chosen[j] = bi
                            heads[T.max(best, 0)] = heads[T.max(best, 0)] + 1
                    routed = routed * (1 - bad)
                    d = T.float32(1e-20)
                    for j in T.serial(k):
                        d = d + sc[chosen[j]]
                    for j in T.serial(width):
                        logical = T.if_then_else(j < k, chosen[T.min(j, K - 1)], e + j - k)
                        phys = T.cast(logical, "int64")
                        if (flags & FLAG_MAP) != 0:
                            count = T.cast(Count[logical], "int64")
                            if count >= T.int64(1) and count <= T.cast(dup, "int64"):
                                col = (T.cast(ep_rank, "int64") + T.cast(row, "int64") * PHYSICAL_STRIDE) % count
                                phys = T.cast(Map[logical, T.cast(col, "int32")], "int64")
                            else:
                                phys = T.int64(-1)
                        oi[j] = T.if_then_else(routed != 0, phys, T.int64(-1))
                        ow[j] = T.if_then_else(
                            routed != 0,
                            T.if_then_else(j < k, sc[chosen[T.min(j, K - 1)]] / d * scaling, T.float32(1)),
                            T.float32(0),
                        )
                    if (flags & FLAG_UNMAPPED) != 0 and fixed == 0:
                        for j in T.serial(k):
                            Unmapped[row, j] = T.if_then_else(routed != 0 and rand == 0, T.cast(chosen[j], "int64"), T.int64(-1))
                T.copy(oi[0:K], OutIdx[row, 0:K])
                T.copy(ow[0:K], OutW[row, 0:K])
                if (flags & FLAG_SCORES) != 0:
                    T.copy(xs[0:E], Scores[row, 0:E])

    return moe_topk_gate_forward_kernel
