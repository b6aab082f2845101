"""What the Ascend norm kernels share (build time only): the row pass of norm_forward and of
norm_forward_and_per_token_cast that adds the residual and takes the row's rstd."""

import tilelang.ascend.language as T

PARTS = 64  # threads of the row's passes (and partial sums)


def row_rstd(dtype: str, has_residual: bool, h):
    """A macro (xs, rs, part, rstd, eps): the row xs (h values of dtype in the unified buffer; h the
    kernel's dynamic hidden size, closed over so the kernel's parameter keeps its name)
    becomes norm_input = xs + rs rounded to dtype (with has_residual), and rstd[0] =
    rsqrt(sum(norm_input^2) / h + eps): PARTS threads each summing the squares of every PARTS-th
    column into part, then one thread adding the PARTS sums in order."""

    @T.macro
    def rstd_of_row(xs, rs, part, rstd, eps):
        with T.SimtVF(threads=PARTS):
            t = T.get_thread_binding()
            s = T.alloc_var("float32")
            s = T.float32(0)
            for k in T.serial(T.ceildiv(h - t, PARTS)):
                c = t + k * PARTS
                if has_residual:  # norm_input, rounded to x's dtype
                    xs[c] = T.cast(T.cast(xs[c], "float32") + T.cast(rs[c], "float32"), dtype)
                val = T.cast(xs[c], "float32")
                s = s + val * val
            part[t] = s
        with T.SimtVF(threads=1):
            total = T.alloc_var("float32")
            total = T.float32(0)
            for k in T.serial(PARTS):
                total = total + part[k]
            rstd[0] = T.rsqrt(total / T.cast(h, "float32") + eps)

    return rstd_of_row
