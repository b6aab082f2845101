"""Argument checks shared by the engram ops: each raises TypeError / ValueError naming the
argument and what is allowed."""

from __future__ import annotations

import torch

MAX_HC = 8  # hyper-connection multiplier: 1 to 8 (the original: 4)


def check_tensor(t, name: str, dtypes: tuple, dims: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must be {allowed}, got {t.dtype}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims, got shape {tuple(t.shape)}")
    if t.device.type not in ("cuda", "cpu", "npu"):
        raise ValueError(f"{name} must be on a CUDA device, an NPU or the CPU, got {t.device}")


def check_same_device(name: str, t: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device} (as {like_name}), got {t.device}")


def check_weight_pair(weight_hidden, weight_embed) -> None:
    """weight_hidden, weight_embed: bf16 (hc, H), the same shape and device, 1 <= hc <= MAX_HC."""
    check_tensor(weight_hidden, "weight_hidden", (torch.bfloat16,), 2)
    check_tensor(weight_embed, "weight_embed", (torch.bfloat16,), 2)
    if weight_embed.shape != weight_hidden.shape:
        raise ValueError(
            f"weight_embed must have weight_hidden's shape {tuple(weight_hidden.shape)}, got {tuple(weight_embed.shape)}"
        )
    check_same_device("weight_embed", weight_embed, weight_hidden, "weight_hidden")
    hc, hidden = weight_hidden.shape
    if not 1 <= hc <= MAX_HC or hidden < 1:
        raise ValueError(f"weight_hidden must be (hc, H) with 1 <= hc <= {MAX_HC} and H >= 1, got {tuple(weight_hidden.shape)}")


def dense(t: torch.Tensor) -> torch.Tensor:
    """t itself when contiguous and 16-byte aligned (what the kernels read as whole vectors), else
    a contiguous copy (fresh allocations are aligned)."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.contiguous() if not t.is_contiguous() else t.clone()
