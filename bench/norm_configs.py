"""GPU time of norm_forward and norm_forward_and_per_token_cast in the configurations the anchor
cases leave out (bf16 with residual, fp32 input, 3-D strided rows, the SF layouts, the mega MoE
SF), at 16384 x 7168 (3-D: 4 x 4096 x 7168, rows strided by 7680), through the public API of the
installed wheels: run it once per installed wheel pair to compare two builds.

    python bench/norm_configs.py [LABEL]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import tilebake  # noqa: E402

T, H = 16384, 7168
q = tilebake.quant


def rows(dtype, three_d=False):
    if three_d:
        return torch.randn(4, T // 4, 7680, device="cuda").to(dtype)[..., :H]
    return torch.randn(T, H, device="cuda").to(dtype)


def w(dtype):
    return (torch.rand(H, device="cuda") + 0.5).to(dtype)


def mega(t):
    block_m = 256
    phys = (t + block_m - 1) // block_m * block_m
    buf = torch.empty(H // 128, phys, dtype=torch.int32, device="cuda")
    return buf.T[:t], block_m


CASES = {
    "norm_forward bf16 w residual": (
        lambda: (rows(torch.bfloat16), w(torch.bfloat16), rows(torch.bfloat16)),
        lambda x, w, r: q.norm_forward(x, w, 1e-6, residual=r, with_rstd=True),
    ),
    "norm_forward fp32 w": (lambda: (rows(torch.float32), w(torch.float32)), lambda x, w: q.norm_forward(x, w, 1e-6)),
    "norm_forward fp32 w residual": (
        lambda: (rows(torch.float32), w(torch.float32), rows(torch.float32)),
        lambda x, w, r: q.norm_forward(x, w, 1e-6, residual=r),
    ),
    "norm_forward bf16 w 3-D strided": (
        lambda: (rows(torch.bfloat16, True), w(torch.bfloat16)),
        lambda x, w: q.norm_forward(x, w, 1e-6),
    ),
    "cast bf16 w residual ue8m0 packed": (
        lambda: (rows(torch.bfloat16), w(torch.bfloat16), rows(torch.bfloat16)),
        lambda x, w, r: q.norm_forward_and_per_token_cast(
            x, w, 1e-6, "e4m3", 32, r, round_sf=True, use_packed_ue8m0=True
        ),
    ),
    "cast bf16 w residual fp32 sf": (
        lambda: (rows(torch.bfloat16), w(torch.bfloat16), rows(torch.bfloat16)),
        lambda x, w, r: q.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, r),
    ),
    "cast bf16 w ue8m0 packed": (
        lambda: (rows(torch.bfloat16), w(torch.bfloat16)),
        lambda x, w: q.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, round_sf=True, use_packed_ue8m0=True),
    ),
    "cast bf16 w ue8m0 packed col-major": (
        lambda: (rows(torch.bfloat16), w(torch.bfloat16)),
        lambda x, w: q.norm_forward_and_per_token_cast(
            x, w, 1e-6, "e4m3", 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True
        ),
    ),
    "cast bf16 w npc128 round_sf": (
        lambda: (rows(torch.bfloat16), w(torch.bfloat16)),
        lambda x, w: q.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 128, round_sf=True),
    ),
    "cast bf16 w mega moe sf": (
        lambda: (rows(torch.bfloat16), w(torch.bfloat16), *mega(T)),
        lambda x, w, sf, bm: q.norm_forward_and_per_token_cast(
            x, w, 1e-6, "e4m3", 32, round_sf=True, use_packed_ue8m0=True, mega_moe_sf=sf, mega_moe_block_m=bm
        ),
    ),
    "cast bf16 w 3-D strided fp32 sf": (
        lambda: (rows(torch.bfloat16, True), w(torch.bfloat16)),
        lambda x, w: q.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32),
    ),
    "cast fp32 w fp32 sf": (
        lambda: (rows(torch.float32), w(torch.float32)),
        lambda x, w: q.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32),
    ),
    "cast fp32 w residual ue8m0 packed": (
        lambda: (rows(torch.float32), w(torch.float32), rows(torch.float32)),
        lambda x, w, r: q.norm_forward_and_per_token_cast(
            x, w, 1e-6, "e4m3", 32, r, round_sf=True, use_packed_ue8m0=True
        ),
    ),
}


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    print(f"{label}: device copy {harness.copy_bandwidth_gbs():.0f} GB/s", flush=True)
    for name, (make, fn) in CASES.items():
        inputs = [make() for _ in range(3)]
        try:
            us = harness.time_gpu(fn, inputs)["median_us"]
            print(f"{label:6s} {name:40s} {us:8.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001 (report and go on: one call's failure names itself)
            print(f"{label:6s} {name:40s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
