"""Launch-config search for the Engram gate kernels (kernels_tl/engram/engram_gate_{fwd,bwd}.py
candidate_configs(max_hidden)): the 8192 class at the original's benchmark shape (8001 tokens, hc 4,
hidden 7168) and at hidden 5120, the 4096 class at hidden 4096 and 2560, the 2048 class at 2048 and
1536, the 1024 class at 1024 and 768, the 512 class at 512 and 256 (SHAPES).

python bench/tune_engram_gate.py build DIR [fwd,bwd] [8192,4096]  # build host: lower + nvcc every candidate (sm_90a)
python bench/tune_engram_gate.py run DIR     # GPU: each candidate through the public op (its
                                             # KernelTable entry swapped), checked, CUDA-graph timed
"""

import dataclasses
import json
import operator
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {16384: [(8001, 4, 16384), (8001, 4, 12288)], 8192: [(8001, 4, 7168), (8001, 4, 5120)], 4096: [(8001, 4, 4096), (8001, 4, 2560)],
          2048: [(8001, 4, 2048), (8001, 4, 1536)], 1024: [(8001, 4, 1024), (8001, 4, 768)],
          512: [(8001, 4, 512), (8001, 4, 256)]}
STAGES = ("fwd", "bwd")


def _stem(stage, max_hidden, cfg):
    return f"engram_gate_{stage}.h{max_hidden}." + ".".join(f"{k}{val}" for k, val in dataclasses.asdict(cfg).items())


def build(out: Path):
    sys.path[:0] = [str(ROOT / "build_tools"), str(ROOT), str(ROOT / "src")]
    import importlib

    import aot
    import harness

    classes = [int(c) for c in sys.argv[4].split(",")] if len(sys.argv) > 4 else [8192]
    for stage in sys.argv[3].split(",") if len(sys.argv) > 3 else STAGES:
        kernels = importlib.import_module(f"kernels_tl.engram.engram_gate_{stage}")
        op = importlib.import_module(f"tilebake.engram.engram_gate_{stage}")
        for max_hidden in classes:
            v = next(v for v in op._KERNELS.variant_type.all() if v.max_hidden == max_hidden)
            for cfg in kernels.candidate_configs(max_hidden):
                stem = _stem(stage, max_hidden, cfg)
                aot.lower_one(v, "sm_90a", out, build_kwargs={"cfg": cfg}, stem=stem)
                harness.compile_cubin(out / "sm_90a" / f"{stem}.cu")
                (out / "sm_90a" / f"{stem}.cfg").write_text(json.dumps({"max_hidden": max_hidden, **dataclasses.asdict(cfg)}))
                print("built", stem, flush=True)


def gate_inputs(T, hc, H):
    """(x, kv, fused weight, grad_out) on the GPU: the gate's inputs at (T, hc, H)."""
    import torch

    x = torch.randn(T, hc, H, device="cuda").bfloat16()
    kv = torch.randn(T, hc + 1, H, device="cuda").bfloat16()
    w = torch.rand(hc, H, device="cuda") + 0.5
    return x, kv, w, torch.randn(T, hc, H, device="cuda").bfloat16()


class Candidate:
    """A tuning cubin called like loader.Kernel (device, *args in the declared order)."""

    def __init__(self, out: Path, stem: str, declared: tuple):
        from tilebake._runtime import loader

        meta = json.loads((out / "sm_90a" / f"{stem}.json").read_text())
        self.launcher = loader._native()
        names = [p["name"] for p in meta["params"]]
        self.smem = int(meta["dynamic_smem"])
        self.handle = self.launcher.load((out / "sm_90a" / f"{stem}.cubin").read_bytes(), meta["entry"], 0, self.smem)
        self.sig = "".join(p["kind"] for p in meta["params"]).encode()
        self.grid = loader._compile_grid(meta["grid"], declared, stem)
        self.block = tuple(int(b) for b in meta["block"])
        self.reorder = operator.itemgetter(*[declared.index(n) for n in names])
        self.arg_names = declared

    def __call__(self, device, *args):
        import torch

        stream = torch.cuda.current_stream().cuda_stream
        self.launcher.launch(self.handle, self.grid(*args), self.block, self.smem, stream, self.sig, self.reorder(args))


