"""cast with stochastic rounding (SR): fp32 -> bf16, fp32 -> e4m3, bf16 -> e4m3, as a TileLang factory.

Build time only. The tensor is flat (numel % 4 == 0); each thread owns `groups_per_thread` groups
of 4 consecutive elements, group g of a CTA at g * threads + tx so that a warp's accesses are
consecutive. Random bits: sr_random_bits(fp32 bits of the input, flat index); rounding:
sr_float32_to_bfloat16_bits / sr_float32_to_e4m3_bits (kernels_tl/quant/common.py), integer
arithmetic only, so sm_90a and sm_100a give the same bytes. Round-to-nearest pairs use torch.
"""

import dataclasses

import tilelang.language as T

from kernels_tl.quant.common import sr_float32_to_bfloat16_bits, sr_float32_to_e4m3_bits, sr_random_bits_into
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
    in_dtype = {"bf16": "bfloat16", "fp32": "float32"}[v.in_dtype]
    to_bf16 = v.out_dtype == "bf16"
    out_dtype = "uint16" if to_bf16 else "uint8"  # the bit patterns; same storage as bf16 / e4m3
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
            h = T.alloc_local((1,), "uint32")
            for k in T.unroll(G):
                g = b * groups_per_cta + k * THREADS + tx
                if g < num_groups:
                    for j in T.vectorized(4):
                        xs[k, j] = X[b * groups_per_cta + k * THREADS + tx, j]
            for k in T.unroll(G):
                g = b * groups_per_cta + k * THREADS + tx
                if g < num_groups:
                    for j in T.unroll(4):
                        x = T.cast(xs[k, j], "float32")
                        sr_random_bits_into(
                            h, T.reinterpret(x, "uint32"), (b * groups_per_cta + k * THREADS + tx) * 4 + j
                        )
                        r = h[0]
                        if to_bf16:
                            ys[j] = T.cast(sr_float32_to_bfloat16_bits(x, r), out_dtype)
                        else:
                            ys[j] = T.cast(sr_float32_to_e4m3_bits(x, r), out_dtype)
                    for j in T.vectorized(4):
                        Y[b * groups_per_cta + k * THREADS + tx, j] = ys[j]

    return cast_kernel
