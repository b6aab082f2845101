"""TileLang pieces shared by the Ascend 950 quant kernels (build time only): the 32-column group
of the original's Ascend casts, the chunk a step moves through the unified buffer, and the e4m3
group arithmetic of numerics.md (as kernels_tl/quant/common.py's, which supplies the bit tricks)."""

import tilelang.ascend.language as T

from kernels_tl.quant.common import pow2_inverse, pow2_scale_exponent, pow2_sf
from tilebake.quant.per_token_cast import ASCEND_NUM_PER_CHANNELS as NPC

CHUNK = 2048  # columns a step: 64 groups, one SIMT thread each
GROUPS = CHUNK // NPC
FMT_MAX = 448.0  # e4m3


@T.macro
def group_amax(xs, g):
    """max |xs| over group g's NPC values of the chunk (fp32)."""
    amax = T.alloc_var("float32")
    amax = T.float32(0)
    for j in T.serial(NPC):
        amax = T.max(amax, T.abs(T.cast(xs[g * NPC + j], "float32")))
    return amax


def e4m3_scales(c, round_sf: bool):
    """(stored sf, quantising multiplier) of a group whose clamped amax is c: c / 448 and 448 / c
    (two true divisions), or the power of two from the bits of c * (1 / 448) and its inverse."""
    if round_sf:
        e = pow2_scale_exponent(c, FMT_MAX)
        return pow2_sf(e), pow2_inverse(e)
    return c / T.float32(FMT_MAX), T.float32(FMT_MAX) / c


def e4m3_code(x, inv):
    """e4m3(clamp(fp32(x) * inv, -448, 448)), rounded to nearest even."""
    return T.cast(T.clamp(T.cast(x, "float32") * inv, -FMT_MAX, FMT_MAX), "float8_e4m3fn")


@T.macro
def cast_group(vals, qs, ss, g, amax, amax_clamp, sf_mode: str):
    """Group g's SF (ss[g]: fp32, power-of-two fp32 for 'round', the UE8M0 byte for 'ue8m0') and
    e4m3 codes (qs) of its NPC fp32 values in vals, whose max |value| is amax: per_token_cast's
    arithmetic, for kernels that compute the values first."""
    c = T.max(amax, amax_clamp)
    sf, inv = e4m3_scales(c, sf_mode != "fp32")
    if sf_mode == "ue8m0":
        ss[g] = T.cast(pow2_scale_exponent(c, FMT_MAX) + 127, "uint8")
    else:
        ss[g] = sf
    for j in T.serial(NPC):
        qs[g * NPC + j] = e4m3_code(vals[g * NPC + j], inv)
