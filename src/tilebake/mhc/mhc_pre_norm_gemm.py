"""mhc_pre_norm_gemm_fwd / _bwd: the mHC pre-norm projection, our own kernels (2.1.0 leaves this
GEMM to DeepGEMM; its 1.0 layer needs it). x is the residual (..., m, H) flattened to K = m H
columns a token; fn is (N, K) fp32 with N = m (m + 2) mixes (or fewer: mhc_head pads to them).

The forward writes split-K partials of x @ fn^T and of the square sums of x, which
mhc_reduce_partials_and_rmsnorm_fwd adds in split order; split s covers the K columns
[s c, (s + 1) c), c = ceil(K / (64 n_splits)) * 64 (torch.chunk's split when K / n_splits is a
multiple of 64, as 28672 / 16 is), a split past K is zeros.

Validate, allocate, launch (kernels_tl/mhc/mhc_pre_norm_gemm.py); CPU tensors take plain torch
arithmetic in fp32 over the same splits; NPU tensors the Ascend 950 kernels
(kernels_tl/ascend/mhc/mhc_pre_norm_gemm.py: fp32 products and sums in a fixed order, fn not
split; emulated on the CPU only).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

from tilebake import config
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.mhc import _plans_norm
from tilebake.mhc._common import MhcAscendVariant, check_aligned, check_shape, check_streams
from tilebake.quant.norm_backward import sum_partial_rows, sum_partial_rows_kernel

BM, BK = 64, 64  # the forward's tile: tokens x columns (a split is whole BK steps)
MAX_MULTS = (4, 8)  # a variant's mixes: up to 24 (m <= 4) or 80 (m <= 8)
MAX_MIXES = MAX_MULTS[-1] * (MAX_MULTS[-1] + 2)
_BWD_CTAS_PER_SM = 2  # the backward CTAs an SM holds (its registers: about 190 a thread)


@dataclasses.dataclass(frozen=True)
class MhcPreNormGemmVariant(Variant):
    family = "mhc"
    op = "mhc_pre_norm_gemm"

    direction: str  # 'fwd' | 'bwd'
    max_mult: int  # the tile's mixes: max_mult (max_mult + 2)

    @classmethod
    def all(cls):
        return tuple(cls(d, m) for d in ("fwd", "bwd") for m in MAX_MULTS)

    def params(self):
        if self.direction == "fwd":
            return ptr("X", "FN", "OUT", "SQ") + i32("num_tokens", "num_cols", "num_mixes", "n_splits")
        return ptr("X", "FN", "DOM", "DSQ", "XG", "P") + i32("num_tokens", "num_cols", "num_mixes", "num_parts",
                                                            "has_x_grad")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class MhcPreNormGemmAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/mhc_pre_norm_gemm.py): up to MAX_MIXES mixes and
    every size at run time; the backward writes fn_grad itself (no partial rows)."""

    op = "mhc_pre_norm_gemm"

    def params(self):
        if self.direction == "fwd":
            return ptr("X", "FN", "OUT", "SQ") + i32("num_tokens", "num_cols", "num_mixes", "n_splits")
        return ptr("X", "FN", "DOM", "DSQ", "XG", "FG") + i32("num_tokens", "num_cols", "num_mixes", "has_x_grad")


_KERNELS = KernelTable(MhcPreNormGemmVariant)
_PLANS = plan.cache()  # by direction, ranks, which outputs are given, the variant class (and n_splits / parts)


def _max_mult(num_mixes: int) -> int:
    return next(m for m in MAX_MULTS if num_mixes <= m * (m + 2))


