"""Pieces shared by the two moe_topk_gate_forward kernels (moe_topk_gate_forward.py: one warp per
token; moe_topk_gate_forward_wide.py: one CTA per token). Build time only.

Selection works on order-preserving uint32 keys of the selection values (key 0: no candidate;
every float's key is >= 0x007FFFFF). A warp picks one expert per round: its lanes' best keys
(a top-2 cache per lane) give the largest key by one redux.sync and, among the lanes holding it,
the smallest expert id by another, so ties go to the smaller expert and every lane gets the same
answer. The winning lane moves its second key up; a lane that wins with an empty second
recomputes its top-2 among the elements ordered after the winner (key desc, id asc): rare, and a
warp-uniform branch.
"""

import tilelang.language as T

from kernels_tl.quant.common import fmix32
from tilebake._hash import GOLDEN
from tilebake.moe._router import DRAWS_PER_SLOT
from tilebake.moe.moe_topk_gate_forward import FLAG_FIX, FLAG_IMAGE, FLAG_MASK, FLAG_RANDOM

FULL = 0xFFFFFFFF  # every lane of the warp
NONE = 0xFFFFFFFF  # the id of no expert (larger than every expert, so redux.min skips it)


def group_of(expert, inv):
    """expert // group size, with inv = ceil(2^32 / group size): umulhi is exact for experts < 2^16."""
    return T.cast(T.call_extern("uint32", "__umulhi", T.cast(expert, "uint32"), inv), "int32")


def okey(f):
    """The order-preserving uint32 key of the float f (NaN-free). -0 would rank below +0, but no
    selection value is -0: scores are >= +0 and +0 + -0 is +0."""
    b = T.reinterpret(f, "uint32")
    sign = T.reinterpret(T.shift_right(T.reinterpret(f, "int32"), 31), "uint32")  # all ones if negative
    return b ^ (sign | T.uint32(0x80000000))


def key_value(k):
    """The float whose okey is k."""
    return T.reinterpret(T.if_then_else(k >= T.uint32(0x80000000), k ^ T.uint32(0x80000000), ~k), "float32")


def redux_max(v):
    return T.call_extern("uint32", "__reduce_max_sync", T.uint32(FULL), v)


def redux_min(v):
    return T.call_extern("uint32", "__reduce_min_sync", T.uint32(FULL), v)


def redux_or(v):
    return T.call_extern("uint32", "__reduce_or_sync", T.uint32(FULL), v)


def score_value(func, x, m, total):
    """The scoring function at logit x (softmax: with the row's max m and exp-sum total)."""
    if func == "softmax":
        return T.exp(x - m) / total
    if func == "sigmoid":
        return T.float32(1) / (T.float32(1) + T.exp(-x))
    return T.sqrt(T.if_then_else(x > T.float32(20), x, T.log1p(T.exp(x))))


@T.macro
def token_mode(Mask, Random, FixMask, ImageMask, token, flags, routed: T.Ref, rand: T.Ref, fixed: T.Ref, image: T.Ref):
    """The token's mode (mask > force_random > fix_routing_mask > top-k) from its flag bytes:
    routed, rand, fixed, image (0 / 1). token: (t,), a 1-tuple, so that a T.alloc_var t is read
    in place (a macro argument would be copied into a new variable, changing the generated code)."""
    routed = 1
    if (flags & FLAG_MASK) != 0:
        routed = T.if_then_else(Mask[token[0]] != T.int8(0), 1, 0)
    rand = 0
    if (flags & FLAG_RANDOM) != 0:
        rand = T.if_then_else(Random[token[0]] != T.int8(0), routed, 0)
    fixed = 0
    if (flags & FLAG_FIX) != 0:
        fixed = T.if_then_else(FixMask[token[0]] != T.int8(0), routed * (1 - rand), 0)
    image = 0
    if (flags & FLAG_IMAGE) != 0:
        image = T.if_then_else(ImageMask[token[0]] != T.int8(0), 1, 0)


@T.macro
def top2_insert(st, key, eid, ordered):
    """Insert (key, eid) into the cache st = [key1, id1, key2, id2] (uint32), ordered by key desc,
    id asc. ordered: the caller inserts in increasing id order, so a key equal to a held one
    ranks after it (one comparison)."""
    if ordered:
        if key > st[0]:
            st[2] = st[0]
            st[3] = st[1]
            st[0] = key
            st[1] = eid
        elif key > st[2]:
            st[2] = key
            st[3] = eid
    else:
        if key > st[0] or (key == st[0] and eid < st[1]):
            st[2] = st[0]
            st[3] = st[1]
            st[0] = key
            st[1] = eid
        elif key > st[2] or (key == st[2] and eid < st[3]):
            st[2] = key
            st[3] = eid


@T.macro
def top2_merge_xor(a):
    """a = [first, second] (uint32 keys): the top two over the warp, by a butterfly."""
    for s in T.unroll(5):
        b1 = T.shfl_xor(a[0], 1 << s)
        b2 = T.shfl_xor(a[1], 1 << s)
        a[1] = T.max(T.min(a[0], b1), T.max(a[1], b2))
        a[0] = T.max(a[0], b1)


