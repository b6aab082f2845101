"""TileLang pieces shared by the quant kernels (build time only)."""

import tilelang.language as T


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


def e2m1_code(q):
    """fp32 q -> its e2m1 code (int32 0..15) per numerics.md step 4, branch-free.

    m = |q| with NaN and +inf mapped to 6 (the comparison is false for NaN), then the 3-bit
    magnitude code counts the round-half-even thresholds it reaches: rne(2m) for m < 2,
    rne(m) + 2 for 2 <= m < 4, rne(m / 2) + 4 otherwise, i.e. thresholds
    0.25 < m, 0.75 <= m, 1.25 < m, 1.75 <= m, 2.5 < m, 3.5 <= m, 5 < m. Bit 3 is q's sign bit.
    """
    a = T.abs(q)
    m = T.if_then_else(a < T.float32(6), a, T.float32(6))
    mag = (
        T.cast(m > T.float32(0.25), "int32")
        + T.cast(m >= T.float32(0.75), "int32")
        + T.cast(m > T.float32(1.25), "int32")
        + T.cast(m >= T.float32(1.75), "int32")
        + T.cast(m > T.float32(2.5), "int32")
        + T.cast(m >= T.float32(3.5), "int32")
        + T.cast(m > T.float32(5), "int32")
    )
    sign = T.shift_right(T.reinterpret(q, "uint32"), T.uint32(28)) & T.uint32(8)
    return mag | T.cast(sign, "int32")


def e2m1_value(code):
    """e2m1 code (int32, low 4 bits used) -> fp32 value: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
    for k = 0..7 (k / 2 below 4, else (2 + (k & 1)) * ((k >> 1) - 1)); bit 3 negates (-0.0 for 8)."""
    k = code & 7
    twice = T.if_then_else(k < 4, k, 2 * (2 + (k & 1)) * ((k >> 1) - 1))
    v = T.cast(twice, "float32") * T.float32(0.5)
    return T.if_then_else((code & 8) != 0, -v, v)


# --- Element codecs and stochastic rounding (expression builders: call them inside a prim_func) ---
#
# Each returns a TIR expression; the references are in src/tilebake/torch/cast.py (e2m1) and
# src/tilebake/torch/stochastic.py (SR, the hash), written step for step the same way.


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


def e2m1_encode(q):
    """fp32 q -> e2m1 code in an int32 (numerics.md step 4): m = |q|, NaN/inf -> 6, min(m, 6);
    rne(2m) below 2, rne(m) + 2 below 4, rne(m/2) + 4 above; bit 3 = sign bit of q."""
    # |q| by clearing the sign bit (what fabsf does). CUDA's fminf returns the non-NaN operand:
    # NaN -> 6, and inf -> 6.
    m = T.min(T.reinterpret(T.reinterpret(q, "uint32") & T.uint32(0x7FFFFFFF), "float32"), T.float32(6))
    mag = T.if_then_else(
        m < T.float32(2),
        T.nearbyint(m * T.float32(2)),
        T.if_then_else(m < T.float32(4), T.nearbyint(m) + T.float32(2), T.nearbyint(m * T.float32(0.5)) + T.float32(4)),
    )
    sign = T.shift_right(T.reinterpret(q, "uint32"), T.uint32(31))
    return T.cast(mag, "int32") | (T.cast(sign, "int32") << 3)


def fmix32(h):
    """MurmurHash3's 32-bit finaliser (uint32 -> uint32): every input bit flips each output bit
    with probability close to 1/2. An expression builder: `h` appears several times in the
    result, so pass a register, not a large expression (nesting two of these multiplies the
    expression tree); inside kernels prefer the statement form, sr_random_bits_into."""
    h = h ^ T.shift_right(h, T.uint32(16))
    h = h * T.uint32(0x85EBCA6B)
    h = h ^ T.shift_right(h, T.uint32(13))
    h = h * T.uint32(0xC2B2AE35)
    return h ^ T.shift_right(h, T.uint32(16))


def sr_random_bits(value_bits, index):
    """32 random bits for stochastic rounding of the element at `index` (int32, taken mod 2^32)
    whose fp32 bit pattern is `value_bits` (uint32): fmix32(bits ^ fmix32(index * golden + c)).
    Equal inputs give equal bits (deterministic); tilebake.torch.stochastic.sr_random_bits is the
    reference. Expression form (large); kernels use sr_random_bits_into."""
    k = fmix32(T.cast(index, "uint32") * T.uint32(0x9E3779B9) + T.uint32(0x7F4A7C15))
    return fmix32(value_bits ^ k)


def sr_float32_to_bfloat16_bits(x, rbits):
    """Stochastic rounding fp32 -> bf16, as the bf16 bit pattern (uint32, low 16 bits).

    Adds the top 16 random bits to the 16 bits bf16 drops, then truncates: rounds away from
    zero with probability (dropped bits) / 2^16, exactly the distance to the lower neighbour over
    the gap. Overflow past the largest finite bf16 gives inf (the next value up); NaN keeps its
    sign and top payload bits, made quiet."""
    bits = T.reinterpret(x, "uint32")
    is_nan = (bits & T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000)
    rounded = T.shift_right(bits + T.shift_right(rbits, T.uint32(16)), T.uint32(16))
    return T.if_then_else(is_nan, T.shift_right(bits, T.uint32(16)) | T.uint32(0x40), rounded)


