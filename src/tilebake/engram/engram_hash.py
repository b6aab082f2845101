"""engram_hash: the n-gram hash embedding indices of every layer, order and table.

Validate, allocate, launch (kernels_tl/engram/engram_hash.py); CPU tensors take the reference
(tilebake.torch.engram.engram_hash_ref), with the same values.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._library import register
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
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


_KERNELS = KernelTable(EngramHashVariant)


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
    """
    _check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
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
    return out


def _meta(ids, multipliers, vocab_sizes, offsets, image_token_mask):
    width = (ids.shape[1] - 1) * vocab_sizes.shape[2]
    return torch.empty((multipliers.shape[0], ids.shape[0], width), dtype=torch.int32, device=ids.device)


register(
    "engram_hash(Tensor ngram_token_ids, Tensor multipliers, Tensor vocab_sizes, Tensor offsets, "
    "Tensor? image_token_mask) -> Tensor",
    lambda *args: engram_hash(*args),
    _meta,
)
