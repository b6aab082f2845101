"""apply_rotary: in-place rotary position embedding (RoPE) of query and optional key.

Validate, launch. The kernel is kernels_tl/transform/apply_rotary.py (query and key in one
launch); the reference (and the CPU path) is tilebake.torch.rotary_embedding_ref, which
computes the same fp32 operations in the same order, so results are bit-identical.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Optional

import torch

from tilebake._checks import check_device
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, i64, ptr
from tilebake.utils import FLOAT_FORMATS

ROT_DIMS = (64, 128)
_INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class ApplyRotaryVariant(Variant):
    family = "transform"
    op = "apply_rotary"
    PARAMS = (
        ptr("Q", "K", "C", "P32", "P64")
        + i32("pos_kind")
        + i64("seqlen_offset")
        + i32(
            "interleaved", "conjugate", "batch", "seqlen", "q_heads", "k_heads", "cache_rows", "q_batch_stride",
            "q_token_stride", "q_head_stride", "k_batch_stride", "k_token_stride", "k_head_stride", "cache_stride",
            "pos_batch_stride", "pos_token_stride"
        )
    )  # fmt: skip

    dtype: str  # query/key: 'bf16' | 'fp32'
    rot_dim: int  # 64 | 128; NeoX/interleaved, conjugate, positions (none/int32/int64) are runtime

    @classmethod
    def all(cls):
        return tuple(cls(*k) for k in itertools.product(FLOAT_FORMATS.values(), ROT_DIMS))


@dataclasses.dataclass(frozen=True)
class ApplyRotaryAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/transform/apply_rotary.py): contiguous query and
    key of at most MAX_ASCEND_ROW elements a token; the tokens' cache rows gathered by torch."""

    family = "transform"
    op = "apply_rotary"
    backend = "ascend"
    PARAMS = ptr("Q", "K", "G", "F") + i32("num_tokens", "q_heads", "k_heads", "interleaved", "conjugate")

    dtype: str  # 'bf16' | 'fp32'
    rot_dim: int
    num_vec_cores: int

    @classmethod
    def all(cls):
        keys = itertools.product(FLOAT_FORMATS.values(), ROT_DIMS, ASCEND_VEC_CORES)
        return tuple(cls(*k) for k in keys)


MAX_ASCEND_ROW = 16384  # heads x rot_dim of one token the Ascend kernel holds (64 KiB of fp32)
_KERNELS = KernelTable(ApplyRotaryVariant)
POS_NONE, POS_INT32, POS_INT64 = 0, 1, 2  # the kernel's pos_kind


