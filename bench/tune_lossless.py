"""Launch-config search for per_block_cast_lossless (block 128 x 128), with a byte check of every
candidate against the reference over the GPU test's input/output layouts and odd shapes.

python bench/tune_lossless.py build DIR   # build host: lower + nvcc every candidate (sm_90a), via bench/tune.py
python bench/tune_lossless.py run DIR     # GPU: check each candidate's bytes, time it at SHAPES
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(16384, 7168), (4096, 7168)]
CHECK_SHAPES = [(1, 128), (127, 7168), (8001, 384), (256, 7168 + 32)]
OP = "per_block_cast_lossless"


def build(out: Path):
    sys.path[:0] = [str(ROOT / "bench")]
    import tune

    tune._variants = lambda op: [dict(block_m=128, block_k=128)]
    tune.build(out, OP)


def _args(x, inb, outb, out_packed, out_col):
    import torch

    from tilebake.quant._common import alloc_sf
    from tilebake.utils import ceil_div

    data, sf_in = x
    t, h = data.shape[0], 2 * data.shape[1]
    bm, bk = outb
    out = data.new_empty((t, h), dtype=torch.float8_e4m3fn)
    sf = alloc_sf(data, ceil_div(t, bm), ceil_div(h, bk), out_packed, out_col)
    in_size, size = sf_in.element_size(), sf.element_size()
    values = dict(
        X=data.data_ptr(), Y=out.data_ptr(), SIN=sf_in.data_ptr(), SIN32=sf_in.data_ptr(), S=sf.data_ptr(),
        in_sf_packed=int(sf_in.dtype == torch.int32), in_sf_stride_m=sf_in.stride(0) * in_size,
        in_sf_stride_k=sf_in.stride(1) * in_size,
        in_shift_m=inb[0].bit_length() - 1, in_shift_k=inb[1].bit_length() - 1,
        packed_sf=int(out_packed), sf_stride_m=sf.stride(0) * size, sf_stride_k=sf.stride(1) * size,
        num_tokens=t, x_words=h // 8, x_stride=data.stride(0) // 4 if t > 1 else 0, y_stride=out.stride(0) // 4,
    )  # fmt: skip
    return values, out, sf


def run(out: Path):
    import torch

    sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]
    import harness

    import tilebake
    from tests.quant.test_per_block_cast_lossless import CASES, make_fp4
    from tilebake._runtime import loader

    launcher = loader._native()
    copy = harness.copy_bandwidth_gbs()
    cases = [c for c in CASES if c[3] == (128, 128)]
    for meta_path in sorted((out / "sm_90a").glob(f"{OP}.*.json")):
        meta = json.loads(meta_path.read_text())
        stem = meta_path.stem
        smem = int(meta["dynamic_smem"])
        handle = launcher.load((out / "sm_90a" / f"{stem}.cubin").read_bytes(), meta["entry"], 0, smem)
        names = tuple(p["name"] for p in meta["params"])
        sig = "".join(p["kind"] for p in meta["params"]).encode()
        grid = loader._compile_grid(meta["grid"], names, stem)
        block = tuple(int(b) for b in meta["block"])

        def launch(values):
            a = tuple(values[n] for n in names)
            launcher.launch(handle, grid(*a), block, smem, torch.cuda.current_stream().cuda_stream, sig, a)

        bad = 0
        for (inb, in_packed, in_col, outb, out_packed, out_col), (t, h) in [
            (c, s) for c in cases for s in CHECK_SHAPES
        ]:
            x = make_fp4(t, h, inb, in_packed, in_col, "cuda")
            kw = dict(use_tma_aligned_col_major_sf=out_col, round_sf=out_packed, use_packed_ue8m0=out_packed)
            want = tilebake.torch.per_block_cast_lossless(x, "e4m3", inb, outb, **kw)
            values, y, sf = _args(x, inb, outb, out_packed, out_col)
            sf.view(torch.uint8).fill_(0xAB)
            y.view(torch.uint8).fill_(0xAB)
            launch(values)
            if not (
                torch.equal(y.view(torch.uint8), want[0].view(torch.uint8))
                and torch.equal(sf.view(torch.uint8), want[1].view(torch.uint8))
            ):
                bad += 1
                print(f"  MISMATCH {stem} in{inb} packed={in_packed} col={in_col} out_packed={out_packed} "
                      f"out_col={out_col} {t}x{h}", flush=True)  # fmt: skip
        checked = len(cases) * len(CHECK_SHAPES)
        for t, h in SHAPES:
            nbytes = t * h // 2 + t * h // 32 + t * h + (t // 128) * (h // 512) * 4
            xs = [make_fp4(t, h, (1, 32), True, False, "cuda") for _ in range(harness.rotation_count(int(nbytes)))]
            prepared = [_args(x, (1, 32), (128, 128), True, False) for x in xs]
            us = harness.time_gpu(lambda p: launch(p[0]), [(p,) for p in prepared], reps=30)["median_us"]
            gbs = nbytes / us / 1e3
            print(f"{stem:90s} {t:6d}x{h:5d} {us:8.1f} us {gbs:6.0f} GB/s {100 * gbs / copy:5.1f}% "
                  f"checked {checked - bad}/{checked} ok", flush=True)  # fmt: skip
    print(f"copy {copy:.0f} GB/s")


if __name__ == "__main__":
    {"build": build, "run": run}[sys.argv[1]](Path(sys.argv[2]))