def run(out: Path):
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import harness

    import tilebake
    from tilebake.torch import engram as ref
    import importlib

    fwd_mod = importlib.import_module("tilebake.engram.engram_gate_fwd")  # (tilebake.engram.<op> is the function)
    bwd_mod = importlib.import_module("tilebake.engram.engram_gate_bwd")

    from tilebake._runtime import plan

    plan.remember = lambda *args: None  # no call plans: a candidate is no loader.Kernel (graph timing: GPU time only)
    copy = harness.copy_bandwidth_gbs()
    print(f"copy {copy:.0f} GB/s", flush=True)
    mods = {"fwd": fwd_mod, "bwd": bwd_mod}
    ctas_per_sm = dict(fwd_mod.CTAS_PER_SM), dict(bwd_mod.CTAS_PER_SM)
    candidates = [(p.stem, json.loads(p.read_text())) for p in sorted((out / "sm_90a").glob("*.cfg"))]
    shapes = [(cls, shape) for cls in sorted({cfg["max_hidden"] for _, cfg in candidates}, reverse=True) for shape in SHAPES[cls]]
    for max_hidden, shape in shapes:
        T, hc, H = shape
        bufs = []
        for _ in range(2):
            x, kv, w, g = gate_inputs(T, hc, H)
            bufs.append((x, kv, w, g, ref.engram_gate_fwd_ref(x, kv, w, 1e-6, 1e-4)))
        fwd_bytes = T * (3 * hc + 1) * H * 2  # x, k, v read; out written
        bwd_bytes = T * (5 * hc + 2) * H * 2  # g, x, k, v read; dx, dk, dv written
        want_f = bufs[0][4]
        want_b = ref.engram_gate_bwd_ref(bufs[0][3], *bufs[0][:3], *bufs[0][4][1:], 1e-4)
        for stem, cfg in candidates:
            if cfg["max_hidden"] != max_hidden:
                continue
            stage = stem.split(".")[0].rsplit("_", 1)[1]
            mod = mods[stage]
            key = ("bf16", max_hidden)
            mod._KERNELS[key] = Candidate(out, stem, mod._KERNELS.variant_type(*key).arg_names)
            mod.CTAS_PER_SM[max_hidden] = cfg["ctas_per_sm"]

            def fwd(x, kv, w, g, saved):
                tilebake.engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-4)

            def bwd(x, kv, w, g, saved):
                tilebake.engram.engram_gate_bwd(g, x, kv, w, *saved[1:], 1e-4)

            fn = fwd if stage == "fwd" else bwd
            if stage == "fwd":
                got = tilebake.engram.engram_gate_fwd(*bufs[0][:3], 1e-6, 1e-4)
                ok = torch.allclose(got[0].float(), want_f[0].float(), rtol=1e-2, atol=1e-2)
                ok = ok and all(torch.allclose(a, b, rtol=1e-3, atol=1e-3) for a, b in zip(got[1:], want_f[1:]))
            else:
                got = tilebake.engram.engram_gate_bwd(bufs[0][3], *bufs[0][:3], *bufs[0][4][1:], 1e-4)
                ok = all(torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2) for a, b in zip(got[:2], want_b[:2]))
                ok = ok and torch.allclose(got[2].sum(0), want_b[2][0], rtol=1e-2, atol=1e-1)
            us = harness.time_graph(fn, bufs)
            gbs = (fwd_bytes if stage == "fwd" else bwd_bytes) / us / 1e3
            print(f"{shape} {stem:50s} {us:8.1f} us {gbs:6.0f} GB/s {100 * gbs / copy:5.1f}% {'ok' if ok else 'MISMATCH'}",
                  flush=True)  # fmt: skip
            del mod._KERNELS[key]
            fwd_mod.CTAS_PER_SM.update(ctas_per_sm[0])
            bwd_mod.CTAS_PER_SM.update(ctas_per_sm[1])


if __name__ == "__main__":
    {"build": build, "run": run}[sys.argv[1]](Path(sys.argv[2]))
