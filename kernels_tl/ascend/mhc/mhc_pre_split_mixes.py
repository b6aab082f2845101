"""mhc_pre_split_mixes_fwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_pre_split_mixes.MhcPreSplitMixesAscendVariant: per token, y = mixes * scale[segment]
+ base over the m (m + 2) columns; pre = 1 / (1 + exp(-y[:m])) + eps, post = 1 / (1 + exp(-y[m:2m]))
* post_mult, comb = y[2m:] (tilebake.torch.mhc.mhc_pre_split_mixes_ref; the exponential the one
thing not bit-exact). A SIMT thread a (token, column) item, on GM: a block per vector core, each
taking steps core, core + num_vec_cores, ... of THREADS items. Built and lowered here, never run
on an NPU: checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from tilebake.mhc.mhc_pre_split_mixes import MhcPreSplitMixesAscendVariant

THREADS = 128


def build(v: MhcPreSplitMixesAscendVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    cols = T.dynamic("mix_cols")  # m (m + 2)
    CORES = v.num_vec_cores

    @T.prim_func
    def mhc_pre_split_mixes_fwd_kernel(
        MIX: T.Tensor((n, cols), "float32"),
        SCALE: T.Tensor((3,), "float32"),
        BASE: T.Tensor((cols,), "float32"),
        PRE: T.Tensor((n, m), "float32"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m * m), "float32"),
        post_mult: T.float32,
        pre_eps: T.float32,
    ):
        with T.Kernel(CORES) as core:
            for r in T.serial(T.ceildiv(T.ceildiv(n * cols, THREADS) - core, CORES)):
                with T.SimtVF(threads=THREADS):
                    i = (core + r * CORES) * THREADS + T.get_thread_binding()
                    y = T.alloc_var("float32")
                    if i < n * cols:
                        t = i // cols
                        c = i % cols
                        y = MIX[t, c] * SCALE[T.if_then_else(c < m, 0, T.if_then_else(c < 2 * m, 1, 2))] + BASE[c]
                        if c < m:
                            PRE[t, c] = T.float32(1) / (T.float32(1) + T.exp(-y)) + pre_eps
                        elif c < 2 * m:
                            POST[t, c - m] = T.float32(1) / (T.float32(1) + T.exp(-y)) * post_mult
                        else:
                            COMB[t, c - 2 * m] = y

    return mhc_pre_split_mixes_fwd_kernel