@T.macro
def select_topk(keys, st, nst, slots, chunk, chunk_ok, id_of, ordered, lane, num_topk, my_e, my_k, lost):
    """The num_topk largest of keys[j] (ids id_of(j); chunk_ok(c): slots c * chunk ... are held,
    a warp-uniform test; ordered: id_of grows with j), largest first: lane r gets round r's id
    in my_e[0] and key in my_k[0]; lost[0] = 1 if a round found no candidate (its key 0).
    st, nst: 4-element uint32 local buffers (top-2 caches)."""
    mk = T.alloc_var("uint32")
    e = T.alloc_var("uint32")
    win = T.alloc_var("int32")
    need = T.alloc_var("int32")
    for i in T.unroll(2):
        st[2 * i] = T.uint32(0)
        st[2 * i + 1] = T.uint32(NONE)
    for c in T.unroll(slots // chunk):
        if chunk_ok(c):
            for jj in T.unroll(chunk):
                top2_insert(st, keys[c * chunk + jj], id_of(c * chunk + jj), ordered)
    for r in T.serial(num_topk):
        mk = redux_max(st[0])
        e = redux_min(T.if_then_else(st[0] == mk, st[1], T.uint32(NONE)))
        if mk == T.uint32(0):
            lost[0] = 1
        if lane == r:
            my_e[0] = T.cast(e, "int32")
            my_k[0] = mk
        win = T.if_then_else(st[1] == e, 1, 0)
        need = T.if_then_else(win != 0 and st[2] == T.uint32(0), 1, 0)
        if win != 0:
            st[0] = st[2]
            st[1] = st[3]
            st[2] = T.uint32(0)
        if T.any_sync(need != 0) != 0:
            # The lanes that won with an empty second: top-2 of what is ordered after (mk, e).
            for i in T.unroll(2):
                nst[2 * i] = T.uint32(0)
                nst[2 * i + 1] = T.uint32(NONE)
            for c in T.unroll(slots // chunk):
                if chunk_ok(c):
                    for jj in T.unroll(chunk):
                        j = c * chunk + jj
                        if keys[j] < mk or (keys[j] == mk and id_of(j) > e):
                            top2_insert(nst, keys[j], id_of(j), ordered)
            if need != 0:
                for i in T.unroll(4):
                    st[i] = nst[i]


@T.macro
def random_slots(my_e, lane, t, ep_rank, num_experts, num_topk):
    """force_random: lane r gets slot r's expert in my_e[0] (tilebake.torch.gate.random_experts):
    the first free one of its 64 hashed draws, else the smallest free expert (< 32: at most 31
    slots are taken). Every lane computes the same draws; a draw is free if no earlier lane holds it."""
    seed = T.alloc_var("uint32")
    h = T.alloc_var("uint32")
    e = T.alloc_var("int32")
    a = T.alloc_var("int32")
    seed = fmix32(T.cast(ep_rank, "uint32"))
    seed = seed ^ T.cast(t, "uint32")
    seed = fmix32(seed)
    for r in T.serial(num_topk):
        e = -1
        a = 0
        while a < DRAWS_PER_SLOT and e < 0:
            h = seed + T.cast(r * DRAWS_PER_SLOT + a + 1, "uint32") * T.uint32(GOLDEN)
            h = fmix32(h)
            h = h % T.cast(num_experts, "uint32")
            if T.any_sync(lane < r and my_e[0] == T.cast(h, "int32")) == 0:
                e = T.cast(h, "int32")
            a = a + 1
        if e < 0:
            h = redux_or(
                T.if_then_else(
                    lane < r and my_e[0] < 32, T.shift_left(T.uint32(1), T.cast(my_e[0], "uint32")), T.uint32(0)
                )
            )
            e = T.call_extern("int32", "__ffs", T.cast(~h, "int32")) - 1
        if lane == r:
            my_e[0] = e


@T.macro
def write_outputs(OutIdx, OutW, Unmapped, Map, Count, t, lane, flags, ok, rand, fixed, my_e, my_s, denom, scaling,
                  ep_rank, num_experts, num_topk, width, dup, flag_map, flag_unmapped, stride):  # fmt: skip
    """Lane i < width writes slot i: a routed slot's expert and weight, a shared slot (weight 1),
    or -1 / 0 for an unrouted token (ok == 0); then the physical id and unmapped_topk_idx."""
    if lane < width:
        le = T.alloc_var("int32")
        w = T.alloc_var("float32")
        phys = T.alloc_var("int64")
        cnt = T.alloc_var("int32")
        le = -1
        w = T.float32(0)
        if ok != 0:
            if lane < num_topk:
                le = my_e
                w = my_s / denom * scaling
            else:
                le = num_experts + lane - num_topk
                w = T.float32(1)
        phys = T.cast(le, "int64")
        if le >= 0 and (flags & flag_map) != 0:
            cnt = Count[le]
            phys = T.int64(-1)
            if cnt >= 1 and cnt <= dup:
                phys = T.cast(
                    Map[le, (T.cast(ep_rank, "int64") + T.cast(t, "int64") * stride) % cnt],
                    "int64",
                )
        OutIdx[t, lane] = phys
        OutW[t, lane] = w
        if (flags & flag_unmapped) != 0 and lane < num_topk and fixed == 0:
            Unmapped[t, lane] = T.if_then_else(ok != 0 and rand == 0, T.cast(my_e, "int64"), T.int64(-1))
