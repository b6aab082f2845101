"""mhc_head_compute_mix_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_head_compute_mix.MhcHeadComputeMixAscendVariant.

fwd: out[t, i] = 1 / (1 + exp(-(x[t, i] * scale + base[i]))) + eps
(tilebake.torch.mhc.mhc_head_compute_mix_ref; the exponential the one thing not bit-exact). A SIMT
thread a (token, stream) item, on GM: a block per vector core, each taking steps core, core +
num_vec_cores, ... of THREADS items.
bwd: gy = g s (1 - s) with s recomputed, x_grad = gy * scale; partial row b sums the tokens
[b ceil(T / P), ...) (the CUDA kernel's split): base_p[b, i] = the sum of gy[t, i] over them in
token order, scale_p[b] = the sum over the streams in order of each stream's sum of gy x. A vector
core the rows core, core + num_vec_cores, ...; a SIMT thread a stream, on GM (the sums kept in
the unified buffer; the token walk common.partial_row_summer's). Built and lowered here, never
run on an NPU: checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.mhc.common import partial_row_summer
from tilebake.mhc._common import MAX_MHC_MULT
from tilebake.mhc.mhc_head_compute_mix import MhcHeadComputeMixAscendVariant

THREADS = 128


def build(v: MhcHeadComputeMixAscendVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    CORES = v.num_vec_cores
    if v.direction == "bwd":
        return _backward(n, m, CORES)

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


@T.macro
def _gradient(t, i, y: T.Ref, gy: T.Ref, s: T.Ref, prod: T.Ref, G):
    """gy = G[t, i] s (1 - s), s the sigmoid of y."""
    s = T.float32(1) / (T.float32(1) + T.exp(-y))
    prod = T.float32(1) - s
    prod = s * prod
    gy = G[t, i] * prod  # noqa: F841 (a store through the T.Ref)


def _backward(n, m, CORES):
    M = MAX_MHC_MULT
    parts = T.dynamic("num_partials")
    sum_row = partial_row_summer(M, _gradient)

    @T.prim_func
    def mhc_head_compute_mix_bwd_kernel(
        G: T.Tensor((n, m), "float32"),
        X: T.Tensor((n, m), "float32"),
        SCALE: T.Tensor((1,), "float32"),
        BASE: T.Tensor((m,), "float32"),
        XG: T.Tensor((n, m), "float32"),
        SP: T.Tensor((parts, 1), "float32"),
        BP: T.Tensor((parts, m), "float32"),
    ):
        with T.Kernel(CORES) as core:
            sums = T.alloc_shared((2, M), "float32")  # a stream's base and scale sums
            per = T.ceildiv(n, parts)
            for r in T.serial(T.ceildiv(parts - core, CORES)):
                b = core + r * CORES
                sum_row(b, per, X, XG, SCALE, BASE, sums, G)
                with T.SimtVF(threads=M):  # the row: streams in order
                    i = T.get_thread_binding()
                    acc = T.alloc_var("float32")
                    if i < m:
                        BP[b, i] = sums[0, i]
                    if i == 0:
                        acc = sums[1, 0]
                        for j in T.serial(m - 1):
                            acc = acc + sums[1, j + 1]
                        SP[b, 0] = acc

    return mhc_head_compute_mix_bwd_kernel
