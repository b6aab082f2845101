"""Inputs shared by the SwiGLU tests: expert (psum) layouts and values over many binades."""

import torch

from tests.helpers import poison_


def psum_layout(counts, alignment=128, extra_rows=0, device="cpu"):
    """int32 psum for per-expert token counts: psum[e] = align(psum[e-1]) + counts[e]; and the
    number of rows, align(psum[-1]) + extra_rows (rows past psum[-1] are padding too)."""
    psum, end = [], 0
    for n in counts:
        end = -(-end // alignment) * alignment + n
        psum.append(end)
    rows = -(-end // alignment) * alignment + extra_rows
    return torch.tensor(psum, dtype=torch.int32, device=device), rows


def random_counts(num_experts, mean, generator=None):
    """Token counts with empty experts, odd counts and exact multiples of 128 mixed in."""
    counts = torch.randint(0, 2 * mean + 1, (num_experts,), generator=generator).tolist()
    for e in range(0, num_experts, 5):
        counts[e] = 0
    for e in range(2, num_experts, 7):
        counts[e] = 128
    return counts


def make_x(rows, width, dtype, device):
    """(rows, width) values N(0,1) scaled per row by 2^k, k in [-6, 6]: many binades, some large
    enough to be clamped and to saturate exp."""
    scale = torch.exp2(torch.randint(-6, 7, (rows, 1), device=device).float())
    return (torch.randn(rows, width, device=device) * scale).to(dtype)


def poison_allocator(device, nbytes=1 << 30):
    """Fill freed memory with 0xFF bytes so the next allocations get it: an output element a
    kernel forgets to write then reads as NaN/0xFF. The caching allocator serves requests of at
    most 1 MiB from a separate small pool, so both pools are poisoned."""
    if torch.device(device).type != "cuda":
        return
    blocks = [torch.empty(nbytes, dtype=torch.uint8, device=device)]
    blocks += [torch.empty(1 << 20, dtype=torch.uint8, device=device) for _ in range(16)]
    for block in blocks:
        poison_(block)
    del blocks
