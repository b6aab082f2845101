"""per_token_cast e4m3 1x128 on bf16 (16384, 7168): why bench/anchors.py timed the UE8M0
column-major SF case at 94.6 us while a script timing it alone got 87.1, and which kernel
version / launch config is fastest in anchors.py's setting (issue 13, item 7).

    python bench/ptc_diag.py build DIR [REGEX]   # build host: lower + nvcc the candidates (sm_90a)
    python bench/ptc_diag.py diag                # GPU: the shipped op in anchors.py's setting, varied
    python bench/ptc_diag.py sweep DIR           # GPU: every cubin in DIR, anchors.py's setting
    python bench/ptc_diag.py layouts [REPS] [FIXED]  # GPU: the shipped op, every SF layout, as anchors.py
    python bench/ptc_diag.py window              # GPU: per-call times right after memory is released
    python bench/ptc_diag.py anchors [FIXED]     # GPU: anchors.py's loop for its per_token_cast cases

anchors.py's setting: a fresh input per rotation slot (harness.rotation_count: 2 here), made
after the previous case's buffers were freed and torch.cuda.empty_cache(); outputs allocated
per call; harness.time_gpu (CUDA events around each call, median of 50).
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T_, H_ = 16384, 7168


def build(out: Path, only: str = ""):
    sys.path[:0] = [str(ROOT / "build_tools"), str(ROOT), str(ROOT / "src")]

    import aot
    import harness

    from kernels_tl.quant import per_token_cast as k
    from tilebake.quant.per_token_cast import PerTokenCastVariant

    jobs = []
    for mode in ("ue8m0", "fp32"):
        v = PerTokenCastVariant("bf16", "e4m3", 128, mode)
        for cfg in k.candidate_configs() if mode == "ue8m0" else [k.DEFAULT_CONFIG]:
            stem = f"new.{mode}." + ".".join(f"{a}{b}" for a, b in dataclasses.asdict(cfg).items())
            if not only or re.search(only, stem):
                jobs.append((v, cfg, stem))
    for v, cfg, stem in jobs:
        aot.lower_one(v, "sm_90a", out, build_kwargs={"cfg": cfg}, stem=stem)
        print("built", stem, harness.compile_cubin(out / "sm_90a" / f"{stem}.cu"), flush=True)


# --- GPU side ---


def _gpu():
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import harness

    import tilebake

    return torch, harness, tilebake


def times_us(fn, inputs, warmup=5, reps=50):
    """harness.time_gpu's loop, keeping every rep's time in call order."""
    torch, _, _ = _gpu()
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (s, e) in enumerate(ev):
        s.record()
        fn(*inputs[i % len(inputs)])
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in ev]


def summary(ts, n_inputs):
    """median, and the median per rotation slot (rep i used input i % n_inputs)."""
    per = [statistics.median(ts[j::n_inputs]) for j in range(n_inputs)]
    return f"median {statistics.median(ts):6.1f}  per input " + " ".join(f"{p:6.1f}" for p in per)


def bf16(t=T_, h=H_):
    torch, _, _ = _gpu()
    return torch.randn(t, h, device="cuda").to(torch.bfloat16)


def ptc(**kw):
    _, _, tilebake = _gpu()
    return lambda x, out=None: tilebake.quant.per_token_cast(x, "e4m3", 128, out=out, **kw)


UE8M0_COL = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
LAYOUTS = {
    "fp32 row": {},
    "fp32 col": dict(use_tma_aligned_col_major_sf=True),
    "round row": dict(round_sf=True),
    "round col": dict(use_tma_aligned_col_major_sf=True, round_sf=True),
    "ue8m0 row": dict(round_sf=True, use_packed_ue8m0=True),
    "ue8m0 col": UE8M0_COL,
}


def anchors_case(fn, make=bf16):
    """One case as anchors.py runs it: fresh inputs (rotation_count of them), time_gpu, free."""
    torch, harness, _ = _gpu()
    one = make()
    inputs = [(one,)] + [(make(),) for _ in range(harness.rotation_count(one.numel() * one.element_size()) - 1)]
    ts = times_us(fn, inputs)
    return ts, inputs


def addr(t):
    return f"{t.data_ptr():#x}"


def diag():
    torch, harness, tilebake = _gpu()
    print("copy GB/s", round(harness.copy_bandwidth_gbs()))
    x1 = bf16(1)
    y1 = torch.empty_like(x1)
    print("torch.mul(out=) host us", round(harness.host_us_per_call(lambda: torch.mul(x1, 2, out=y1), ()), 2))
    # 1. anchors.py's sequence: the fp32-SF case, free + empty_cache, the UE8M0 column-major case.
    ts, inputs = anchors_case(ptc())
    print("A1 fp32sf (anchors seq)     ", summary(ts, 2))
    del inputs
    torch.cuda.empty_cache()
    ts, inputs = anchors_case(ptc(**UE8M0_COL))
    print("A2 ue8m0 col (anchors seq)  ", summary(ts, 2), "x at", [addr(a[0]) for a in inputs])
    d, s = ptc(**UE8M0_COL)(inputs[0][0])
    print("   out data", addr(d), "sf", addr(s), "sf base storage", s.untyped_storage().nbytes())
    del d, s
    # 2. The same inputs, varied.
    for j in range(2):
        print(f"A3 ue8m0 col input {j} alone  ", summary(times_us(ptc(**UE8M0_COL), [inputs[j]]), 1))
    for name, kw in LAYOUTS.items():
        print(f"A4 {name:9s} same inputs   ", summary(times_us(ptc(**kw), inputs), 2))
    x0 = inputs[0][0]
    data = torch.empty(T_, H_, dtype=torch.float8_e4m3fn, device="cuda")
    from tilebake.quant._common import alloc_sf

    sf = alloc_sf(x0, T_, 56, True, True)
    print("A5 ue8m0 col out= given     ", summary(times_us(lambda x: ptc(**UE8M0_COL)(x, out=(data, sf)), inputs), 2))
    print("A6 ue8m0 col out=(data,None)", summary(times_us(lambda x: ptc(**UE8M0_COL)(x, out=(data, None)), inputs), 2))
    print("A7 ue8m0 col out=(None,sf)  ", summary(times_us(lambda x: ptc(**UE8M0_COL)(x, out=(None, sf)), inputs), 2))
    inputs4 = inputs + [(bf16(),), (bf16(),)]
    print("A8 ue8m0 col 4 inputs       ", summary(times_us(ptc(**UE8M0_COL), inputs4), 4))
    print("A9 ue8m0 col graph (2 in)   ", round(harness.time_graph(ptc(**UE8M0_COL), inputs), 1))
    print("   back-to-back us/call     ", round(harness.time_back_to_back(ptc(**UE8M0_COL), inputs), 1))
    data = sf = None  # free them (the lambdas above are done)
    del inputs, inputs4, x0
    # 3. The UE8M0 case first after empty_cache, without the fp32 case before it; then again.
    for k in range(2):
        torch.cuda.empty_cache()
        ts, inputs = anchors_case(ptc(**UE8M0_COL))
        print(f"B{k} ue8m0 col fresh again    ", summary(ts, 2), "x at", [addr(a[0]) for a in inputs])
        del inputs
    # 4. The fp32 case in the UE8M0 case's slot (after empty_cache), and inputs made directly in bf16.
    torch.cuda.empty_cache()
    ts, inputs = anchors_case(ptc())
    print("C1 fp32sf after empty_cache ", summary(ts, 2))
    del inputs
    torch.cuda.empty_cache()
    ts, inputs = anchors_case(ptc(**UE8M0_COL), lambda: torch.randn(T_, H_, device="cuda", dtype=torch.bfloat16))
    print("C2 ue8m0 col, bf16 randn    ", summary(ts, 2))
    del inputs
    torch.cuda.empty_cache()


def _cubin_fn(path: Path, launcher, loader, torch):
    """fn(x) -> (data, sf): the cubin launched as the hot path does, outputs allocated per call."""
    from tilebake.quant._common import alloc_sf, sf_strides_for_kernel

    meta = json.loads(path.with_suffix(".json").read_text())
    handle = launcher.load(path.read_bytes(), meta["entry"], 0, int(meta["dynamic_smem"]))
    names = tuple(p["name"] for p in meta["params"])
    sig = "".join(p["kind"] for p in meta["params"]).encode()
    grid = loader._compile_grid(meta["grid"], names, path.stem)
    block = tuple(int(b) for b in meta["block"])
    packed = meta["key"]["sf_mode"] == "ue8m0"

    def fn(x):
        t, h = x.shape
        data = x.new_empty((t, h), dtype=torch.float8_e4m3fn)
        sf = alloc_sf(x, t, -(-h // 128), packed, packed)  # UE8M0 column-major; fp32 row-major
        st, sg = sf_strides_for_kernel(sf, packed)
        v = dict(S=sf.data_ptr(), X=x.data_ptr(), Y=data.data_ptr(), amax_clamp=1e-4, hidden=h, num_tokens=t,
                 sf_stride_g=sg, sf_stride_t=st, x_stride=x.stride(0), y_stride=data.stride(0))  # fmt: skip
        a = tuple(v[n] for n in names)
        launcher.launch(handle, grid(*a), block, 0, torch.cuda.current_stream().cuda_stream, sig, a)
        return data, sf

    return fn, packed


def sweep(out: Path):
    torch, harness, tilebake = _gpu()
    from tilebake._runtime import loader

    launcher = loader._native()
    print("copy GB/s", round(harness.copy_bandwidth_gbs()))
    fns = {p.stem: _cubin_fn(p, launcher, loader, torch) for p in sorted((out / "sm_90a").glob("*.cubin"))}
    torch.cuda.empty_cache()
    inputs = [(bf16(),), (bf16(),)]
    odd = (bf16(8001, 7168 + 16 * 9) * torch.exp2(torch.randint(-8, 9, (8001, 1), device="cuda")).bfloat16(),)
    rows = {}
    for rep in range(2):  # two passes: the spread between them is the noise
        for stem, (fn, packed) in fns.items():
            if rep == 0:
                ok = True
                for (x,) in (inputs[0], odd):
                    got = fn(x)
                    want = tilebake.torch.cast(x, "e4m3", (1, 128), round_sf=packed, use_packed_ue8m0=packed,
                                               use_tma_aligned_col_major_sf=packed, amax_clamp=1e-4)  # fmt: skip
                    ok &= all(torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8))
                              for g, w in zip(got, want))  # fmt: skip
                    ok &= got[1].stride() == want[1].stride()
                rows[stem] = {"ok": ok, "eager": []}
            rows[stem]["eager"].append(statistics.median(times_us(fn, inputs)))
    for stem, r in sorted(rows.items(), key=lambda kv: sum(kv[1]["eager"])):
        e = r["eager"]
        print(f"{stem:80s} eager {e[0]:6.1f} {e[1]:6.1f}  {'ok' if r['ok'] else 'MISMATCH'}")


def layouts(reps: int = 3, fixed: int = 1):
    """The shipped op, every SF layout, each timed as anchors.py times a case (fresh inputs after
    empty_cache, outputs per call), `reps` times round; with `fixed`, after anchors.py's
    release_copy_buffers() as anchors.py now does."""
    torch, harness, _ = _gpu()
    import anchors

    print("copy GB/s", round(harness.copy_bandwidth_gbs()))
    if int(fixed):
        anchors.release_copy_buffers()
    x1 = bf16(1)
    y1 = torch.empty_like(x1)
    print("torch.mul(out=) host us", round(harness.host_us_per_call(lambda: torch.mul(x1, 2, out=y1), ()), 2))
    res = {name: [] for name in LAYOUTS}
    for _ in range(int(reps)):
        for name, kw in LAYOUTS.items():
            ts, inputs = anchors_case(ptc(**kw))
            res[name].append(statistics.median(ts))
            del inputs
            torch.cuda.empty_cache()
    for name in LAYOUTS:
        ts = res[name]
        print(
            f"{name:10s} anchors-setting eager "
            + " ".join(f"{t:6.1f}" for t in ts)
            + f"  median {statistics.median(ts):6.1f}"
        )


def window():
    """Per-call times of the UE8M0 column-major case right after memory goes back to the driver
    (torch.cuda.empty_cache), in bins of 25 calls, with each bin's start in ms after the release."""
    torch, harness, _ = _gpu()
    import time

    print("copy GB/s", round(harness.copy_bandwidth_gbs()))  # leaves its 2 x 2 GiB in torch's cache
    fn = ptc(**UE8M0_COL)
    fn(bf16(64))  # load the kernel

    def trace(label, n=300):
        e0 = torch.cuda.Event(enable_timing=True)
        e0.record()
        inputs = [(bf16(),), (bf16(),)]  # made after the release, as anchors.py makes a case's
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for i, (s, e) in enumerate(ev):
            s.record()
            fn(*inputs[i % 2])
            e.record()
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) * 1e3 for s, e in ev]
        bins = [f"{e0.elapsed_time(ev[i][0]):5.1f}ms:{statistics.median(ts[i : i + 25]):5.1f}" for i in range(0, n, 25)]
        print(f"{label:34s}", " ".join(bins))

    def release(gib, settle=0.0):
        b = torch.empty(gib * 2**28, device="cuda").fill_(1.0)
        del b
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if settle:
            torch.cuda.synchronize()
            time.sleep(settle)

    torch.cuda.empty_cache()  # the first release: copy_bandwidth_gbs's 4 GiB, as in anchors.py
    trace("first release (copy's 4 GiB)")
    trace("again, nothing released")
    release(4)
    trace("4 GiB touched + released")
    release(4, 0.1)
    trace("4 GiB released, 0.1 s wait")
    release(4, 1.0)
    trace("4 GiB released, 1 s wait")
    release(1)
    trace("1 GiB released")


