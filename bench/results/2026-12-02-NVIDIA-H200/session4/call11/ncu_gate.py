import torch, tilebake
T, hc, H = 8001, 4, 7168
x = torch.randn(T, hc, H, device="cuda").bfloat16()
kv = torch.randn(T, hc + 1, H, device="cuda").bfloat16()
w = torch.rand(hc, H, device="cuda") + 0.5
g = torch.randn(T, hc, H, device="cuda").bfloat16()
saved = tilebake.engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-4)
torch.cuda.synchronize()
tilebake.engram.engram_gate_bwd(g, x, kv, w, *saved[1:], 1e-4)
torch.cuda.synchronize()
