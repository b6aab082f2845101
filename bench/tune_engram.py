"""Launch-config search for the Engram Sinkhorn momentum update (kernels_tl/engram/engram_sinkhorn.py
candidate_configs()), fp32 grad and buffer, nesterov off, and for its row step
(step_candidate_configs(), 100001 x 5120), at the original's benchmark sizes.

python bench/tune_engram.py build DIR [step]   # build host: lower + nvcc every candidate (sm_90a)
python bench/tune_engram.py run DIR [step]     # GPU: check each candidate's results, time it (CUDA graph)
"""

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUMEL = 512000512


def _stem(v, cfg):
    return v.id + "." + ".".join(f"{k}{val}" for k, val in dataclasses.asdict(cfg).items())


def build(out: Path, stage: str):
    sys.path[:0] = [str(ROOT / "build_tools"), str(ROOT), str(ROOT / "src")]

    import aot
    import harness

    from kernels_tl.engram import engram_sinkhorn as kernels
    from tilebake.engram.engram_sinkhorn import EngramSinkhornVariant

    v = EngramSinkhornVariant(stage, "fp32", "fp32")
    for cfg in kernels.step_candidate_configs() if stage == "step" else kernels.candidate_configs():
        stem = _stem(v, cfg)
        aot.lower_one(v, "sm_90a", out, build_kwargs={"cfg": cfg}, stem=stem)
        print("built", stem, harness.compile_cubin(out / "sm_90a" / f"{stem}.cu"), flush=True)


def _gpu_setup():
    """(harness, loader, the native launcher, this run's copy bandwidth, printed)."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import harness

    from tilebake._runtime import loader

    copy = harness.copy_bandwidth_gbs()
    torch.cuda.empty_cache()
    print(f"copy {copy:.0f} GB/s", flush=True)
    return harness, loader, loader._native(), copy


def run_step(out: Path):
    import torch

    from tilebake.torch.engram import engram_sinkhorn_step_ref

    harness, loader, launcher, copy = _gpu_setup()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    for rows, cols in ((100001, 5120), (8001, 8192), (3, 4100)):  # the original's; the longest rows; few, odd
        mats = [torch.randn(rows, cols, device="cuda") for _ in range(2)]
        scales = [torch.rand(rows, device="cuda") + 0.5 for _ in range(2)]
        cs = torch.rand(cols, device="cuda") + 0.5
        norm = torch.empty(rows, device="cuda")
        want_rs = scales[0].clone()
        want_norm, want_sumsq = engram_sinkhorn_step_ref(mats[0], want_rs, cs, 1e-20)
        for meta_path in sorted((out / "sm_90a").glob("*step*.json")):
            meta = json.loads(meta_path.read_text())
            stem = meta_path.stem
            if cols > int(stem.split("max_cols")[1].split(".")[0]):
                continue
            ctas = min(rows, int(stem.split("ctas_per_sm")[1].split(".")[0]) * num_sms)
            partial = torch.empty(ctas, cols, device="cuda")
            smem = meta["dynamic_smem"]
            handle = launcher.load((out / "sm_90a" / f"{stem}.cubin").read_bytes(), meta["entry"], 0, smem)
            names = tuple(p["name"] for p in meta["params"])
            sig = "".join(p["kind"] for p in meta["params"]).encode()
            grid = loader._compile_grid(meta["grid"], names, stem)
            block = tuple(int(b) for b in meta["block"])

            def call(m, rs):
                v = dict(M=m.data_ptr(), RS=rs.data_ptr(), CS=cs.data_ptr(), NORM=norm.data_ptr(),
                         P=partial.data_ptr(), eps=1e-20, num_rows=rows, num_cols=cols, num_ctas=ctas)  # fmt: skip
                a = tuple(v[n] for n in names)
                launcher.launch(handle, grid(*a), block, smem, torch.cuda.current_stream().cuda_stream, sig, a)

            rs = scales[0].clone()
            call(mats[0], rs)
            ok = torch.allclose(norm, want_norm, rtol=1e-5) and torch.allclose(rs, want_rs, rtol=1e-5)
            ok = ok and torch.allclose(partial.sum(0), want_sumsq[0], rtol=1e-4)
            us = harness.time_graph(call, [(m, s.clone()) for m, s in zip(mats, scales)])
            gbs = rows * cols * 4 / us / 1e3
            print(f"{rows}x{cols} {stem.split('.', 4)[-1]:28s} {us:8.1f} us {gbs:6.0f} GB/s {100 * gbs / copy:5.1f}% "
                  f"{'ok' if ok else 'MISMATCH'}", flush=True)  # fmt: skip


def run(out: Path):
    import torch

    from tilebake.torch.engram import engram_sinkhorn_momentum_update_ref

    harness, loader, launcher, copy = _gpu_setup()
    grads = [torch.randn(NUMEL, device="cuda") for _ in range(2)]
    bufs = [torch.randn(NUMEL, device="cuda") for _ in range(2)]
    outs = [torch.empty(NUMEL, device="cuda") for _ in range(2)]
    small_g, small_m = torch.randn(8001 * 7, device="cuda"), torch.randn(8001 * 7, device="cuda")
    want_m = small_m.clone()
    want = engram_sinkhorn_momentum_update_ref(small_g, want_m, 0.95, False)
    for meta_path in sorted((out / "sm_90a").glob("*.json")):
        meta = json.loads(meta_path.read_text())
        stem = meta_path.stem
        handle = launcher.load((out / "sm_90a" / f"{stem}.cubin").read_bytes(), meta["entry"], 0, 0)
        names = tuple(p["name"] for p in meta["params"])
        sig = "".join(p["kind"] for p in meta["params"]).encode()
        grid = loader._compile_grid(meta["grid"], names, stem)
        block = tuple(int(b) for b in meta["block"])

        def call(g, m, o):
            v = dict(G=g.data_ptr(), MB=m.data_ptr(), OUT=o.data_ptr(), beta1=0.95,
                     one_minus_beta1=float(torch.tensor(1 - 0.95, dtype=torch.float32)), nesterov=0, numel=g.numel())  # fmt: skip
            a = tuple(v[n] for n in names)
            launcher.launch(handle, grid(*a), block, 0, torch.cuda.current_stream().cuda_stream, sig, a)

        m, o = small_m.clone(), torch.empty_like(small_m)
        call(small_g, m, o)
        ok = torch.equal(o, want) and torch.equal(m, want_m)
        us = harness.time_graph(call, list(zip(grads, bufs, outs)))
        gbs = NUMEL * 16 / us / 1e3
        print(f"{stem.split('.', 4)[-1]:40s} {us:8.1f} us {gbs:6.0f} GB/s {100 * gbs / copy:5.1f}% "
              f"{'ok' if ok else 'MISMATCH'}", flush=True)  # fmt: skip


if __name__ == "__main__":
    stage = sys.argv[3] if len(sys.argv) > 3 else "momentum"
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]), stage)
    else:
        (run_step if stage == "step" else run)(Path(sys.argv[2]))
