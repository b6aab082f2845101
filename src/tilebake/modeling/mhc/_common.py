"""Plumbing shared by the mhc autograd Functions: which path a call takes, the Megatron
`main_grad` convention, and the reference path's backward (torch autograd of the reference math)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch


def reference_streams(t: torch.Tensor) -> bool:
    """Residual streams and layer activations: bf16 takes the kernel entry points (which run
    their own references on CPU tensors); fp32 and fp64 take the reference math (gradcheck)."""
    return t.dtype in (torch.float32, torch.float64)


def reference_mixes(t: torch.Tensor) -> bool:
    """Per-token mixes: the kernels take fp32 only; any other floating dtype (fp64 for
    gradcheck, or a caller's bf16) takes the reference math."""
    return t.dtype != torch.float32


def mix_count(streams: int) -> int:
    """m3 = m (m + 2): the pre, post and comb mixes of m streams."""
    return streams * (streams + 2)


def check_mult(residual: torch.Tensor, mhc_mult: int, name: str = "residual") -> int:
    if not isinstance(residual, torch.Tensor) or residual.dim() < 2:
        raise ValueError(f"{name} must be a tensor (..., mhc_mult, hidden)")
    if residual.shape[-2] != mhc_mult:
        raise ValueError(f"{name} must have mhc_mult = {mhc_mult} streams (dim -2), got shape {tuple(residual.shape)}")
    return mhc_mult


def check_fn(fn: torch.Tensor, rows: int, residual: torch.Tensor) -> None:
    k = residual.shape[-2] * residual.shape[-1]
    if fn.dim() != 2 or tuple(fn.shape) != (rows, k):
        raise ValueError(f"fn must have shape {(rows, k)} (m3 x m H) for residual {tuple(residual.shape)}, "
                         f"got {tuple(fn.shape)}")  # fmt: skip


def param_grad(param: torch.Tensor, grad: Optional[torch.Tensor], needed: bool) -> Optional[torch.Tensor]:
    """The gradient an autograd Function returns for a parameter. Megatron convention: a parameter
    with a `main_grad` attribute gets the gradient added into main_grad in place (main_grad's
    dtype, fp32 in practice) and None is returned; otherwise the gradient in the parameter's
    dtype and shape (a (1,) kernel scale becomes the caller's scalar, for one)."""
    if not needed or grad is None:
        return None
    main = getattr(param, "main_grad", None)
    if main is not None:
        main.add_(grad.reshape(main.shape).to(main.dtype))
        return None
    return grad.reshape(param.shape).to(param.dtype)


def autograd_of(fn: Callable, inputs: Sequence, needs: Sequence[bool], grad_outputs: Sequence) -> list:
    """Gradients of fn(*inputs) for the inputs flagged in needs (None elsewhere) by torch autograd:
    the reference path's backward (recomputed, so the forward saves only its inputs). An input the
    outputs do not depend on gets zeros."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(n) if isinstance(t, torch.Tensor) else t for t, n in zip(inputs, needs)]
        outs = fn(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grad_outputs) if g is not None and o.requires_grad]
        wrt = [leaf for leaf, n in zip(leaves, needs) if n]
        grads = iter(
            torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True) if pairs and wrt
            else [None] * len(wrt)
        )  # fmt: skip
    out = []
    for leaf, n in zip(leaves, needs):
        g = next(grads) if n else None
        out.append(torch.zeros_like(leaf) if n and g is None else g)
    return out


def tokens(t: torch.Tensor, *trailing: int) -> torch.Tensor:
    """t as (T, *trailing), contiguous (a view where it already is)."""
    return t.contiguous().view(-1, *trailing)
