"""mhc_multilayer_recompute, as a TileLang factory (build time only): up to LMAX layers a launch
(num_layers of them, the post step for the first num_post), m (up to the variant's max_mult,
whose register arrays it sizes) and every size at run time.

A thread an 8-column vector of a token (grid: tokens x column blocks, flattened), its m residual
vectors in registers from the initial read to the chunk's last layer; the layers unroll at build
time, each guarded by num_layers / num_post. A layer's pre step is
kernels_tl/mhc/mhc_pre_apply_mix.py's forward (o = mix[0] r[0], then + mix[i] r[i] in order, every
product and sum rounded on its own), its post step kernels_tl/mhc/mhc_post.py's (out[o] = post[o]
x, then + comb[i, o] r[i] in order, each term by a fused multiply-add: H200 session 11, 2884-2889
us against 3213-3214 for 10 layers at 8192 x 8192 with every product rounded; fusing the pre step's
too gained nothing in mhc_pre_apply_mix), each rounded to bf16 once. The next layer reads the
rounded post output, as the chain of those kernels does, so the results are theirs bit for bit.
DRAM traffic: the initial residual, then a layer's output read and its input and residual written;
the mixes go through shared memory.
"""

import tilelang.language as T
from tvm.script.ir_builder import tirx as ir

from tilebake.mhc._common import VEC
from tilebake.mhc.mhc_multilayer_recompute import LAYER_PARAMS, LMAX, MhcMultilayerRecomputeVariant

THREADS = 128
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # whole vectors: the host checks hidden % VEC
# CTAs an SM asked of ptxas, by max_mult: 5 holds m <= 4 to 96 registers without spills (20 warps
# an SM rather than 16); m <= 8 needs about 168.
MIN_CTAS = {4: 5, 8: 1}


def _widen_pair(buf, index: tuple, k):
    """buf[*index, 2k] and buf[*index, 2k + 1] (bf16) as fp32, from their 32-bit word: the low one
    shifted up, the high one masked (an instruction each; a cast of the high one extracts its 16
    bits first, one more: 4% of the kernel's instructions)."""
    word = T.reinterpret("uint32", T.BufferLoad(buf, [*index, T.Ramp(2 * k, 1, 2)]))
    return (T.reinterpret("float32", T.shift_left(word, T.uint32(16))),
            T.reinterpret("float32", T.bitwise_and(word, T.uint32(0xFFFF0000))))


def build(v: MhcMultilayerRecomputeVariant):
    return _kernel(v.max_mult, v.exact)


