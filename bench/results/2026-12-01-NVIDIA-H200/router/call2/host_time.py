"""Host cost per call, same run: torch.mul(out=) at T=1, moe_topk_gate_forward (the bench case) at
T=1 and T=16384, with out=, and a CUDA event record (bench.py's eager timing records two per call)."""
import json
import sys

import torch

sys.path.insert(0, "bench")
import harness  # noqa: E402

import tilebake  # noqa: E402

x = torch.randn(1, 7168, device="cuda").to(torch.bfloat16)
y = torch.empty_like(x)
b = torch.randn(256, device="cuda") * 0.1
res = {"torch_mul_out_us": harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ())}
for t in (1, 16384):
    logits = torch.randn(t, 256, device="cuda")
    out = (torch.empty(t, 8, dtype=torch.int64, device="cuda"), torch.empty(t, 8, device="cuda"))
    f = tilebake.moe.moe_topk_gate_forward
    calls = 5000 if t == 1 else 2000
    res[f"gate_T{t}_us"] = harness.host_us_per_call(lambda: f(logits, 8, False, 0, 2.5, 0, bias=b), (), calls)
    res[f"gate_T{t}_out_us"] = harness.host_us_per_call(lambda: f(logits, 8, False, 0, 2.5, 0, bias=b, out=out), (), calls)
ev = torch.cuda.Event(enable_timing=True)
res["event_record_us"] = harness.host_us_per_call(lambda: ev.record(), ())
print(json.dumps(res))

# Beyond the bench case: kernel time (CUDA-graph replay, 4 rotated inputs) for other expert counts.
for e in (512, 1024, 8192):
    n = 16384 if e < 8192 else 4096
    bias_e = torch.randn(e, device="cuda") * 0.1
    ins = [(torch.randn(n, e, device="cuda"),) for _ in range(4)]
    g = lambda x: tilebake.moe.moe_topk_gate_forward(x, 8, False, 0, 2.5, 0, bias=bias_e)  # noqa: E731
    print(json.dumps({f"graph_us_T{n}_E{e}_top8_bias": harness.time_graph(g, ins)}))
