"""What the Ascend engram kernels share (build time only): tilebake.torch.engram.sum_partials'
fixed-order sum of (P, columns) partial rows, a chunk of CHUNK columns at a time."""

import tilelang.ascend.language as T

from tilebake.torch.engram import PARTIAL_GROUPS

CHUNK = 2048
THREADS = 128  # SIMT threads, each over every THREADS-th column of a chunk
STEPS = CHUNK // THREADS


def partial_rows_summer(parts):
    """A macro (P, ps, acc, c0): acc[g, :] = the sum of P's rows g, g + PARTIAL_GROUPS, ... in row
    order over columns c0 .. c0 + CHUNK (ps: a row's staging buffer). parts: the kernel's own row
    count, closed over (a macro argument would rename it)."""

    @T.macro
    def sum_rows(P, ps, acc, c0):
        with T.SimtVF(threads=THREADS):
            t = T.get_thread_binding()
            for q in T.serial(STEPS):
                for g in T.serial(PARTIAL_GROUPS):
                    acc[g, q * THREADS + t] = T.float32(0)
        for p in T.serial(parts):
            T.copy(P[p, c0 : c0 + CHUNK], ps)
            with T.SimtVF(threads=THREADS):
                t = T.get_thread_binding()
                for q in T.serial(STEPS):
                    j = q * THREADS + t
                    acc[p % PARTIAL_GROUPS, j] = acc[p % PARTIAL_GROUPS, j] + ps[j]

    return sum_rows


@T.macro
def add_accumulators(acc, j, total: T.Ref):
    """total = acc[0, j] + acc[1, j] + ... in accumulator order (inside a SIMT function)."""
    total = acc[0, j]
    for g in T.serial(PARTIAL_GROUPS - 1):
        total = total + acc[g + 1, j]