def anchors_ptc(fixed: int = 1):
    """anchors.py's main loop for its two per_token_cast cases and nothing else (the other ops'
    kernels are not in a partial build; no host timing), with or without release_copy_buffers()."""
    torch, harness, _ = _gpu()
    import anchors

    copy = harness.copy_bandwidth_gbs()
    if int(fixed):
        anchors.release_copy_buffers()
    out = []
    for name in ("per_token_cast e4m3 1x128 fp32sf", "per_token_cast e4m3 1x128 ue8m0 colmajor"):
        make, fn = anchors.CASES[name]
        one = make(anchors.T)
        nbytes = sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(one))
        inputs = [one] + [make(anchors.T) for _ in range(harness.rotation_count(nbytes) - 1)]
        out.append(f"{name.split('1x128 ')[1]} {harness.time_gpu(fn, inputs)['median_us']:6.1f}")
        del inputs, one
        torch.cuda.empty_cache()
    print(f"anchors.py loop ({'fixed' if int(fixed) else 'as before'}), copy {copy:.0f} GB/s:", "  ".join(out))


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "build":
        build(Path(rest[0]), *rest[1:])
    elif cmd == "sweep":
        sweep(Path(rest[0]))
    elif cmd == "layouts":
        layouts(*rest)
    elif cmd == "window":
        window()
    elif cmd == "anchors":
        anchors_ptc(*rest)
    else:
        diag()
