"""TileLang pieces shared by the quant kernels (build time only)."""

import dataclasses

import tilelang.language as T

from tilebake._hash import GOLDEN, SR_OFFSET

# Format name -> TileLang dtype (e2m1: the packed bytes, two codes each): the one table.
TL_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "e4m3": "float8_e4m3fn", "e2m1": "uint8"}


def per_token_sf_buffer(num_tokens, hidden, num_per_channels: int, packed_ue8m0: bool):
    """The scale-factor tensor of a per-token (1 x num_per_channels) quantisation, as
    (shape, strides, dtype) for T.StridedTensor.

    Its strides are runtime (the `sf_stride_t`, `sf_stride_g` kernel arguments), so row-major
    and TMA-aligned column-major SF share one binary. fp32 SF are indexed [token, group];
    packed UE8M0 SF as bytes [token, word, byte-in-word], strides in bytes.
    """
    sf_stride_t = T.dynamic("sf_stride_t")
    sf_stride_g = T.dynamic("sf_stride_g")
    num_groups = T.ceildiv(hidden, num_per_channels)
    if packed_ue8m0:
        return (num_tokens, T.ceildiv(num_groups, 4), 4), (sf_stride_t, sf_stride_g, 1), "uint8"
    return (num_tokens, num_groups), (sf_stride_t, sf_stride_g), "float32"


def pow2_scale_exponent(c, fmt_max: float):
    """round_sf (numerics.md): the exponent e of the power-of-two SF 2^e >= c / fmt_max, from the
    fp32 bits of s = c * (1 / fmt_max): e = ((bits(s) - 1) >> 23) + 1 - 127 (int32)."""
    return ((T.reinterpret(c * T.float32(1.0 / fmt_max), "int32") - 1) >> 23) + 1 - 127


def pow2_inverse(e):
    """2^-e as fp32, built from its bits; 0 for e >= 127, i.e. for a block holding inf (e = 128),
    as the references give (x * 0 -> NaN for the inf itself)."""
    return T.reinterpret(T.max(127 - e, 0) << 23, "float32")


def pow2_sf(e):
    """The power-of-two SF 2^e as fp32, from its bits (e = 128, a block holding inf, gives inf)."""
    return T.reinterpret((e + 127) << 23, "float32")


