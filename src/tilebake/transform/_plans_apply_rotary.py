"""The call plan (tilebake/_runtime/plan.py) of apply_rotary: its kernel path for one call key
(dtype, rank, rot_dim, key and positions given or not, the flags; seqlen_offset 0): the same
checks as apply_rotary._launch (or stricter: those calls take the Python path, which also
decides about the torch path), the same kernel arguments, and the version bumps of the
rotated tensors."""

from __future__ import annotations

import torch

from tilebake._runtime import plan
from tilebake.transform.apply_rotary import POS_INT32, POS_INT64, POS_NONE

_INT32_MAX = 2**31 - 1


def rotary_plan(kernel, device, dtype, ndim: int, rot: int, has_key: bool, pos_dtype, interleaved, conjugate):
    """apply_rotary(query, cos_sin_cache, key, positions, interleaved, conjugate, 0): run(plan,
    query, cos_sin_cache, key, positions). pos_dtype: positions' dtype, or None."""
    vec = 16 // dtype.itemsize  # the kernel's 16-byte vectors
    lead = ("T",) if ndim == 3 else ("B", "S")
    b = plan.Builder()
    if ndim == 3:
        b.let("B", 1)

    def rows(arg, heads, name):  # query / key: lead + (heads, rot), 16-byte aligned
        dims = ("t",) if ndim == 3 else ("b", "s")
        strides = (*(f"{name}_{d}" for d in dims), f"{name}_h", f"{name}_r")
        t = b.tensor(arg, dtype, (*lead, heads, rot), strides=strides, align=16)
        b.check(f"{name}_r == 1")
        # the kernel's (batch, token, head) strides: 0 for a dim of size 1 (apply_rotary._strides)
        b.let(f"{name}_bs", 0 if ndim == 3 else f"(B > 1) * {name}_b")
        b.let(f"{name}_ts", f"(T > 1) * {name}_t" if ndim == 3 else f"(S > 1) * {name}_s")
        b.let(f"{name}_hs", f"({heads} > 1) * {name}_h")
        b.check(" and ".join(f"{name}_{s} % {vec} == 0 and {name}_{s} <= {_INT32_MAX}" for s in ("bs", "ts", "hs")))
        return t

    q = rows(0, "QH", "q")
    b.let("L", "T" if ndim == 3 else "B * S")
    b.check(f"L >= 1 and QH >= 1 and L <= {_INT32_MAX - 4}")
    cache = b.tensor(1, torch.float32, ("P", rot), strides=("c_s", "c_r"), align=16)
    b.check(f"c_r == 1 and P <= {_INT32_MAX}")
    b.let("cs", "(P > 1) * c_s")
    b.check(f"cs % 4 == 0 and cs <= {_INT32_MAX}")
    if has_key:
        k = rows(2, "KH", "k")
    else:
        k = q
        for s, v in (("KH", 0), ("k_bs", 0), ("k_ts", 0), ("k_hs", 0)):
            b.let(s, v)
    if pos_dtype is None:
        pos, pos_kind = cache, POS_NONE  # a valid dummy, never read
        b.let("p_bs", 0)
        b.let("p_ts", 0)
    else:
        pos_kind = POS_INT32 if pos_dtype == torch.int32 else POS_INT64
        strides = ("p_t",) if ndim == 3 else ("p_b", "p_s")
        pos = b.tensor(3, pos_dtype, lead, strides=strides, align=pos_dtype.itemsize)
        b.let("p_bs", 0 if ndim == 3 else "(B > 1) * p_b")
        b.let("p_ts", "(T > 1) * p_t" if ndim == 3 else "(S > 1) * p_s")
        b.check(f"p_bs <= {_INT32_MAX} and p_ts <= {_INT32_MAX}")
    b.launch(
        kernel, device, Q=q, K=k, C=cache, P32=pos, P64=pos, pos_kind=pos_kind, seqlen_offset=0,
        interleaved=int(interleaved), conjugate=int(conjugate), batch="B", seqlen="T" if ndim == 3 else "S",
        q_heads="QH", k_heads="KH", cache_rows="P", q_batch_stride="q_bs", q_token_stride="q_ts",
        q_head_stride="q_hs", k_batch_stride="k_bs", k_token_stride="k_ts", k_head_stride="k_hs",
        cache_stride="cs", pos_batch_stride="p_bs", pos_token_stride="p_ts",
    )  # fmt: skip
    b.bump(q)
    if has_key:
        b.bump(k)
    b.returns(None)
    return b.build()
