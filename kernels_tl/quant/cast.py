"""cast with stochastic rounding (SR): fp32 -> bf16, fp32 -> e4m3, bf16 -> e4m3, as a TileLang factory.

Build time only. The tensor is flat (numel % 4 == 0); each thread owns `groups_per_thread` groups
of 4 consecutive elements, group g of a CTA at g * threads + tx so that a warp's accesses are
consecutive. Random bits: one hash per pair of elements (sr_random_pair_into over the pair's
fp32 bits and its index numel-position / 2), 16 bits each; rounding: sr_float32_to_bfloat16_bits
(integer) / sr_float32_to_e4m3_value (integer, then the exact satfinite conversion), so sm_90a
and sm_100a give the same bytes. Round-to-nearest pairs use torch.
"""

import dataclasses

import tilelang.language as T

from kernels_tl.quant.common import (
    TL_DTYPES,
    sr_float32_to_bfloat16_bits,
    sr_float32_to_e4m3_value,
    sr_pair_word,
    sr_random_pair_into,
)
from tilebake.quant.cast import CastVariant


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int = 256
    groups_per_thread: int = 4  # groups of 4 elements a thread owns


DEFAULT_CONFIG = LaunchConfig()


def candidate_configs():
    """The search space bench/tune.py times on a GPU."""
    return [LaunchConfig(t, g) for t in (128, 256, 512) for g in (1, 2, 4, 8)]


PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # accesses are guarded per 4-element group


def build(v: CastVariant, cfg: LaunchConfig = DEFAULT_CONFIG):
    in_dtype = TL_DTYPES[v.in_dtype]
    to_bf16 = v.out_dtype == "bf16"
    out_dtype = "uint16" if to_bf16 else "float8_e4m3fn"  # bf16 as its bit patterns
    THREADS, G = cfg.threads, cfg.groups_per_thread
    groups_per_cta = THREADS * G

    num_groups = T.dynamic("num_groups")  # numel / 4

    @T.prim_func
    def cast_kernel(
        X: T.Tensor((num_groups, 4), in_dtype),
        Y: T.Tensor((num_groups, 4), out_dtype),
    ):
        with T.Kernel(T.ceildiv(num_groups, groups_per_cta), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            xs = T.alloc_local((G, 4), in_dtype)
            ys = T.alloc_local((4,), out_dtype)
            vs = T.alloc_local((4,), "float32")  # e4m3: the SR values before the conversion
            h = T.alloc_local((1,), "uint32")
            for k in T.unroll(G):
                g = b * groups_per_cta + k * THREADS + tx
                if g < num_groups:
                    for j in T.vectorized(4):
                        xs[k, j] = X[b * groups_per_cta + k * THREADS + tx, j]
            for k in T.unroll(G):
                g = b * groups_per_cta + k * THREADS + tx
                if g < num_groups:
                    for jp in T.unroll(2):
                        # Elements 4g + 2jp and 4g + 2jp + 1 form pair 2g + jp: one hash, 16 bits each.
                        x0 = T.cast(xs[k, 2 * jp], "float32")
                        x1 = T.cast(xs[k, 2 * jp + 1], "float32")
                        sr_random_pair_into(
                            h,
                            sr_pair_word(T.reinterpret(x0, "uint32"), T.reinterpret(x1, "uint32")),
                            (b * groups_per_cta + k * THREADS + tx) * 2 + jp,
                        )
                        if to_bf16:
                            ys[2 * jp] = T.cast(sr_float32_to_bfloat16_bits(x0, h[0]), out_dtype)
                            h1 = T.shift_right(h[0], T.uint32(16))
                            ys[2 * jp + 1] = T.cast(sr_float32_to_bfloat16_bits(x1, h1), out_dtype)
                        else:
                            vs[2 * jp] = sr_float32_to_e4m3_value(x0, h[0])
                            vs[2 * jp + 1] = sr_float32_to_e4m3_value(x1, T.shift_right(h[0], T.uint32(16)))
                    if to_bf16:
                        for j in T.vectorized(4):
                            Y[b * groups_per_cta + k * THREADS + tx, j] = ys[j]
                    else:
                        # Representable values (or ones the satfinite conversion saturates): exact.
                        for j in T.vectorized(4):
                            Y[b * groups_per_cta + k * THREADS + tx, j] = T.cast(vs[j], out_dtype)

    return cast_kernel
