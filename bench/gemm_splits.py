"""The pre-norm projection's forward (mhc_pre_norm_gemm_fwd) at the issue's shape, T = 8192,
m = 4, H = 7168, 24 mixes, over n_splits, as a share of the same run's copy bandwidth (it reads
the residual once: bytes as bench/cases_mhc_norm.py counts them). CUDA-graph replays.

    cd bench && python3 gemm_splits.py [--tokens 8192] [--hidden 7168] [--splits 1,4,8,16] [--name N]
"""

import argparse

import harness
import torch

import tilebake


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--splits", default="1,4,8,16")
    parser.add_argument("--name", default="gemm_splits")
    args = parser.parse_args()
    m, mixes = 4, 24
    k = m * args.hidden
    copy = harness.copy_bandwidth_gbs()
    rows = []
    for splits in map(int, args.splits.split(",")):
        bytes_ = args.tokens * k * 2 + mixes * k * 4 + splits * args.tokens * (mixes + 1) * 4
        ins = [(torch.randn(args.tokens, m, args.hidden, device="cuda").bfloat16(), torch.randn(mixes, k, device="cuda"))
               for _ in range(harness.rotation_count(bytes_))]  # fmt: skip
        us = harness.time_graph(lambda r, fn: tilebake.mhc.mhc_pre_norm_gemm_fwd(r, fn, splits), ins)
        gbs = bytes_ / us / 1e3
        rows.append({"n_splits": splits, "us": round(us, 1), "gbs": round(gbs), "of_copy": round(gbs / copy, 3)})
        print(f"| {splits} | {us:.1f} | {gbs:.0f} | {100 * gbs / copy:.1f}% |", flush=True)
    result = {"env": harness.environment(), "tokens": args.tokens, "hidden": args.hidden, "copy_gbs": round(copy),
              "rows": rows}  # fmt: skip
    harness.write_json(harness.results_dir() / f"{args.name}.json", result)
    print(f"copy {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
