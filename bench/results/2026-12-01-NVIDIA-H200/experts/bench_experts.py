"""Kernel time of the fast (<= 1024 experts) and general (1025..8192) variants of topk_gate,
moe_topk_gate_backward and get_fused_mapping at 4096 tokens, k = 8, beside the device copy
bandwidth and torch.mul(out=)'s host time of the same run. Run from the repository root with
tilebake and a tilebake-cuda holding those ops installed:
    python bench/results/2026-12-01-NVIDIA-H200/experts/bench_experts.py > bench.md
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
import harness  # noqa: E402

import tilebake  # noqa: E402
from tilebake.torch.mapping import mapping_size  # noqa: E402

T, K = 4096, 8


def row(name, experts, fn, inputs, nbytes):
    t = harness.time_gpu(fn, inputs, warmup=5, reps=30)["median_us"]
    print(f"| {name} | {experts} | {t:.1f} | {nbytes / t / 1e3:.0f} |", flush=True)


def main():
    copy = harness.copy_bandwidth_gbs()
    x, y = torch.ones(1, device="cuda"), torch.empty(1, device="cuda")
    mul = harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ())
    print(f"{harness.environment()}; copy {copy:.0f} GB/s; torch.mul(out=) host {mul:.2f} us; T={T}, k={K}\n")
    print("| op | experts | median us | GB/s (bytes read + written) |\n|---|---|---|---|")
    for e in (1024, 1025, 2048, 8192):
        n = harness.rotation_count(T * e * 4)
        inputs = [(torch.randn(T, e, device="cuda"),) for _ in range(n)]
        row("topk_gate", e, lambda s: tilebake.moe.topk_gate(s, K), inputs, T * e * 4 + T * K * 8)
    for e in (1024, 1025, 8192):
        n = harness.rotation_count(2 * T * e * 4)
        inputs = []
        for _ in range(n):
            u = torch.rand(T, e, device="cuda")
            idx = torch.randint(0, e, (T, K), device="cuda")
            w, g = torch.rand(T, K, device="cuda"), torch.randn(T, K, device="cuda")
            inputs.append(
                (u, idx, w, g, torch.ones(T, dtype=torch.bool, device="cuda"), torch.randn(1, e, device="cuda"))
            )

        def backward(u, idx, w, g, m, h):
            return tilebake.moe.moe_topk_gate_backward(u, idx, w, g, 2.5, mask=m, grad_scores_sum=h)

        row("moe_topk_gate_backward (aux)", e, backward, inputs, 2 * T * e * 4 + e * 4)
    for e in (1024, 1025, 8192):
        idx = torch.rand(T, e, device="cuda").topk(K, dim=1).indices
        size = mapping_size(T, K, e, 128)
        row("get_fused_mapping (no sync)", e, lambda i: tilebake.moe.get_fused_mapping(i, e, size, 128), [(idx,)],
            T * K * 12 + 3 * size * 4)  # fmt: skip


if __name__ == "__main__":
    main()
