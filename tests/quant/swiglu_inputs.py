"""Inputs shared by the SwiGLU tests: expert (psum) layouts, the GPU shapes and values over many binades."""

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


def psum_layout_rows(counts, rows, alignment=128, device="cpu"):
    """psum_layout with exactly `rows` rows (the rows past the last expert are padding)."""
    psum, aligned_rows = psum_layout(counts, alignment)
    assert aligned_rows <= rows, (aligned_rows, rows)
    return psum.to(device), rows


def gpu_shapes(seed):
    """(rows, hidden, psum) of the GPU tests: 1 row; 8001 rows in a 62-expert layout with empty
    experts, odd counts and padding (H % 128 == 64, and a 2-pass row); a wide layer with a few
    experts. Whether a test passes the psum is its choice."""
    g = torch.Generator().manual_seed(seed)
    psum_8k, _ = psum_layout_rows(random_counts(62, 60, g), 8001)
    psum_small, rows_small = psum_layout([1, 0, 129, 3])
    return [
        (1, 64, torch.tensor([1], dtype=torch.int32)),
        (8001, 192, psum_8k),
        (8001, 2048, psum_8k),
        (rows_small, 7168, psum_small),
    ]


def shape_id(shape):
    return f"E{shape[0]}-H{shape[1]}"


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
    """(rows, 2 * hidden) x for the exactness of act = x / (1 + exp(-x)) and sig = 1 / (1 + exp(-x)),
    which the kernels divide without CUDA's slow path when every |x| of a thread's chunk is < 64.
    x_left: bf16 -- every finite bf16 bit pattern, in bit order (so most 16-element chunks share one
    binade and take the fast path; inf/NaN patterns become 0); fp32 -- 2^20 values log-uniform over
    2^-140 .. 2^7 (subnormals included) of both signs, +-0 mixed in. x_right = 1 and a unit
    act_x_grad make out = act, d x_right = sig * x and d x_left = sig * fma(x, 1 - sig, 1) exactly."""
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
