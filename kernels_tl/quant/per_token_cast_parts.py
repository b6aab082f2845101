"""Pieces of the per_token_cast kernels shared by the hot kernel (per_token_cast.py) and the
runtime-SF kernels (per_token_cast_runtime_sf.py): the launch config and the row-tile load.
Build time only; a module of their own so neither kernel module imports the other's.
"""

import dataclasses

import tilelang.language as T


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int = 256
    threads_per_row: int = 64  # x 16 B = input bytes per row per pass
    rows_per_thread: int = 4  # independent 16-byte loads in flight per thread
    elems_per_thread: int = 0  # contiguous elements a thread owns per row; 0: one 16-byte vector


@T.macro
def load_row_tiles(xs, X, bx, by, tx, col, num_tokens, hidden, cfg, x_vec, x_cols_per_cta):
    """xs[u, :] = this thread's x_vec storage elements (one 16-byte vector) of row
    bx * rows_per_cta + u * rows_per_pass + tx // threads_per_row, for u < rows_per_thread, all
    issued before any is used; zeros where the row or the logical column `col` is outside X.
    x_cols_per_cta: the CTA's columns in storage elements."""
    rows_per_pass = cfg.threads // cfg.threads_per_row
    for u in T.unroll(cfg.rows_per_thread):
        row = bx * (rows_per_pass * cfg.rows_per_thread) + u * rows_per_pass + tx // cfg.threads_per_row
        if row < num_tokens and col < hidden:
            for j in T.vectorized(x_vec):
                # The column spelled out: the vectorizer must see that it is a multiple of x_vec.
                xs[u, j] = X[row, by * x_cols_per_cta + (tx % cfg.threads_per_row) * x_vec + j]
        else:
            for j in T.vectorized(x_vec):
                xs[u, j] = T.cast(0, xs.dtype)
