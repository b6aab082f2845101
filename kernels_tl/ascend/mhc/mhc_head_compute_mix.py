"""mhc_head_compute_mix_fwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_head_compute_mix.MhcHeadComputeMixAscendVariant: out[t, i] = 1 / (1 + exp(-(x[t, i]
* scale + base[i]))) + eps (tilebake.torch.mhc.mhc_head_compute_mix_ref; the exponential the one
thing not bit-exact). A SIMT thread a (token, stream) item, on GM: a block per vector core, each
taking steps core, core + num_vec_cores, ... of THREADS items. Built and lowered here, never run
on an NPU: checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from tilebake.mhc.mhc_head_compute_mix import MhcHeadComputeMixAscendVariant

THREADS = 128


def build(v: MhcHeadComputeMixAscendVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    CORES = v.num_vec_cores

    @T.prim_func
    def mhc_head_compute_mix_fwd_kernel(
        X: T.Tensor((n, m), "float32"),
        SCALE: T.Tensor((1,), "float32"),
        BASE: T.Tensor((m,), "float32"),
        OUT: T.Tensor((n, m), "float32"),
        pre_eps: T.float32,
    ):
        with T.Kernel(CORES) as core:
            for r in T.serial(T.ceildiv(T.ceildiv(n * m, THREADS) - core, CORES)):
                with T.SimtVF(threads=THREADS):
                    i = (core + r * CORES) * THREADS + T.get_thread_binding()
                    y = T.alloc_var("float32")
                    if i < n * m:
                        y = X[i // m, i % m] * SCALE[0] + BASE[i % m]
                        OUT[i // m, i % m] = T.float32(1) / (T.float32(1) + T.exp(-y)) + pre_eps

    return mhc_head_compute_mix_fwd_kernel