def split_columns(num_cols: int, n_splits: int) -> int:
    """Columns a split covers (the last may be short, later ones empty)."""
    return -(-num_cols // (BK * n_splits)) * BK


def _check(residual, fn):
    """(tokens, K, N) of checked inputs."""
    check_streams(residual, "residual", torch.bfloat16, 2)
    check_streams(fn, "fn", torch.float32, 2)
    if fn.dim() != 2:
        raise ValueError(f"fn must be 2-D (mixes, m * hidden), got shape {tuple(fn.shape)}")
    num_cols = residual.shape[-2] * residual.shape[-1]
    num_mixes = fn.shape[0]
    if fn.shape[1] != num_cols or not 1 <= num_mixes <= MAX_MIXES:
        raise ValueError(f"fn must have shape (N, {num_cols}) with 1 <= N <= {MAX_MIXES} (residual's m * hidden "
                         f"columns), got {tuple(fn.shape)}")  # fmt: skip
    check_shape(fn, "fn", fn.shape, residual, "residual")
    if residual.is_cuda and num_cols % 8:
        raise ValueError(f"residual's m * hidden must be a multiple of 8 on CUDA, got {num_cols}")
    if residual.numel() >= 2**31 or num_mixes * num_cols >= 2**31:
        raise ValueError("residual and fn must have fewer than 2^31 elements")
    return residual.numel() // max(num_cols, 1), num_cols, num_mixes


def _check_splits(n_splits) -> int:
    if isinstance(n_splits, bool) or not isinstance(n_splits, int) or n_splits < 1:
        raise ValueError(f"n_splits must be a positive int, got {n_splits!r}")
    return n_splits


def _key(residual, fn, n_splits, out_mul_splitted, sqrsum_splitted):
    """The forward's plan key; the variant class in it (a plan of the other class's kernel would
    sum in another order)."""
    return ("fwd", residual.ndim, n_splits, n_splits.__class__, out_mul_splitted is None, sqrsum_splitted is None,
            fn.shape[0] <= MAX_MULTS[0] * (MAX_MULTS[0] + 2))  # fmt: skip


def mhc_pre_norm_gemm_fwd(residual: torch.Tensor, fn: torch.Tensor, n_splits: int = 16,
                          out_mul_splitted: Optional[torch.Tensor] = None,
                          sqrsum_splitted: Optional[torch.Tensor] = None):  # fmt: skip
    """Split-K partials of the projection: (out_mul_splitted (n_splits, T, 1, N), sqrsum_splitted
    (n_splits, T, 1)), fp32, with out_mul_splitted[s, t, 0] = x_s[t] @ fn_s^T and sqrsum_splitted[s, t,
    0] = sum of x_s[t]^2 over split s's columns (T: residual's leading dims flattened). fn is used
    as bf16 hi + lo parts (16 mantissa bits). Written into the given tensors, else allocated.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[_key(residual, fn, n_splits, out_mul_splitted, sqrsum_splitted)]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, residual, fn, out_mul_splitted, sqrsum_splitted)
            if result is not NotImplemented:
                return result
    n_splits = _check_splits(n_splits)
    num_tokens, num_cols, num_mixes = _check(residual, fn)
    shapes = ((n_splits, num_tokens, 1, num_mixes), (n_splits, num_tokens, 1))
    outs = []
    for t, name, shape in zip((out_mul_splitted, sqrsum_splitted), ("out_mul_splitted", "sqrsum_splitted"), shapes):
        if t is None:
            t = residual.new_empty(shape, dtype=torch.float32)
        else:
            check_streams(t, name, torch.float32, 1)
            check_shape(t, name, shape, residual, "residual")
        outs.append(t)
    out_mul, sqrsum = outs
    if num_tokens == 0:
        return out_mul, sqrsum
    if residual.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_pre_norm_gemm", "fwd", residual, residual.data_ptr(), fn.data_ptr(), out_mul.data_ptr(),
               sqrsum.data_ptr(), num_tokens, num_cols, num_mixes, n_splits)  # fmt: skip
        plan.bump(out_mul if out_mul_splitted is not None else None, sqrsum if sqrsum_splitted is not None else None)
        return out_mul, sqrsum
    if not residual.is_cuda:
        x = residual.reshape(num_tokens, num_cols).float()
        c = split_columns(num_cols, n_splits)
        for s in range(n_splits):
            xs, fs = x[:, s * c : (s + 1) * c], fn[:, s * c : (s + 1) * c]
            out_mul[s, :, 0] = xs @ fs.t()
            sqrsum[s, :, 0] = xs.square().sum(-1)
        return out_mul, sqrsum
    check_aligned(residual=residual, fn=fn)
    kernel = _KERNELS["fwd", _max_mult(num_mixes)]
    kernel(
        residual.get_device(), residual.data_ptr(), fn.data_ptr(), out_mul.data_ptr(), sqrsum.data_ptr(),
        num_tokens, num_cols, num_mixes, n_splits,
    )  # fmt: skip
    for t, given in ((out_mul, out_mul_splitted), (sqrsum, sqrsum_splitted)):
        if given is not None:
            plan.bump(t)
    plan.remember(_PLANS, _key(residual, fn, n_splits, out_mul_splitted, sqrsum_splitted), _plans_norm.pre_norm_gemm_fwd,
                  kernel, residual.get_device(), residual.ndim - 2, n_splits, out_mul_splitted is not None,
                  sqrsum_splitted is not None)  # fmt: skip
    return out_mul, sqrsum


def mhc_pre_norm_gemm_bwd(residual: torch.Tensor, fn: torch.Tensor, out_mul_grad: torch.Tensor,
                          sqrsum_grad: torch.Tensor, residual_grad: Optional[torch.Tensor] = None,
                          fn_grad: Optional[torch.Tensor] = None):  # fmt: skip
    """The projection's gradients from those of out_mul = x @ fn^T and sqrsum = sum x^2 (a token's
    N values, any shape of T x N / T elements, fp32): residual_grad (as residual, bf16) +=
    out_mul_grad @ fn + 2 sqrsum_grad x (fp32, n in order, rounded to bf16 once: in place when
    given, else a new tensor) and fn_grad (N, K) fp32 = out_mul_grad^T @ x, summed over the
    tokens in a fixed order (two runs give the same bits), written. Returns (residual_grad, fn_grad).
    """
    if not torch.compiler.is_compiling():
        try:
            key = _bwd_key(residual, fn, out_mul_grad, sqrsum_grad, residual_grad, fn_grad)
            call = _PLANS[key]
        except (KeyError, AttributeError, TypeError, IndexError, ZeroDivisionError):
            pass
        else:
            result = plan.run(call, residual, fn, out_mul_grad, sqrsum_grad, residual_grad, fn_grad)
            if result is not NotImplemented:
                return result
    num_tokens, num_cols, num_mixes = _check(residual, fn)
    check_streams(out_mul_grad, "out_mul_grad", torch.float32, 1)
    check_streams(sqrsum_grad, "sqrsum_grad", torch.float32, 1)
    if out_mul_grad.numel() != num_tokens * num_mixes or out_mul_grad.shape[-1] != num_mixes:
        raise ValueError(f"out_mul_grad must hold {num_tokens} x {num_mixes} values (last dim {num_mixes}), "
                         f"got shape {tuple(out_mul_grad.shape)}")  # fmt: skip
    if sqrsum_grad.numel() != num_tokens:
        raise ValueError(f"sqrsum_grad must hold {num_tokens} values, got shape {tuple(sqrsum_grad.shape)}")
    check_shape(out_mul_grad, "out_mul_grad", out_mul_grad.shape, residual, "residual")
    check_shape(sqrsum_grad, "sqrsum_grad", sqrsum_grad.shape, residual, "residual")
    given = residual_grad is not None
    if given:
        check_streams(residual_grad, "residual_grad", torch.bfloat16, 2)
        check_shape(residual_grad, "residual_grad", residual.shape, residual, "residual")
    else:
        residual_grad = torch.empty_like(residual)
    fn_grad_given = fn_grad is not None
    if fn_grad is None:
        fn_grad = torch.empty_like(fn)
    else:
        check_streams(fn_grad, "fn_grad", torch.float32, 2)
        check_shape(fn_grad, "fn_grad", fn.shape, residual, "residual")
    if residual.device.type == "npu":  # the Ascend kernel: fn_grad written whole, no partial rows
        from tilebake.mhc._mhc_ascend import launch

        if num_tokens == 0:
            fn_grad.zero_()
        else:
            launch("mhc_pre_norm_gemm", "bwd", residual, residual.data_ptr(), fn.data_ptr(), out_mul_grad.data_ptr(),
                   sqrsum_grad.data_ptr(), residual_grad.data_ptr(), fn_grad.data_ptr(), num_tokens, num_cols,
                   num_mixes, int(given))  # fmt: skip
            plan.bump(residual_grad if given else None, fn_grad if fn_grad_given else None)
        return residual_grad, fn_grad
    if not residual.is_cuda:
        x = residual.reshape(num_tokens, num_cols).float()
        dom = out_mul_grad.reshape(num_tokens, num_mixes)
        g = dom @ fn + 2 * sqrsum_grad.reshape(num_tokens, 1) * x
        flat = residual_grad.view(num_tokens, num_cols)
        flat.copy_(flat.float() + g if given else g)
        fn_grad.copy_(dom.t() @ x)
        return residual_grad, fn_grad
    if num_tokens == 0:
        fn_grad.zero_()
        return residual_grad, fn_grad
    check_aligned(residual=residual, residual_grad=residual_grad)
    kernel = _KERNELS["bwd", _max_mult(num_mixes)]
    num_parts = _num_parts(num_tokens, num_cols, num_mixes)
    # one share (up to 16 tokens): its partial row is fn_grad itself, with no reduce and no buffer
    partials = fn_grad if num_parts == 1 else fn.new_empty((num_parts, num_mixes, num_cols))
    kernel(
        residual.get_device(), residual.data_ptr(), fn.data_ptr(), out_mul_grad.data_ptr(), sqrsum_grad.data_ptr(),
        residual_grad.data_ptr(), partials.data_ptr(), num_tokens, num_cols, num_mixes, num_parts, int(given),
    )  # fmt: skip
    if num_parts > 1:
        sum_partial_rows(partials.view(num_parts, -1), fn_grad.view(-1))
    plan.bump(residual_grad if given else None, fn_grad if fn_grad_given else None)
    plan.remember(_PLANS, _bwd_key(residual, fn, out_mul_grad, sqrsum_grad, residual_grad if given else None,
                                   fn_grad if fn_grad_given else None), _plans_norm.pre_norm_gemm_bwd, kernel,
                  sum_partial_rows_kernel(), residual.get_device(), residual.ndim - 2, (out_mul_grad.ndim, sqrsum_grad.ndim),
                  (given, fn_grad_given), num_parts)  # fmt: skip
    return residual_grad, fn_grad


def _bwd_key(residual, fn, out_mul_grad, sqrsum_grad, residual_grad, fn_grad):
    """The backward's plan key: ranks, given outputs, the variant class and the partial rows
    (computed from this call's sizes, so a key is one partial-row count); None on the CPU (no SM count)."""
    if not residual.is_cuda:
        return None
    num_cols, num_mixes = residual.shape[-2] * residual.shape[-1], fn.shape[0]
    parts = _num_parts(residual.numel() // num_cols, num_cols, num_mixes)
    return ("bwd", residual.ndim, out_mul_grad.ndim, sqrsum_grad.ndim, residual_grad is None, fn_grad is None,
            num_mixes <= MAX_MULTS[0] * (MAX_MULTS[0] + 2), parts)  # fmt: skip


def _num_parts(num_tokens: int, num_cols: int, num_mixes: int) -> int:
    """The backward's token shares: the count whose CTAs fill the SMs' resident slots in the
    fewest, fullest waves (set_num_sms respected), each share at least 16 tokens."""
    vec = 2 if num_mixes <= MAX_MULTS[0] * (MAX_MULTS[0] + 2) else 1
    return _best_parts(num_tokens, -(-num_cols // (128 * vec)), _BWD_CTAS_PER_SM * config.get_num_sms())


@functools.lru_cache(maxsize=256)  # a search of up to hundreds of counts: once a shape, not once a call
def _best_parts(num_tokens: int, col_blocks: int, slots: int) -> int:
    most = max(1, min(4 * -(-slots // col_blocks), -(-num_tokens // 16)))
    # a CTA's time is proportional to its share, num_tokens / parts; the kernel's to waves / parts
    return min(range(1, most + 1), key=lambda parts: (-(-col_blocks * parts // slots) / parts, parts))
