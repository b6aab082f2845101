"""Checks every op shares; each names the argument, what is allowed and what was given."""

from __future__ import annotations

import torch

DEVICE_TYPES = ("cuda", "npu", "cpu")  # a CUDA GPU (tilebake-cuda), an Ascend NPU (tilebake-ascend), the references


def check_device(t: torch.Tensor, name: str) -> None:
    """t is on a device some backend runs: a CUDA device, an NPU or the CPU."""
    if t.device.type not in DEVICE_TYPES:
        raise ValueError(f"{name} must be on a CUDA device, an NPU or the CPU, got {t.device}")