def sr_float32_to_e4m3_bits(x, rbits):
    """Stochastic rounding fp32 -> float8_e4m3fn, as the e4m3 byte (uint32, low 8 bits).

    |x| = sig * 2^(E - 23) with a 24-bit significand; e4m3 keeps 3 fraction bits down to E = -6
    (then a fixed step of 2^-9), so d = 20 + max(-6 - E, 0) low bits of sig are dropped. The
    result rounds up with probability rem / 2^d (rem = the dropped bits), decided exactly by
    comparing rem with the top d random bits (d <= 32); for d > 32 (|x| < 2^-18) rem is first
    truncated to 32 bits. Codes: (max(E, -6) + 6) * 8 + (sig >> d) + up, where a carry into the
    next binade is just the next code. |x| >= 448 (inf too) saturates to +-448, like the quant
    kernels' clamp and the satfinite conversion; NaN -> 0x7F with the sign of x."""
    bits = T.reinterpret(x, "uint32")
    sign = T.shift_right(bits, T.uint32(24)) & T.uint32(0x80)
    a = bits & T.uint32(0x7FFFFFFF)
    ef = T.cast(T.shift_right(a, T.uint32(23)), "int32")
    e = T.max(ef, 1) - 127  # fp32 denormals share the exponent of the smallest normal
    sig = (a & T.uint32(0x7FFFFF)) | T.if_then_else(ef > 0, T.uint32(0x800000), T.uint32(0))
    d = 20 + T.max(-6 - e, 0)
    du = T.cast(T.min(d, 32), "uint32")
    kept = T.if_then_else(d < 32, T.shift_right(sig, T.min(du, T.uint32(31))), T.uint32(0))
    rem = T.if_then_else(
        d < 32,
        sig & (T.shift_left(T.uint32(1), T.min(du, T.uint32(31))) - T.uint32(1)),
        T.if_then_else(d - 32 < 24, T.shift_right(sig, T.cast(T.min(T.max(d - 32, 0), 31), "uint32")), T.uint32(0)),
    )
    threshold = T.if_then_else(d < 32, T.shift_right(rbits, T.uint32(32) - T.min(du, T.uint32(31))), rbits)
    up = T.if_then_else(threshold < rem, T.uint32(1), T.uint32(0))
    code = T.cast((T.max(e, -6) + 6) * 8, "uint32") + kept + up
    code = T.if_then_else(
        a > T.uint32(0x7F800000), T.uint32(0x7F), T.if_then_else(a >= T.uint32(0x43E00000), T.uint32(0x7E), code)
    )
    return code | sign


@T.macro
def sr_random_bits_into(h, value_bits, index):
    """Statement form of sr_random_bits: writes the 32 random bits into h[0], a
    T.alloc_local((1,), "uint32") register, one step per statement (no expression blow-up)."""
    h[0] = T.cast(index, "uint32") * T.uint32(0x9E3779B9) + T.uint32(0x7F4A7C15)
    h[0] = h[0] ^ T.shift_right(h[0], T.uint32(16))
    h[0] = h[0] * T.uint32(0x85EBCA6B)
    h[0] = h[0] ^ T.shift_right(h[0], T.uint32(13))
    h[0] = h[0] * T.uint32(0xC2B2AE35)
    h[0] = h[0] ^ T.shift_right(h[0], T.uint32(16))
    h[0] = h[0] ^ value_bits
    h[0] = h[0] ^ T.shift_right(h[0], T.uint32(16))
    h[0] = h[0] * T.uint32(0x85EBCA6B)
    h[0] = h[0] ^ T.shift_right(h[0], T.uint32(13))
    h[0] = h[0] * T.uint32(0xC2B2AE35)
    h[0] = h[0] ^ T.shift_right(h[0], T.uint32(16))


def sr_float32_to_e2m1_code(q, rbits):
    """Stochastic rounding fp32 -> e2m1 code (int32 0..15, bit 3 = q's sign bit).

    m = |q| (NaN and values >= 6, inf too, become 6, as e2m1_code does). m lies between two
    neighbouring magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 that are a gap g = .5 / 1 / 2 apart;
    t = m / g is exact (a power-of-two scaling), floor(t) gives the lower code and
    f = t - floor(t) in [0, 1) the distance to it over the gap (exact: Sterbenz). Round up iff
    rbits < trunc(f * 2^32) (exact integer compare; f * 2^32 < 2^32 is exact), i.e. with
    probability f up to 2^-32, so E[value] = m. m = 6 gives f = 0: saturates at code 7.
    Pass `q` as a register (it appears several times in the expression);
    tilebake.torch.stochastic.sr_float32_to_e2m1_codes is the reference."""
    a = T.reinterpret(T.reinterpret(q, "uint32") & T.uint32(0x7FFFFFFF), "float32")
    m = T.if_then_else(a < T.float32(6), a, T.float32(6))
    t = T.if_then_else(m < T.float32(2), m * T.float32(2), T.if_then_else(m < T.float32(4), m, m * T.float32(0.5)))
    base = T.if_then_else(m < T.float32(2), 0, T.if_then_else(m < T.float32(4), 2, 4))
    fl = T.floor(t)
    # 2^32 from its bits: every code generator then holds it exactly (TVM's C target prints a
    # float literal to 7 digits, 4.294967e+09f, which is 2^32 - 256).
    below = T.cast((t - fl) * T.reinterpret(T.uint32(0x4F800000), "float32"), "uint32")
    up = T.if_then_else(rbits < below, 1, 0)
    sign = T.cast(T.shift_right(T.reinterpret(q, "uint32"), T.uint32(28)) & T.uint32(8), "int32")
    return (T.cast(fl, "int32") + base + up) | sign


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
