"""Runs one bench case's op a few times, for Nsight Compute to profile (GPU only).

    ncu --clock-control none --profile-from-start off --set full \
        python3 bench/ncu_case.py OP VARIANT [TxH]

The case is picked from bench/cases.py by op and its variant text (exact, else the one case whose
text contains it); the default shape is the benchmark's large one. Only the last call runs inside
the profiler range, so the inputs' own kernels are left out.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cases  # noqa: E402


def main():
    op, variant = sys.argv[1], sys.argv[2]
    tokens, hidden = map(int, (sys.argv[3] if len(sys.argv) > 3 else "16384x7168").split("x"))
    candidates = [f(tokens, hidden) for f in cases.CASES[op]]
    matching = [c for c in candidates if c["variant"] == variant] or [c for c in candidates if variant in c["variant"]]
    if len(matching) != 1:
        raise SystemExit(f"{len(matching)} cases of {op} match {variant!r}")
    case = matching[0]
    args = case["make"]()
    for _ in range(3):
        case["fn"](*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    case["fn"](*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"ran {op}: {case['variant']} at {tokens}x{hidden}")


if __name__ == "__main__":
    main()
