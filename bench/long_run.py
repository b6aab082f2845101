"""Issue 18's long run: LAUNCHES kernel launches of a cast (per_token_cast, bf16 -> e4m3) and of the
router (moe_topk_gate_forward, 256 experts, top-8), alternating, each call with fresh outputs
(torch allocations and frees) and every 1000th step a new input of another token count. Prints
the process's RSS and torch's CUDA memory (allocated, reserved) every REPORT launches, checks the
results against their first call's now and then, and exits 1 if RSS or CUDA memory grew past
the bounds below after warm-up (GPU only).

    python bench/long_run.py [LAUNCHES]      # default 1_000_000
"""

import os
import sys
import time

import torch

import tilebake

LAUNCHES = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
REPORT = LAUNCHES // 10
RSS_SLACK_MB, CUDA_SLACK_MB = 16, 1  # growth allowed after the first report


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
    torch.manual_seed(0)
    inputs = {t: (torch.randn(t, 1024, device="cuda").bfloat16(), torch.randn(t, 256, device="cuda")) for t in (64, 65)}
    want = {t: (tilebake.quant.per_token_cast(x, "e4m3", 128), tilebake.moe.moe_topk_gate_forward(g, 8, False, 0, 1.0, 0))
            for t, (x, g) in inputs.items()}  # fmt: skip
    torch.cuda.synchronize()
    first, start, launches, step = None, time.perf_counter(), 0, 0
    while launches < LAUNCHES:
        t = 64 + (step // 1000) % 2  # another token count every 1000 steps: new plan arguments, new blocks
        x, g = inputs[t]
        q = tilebake.quant.per_token_cast(x, "e4m3", 128)
        idx, w = tilebake.moe.moe_topk_gate_forward(g, 8, False, 0, 1.0, 0)
        launches += 2
        step += 1
        if step % 50_000 == 0:  # the results stay the first call's
            for a, b in zip((*q, idx, w), (*want[t][0], *want[t][1])):
                if not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
                    print(f"MISMATCH at launch {launches}")
                    return 1
        if launches % REPORT == 0:
            torch.cuda.synchronize()
            row = (rss_mb(), torch.cuda.memory_allocated() / 2**20, torch.cuda.memory_reserved() / 2**20)
            print(f"{launches:>9} launches {time.perf_counter() - start:7.1f} s: RSS {row[0]:8.1f} MiB, CUDA allocated "
                  f"{row[1]:7.2f} MiB, reserved {row[2]:7.2f} MiB", flush=True)  # fmt: skip
            first = first or row
    grew = (rss_mb() - first[0], torch.cuda.memory_allocated() / 2**20 - first[1])
    ok = grew[0] <= RSS_SLACK_MB and grew[1] <= CUDA_SLACK_MB
    print(f"{'flat' if ok else 'GREW'}: RSS {grew[0]:+.1f} MiB, CUDA allocated {grew[1]:+.2f} MiB since the first report")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
