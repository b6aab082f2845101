"""engram_hash: the n-gram hash embedding indices of every layer, order and table.

Validate, allocate, launch (kernels_tl/engram/engram_hash.py); CPU tensors take the reference
(tilebake.torch.engram.engram_hash_ref), with the same values.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr
from tilebake.engram._common import check_same_device, check_tensor, dense


@dataclasses.dataclass(frozen=True)
class EngramHashVariant(Variant):
    family = "engram"
    op = "engram_hash"
    PARAMS = ptr("IDS", "MUL", "VOC", "OFF", "MASK", "OUT") + i32(
        "has_mask", "num_tokens", "max_ngram_size", "num_layers", "num_tables"
    )

    id_dtype: str  # 'int32'

    @classmethod
    def all(cls):
        return (cls("int32"),)


@dataclasses.dataclass(frozen=True)
class EngramHashAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/engram/engram_hash.py): a SIMT thread an item."""

    family = "engram"
    op = "engram_hash"
    backend = "ascend"
    PARAMS = EngramHashVariant.PARAMS

    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(cores) for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(EngramHashVariant)
_PLANS = plan.cache()  # by (image_token_mask is None,): the plan reads the mask or not


def _check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask):
    check_tensor(ngram_token_ids, "ngram_token_ids", (torch.int32,), 2)
    check_tensor(multipliers, "multipliers", (torch.int64,), 2)
    check_tensor(vocab_sizes, "vocab_sizes", (torch.int32,), 3)
    check_tensor(offsets, "offsets", (torch.int32,), 2)
    num_tokens, ngram = ngram_token_ids.shape
    layers = multipliers.shape[0]
    if ngram < 2:
        raise ValueError(f"ngram_token_ids must be (num_tokens, max_ngram_size >= 2), got {tuple(ngram_token_ids.shape)}")
    if multipliers.shape[1] != ngram or layers < 1:
        raise ValueError(f"multipliers must be (num_layers >= 1, {ngram}), got {tuple(multipliers.shape)}")
    if vocab_sizes.shape[:2] != (layers, ngram - 1) or vocab_sizes.shape[2] < 1:
        raise ValueError(f"vocab_sizes must be ({layers}, {ngram - 1}, num_tables >= 1), got {tuple(vocab_sizes.shape)}")
    width = (ngram - 1) * vocab_sizes.shape[2]
    if offsets.shape != (layers, width):
        raise ValueError(f"offsets must be ({layers}, {width}), got {tuple(offsets.shape)}")
    for name, t in (("multipliers", multipliers), ("vocab_sizes", vocab_sizes), ("offsets", offsets)):
        check_same_device(name, t, ngram_token_ids, "ngram_token_ids")
    if image_token_mask is not None:
        check_tensor(image_token_mask, "image_token_mask", (torch.bool,), 1)
        if image_token_mask.shape[0] != num_tokens:
            raise ValueError(f"image_token_mask must be ({num_tokens},), got {tuple(image_token_mask.shape)}")
        check_same_device("image_token_mask", image_token_mask, ngram_token_ids, "ngram_token_ids")
    if layers * num_tokens * width >= 2**31:  # (also bounds the kernel's L x T x M threads)
        raise ValueError(f"engram_hash: the output (L, T, (N-1) M) must have fewer than 2^31 entries, got {layers * num_tokens * width}")


def engram_hash(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
    image_token_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Embedding indices of the hashed n-grams.

    Args:
        ngram_token_ids: (T, N) int32, token i - k of token i in column k.
        multipliers: (L, N) int64 hash multipliers per layer.
        vocab_sizes: (L, N - 1, M) int32 table sizes per layer, n-gram order (2 .. N) and table.
        offsets: (L, (N - 1) M) int32 first index of each table (tilebake.torch.make_offsets).
        image_token_mask: optional (T,) bool; True rows get -1.

    Returns:
        (L, T, (N - 1) M) int32: for order i + 1 (h = XOR of id_j * mul_j, j <= i, 64-bit
        wrapping) and table m, h mod vocab_sizes[l, i - 1, m] (non-negative) + the table's
        offset; -1 for image tokens and tables of non-positive size.

    Out-of-range values: token ids are hashed, never used as indices, so every int32 id (negative
    ones and the extremes too) gives an index inside its table, [offset, offset + vocab_size).
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[image_token_mask is None]
        except (KeyError, TypeError):
            pass
        else:
            result = plan.run(call, ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
            if result is not NotImplemented:
                return result
    _check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
    if ngram_token_ids.device.type == "npu":  # the Ascend kernel
        from tilebake.engram._engram_ascend import engram_hash_npu

        return engram_hash_npu(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
    if not ngram_token_ids.is_cuda:
        from tilebake.torch.engram import engram_hash_ref

        return engram_hash_ref(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
    num_tokens, ngram = ngram_token_ids.shape
    layers, tables = multipliers.shape[0], vocab_sizes.shape[2]
    out = torch.empty((layers, num_tokens, (ngram - 1) * tables), dtype=torch.int32, device=ngram_token_ids.device)
    if num_tokens == 0:
        return out
    ids, mul, voc, off = (dense(t) for t in (ngram_token_ids, multipliers, vocab_sizes, offsets))
    mask = dense(image_token_mask) if image_token_mask is not None else None
    _KERNELS["int32",](
        ids.get_device(), ids.data_ptr(), mul.data_ptr(), voc.data_ptr(), off.data_ptr(),
        mask.data_ptr() if mask is not None else ids.data_ptr(), out.data_ptr(), int(mask is not None),
        num_tokens, ngram, layers, tables,
    )  # fmt: skip
    plan.remember(_PLANS, mask is None, _plan, _KERNELS["int32",], ids.get_device(), mask is not None)
    return out


def _plan(kernel, device, has_mask):
    """run(ids, multipliers, vocab_sizes, offsets, mask): contiguous tensors as _check takes them."""
    b = plan.Builder()
    ids = b.tensor(0, torch.int32, ("T", "N"), strides=("N", 1), align=4)
    mul = b.tensor(1, torch.int64, ("L", "N1"), strides=("N1", 1), align=8)
    voc = b.tensor(2, torch.int32, ("L2", "K", "M"), strides=("K * M", "M", 1), align=4)
    off = b.tensor(3, torch.int32, ("L3", "W"), strides=("W", 1), align=4)
    b.check("T >= 1 and N >= 2 and N1 == N and L >= 1 and L2 == L and L3 == L and K == N - 1 and M >= 1")
    b.check("W == K * M and L * T * W < 2147483648")
    mask = b.tensor(4, torch.bool, ("T4",), strides=(1,), align=1) if has_mask else None
    if has_mask:
        b.check("T4 == T")
    out = b.alloc(torch.int32, ("L", "T", "W"))
    b.launch(kernel, device, IDS=ids, MUL=mul, VOC=voc, OFF=off, MASK=mask if has_mask else ids, OUT=out,
             has_mask=int(has_mask), num_tokens="T", max_ngram_size="N", num_layers="L", num_tables="M")  # fmt: skip
    b.returns(out)
    return b.build()


def _meta(ids, multipliers, vocab_sizes, offsets, image_token_mask):
    width = (ids.shape[1] - 1) * vocab_sizes.shape[2]
    return torch.empty((multipliers.shape[0], ids.shape[0], width), dtype=torch.int32, device=ids.device)


register(
    "engram_hash(Tensor ngram_token_ids, Tensor multipliers, Tensor vocab_sizes, Tensor offsets, "
    "Tensor? image_token_mask) -> Tensor",
    lambda *args: engram_hash(*args),
    _meta,
)
