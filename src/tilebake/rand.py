"""tilebake.rand: random numbers with TileKernels' API (randn, randn_like, set_seed, reserve_seed).

On CUDA and on the CPU, randn is torch.randn, as in the original (its TileLang kernel exists
only for Ascend, to replace a slow torch_npu.randn; tilebake has no Ascend binary yet, so an NPU
tensor also gets torch.randn). Equal seeds give equal numbers: set_seed seeds torch's
generators and restarts the seed counter from which reserve_seed hands out per-launch seeds.
"""

from __future__ import annotations

import torch

__all__ = ["randn", "randn_like", "reserve_seed", "set_seed"]

_MASK64 = (1 << 64) - 1
_counter = 0


def _splitmix64(x: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit ints whose nearby inputs give unrelated outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def set_seed(seed: int) -> None:
    """Seed torch's generators (all devices) and restart the seed counter at `seed`."""
    global _counter
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    torch.manual_seed(seed)
    _counter = seed & _MASK64


def reserve_seed(num_blocks: int) -> int:
    """A 63-bit seed for a launch of num_blocks blocks (block b uses seed + b), and the counter
    moves past them: successive launches get unrelated, reproducible streams."""
    global _counter
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
    seed = _splitmix64(_counter) >> 1
    _counter = (_counter + num_blocks) & _MASK64
    return seed


def randn(*size, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """Standard normal samples of shape `size` (ints or one tuple), dtype default torch's default."""
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype (normal samples), got {dtype}")
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return torch.randn(*size, dtype=dtype, device=device)


def randn_like(input: torch.Tensor) -> torch.Tensor:
    """randn with input's shape, dtype and device."""
    return randn(*input.shape, dtype=input.dtype, device=input.device)
