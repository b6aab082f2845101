"""Host cost per call at T=1, H=7168 of the two SwiGLU bench cases beside torch.mul(out=), in
the same process (bench.py's host table needs every op in the wheel)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
import cases  # noqa: E402
import harness  # noqa: E402

x = torch.randn(1, 7168, device="cuda").to(torch.bfloat16)
y = torch.empty_like(x)
mul = harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ())
print(f"host us per call at T=1: torch_mul_out {mul:.2f}")
for op in ("swiglu_forward", "swiglu_backward"):
    case = cases.CASES[op][0](1, 7168)
    us = harness.host_us_per_call(case["fn"], case["make"]())
    print(f"host us per call at T=1: {op} {us:.2f} ({us / mul:.2f}x torch.mul(out=))")
