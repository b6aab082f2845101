"""The gate kernels' register classes: at 8001 x 4 x 7168, the shipped 8192-class kernel against
the 16384-class one (the same code, twice the registers a row), CUDA-graph timed."""
import importlib
import sys

import torch

sys.path.insert(0, "bench")
import harness  # noqa: E402

import tilebake  # noqa: E402

fwd = importlib.import_module("tilebake.engram.engram_gate_fwd")
bwd = importlib.import_module("tilebake.engram.engram_gate_bwd")
T, hc, H = 8001, 4, 7168
bufs = []
for _ in range(2):
    x, kv, g = (torch.randn(T, n, H, device="cuda").bfloat16() for n in (hc, hc + 1, hc))
    w = torch.rand(hc, H, device="cuda") + 0.5
    bufs.append((x, kv, w, g, tilebake.engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-4)))
calls = {
    "fwd": lambda x, kv, w, g, s: tilebake.engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-4),
    "bwd": lambda x, kv, w, g, s: tilebake.engram.engram_gate_bwd(g, x, kv, w, *s[1:], 1e-4),
}
for name, mod in (("fwd", fwd), ("bwd", bwd)):
    shipped = harness.time_graph(calls[name], bufs)
    mod._KERNELS["bf16", 8192] = mod._KERNELS["bf16", 16384]
    ctas = mod.CTAS_PER_SM[8192]
    mod.CTAS_PER_SM[8192] = mod.CTAS_PER_SM[16384]
    mod._PLANS.clear()
    wide = harness.time_graph(calls[name], bufs)
    print(f"engram_gate_{name} at {T} x {hc} x {H}: 8192 class {shipped:.1f} us, 16384 class {wide:.1f} us", flush=True)
    del mod._KERNELS["bf16", 8192]
    mod.CTAS_PER_SM[8192] = ctas
    mod._PLANS.clear()