def _check_rows(t, name: str, query: torch.Tensor) -> None:
    if t.device != query.device:
        raise ValueError(f"{name} must be on {query.device} (as query), got {t.device}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def _check(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset) -> None:
    if not isinstance(query, torch.Tensor):
        raise TypeError(f"query must be a torch.Tensor, got {type(query).__name__}")
    if query.dtype not in FLOAT_FORMATS:
        raise TypeError(f"query must be torch.bfloat16 or torch.float32, got {query.dtype}")
    if query.dim() not in (3, 4):
        raise ValueError(f"query must be [T, H, rot_dim] or [B, S, H, rot_dim], got shape {tuple(query.shape)}")
    check_device(query, "query")
    rot = query.shape[-1]
    if rot not in ROT_DIMS:
        raise ValueError(
            f"query.shape[-1] (rot_dim) must be one of {ROT_DIMS}, got {rot} "
            "(for a partial rotation pass the rotated slice, e.g. query[..., -rot_dim:])"
        )
    _check_rows(query, "query", query)
    lead = tuple(query.shape[:-2])
    if not isinstance(cos_sin_cache, torch.Tensor):
        raise TypeError(f"cos_sin_cache must be a torch.Tensor, got {type(cos_sin_cache).__name__}")
    if cos_sin_cache.dtype != torch.float32:
        raise TypeError(f"cos_sin_cache must be torch.float32, got {cos_sin_cache.dtype}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rot:
        raise ValueError(
            f"cos_sin_cache must be [max_positions, {rot}] ([cos | sin] halves, rot_dim of query), "
            f"got shape {tuple(cos_sin_cache.shape)}"
        )
    _check_rows(cos_sin_cache, "cos_sin_cache", query)
    if key is not None:
        if not isinstance(key, torch.Tensor):
            raise TypeError(f"key must be a torch.Tensor or None, got {type(key).__name__}")
        if key.dtype != query.dtype:
            raise TypeError(f"key must have query's dtype {query.dtype}, got {key.dtype}")
        if key.dim() != query.dim() or tuple(key.shape[:-2]) != lead or key.shape[-1] != rot:
            raise ValueError(
                f"key must be {lead} + (heads, {rot}) like query (any head count), got shape {tuple(key.shape)}"
            )
        _check_rows(key, "key", query)
    if positions is not None:
        if not isinstance(positions, torch.Tensor):
            raise TypeError(f"positions must be a torch.Tensor or None, got {type(positions).__name__}")
        if positions.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"positions must be torch.int32 or torch.int64, got {positions.dtype}")
        if tuple(positions.shape) != lead:
            raise ValueError(f"positions must have shape {lead} (query's tokens), got {tuple(positions.shape)}")
        if positions.device != query.device:
            raise ValueError(f"positions must be on {query.device} (as query), got {positions.device}")
    for name, flag in (("interleaved", interleaved), ("conjugate", conjugate)):
        if not isinstance(flag, int):  # bool, or an int used as one
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    # A Python (or numpy) integer; a tensor would need a device sync to read.
    if isinstance(seqlen_offset, (bool, torch.Tensor)) or not hasattr(seqlen_offset, "__index__"):
        raise TypeError(f"seqlen_offset must be a Python int, got {type(seqlen_offset).__name__}")
    if not -(2**63) <= operator.index(seqlen_offset) < 2**63:
        raise ValueError(f"seqlen_offset must fit in int64, got {seqlen_offset}")


def apply_rotary(
    query: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    key: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    conjugate: bool = False,
    seqlen_offset: int = 0,
) -> None:
    """Rotate query (and key) in place by the rotary position embedding.

    Args:
        query: [T, H, rot_dim] or [B, S, H, rot_dim], bf16 or fp32, rot_dim 64 or 128, the last
            dim contiguous; any strides for the token and head dims (views of a fused QKV
            buffer are fine). For a partial rotation pass the rotated slice (query[..., -rot:]).
        cos_sin_cache: fp32 [max_positions, rot_dim]: row p = [cos(p f_i) | sin(p f_i)], i < rot_dim/2.
        key: optional, query's dtype and leading dims ([T] or [B, S]), any head count; rotated
            with the same rows. Must not overlap query.
        positions: optional int32/int64 [T] or [B, S]: the cache row of each token is
            positions + seqlen_offset; without it the token's index (within its sequence for
            [B, S, H, rot_dim]) + seqlen_offset.
        interleaved: GPT-J pairs (2i, 2i + 1) instead of NeoX halves (i, rot_dim/2 + i).
        conjugate: rotate by the inverse (sin negated): undoes apply_rotary with the same rows.
        seqlen_offset: a Python int added to every token's position (not a tensor: reading
            one would sync).

    Arithmetic per pair (x1, x2), fp32: out1 = fma(x1, cos, -fp32(x2 sin)), out2 =
    fma(x2, cos, fp32(x1 sin)), rounded to query's dtype; tilebake.torch.rotary_embedding_ref
    gives the same bits. A token whose cache row lies outside [0, max_positions) is left
    unchanged (not rotated; checked on the device, no host sync). The row is computed in 64
    bits: an int32 position plus a large seqlen_offset does not wrap. CPU tensors, and CUDA
    tensors whose strides or addresses are not multiples of 16 bytes, take the torch path
    (the reference, same bits, slower).
    """
    # The native path (transform/_plans_apply_rotary.py), seqlen_offset 0 only (a plan bakes its
    # arguments in: a decode loop's changing offset would build one every step). The key holds
    # the flags' classes: a float 1.0 (rejected below) must not match True's plan.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[query.dtype, query.ndim, query.shape[-1], key is None,
                          None if positions is None else positions.dtype, interleaved, interleaved.__class__, conjugate,
                          conjugate.__class__, seqlen_offset, seqlen_offset.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            if plan.run(call, query, cos_sin_cache, key, positions) is not NotImplemented:
                return None
    _check(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)
    plan_key = (query.dtype, query.ndim, query.shape[-1], key is None, None if positions is None else positions.dtype,
                interleaved, interleaved.__class__, conjugate, conjugate.__class__, seqlen_offset,
                seqlen_offset.__class__)  # fmt: skip
    interleaved, conjugate, seqlen_offset = bool(interleaved), bool(conjugate), operator.index(seqlen_offset)
    if torch.compiler.is_compiling():
        torch.ops.tilebake.apply_rotary(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)
        return None
    if query.device.type == "npu":  # the Ascend kernels where they apply
        from tilebake.transform._apply_rotary_ascend import apply_rotary_npu

        if apply_rotary_npu(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset):
            return None
    if not query.is_cuda or not _launch(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset):
        _torch_path(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)
    elif plan_key[-1] is int and seqlen_offset == 0 and query.numel() and plan_key not in _PLANS:
        from tilebake.transform._plans_apply_rotary import rotary_plan

        plan.remember(
            _PLANS, plan_key,
            rotary_plan, _KERNELS[FLOAT_FORMATS[query.dtype], query.shape[-1]], query.get_device(), query.dtype,
            query.dim(), query.shape[-1], key is not None, None if positions is None else positions.dtype,
            interleaved, conjugate,
        )  # fmt: skip
    return None


_PLANS = plan.cache()


def _torch_path(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset) -> None:
    from tilebake.torch import rotary_embedding_ref

    q, k = rotary_embedding_ref(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)
    query.copy_(q)
    if key is not None:
        key.copy_(k)


def _strides(t: torch.Tensor, dims: int, want: int) -> list[int]:
    """The strides of t's first `dims` dims (in elements), 0 for a dim of size 1 (never stepped
    over, and then trivially aligned), zeros prepended for missing leading dims up to `want`."""
    strides = [s if n > 1 else 0 for n, s in zip(t.shape[:dims], t.stride()[:dims])]
    return [0] * (want - len(strides)) + strides


def _launch(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset) -> bool:
    """Launch the kernel; False when the tensors do not fit it (the caller takes the torch path)."""
    lead = query.shape[:-2]
    batch, seqlen = (1, *lead) if len(lead) == 1 else lead
    q_heads = query.shape[-2]
    k_heads = 0 if key is None else key.shape[-2]
    if batch * seqlen == 0 or q_heads + k_heads == 0:
        return True
    vec = 16 // query.element_size()  # elements in the kernel's 16-byte vectors
    q_strides = _strides(query, query.dim() - 1, 3)
    k_strides = [0, 0, 0] if key is None else _strides(key, key.dim() - 1, 3)
    c_stride = cos_sin_cache.stride(0) if cos_sin_cache.shape[0] > 1 else 0
    p_strides = [0, 0] if positions is None else _strides(positions, positions.dim(), 2)
    pointers = [query.data_ptr(), cos_sin_cache.data_ptr()] + ([] if key is None else [key.data_ptr()])
    if (
        any(p % 16 for p in pointers)
        or any(s % vec for s in q_strides + k_strides)
        or c_stride % 4
        or max(abs(s) for s in q_strides + k_strides + p_strides + [c_stride]) > _INT32_MAX
        or batch * seqlen > _INT32_MAX - 4  # the kernel's token index is int32
        or cos_sin_cache.shape[0] > _INT32_MAX
    ):
        return False
    if positions is None:
        pos_kind, p32 = POS_NONE, cos_sin_cache.data_ptr()  # a valid dummy, never read
    else:
        pos_kind, p32 = (POS_INT32 if positions.dtype == torch.int32 else POS_INT64), positions.data_ptr()
    args = (
        query.data_ptr(), query.data_ptr() if key is None else key.data_ptr(), cos_sin_cache.data_ptr(), p32, p32,
        pos_kind, seqlen_offset, int(interleaved), int(conjugate),
        batch, seqlen, q_heads, k_heads, cos_sin_cache.shape[0],
        *q_strides, *k_strides, c_stride, *p_strides,
    )  # fmt: skip
    _KERNELS[FLOAT_FORMATS[query.dtype], query.shape[-1]](query.get_device(), *args)
    # In-place writes count, as for torch's in-place ops.
    torch.autograd.graph.increment_version(query if key is None else (query, key))
    return True


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it ---


def _op_impl(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset):
    apply_rotary(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)


def _meta(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset):
    return None


register(
    "apply_rotary(Tensor(a!) query, Tensor cos_sin_cache, Tensor(b!)? key, Tensor? positions, bool interleaved,"
    " bool conjugate, int seqlen_offset) -> ()",
    _op_impl,
    _meta,
)
