"""engram_hash: n-gram hash embedding indices, as a TileLang factory (build time only).

One thread per (layer l, token t, table m): h = id_0 * mul_0, then for each order
i = 1 .. N-1 h ^= id_i * mul_i (64-bit, wrapping: unsigned arithmetic) and the index
(h mod vocab[l, i-1, m], non-negative as Python's modulo) + offsets[l, (i-1) M + m], or -1 for
an image token (has_mask and MASK[t] != 0) or a non-positive table size. Each thread redoes the
cheap XOR chain and takes only its table's modulos (64-bit divisions are the cost). N, L and M
are runtime sizes (the original compiles them in). Inputs and the output are contiguous.
"""

import tilelang.language as T

from tilebake.engram.engram_hash import EngramHashVariant

THREADS = 128


def build(v: EngramHashVariant):
    num_tokens = T.dynamic("num_tokens")
    ngram = T.dynamic("max_ngram_size")  # N
    layers = T.dynamic("num_layers")  # L
    tables = T.dynamic("num_tables")  # M

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
        with T.Kernel(T.ceildiv(layers * num_tokens * tables, THREADS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            i = T.alloc_var("int32")
            i = b * THREADS + tx
            if i < layers * num_tokens * tables:
                l = T.alloc_var("int32")
                t = T.alloc_var("int32")
                m = T.alloc_var("int32")
                m = i % tables
                t = (i // tables) % num_tokens
                l = i // tables // num_tokens
                h = T.alloc_var("uint64")
                size = T.alloc_var("int64")
                r = T.alloc_var("int64")
                masked = T.alloc_var("int32")
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
