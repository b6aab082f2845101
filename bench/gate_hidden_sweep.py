"""The Engram gate's GPU time over hidden sizes (8001 tokens, hc 4), beside the same run's copy
bandwidth: what `hidden 256 to 16384 at full speed` asks of the three register classes.

    python bench/gate_hidden_sweep.py   # GPU; prints a row a hidden size
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from tune_engram_gate import gate_inputs  # noqa: E402

import tilebake  # noqa: E402

T, HC, EPS, CLAMP = 8001, 4, 1e-6, 1e-4


def main():
    copy = harness.copy_bandwidth_gbs()
    print(f"copy {copy:.0f} GB/s; T = {T}, hc = {HC}; GPU time of CUDA-graph replays")
    print("| hidden | fwd us | fwd % of copy | bwd us | bwd % of copy |")
    for hidden in (256, 512, 1024, 1536, 2048, 3072, 4096, 5120, 7168, 8192, 12288, 16384):
        bufs = []
        for _ in range(2):
            x, kv, w, g = gate_inputs(T, HC, hidden)
            saved = tilebake.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP, save_for_backward=True)[1:]
            bufs.append((x, kv, w, g, saved))
        fwd = harness.time_graph(lambda x, kv, w, g, s: tilebake.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP), bufs)
        bwd = harness.time_graph(lambda x, kv, w, g, s: tilebake.engram.engram_gate_bwd(g, x, kv, w, *s, CLAMP), bufs)
        fwd_gb = T * (3 * HC + 1) * hidden * 2 / fwd / 1e3  # x, k, v read; out written
        bwd_gb = T * (5 * HC + 2) * hidden * 2 / bwd / 1e3  # g, x, k, v read; dx, dk, dv written
        print(f"| {hidden} | {fwd:.1f} | {100 * fwd_gb / copy:.1f} | {bwd:.1f} | {100 * bwd_gb / copy:.1f} |", flush=True)
        del bufs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
