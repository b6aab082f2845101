"""Host cost of the ways a C extension can get a new CUDA tensor from torch (issue 14, item 1),
beside torch.mul(x, 2, out=y) in the same process: what an allocating call pays per output.

python bench/alloc_cost.py     # GPU machine; prints us per call of each way, best of 3 x 5000 calls
"""

import harness
import torch


def main():
    x = torch.randn(1, 7168, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    fp8 = torch.float8_e4m3fn
    shape = (1, 7168)
    same_dtype = x.new_empty(shape, dtype=fp8)  # a template of the output's dtype and shape
    tiny = torch.empty(1, dtype=fp8, device="cuda")
    expanded = tiny.expand(shape)  # a one-element template of the output's shape: empty_like -> contiguous
    dev = x.device
    ways = {
        "torch.mul(x, 2, out=y)": lambda: torch.mul(x, 2, out=y),
        "x.new_empty(shape, dtype=fp8)  [today's plans]": lambda: x.new_empty(shape, dtype=fp8),
        "t.new_empty(shape), t of the output dtype": lambda: same_dtype.new_empty(shape),
        "torch.empty(shape, dtype=fp8, device=dev)": lambda: torch.empty(shape, dtype=fp8, device=dev),
        "torch.empty_like(template of shape and dtype)": lambda: torch.empty_like(same_dtype),
        "torch.empty_like(one element expanded to shape)": lambda: torch.empty_like(expanded),
        "torch.empty_strided(shape, strides, dtype, device)": lambda: torch.empty_strided(
            shape, (7168, 1), dtype=fp8, device=dev
        ),
        "x.new_empty((7168 + 224 * 4,), dtype=uint8): 2 outputs in 1": lambda: x.new_empty((8064,), dtype=torch.uint8),
        "buffer[:7168].view(fp8).view(shape)": lambda: same_dtype.view(-1)[:7168].view(shape),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
    }
    for name, fn in ways.items():
        us = harness.host_us_per_call(fn, ())
        print(f"{name:60s} {us:6.2f} us", flush=True)
    b = expanded
    print("empty_like(expanded): shape", tuple(torch.empty_like(b).shape), "strides", torch.empty_like(b).stride())


if __name__ == "__main__":
    main()
