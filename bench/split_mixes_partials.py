"""mhc_pre_split_mixes_bwd at the anchor's shape (T = 8192, m = 4) over the number of per-CTA
partial rows (config.set_num_sms), CUDA-graph replays, with each of its two kernels' own GPU
time from torch.profiler (GPU only).

    cd bench && python3 split_mixes_partials.py [--tokens 8192] [--parts 132,66,33,16]
"""

import argparse
import statistics

import harness
import torch

import tilebake
from tilebake import config


def kernel_times(fn, args, calls: int = 50) -> dict:
    """Median us of each kernel the call launches (torch.profiler's CUDA activity)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    times = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(event.name, []).append(event.device_time)
    return {name[:60]: round(statistics.median(t), 2) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--parts", default="132,96,66,33,16")
    args = parser.parse_args()
    m, n = 4, args.tokens
    m3 = m * (m + 2)

    def make():
        f = lambda *s: torch.randn(*s, device="cuda")  # noqa: E731
        return f(n, m), f(n, m), f(n, m * m), f(n, m3), f(n, m), torch.rand(3, device="cuda") + 0.5, f(m3)

    inputs = [make() for _ in range(8)]
    fn = tilebake.mhc.mhc_pre_split_mixes_bwd
    for parts in map(int, args.parts.split(",")):
        config.set_num_sms(parts)
        graph_us = harness.time_graph(fn, inputs, reps=200)
        print(f"partials {parts:4d}: graph {graph_us:6.2f} us/call, kernels {kernel_times(fn, inputs[0])}", flush=True)


if __name__ == "__main__":
    main()