def _kernel(MAX_M, EXACT):
    n = T.dynamic("num_tokens")
    mhc_mult = T.dynamic("mhc_mult")  # R0's layout (the host passes m == MAX_M to an exact variant)
    # The loops' stream count: for an exact variant the constant MAX_M (no run-time guards, the
    # mixes' shared-memory offsets immediates: 17% fewer instructions at m = 4)
    m = MAX_M if EXACT else mhc_mult
    h = T.dynamic("hidden")
    LAYERS = tuple(range(LMAX))  # a Python tuple: the layer loops unroll as the kernel is built
    # A layer's mixes in shared memory: pre[MAX_M], post[MAX_M], comb[i * m + o] (as in DRAM; the
    # addresses are i * m, computed once, plus constants)
    POST_AT, COMB_AT, MIXES = MAX_M, 2 * MAX_M, (2 + MAX_M) * MAX_M
    assert MAX_M * MAX_M <= THREADS  # one comb entry a thread

    @T.prim_func
    def mhc_multilayer_recompute_kernel(
        R0: T.Tensor((n, mhc_mult, h), "bfloat16"),
        num_layers: T.int32,
        num_post: T.int32,
    ):
        # A layer's tensors: separate parameters, named as LAYER_PARAMS with the layer's index
        # (COMB flat: the same memory as (n, m, m)). T.prim_func takes its parameters from the
        # signature; the IR builder's arg() (what it calls for each of those) adds these 6 * LMAX.
        shapes = {"PRE": ((n, m), "float32"), "LO": ((n, h), "bfloat16"), "POST": ((n, m), "float32"),
                  "COMB": ((n, m * m), "float32"), "LI": ((n, h), "bfloat16"),
                  "RL": ((n, m, h), "bfloat16")}  # fmt: skip
        PRE, LO, POST, COMB, LI, RL = (
            [ir.arg(f"{name}{l}", T.Tensor(*shapes[name])) for l in LAYERS] for name in LAYER_PARAMS
        )
        # One dimension, a token's column blocks adjacent: they run together, so the token's mixes
        # come from DRAM once (then L2) and its rows are read and written as whole runs (H200
        # session 12 call 3, 10 layers at 8192 x 8192: 2595-2604 us against 2734 token-major;
        # mhc_post / pre_apply_mix forwards lost 3-9% so, and stay token-major).
        with T.Kernel(n * T.ceildiv(h, THREADS * VEC), threads=THREADS) as w:
            T.annotate_min_blocks_per_sm(MIN_CTAS[MAX_M])
            tx = T.get_thread_binding(0)
            t = T.alloc_var("int32")
            t = w // T.ceildiv(h, THREADS * VEC)
            T.assume(h % VEC == 0)
            mix = T.alloc_shared((LMAX, MIXES), "float32")
            rs = T.alloc_local((2, MAX_M, VEC), "bfloat16")  # layer l reads rs[l % 2], its post writes rs[1 - l % 2]
            xs = T.alloc_local((2, VEC), "bfloat16")  # layer l's output in xs[l % 2], the next one's on its way
            rf = T.alloc_local((MAX_M, VEC), "float32")  # the layer's residual, converted once
            xf = T.alloc_local((VEC,), "float32")
            acc = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "bfloat16")
            # The thread's vector, a variable: its columns vec * VEC + j then stay one 32-bit term
            # of the addresses (TileLang widens each term of (b * THREADS + tx) * VEC to 64 bits,
            # and nvcc then splits each 16-byte store into four 4-byte ones).
            vec = T.alloc_var("int32")
            vec = (w - t * T.ceildiv(h, THREADS * VEC)) * THREADS + tx
            if vec * VEC < h:  # the first reads in flight while the mixes are staged
                for i in T.unroll(MAX_M):
                    if i < m:
                        for j in T.vectorized(VEC):
                            rs[0, i, j] = R0[t, i, vec * VEC + j]
                if num_post > 0:
                    for j in T.vectorized(VEC):
                        xs[0, j] = LO[0][t, vec * VEC + j]
            # Every layer's mixes of the token at once, one latency rather than one a layer: all
            # loads into registers first, then the stores to shared memory (a load stored in its
            # own guarded block made nvcc wait for each before the next: 20 round trips a CTA,
            # 2644-2649 us against 2237-2242 for 10 layers at 8192 x 8192, H200 session 13).
            staged = T.alloc_local((LMAX, 3), "float32")
            for l in LAYERS:
                if l < num_layers:
                    if tx < m:
                        staged[l, 0] = PRE[l][t, tx]
                if l < num_post:
                    if tx < m:
                        staged[l, 1] = POST[l][t, tx]
                    if tx < m * m:
                        staged[l, 2] = COMB[l][t, tx]
            for l in LAYERS:
                if l < num_layers:
                    if tx < m:
                        mix[l, tx] = staged[l, 0]
                if l < num_post:
                    if tx < m:
                        mix[l, POST_AT + tx] = staged[l, 1]
                    if tx < m * m:
                        mix[l, COMB_AT + tx] = staged[l, 2]
            T.sync_threads()
            if vec * VEC < h:
                for l in LAYERS:
                    p = l % 2
                    if l + 1 < LMAX:
                        if l + 1 < num_post:  # the next layer's output read under this layer's work
                            for j in T.vectorized(VEC):
                                xs[1 - p, j] = LO[l + 1][t, vec * VEC + j]
                    if l < num_layers:  # the pre step
                        for i in T.unroll(MAX_M):
                            if i < m:
                                for k in T.unroll(VEC // 2):
                                    rf[i, 2 * k], rf[i, 2 * k + 1] = _widen_pair(rs, (p, i), k)
                        for j in T.unroll(VEC):
                            acc[j] = T.ieee_mul(mix[l, 0], rf[0, j])
                        for i in T.unroll(MAX_M - 1):
                            if i + 1 < m:
                                for j in T.unroll(VEC):
                                    acc[j] = T.ieee_add(acc[j], T.ieee_mul(mix[l, i + 1], rf[i + 1, j]))
                        for j in T.unroll(VEC):
                            ys[j] = T.cast(acc[j], "bfloat16")
                        for j in T.vectorized(VEC):
                            LI[l][t, vec * VEC + j] = ys[j]
                    if l < num_post:  # the post step (num_post <= num_layers: rf is the residual's)
                        for k in T.unroll(VEC // 2):
                            xf[2 * k], xf[2 * k + 1] = _widen_pair(xs, (p,), k)
                        for o in T.unroll(MAX_M):
                            if o < m:
                                for j in T.unroll(VEC):
                                    acc[j] = T.ieee_mul(mix[l, POST_AT + o], xf[j])
                                for i in T.unroll(MAX_M):
                                    if i < m:
                                        comb = mix[l, COMB_AT + i * m + o]
                                        for j in T.unroll(VEC):
                                            acc[j] = T.ieee_fmaf(comb, rf[i, j], acc[j])
                                for j in T.unroll(VEC):
                                    rs[1 - p, o, j] = T.cast(acc[j], "bfloat16")
                                for j in T.vectorized(VEC):
                                    RL[l][t, o, vec * VEC + j] = rs[1 - p, o, j]

    return mhc_multilayer_recompute_kernel
