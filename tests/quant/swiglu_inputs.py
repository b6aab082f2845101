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


def division_domain_x(dtype, device, hidden=1024):
    """(rows, 2 * hidden) x for the exactness of silu = x / (1 + exp(-x)) and sig = 1 / (1 + exp(-x)),
    which the kernels divide without CUDA's slow path when every |x| of a thread's chunk is < 64.
    x_left: bf16 -- every finite bf16 bit pattern, in bit order (so most 16-element chunks share one
    binade and take the fast path; inf/NaN patterns become 0); fp32 -- 2^20 values log-uniform over
    2^-140 .. 2^7 (subnormals included) of both signs, +-0 mixed in. x_right = 1 and a unit
    act_x_grad make y = silu, d x_right = silu and d x_left = dsilu exactly."""
    if dtype == torch.bfloat16:
        bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
        left = bits.view(torch.bfloat16).float()
        left[~torch.isfinite(left)] = 0
    else:
        g = torch.Generator().manual_seed(3)
        n = 1 << 20
        mag = torch.exp2(torch.rand(n, generator=g, dtype=torch.float64) * 147 - 140)
        sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
        left = (mag * sign).float()
        left[::997] = 0.0
        left[1::997] = -0.0
    left = left.reshape(-1, hidden)
    x = torch.cat([left, torch.ones_like(left)], dim=1).to(dtype)
    return x.to(device)