@T.macro
def store_ue8m0_sf(SB, row, group, num_groups, e):
    """The group's SF as a UE8M0 byte e + 127 in SB[row, word, byte] (4 groups a word); the last
    group zero-fills the rest of its word, so a packed row holds no stale bytes."""
    SB[row, group // 4, group % 4] = T.cast(e + 127, "uint8")
    if group == num_groups - 1:
        for k in T.serial(3 - group % 4):
            SB[row, group // 4, group % 4 + 1 + k] = T.uint8(0)


@T.macro
def store_ue8m0_word(SW, row, group, num_groups, e, lanes, owner):
    """Packed UE8M0 SF as whole 4-byte words (the bytes of store_ue8m0_sf): group g's byte
    e + 127 at byte g % 4 of word g // 4, 0 for g >= num_groups. A word's 4 groups sit in
    4 * lanes consecutive lanes of one warp (`lanes` per group, every lane of a group holding its
    e), so two OR-shuffles give every lane the word, and `owner` (the word's first lane, in
    range) stores it in SW[row, g // 4] (a uint32 view): one store per word, not 4 byte stores.
    Every lane of the warp must run this (the shuffles)."""
    w = T.alloc_var("uint32")
    byte = T.cast((e + 127) & 255, "uint32")
    w = T.if_then_else(group < num_groups, T.shift_left(byte, T.cast((group % 4) * 8, "uint32")), T.uint32(0))
    w = w | T.shfl_xor(w, lanes)
    w = w | T.shfl_xor(w, 2 * lanes)
    if owner:
        SW[row, group // 4] = w


@dataclasses.dataclass(frozen=True)
class GroupScale:
    """A per-token (1 x npc) group scale's compile-time parameters: `lanes` consecutive lanes
    share a group; the format's largest value; the SF mode."""

    lanes: int
    fmt_max: float
    round_sf: bool
    packed_ue8m0: bool


@T.macro
def group_scale_into(inv, values, spec, amax_clamp, S, row, group, num_groups, owner):
    """The group scale (spec: a GroupScale) for a thread holding its share of the group in
    `values` (a local buffer): amax over spec.lanes lanes (butterfly shuffles: every lane ends
    with the same bits), c = max(amax, amax_clamp); inv[0] = 2^-e (round_sf) or fmt_max / c;
    the owner lane stores the SF in S[row, group] (fp32: 2^e or c / fmt_max) or, packed, as
    UE8M0 bytes."""
    amax = T.alloc_var("float32")
    amax = T.float32(0)
    for j in T.unroll(values.shape[0]):
        amax = T.max(amax, T.abs(values[j]))
    for s in T.unroll(spec.lanes.bit_length() - 1):
        amax = T.max(amax, T.shfl_xor(amax, spec.lanes >> (s + 1)))
    c = T.max(amax, amax_clamp)
    e = pow2_scale_exponent(c, spec.fmt_max)
    inv[0] = pow2_inverse(e) if spec.round_sf else T.float32(spec.fmt_max) / c
    if spec.packed_ue8m0:
        if owner:
            store_ue8m0_sf(S, row, group, num_groups, e)
    elif owner:
        S[row, group] = pow2_sf(e) if spec.round_sf else c / T.float32(spec.fmt_max)


def e2m1_code(q):
    """fp32 q -> its e2m1 code (int32 0..15) per numerics.md step 4, in 7 ALU instructions:
    the package's only e2m1 encoder (tilebake.torch.cast.e2m1_encode is its reference).

    m = min(|q|, 6) (a NaN compares false, so NaN and inf become 6). The e2m1 grid is g = 0.5
    apart below 2, 1 apart in [2, 4), 2 apart in [4, 6], i.e. g = 2^(b - 1) with
    b = max(exponent of m, 0) = 0..2. One fp32 add of M' = 2^(22 + b) + 2b * g, a multiple of
    g whose ulp is g, rounds m to the grid half-to-even (M''s mantissa is even, so ties go
    where rne(2m), rne(m) + 2, rne(m / 2) + 4 send them) and leaves M''s bits + the grid index
    in the sum's bits: their low 3 bits are 2b + index, the code (at most 7). M''s bits are
    eb * (2^23 + 2) + (22 << 23) - 254 with eb = bits(max(m, 1)) >> 23 (127..129, NaN-free).
    Bit 3 is q's sign bit (-0.0 gives 8, as the reference)."""
    a = T.call_extern("float32", "fabsf", q)  # CUDA: a free |.| operand modifier; the C target has fabsf too
    m = T.if_then_else(a < T.float32(6), a, T.float32(6))
    eb = T.shift_right(T.reinterpret(T.max(m, T.float32(1)), "int32"), 23)
    magic = T.reinterpret(eb * T.int32((1 << 23) + 2) + T.int32((22 << 23) - 254), "float32")
    # (sum & 7) | (sign nibble & ~7): one LOP3 (q >> 28 keeps the sign at bit 3 over 3 exponent bits).
    code = T.reinterpret(m + magic, "int32") & 7
    return code | (T.cast(T.shift_right(T.reinterpret(q, "uint32"), T.uint32(28)), "int32") & ~7)


def e2m1_value(code):
    """e2m1 code (int32, low 4 bits used) -> fp32 value: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
    for k = 0..7 (k / 2 below 4, else (2 + (k & 1)) * ((k >> 1) - 1)); bit 3 negates (-0.0 for 8)."""
    k = code & 7
    twice = T.if_then_else(k < 4, k, 2 * (2 + (k & 1)) * ((k >> 1) - 1))
    v = T.cast(twice, "float32") * T.float32(0.5)
    return T.if_then_else((code & 8) != 0, -v, v)


# --- Element codecs and stochastic rounding (expression builders: call them inside a prim_func) ---
#
# Each returns a TIR expression; the references are in src/tilebake/torch/cast_formats.py (e2m1) and
# src/tilebake/torch/stochastic.py (SR, the hash), written step for step the same way.


def e2m1x8_word(xs, row, base):
    """The 4 packed e2m1 bytes xs[row, base .. base + 3] (a local int8/uint8 buffer) as one
    little-endian uint32 of 8 codes, code 0 in the low nibble (the compiler keeps the loaded
    register)."""
    w = T.cast(T.cast(xs[row, base], "uint8"), "uint32")
    for i in range(1, 4):
        w = w | T.shift_left(T.cast(T.cast(xs[row, base + i], "uint8"), "uint32"), T.uint32(8 * i))
    return w


def e2m1x8_bf16x2(w, k):
    """bf16 bit patterns of codes 2k and 2k+1 (k = 0..3) of the uint32 `w` of 8 e2m1 codes, as a
    uint32 (code 2k in the low half): e2m1 values are exact in bf16, so these are also the top
    halves of their fp32 bits. About 1.5 instructions per code, through PRMT (__byte_perm):
    the 3 magnitude bits of 4 codes select their bf16 low bytes (00 00 80 C0 00 40 80 C0) and
    high bytes (00 3F 3F 3F 40 40 40 40) from two 8-byte tables; a third PRMT interleaves them;
    bit 3 of each code, moved to bit 7 of a byte by PRMT, becomes the bf16 sign (-0.0 for code 8).
    An expression builder: pass `w` as a register; the lookups shared by two k are one PRMT each
    once the compiler merges the common subexpressions."""
    sel = T.shift_right(w, T.cast(16 * (k // 2), "uint32")) & T.uint32(0x7777)
    lo = T.call_extern("uint32", "__byte_perm", T.uint32(0xC0800000), T.uint32(0xC0804000), sel)
    hi = T.call_extern("uint32", "__byte_perm", T.uint32(0x3F3F3F00), T.uint32(0x40404040), sel)
    # Bytes lo[2(k % 2)], hi[..], lo[2(k % 2) + 1], hi[..]: selector 0x5140 or 0x7362. k may be a
    # TIR loop variable (arithmetic, no Python branch on it).
    pair = T.call_extern("uint32", "__byte_perm", lo, hi, T.uint32(0x5140) + T.cast(k % 2, "uint32") * T.uint32(0x2222))
    # Byte k of w << 4 holds code 2k's sign at bit 7, byte k of w code 2k+1's: into bytes 1 and 3.
    signs = T.call_extern(
        "uint32", "__byte_perm", T.shift_left(w, T.uint32(4)), w, T.cast(((4 + k) << 12) | (k << 4), "uint32")
    )
    return pair | (signs & T.uint32(0x80008000))


def ue8m0_to_float32(byte):
    """UE8M0 byte b -> 2^(b - 127) via the fp32 bits (0 -> 2^-127, a denormal; 255 -> inf)."""
    b = T.cast(byte, "int32")
    return T.reinterpret(T.if_then_else(b == 0, T.int32(1 << 22), T.shift_left(b, 23)), "float32")


def e2m1_decode_float32(code):
    """e2m1 code (low 4 bits of an int32) -> fp32, through its bits: magnitude code 0b(e m) is
    m * 0.5 for e == 0, else 2^(e-1) * (1 + m/2); bit 3 is the sign."""
    e = (code >> 1) & 3
    m = code & 1
    mag = T.if_then_else(e == 0, m * T.int32(0x3F000000), ((e + 126) << 23) | (m << 22))
    return T.reinterpret(mag | ((code & 8) << 28), "float32")


def fmix32(h):
    """MurmurHash3's 32-bit finaliser (uint32 -> uint32): every input bit flips each output bit
    with probability close to 1/2. An expression builder: `h` appears several times in the
    result, so pass a register, not a large expression; inside kernels prefer the statement
    form, sr_random_pair_into."""
    h = h ^ T.shift_right(h, T.uint32(16))
    h = h * T.uint32(0x85EBCA6B)
    h = h ^ T.shift_right(h, T.uint32(13))
    h = h * T.uint32(0xC2B2AE35)
    return h ^ T.shift_right(h, T.uint32(16))


# Stochastic rounding (SR) draws 16 random bits per element (the precision of NVIDIA's cvt.rs):
# one hash per PAIR of elements (flat indices 2p, 2p + 1), the even element taking the low half,
# the odd one the high half. The hash is MurmurHash3's fmix32 with the key xored in after its
# first xorshift: h = w ^ (w >> 16) ^ (p * GOLDEN + SR_OFFSET) (tilebake._hash), then fmix32's two
# multiply-xorshift rounds, w being the pair's value word (sr_pair_word of their fp32 bit
# patterns). Equal inputs give equal bits (deterministic, no RNG state) and the arithmetic is
# integer-only (sm_90a and sm_100a give the same bytes). Keying after the first xorshift saves
# the key's own shift: 9 SASS instructions per pair of bf16 values.


def sr_pair_word(bits0, bits1):
    """The 32-bit value word of a pair from its elements' fp32 bit patterns (uint32):
    rotr(bits0, 16) ^ bits1. For widened bf16 values this is the packed pair (bf16 0 in the low
    half, bf16 1 in the high half), i.e. the loaded 32-bit word itself."""
    return (T.shift_right(bits0, T.uint32(16)) | T.shift_left(bits0, T.uint32(16))) ^ bits1


@T.macro
def sr_random_pair_into(h, word, pair_index):
    """h[0] (a T.alloc_local((1,), "uint32") register) = the random bits of elements 2p
    (h & 0xFFFF) and 2p + 1 (h >> 16), p = pair_index mod 2^32: word ^ (word >> 16) ^
    (p * GOLDEN + SR_OFFSET), then x *= 0x85EBCA6B, x ^= x >> 13, x *= 0xC2B2AE35,
    x ^= x >> 16. One step per statement (no expression blow-up);
    tilebake.torch.stochastic.sr_random_bits is the reference."""
    h[0] = T.cast(pair_index, "uint32") * T.uint32(GOLDEN) + T.uint32(SR_OFFSET)
    h[0] = h[0] ^ word ^ T.shift_right(word, T.uint32(16))
    h[0] = h[0] * T.uint32(0x85EBCA6B)
    h[0] = h[0] ^ T.shift_right(h[0], T.uint32(13))
    h[0] = h[0] * T.uint32(0xC2B2AE35)
    h[0] = h[0] ^ T.shift_right(h[0], T.uint32(16))


def _f32(bits: int):
    """An fp32 constant from its bits: every code generator then holds it exactly (TVM's C
    target prints float literals to 7 digits)."""
    return T.reinterpret(T.uint32(bits), "float32")


def sr_float32_to_bfloat16_bits(x, rbits):
    """Stochastic rounding fp32 -> bf16, as the bf16 bit pattern (uint32, low 16 bits).

    Adds the 16 random bits (the low half of `rbits`) to the 16 bits bf16 drops, then truncates:
    rounds away from zero with probability (dropped bits) / 2^16, exactly the distance to the
    lower neighbour over the gap. Overflow past the largest finite bf16 gives inf (the next value
    up); NaN keeps its sign and top payload bits, made quiet."""
    bits = T.reinterpret(x, "uint32")
    is_nan = (bits & T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000)
    rounded = T.shift_right(bits + (rbits & T.uint32(0xFFFF)), T.uint32(16))
    return T.if_then_else(is_nan, T.shift_right(bits, T.uint32(16)) | T.uint32(0x40), rounded)


SR_E4M3_PRESCALE_MIN = 2.0**-6  # scales from here up stay exact (normal) times 2^-120


def sr_e4m3_prescale(scale):
    """scale * 2^-120: exact (a normal fp32) when scale >= SR_E4M3_PRESCALE_MIN, and then
    x * sr_e4m3_prescale(scale) is the pre-scaled input of sr_scaled_to_e4m3_value in one
    multiply (below, multiply by scale and pass to sr_float32_to_e4m3_value)."""
    return scale * _f32(0x03800000)


def sr_scaled_to_e4m3_value(t, rbits):
    """sr_float32_to_e4m3_value of x given t = x * 2^-120 (already scaled; see there)."""
    b = T.min(T.reinterpret(t, "int32"), T.int32(0x7FF00000))
    noise = T.shift_left(rbits & T.uint32(0xFFFF), T.uint32(4))
    r = (T.cast(b, "uint32") + noise) & T.uint32(0xFFF00000)
    return T.reinterpret(r, "float32") * _f32(0x7B800000)


def sr_float32_to_e4m3_value(x, rbits):
    """Stochastic rounding fp32 -> float8_e4m3fn, as the fp32 value whose (saturating, RNE)
    hardware conversion to e4m3 is the result: cast it with T.cast(..., "float8_e4m3fn") (the
    vectorized cast becomes cvt.rn.satfinite.e4m3x2.f32, two values per instruction).

    t = x * 2^-120 maps e4m3's smallest normal 2^-6 onto fp32's 2^-126, so e4m3's subnormal
    step 2^-9 becomes fp32's subnormal bit 20 and every e4m3 code keeps exactly the top 12 bits
    of t's pattern (sign, 8 exponent bits, 3 fraction bits; t's pattern >> 20 is the code). SR:
    add the 16 random bits (low half of `rbits`) at bits 4..19 of t's pattern, drop the low 20
    bits, scale back by 2^120 (exact). It rounds up (away from zero) iff the carry reaches bit
    20, with probability floor(dropped / 2^4) / 2^16 (dropped = t's low 20 bits): the distance to
    the lower neighbour over the gap, truncated to 16 bits. Representable values never move;
    values past 448 land on 480 or beyond (or inf), which the satfinite conversion saturates to
    +-448. NaN: the signed min keeps a NaN pattern below 0x7FF00000 so the add cannot carry into
    the sign (the GPU's NaN is 0x7FFFFFFF); the conversion makes it 0x7F.
    tilebake.torch.stochastic.sr_float32_to_e4m3_value is the reference."""
    return sr_scaled_to_e4m3_value(x * _f32(0x03800000), rbits)


def sr_float32_to_e2m1_code(q, rbits):
    """Stochastic rounding fp32 -> e2m1 code (int32 0..15, bit 3 = q's sign bit).

    m = |q| with NaN and values >= 6 (inf too) mapped to 6, as e2m1_code does. t = m * 2^-126
    maps e2m1's smallest normal 1 onto fp32's 2^-126, so its subnormal step 0.5 becomes fp32's
    subnormal bit 22 and t's pattern >> 22 is the magnitude code (6 -> 7). SR: add the 16 random
    bits (low half of `rbits`) at bits 6..21, then shift: rounds up with probability
    floor(dropped / 2^6) / 2^16 (dropped = t's low 22 bits), the distance to the lower neighbour
    over the gap truncated to 16 bits; 6 is exact, so the code never passes 7. Pass `q` as a
    register (it appears twice); tilebake.torch.stochastic.sr_float32_to_e2m1_codes is the
    reference."""
    a = T.reinterpret(T.reinterpret(q, "uint32") & T.uint32(0x7FFFFFFF), "float32")
    # CUDA's fminf returns the non-NaN operand: NaN -> 6 (one FMNMX; the C target's min agrees).
    t = T.reinterpret(T.min(a, T.float32(6)) * _f32(0x00800000), "uint32")
    mag = T.shift_right(t + T.shift_left(rbits & T.uint32(0xFFFF), T.uint32(6)), T.uint32(22))
    sign = T.shift_right(T.reinterpret(q, "uint32"), T.uint32(28)) & T.uint32(8)
    return T.cast(mag | sign, "int32")


@T.macro
def psum_row_valid(valid, P, row, use_psum, num_experts, search_steps, alignment):
    """valid[0] = 1 if `row` is an expert's slot of the psum layout, [align(psum[e-1]), psum[e])
    for some e (psum[-1] taken as 0), else 0; always 1 without psum (use_psum == 0). A binary
    search for the first e with psum[e] > row, search_steps = num_experts.bit_length() steps;
    uniform per CTA when `row` is. `valid` is a T.alloc_local((1,), "int32")."""
    lo = T.alloc_var("int32")
    hi = T.alloc_var("int32")
    valid[0] = 1
    if use_psum != 0:
        lo = 0
        hi = num_experts
        for _ in T.serial(search_steps):
            if lo < hi:
                if P[(lo + hi) >> 1] > row:
                    hi = (lo + hi) >> 1
                else:
                    lo = ((lo + hi) >> 1) + 1
        if lo >= num_experts:
            valid[0] = 0
        elif lo > 0:
            if row < (P[lo - 1] + alignment - 1) // alignment * alignment:
                valid[0] = 0


# Correctly rounded fp32 division without a slow path, for SwiGLU's den = 1 + exp(-x) with
# |x| < 64 (den in [1, 2^93)): the instruction sequence of CUDA's div.rn fast path (rcp.approx,
# one Newton step on the reciprocal, one correction of the quotient), which CUDA uses whenever
# its FCHK range check passes, i.e. while the quotient, reciprocal and remainder stay normal. Here
# they do, except for a tiny numerator (|x| < 2^-24): then exp(-x) is within an ulp of 1, so den
# rounds to exactly 2, and q = x * 0.5 is already the correctly rounded quotient (the remainder
# is exact and the correction keeps q). The correction is written with the negated remainder,
# b * q - a, so that a -0 numerator keeps its sign (CUDA's a - b * q would give +0 there). Callers
# take T.ieee_fdiv (CUDA's checked division) for chunks with any |x| >= 64 (or inf). The GPU tests
# check silu and dsilu bit for bit for every finite bf16 x and 2^20 fp32 x over all binades.
FAST_DIV_MAX_ABS_X = 64.0


@T.macro
def reciprocal_into(r, b, n):
    """r[j] = 1 / b[j] to within an ulp (rcp.approx.ftz + one Newton step), j < n."""
    for j in T.unroll(n):
        r[j] = T.fast_rcp(b[j])
    for j in T.unroll(n):
        r[j] = T.ieee_fmaf(r[j], T.ieee_fmaf(-b[j], r[j], T.float32(1)), r[j])


@T.macro
def div_rn_into(q, a, b, r, n):
    """q[j] = a[j] / b[j] correctly rounded, r from reciprocal_into(r, b, n); see above for the range."""
    for j in T.unroll(n):
        q[j] = T.ieee_mul(a[j], r[j])
    for j in T.unroll(n):
        q[j] = T.ieee_fmaf(-r[j], T.ieee_fmaf(b[j], q[j], -a[j]), q[j])


@T.macro
def inv_rn_into(q, b, r, n):
    """q[j] = 1 / b[j] correctly rounded (div_rn_into with a = 1), r from reciprocal_into(r, b, n)."""
    for j in T.unroll(n):
        q[j] = T.ieee_fmaf(-r[j], T.ieee_fmaf(b[j], r[j], T.float32(-1)), r[j])
