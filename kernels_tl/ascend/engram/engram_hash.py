"""engram_hash for Ascend 950 (build time only), read from
tilebake.engram.engram_hash.EngramHashAscendVariant: the arithmetic of the CUDA kernel
(kernels_tl/engram/engram_hash.py): per (layer l, token t, table m), h = id_0 * mul_0, then for
each order i = 1 .. N-1 h ^= id_i * mul_i (64-bit, wrapping) and the index (h mod vocab[l, i-1,
m], non-negative as Python's modulo) + offsets[l, (i-1) M + m], or -1 for an image token or a
non-positive table size.

A block per vector core, each taking steps core, core + num_vec_cores, ... of THREADS items
(l, t, m); a SIMT thread an item, reading its ids, multipliers, sizes and offsets from GM and
writing its N - 1 indices to GM (scattered: the SIMT threads' own loads and stores). Built and
lowered here, never run on an NPU: checked on the CPU by tests/ascend/test_emulated_engram.py.
"""

import tilelang.ascend.language as T

from tilebake.engram.engram_hash import EngramHashAscendVariant

THREADS = 128


def build(v: EngramHashAscendVariant):
    num_tokens = T.dynamic("num_tokens")
    ngram = T.dynamic("max_ngram_size")  # N
    layers = T.dynamic("num_layers")  # L
    tables = T.dynamic("num_tables")  # M
    CORES = v.num_vec_cores

    @T.prim_func
    def engram_hash_kernel(
        IDS: T.Tensor((num_tokens, ngram), "int32"),
        MUL: T.Tensor((layers, ngram), "int64"),
        VOC: T.Tensor((layers, ngram - 1, tables), "int32"),
        OFF: T.Tensor((layers, (ngram - 1) * tables), "int32"),
        MASK: T.Tensor((num_tokens,), "uint8"),
        OUT: T.Tensor((layers, num_tokens, (ngram - 1) * tables), "int32"),
        has_mask: T.int32,
    ):
        with T.Kernel(CORES) as core:
            items = layers * num_tokens * tables
            for s in T.serial(T.ceildiv(T.ceildiv(items, THREADS) - core, CORES)):
                with T.SimtVF(threads=THREADS):
                    tx = T.get_thread_binding()
                    i = T.alloc_var("int32")
                    h = T.alloc_var("uint64")
                    size = T.alloc_var("int64")
                    r = T.alloc_var("int64")
                    masked = T.alloc_var("int32")
                    i = (core + s * CORES) * THREADS + tx
                    if i < items:
                        m = i % tables
                        t = (i // tables) % num_tokens
                        l = i // tables // num_tokens
                        masked = 0
                        if has_mask != 0:
                            masked = T.if_then_else(MASK[t] != T.uint8(0), 1, 0)
                        h = T.cast(T.cast(IDS[t, 0], "int64"), "uint64") * T.cast(MUL[l, 0], "uint64")
                        for n in T.serial(ngram - 1):
                            h = h ^ (T.cast(T.cast(IDS[t, n + 1], "int64"), "uint64") * T.cast(MUL[l, n + 1], "uint64"))
                            size = T.cast(VOC[l, n, m], "int64")
                            if masked != 0 or size <= 0:
                                OUT[l, t, n * tables + m] = -1
                            else:
                                r = T.reinterpret(h, "int64") % size
                                if r < 0:
                                    r = r + size
                                OUT[l, t, n * tables + m] = T.cast(r, "int32") + OFF[l, n * tables + m]

    return engram_hash_kernel
