"""Launch-config search for an op whose kernel module has `LaunchConfig` and `candidate_configs()`
(per_token_cast, cast_back, per_token_cast_and_cast_back, cast, norm_forward, mhc_pre_apply_mix,
mhc_pre_big_fuse).

python bench/tune.py build .carry/tune cast_back [REGEX]  # build host: lower + nvcc every candidate
                                                         # (sm_90a), or those whose file stem matches REGEX
python bench/tune.py run .carry/tune cast_back     # GPU: time each candidate's cubin, check its bytes

Each candidate is checked once against the shipped op (same bytes, or within _CLOSE) and timed at
the SHAPES below (its kernel time from CUPTI, harness.kernel_us); the best config per (variant,
shape) is printed with its % of copy bandwidth.
"""

import dataclasses
import importlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(16384, 7168), (4096, 7168), (4096, 4096)]
# (tokens, hidden) by op where not SHAPES: mHC at its anchor's shape (m = 4 streams) and a small one
OP_SHAPES = {"mhc_pre_apply_mix": [(8192, 7168), (4096, 1280)], "mhc_pre_big_fuse": [(8192, 7168), (4096, 1280)]}


def _variants(op):
    """The variants worth tuning (the benchmarked ones), as keyword dicts of the Variant fields."""
    return {
        "per_token_cast": [
            dict(in_dtype="bf16", fmt="e4m3", num_per_channels=128, sf_mode="fp32"),
            dict(in_dtype="bf16", fmt="e2m1", num_per_channels=16, sf_mode="rne"),
            dict(in_dtype="bf16", fmt="e4m3", num_per_channels=128, sf_mode="runtime"),  # timed with SR on
            dict(in_dtype="fp32", fmt="e4m3", num_per_channels=128, sf_mode="fp32"),
        ],
        "cast_back": [
            dict(in_fmt="e4m3", out_dtype="bf16", sf_kind="fp32", per_channel=False),
            dict(in_fmt="e2m1", out_dtype="bf16", sf_kind="ue8m0", per_channel=False),
        ],
        "per_token_cast_and_cast_back": [dict(in_dtype="bf16", fmt="e4m3", num_per_channels=128)],
        "cast": [dict(in_dtype="fp32", out_dtype="bf16")],
        "norm_forward": [dict(in_dtype="bf16", has_weight=True, has_residual=True)],
        "mhc_pre_apply_mix": [dict(direction="fwd"), dict(direction="bwd")],
        "mhc_pre_big_fuse": [dict(max_mult=4)],
    }[op]


# Ops whose reductions differ from the reference's in the last bits: (relative) tolerance of the check.
# (rtol, atol); mhc_pre_apply_mix: its mix_grad, summed in another order by another warp count;
# mhc_pre_big_fuse: the shipped kernel's Sinkhorn (div.approx) against the candidate's
_CLOSE = {"norm_forward": (2**-7, 1e-5), "mhc_pre_apply_mix": (1e-4, 1e-3), "mhc_pre_big_fuse": (1e-5, 1e-6)}


def _variant_type(op):
    sys.path[:0] = [str(ROOT / "build_tools"), str(ROOT), str(ROOT / "src")]
    from tilebake._registry import VARIANT_TYPES

    return next(t for t in VARIANT_TYPES if t.op == op and t.backend == "cuda")


def _stem(v, cfg):
    return v.id + "." + ".".join(f"{k}{val}" for k, val in dataclasses.asdict(cfg).items())


def build(out: Path, op: str, only: str = ""):
    vt = _variant_type(op)

    import aot
    import harness

    kernels = None
    for fields in _variants(op):
        v = vt(**fields)
        kernels = kernels or importlib.import_module(v.kernel_module())
        for cfg in kernels.candidate_configs():
            if op == "mhc_pre_apply_mix" and v.direction == "bwd" and cfg.tokens != 1:
                continue  # the backward has no tokens a thread
            stem = _stem(v, cfg)
            if only and not re.search(only, stem):
                continue
            try:
                aot.lower_one(v, "sm_90a", out, build_kwargs={"cfg": cfg}, stem=stem)
            except BaseException as e:  # a config the kernel cannot express
                print("skip", stem, e)
                continue
            harness.compile_cubin(out / "sm_90a" / f"{stem}.cu")
            print("built", stem, flush=True)


def _setup(op, key, t, h):
    """(fresh input args list, values(args) -> kernel argument dict, output(args), expected(args), bytes)."""
    import torch

    import tilebake

    if op == "per_token_cast" and key["fmt"] == "e2m1":  # bf16 -> e2m1 1x16, e4m3 SF (sf_mode 3)

        def make():
            x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            y = torch.empty(t, h // 2, dtype=torch.int8, device="cuda")
            return (x, y, torch.empty(t, h // 16, dtype=torch.float8_e4m3fn, device="cuda"))

        def values(x, y, s):
            return dict(X=x.data_ptr(), Y=y.data_ptr(), S=s.data_ptr(), SB=s.data_ptr(), SE=s.data_ptr(),
                        amax_clamp=6 * 2.0**-9, sf_mode=3, num_tokens=t, hidden=h, x_stride=h, y_stride=h // 2,
                        sf_stride_t=h // 16, sf_stride_g=1)  # fmt: skip

        return (
            make,
            values,
            (lambda x, y, s: torch.cat([y.view(torch.uint8).flatten(), s.view(torch.uint8).flatten()])),
            (
                lambda x, y, s: torch.cat(
                    [
                        t.view(torch.uint8).flatten()
                        for t in tilebake.quant.per_token_cast(x, "e2m1", 16, use_e4m3_sf=True)
                    ]
                )
            ),
            t * h * 2 + t * h // 2 + t * (h // 16),
        )
    if op == "per_token_cast" and key["sf_mode"] == "runtime":  # bf16 -> e4m3 1x128 fp32 SF, stochastic rounding

        def make():
            x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            return (
                x,
                torch.empty(t, h, dtype=torch.float8_e4m3fn, device="cuda"),
                torch.empty(t, h // 128, device="cuda"),
            )

        def values(x, y, s):
            return dict(X=x.data_ptr(), Y=y.data_ptr(), S=s.data_ptr(), SB=s.data_ptr(), SE=s.data_ptr(),
                        amax_clamp=1e-4, sf_mode=0, store_data=1, stochastic=1, num_tokens=t, hidden=h, x_stride=h,
                        y_stride=h, sf_stride_t=h // 128, sf_stride_g=1)  # fmt: skip

        def expected(x, y, s):
            data, sf = tilebake.quant.per_token_cast(x, "e4m3", 128, stochastic_cast=True)
            return torch.cat([data.view(torch.uint8).flatten(), sf.view(torch.uint8).flatten()])

        return (
            make,
            values,
            (lambda x, y, s: torch.cat([y.view(torch.uint8).flatten(), s.view(torch.uint8).flatten()])),
            expected,
            t * h * 3 + t * (h // 128) * 4,
        )
    if op == "per_token_cast":
        in_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[key["in_dtype"]]

        def make():
            x = torch.randn(t, h, device="cuda").to(in_dtype)
            return (
                x,
                torch.empty(t, h, dtype=torch.float8_e4m3fn, device="cuda"),
                torch.empty(t, h // 128, device="cuda"),
            )

        def values(x, y, s):
            return dict(X=x.data_ptr(), Y=y.data_ptr(), S=s.data_ptr(), amax_clamp=1e-4, num_tokens=t, hidden=h,
                        x_stride=h, y_stride=h, sf_stride_t=h // 128, sf_stride_g=1)  # fmt: skip

        return (
            make,
            values,
            (lambda x, y, s: torch.cat([y.view(torch.uint8).flatten(), s.view(torch.uint8).flatten()])),
            (
                lambda x, y, s: torch.cat(
                    [t.view(torch.uint8).flatten() for t in tilebake.quant.per_token_cast(x, "e4m3", 128)]
                )
            ),
            t * h * (1 + in_dtype.itemsize) + t * (h // 128) * 4,
        )
    if op == "cast_back":
        e2m1 = key["in_fmt"] == "e2m1"
        npc = 32 if e2m1 else 128
        packed = key["sf_kind"] == "ue8m0"

        def make():
            x = torch.randn(t, h, device="cuda")
            q = tilebake.torch.cast(x, key["in_fmt"], (1, npc), round_sf=packed, use_packed_ue8m0=packed)
            return (q, torch.empty(t, h, dtype=torch.bfloat16, device="cuda"))

        def values(q, y):
            data, sf = q
            scale = 4 if packed else 1
            return dict(X=data.data_ptr(), S=sf.data_ptr(), Y=y.data_ptr(), block_m=1, block_k=npc, num_tokens=t,
                        x_cols=data.shape[1], x_stride=data.stride(0), sf_stride_0=sf.stride(0) * scale,
                        sf_stride_1=sf.stride(1) * scale)  # fmt: skip

        return (
            make,
            values,
            (lambda q, y: y),
            (lambda q, y: tilebake.quant.cast_back(q, "bf16", (1, npc))),
            (t * h * (0.5 if e2m1 else 1) + t * h * 2),
        )
    if op == "per_token_cast_and_cast_back":

        def make():
            x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            return (x, x.clone())

        def values(x, original):
            return dict(X=x.data_ptr(), amax_clamp=1e-4, round_sf=0, use_e4m3_sf=0, num_tokens=t, hidden=h, x_stride=h)

        def expected(x, original):
            y = original.clone()
            tilebake.quant.per_token_cast_and_cast_back(y, "e4m3", key["num_per_channels"])
            return y

        return make, values, (lambda x, original: x), expected, t * h * 4
    if op == "cast":

        def make():
            return (torch.randn(t, h, device="cuda"), torch.empty(t, h, dtype=torch.bfloat16, device="cuda"))

        def values(x, y):
            return dict(X=x.data_ptr(), Y=y.data_ptr(), num_groups=t * h // 4)

        return make, values, (lambda x, y: y), (lambda x, y: tilebake.quant.cast(x, torch.bfloat16, True)), t * h * 6
    if op == "norm_forward":

        def make():
            x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            w = torch.randn(h, device="cuda").to(torch.bfloat16)
            r = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            return (x, w, r, torch.empty_like(x), torch.empty_like(x), torch.empty(t, device="cuda"))

        def values(x, w, r, ro, y, rstd):
            return dict(X=x.data_ptr(), W=w.data_ptr(), R=r.data_ptr(), RO=ro.data_ptr(), Y=y.data_ptr(),
                        RSTD=rstd.data_ptr(), batch=1, num_tokens=t, hidden=h, eps=1e-6, out_scale=1.0, with_rstd=1,
                        x_stride=h, x_batch_stride=t * h, residual_stride=h, residual_batch_stride=t * h,
                        residual_out_stride=h, residual_out_batch_stride=t * h, out_stride=h,
                        out_batch_stride=t * h)  # fmt: skip

        def expected(x, w, r, ro, y, rstd):
            # Another reduction order changes rstd in its last bits: the outputs are compared
            # within a tolerance (_CLOSE), not bit for bit.
            y, rstd, ro = tilebake.torch.norm_forward_ref(x, w, 1e-6, residual=r)
            return torch.cat([y.flatten().float(), ro.flatten().float(), rstd.flatten()])

        return (
            make,
            values,
            (lambda x, w, r, ro, y, rstd: torch.cat([y.flatten().float(), ro.flatten().float(), rstd.flatten()])),
            expected,
            t * h * 8 + h * 2 + t * 4,
        )
    if op == "mhc_pre_apply_mix":
        return _apply_mix_setup(key["direction"], t, h)
    if op == "mhc_pre_big_fuse":
        return _big_fuse_setup(t, h)
    raise SystemExit(f"no tuning setup for {op}")


def _apply_mix_setup(direction, t, h, m=4):
    import torch

    import tilebake

    bf16 = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)  # noqa: E731
    sizes = dict(num_tokens=t, mhc_mult=m, hidden=h)
    if direction == "fwd":

        def make():
            return bf16(t, m, h), torch.rand(t, m, device="cuda"), bf16(t, h)

        def values(x, mix, o):
            return dict(X=x.data_ptr(), MIX=mix.data_ptr(), O=o.data_ptr(), **sizes)

        expected = lambda x, mix, o: tilebake.mhc.mhc_pre_apply_mix_fwd(x, mix).float().flatten()  # noqa: E731
        return make, values, (lambda x, mix, o: o.float().flatten()), expected, t * m * h * 2 + t * h * 2 + t * m * 4

    def make():
        mix, mix_grad = torch.rand(t, m, device="cuda"), torch.empty(t, m, device="cuda")
        return bf16(t, h), bf16(t, m, h), mix, bf16(t, m, h), mix_grad

    def values(og, x, mix, xg, mg):
        return dict(OG=og.data_ptr(), X=x.data_ptr(), MIX=mix.data_ptr(), XG=xg.data_ptr(), MG=mg.data_ptr(),
                    has_x_grad=1, **sizes)  # fmt: skip

    def expected(og, x, mix, xg, mg):
        xg = xg.clone()  # (the call then accumulates into the original)
        mg = tilebake.mhc.mhc_pre_apply_mix_bwd(og, x, mix, xg)
        return torch.cat([xg.float().flatten(), mg.flatten()])

    output = lambda og, x, mix, xg, mg: torch.cat([xg.float().flatten(), mg.flatten()])  # noqa: E731
    return make, values, output, expected, t * h * 2 + t * m * h * 2 * 3 + t * m * 8


def _big_fuse_setup(t, h, m=4, splits=1):
    """The anchor's case: one split (n_splits 1), m = 4."""
    import torch

    import tilebake

    m3 = m * (m + 2)

    def make():
        residual = torch.randn(t, m, h, device="cuda").to(torch.bfloat16)
        pm, ps = torch.randn(splits, t, 1, m3, device="cuda"), torch.rand(splits, t, 1, device="cuda") * m * h
        scale, base = torch.rand(3, device="cuda") + 0.5, torch.randn(m3, device="cuda") * 0.1
        outs = torch.empty(t, m, device="cuda"), torch.empty(t, m * m, device="cuda"), torch.empty(t, h, device="cuda")
        return pm, ps, scale, base, residual, outs[0], outs[1], outs[2].to(torch.bfloat16)

    def values(pm, ps, scale, base, x, post, comb, o):
        return dict(PM=pm.data_ptr(), PS=ps.data_ptr(), SCALE=scale.data_ptr(), BASE=base.data_ptr(), X=x.data_ptr(),
                    POST=post.data_ptr(), COMB=comb.data_ptr(), O=o.data_ptr(), num_tokens=t, mhc_mult=m, hidden=h,
                    mix_cols=m3, n_splits=splits, rms_group_size=m * h, repeat=10, rms_eps=1e-6, pre_eps=1e-6,
                    eps=1e-6, post_mult=2.0)  # fmt: skip

    def expected(pm, ps, scale, base, x, *outs):
        got = tilebake.mhc.mhc_pre_big_fuse_fwd(pm, ps, scale, base, x, None, None, None, 1e-6, 1e-6, 1e-6, 2.0, 10, splits)
        return torch.cat([v.float().flatten() for v in got])

    output = lambda *a: torch.cat([v.float().flatten() for v in a[5:]])  # noqa: E731
    return make, values, output, expected, t * m * h * 2 + t * h * 2 + t * (m3 + 1) * 4 * splits + t * (m + m * m) * 4


def run(out: Path, op: str):
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import harness

    from tilebake._runtime import loader

    launcher = loader._native()
    copy = harness.copy_bandwidth_gbs()
    rows = []
    for meta_path in sorted((out / "sm_90a").glob(f"{op}.*.json")):
        meta = json.loads(meta_path.read_text())
        if meta["op"] != op:
            continue
        stem = meta_path.stem
        smem = int(meta["dynamic_smem"])
        handle = launcher.load((out / "sm_90a" / f"{stem}.cubin").read_bytes(), meta["entry"], 0, smem)
        names = tuple(p["name"] for p in meta["params"])
        sig = "".join(p["kind"] for p in meta["params"]).encode()
        grid = loader._compile_grid(meta["grid"], names, stem)
        block = tuple(int(b) for b in meta["block"])
        for t, h in OP_SHAPES.get(op, SHAPES):
            make, values, output, expected, nbytes = _setup(op, meta["key"], t, h)
            inputs = [make() for _ in range(harness.rotation_count(int(nbytes)))]

            def call(*args):
                v = values(*args)
                a = tuple(v[n] for n in names)
                launcher.launch(handle, grid(*a), block, smem, torch.cuda.current_stream().cuda_stream, sig, a)

            want = expected(*inputs[0])  # before the call: the in-place op overwrites its input
            call(*inputs[0])
            got = output(*inputs[0])
            if op in _CLOSE:
                ok = torch.allclose(got, want, rtol=_CLOSE[op][0], atol=_CLOSE[op][1])
            else:
                ok = torch.equal(got.view(torch.uint8), want.view(torch.uint8))
            # the kernel's own time (CUPTI): eager event timing of a few-microsecond kernel is host time
            us = harness.kernel_us(call, inputs)
            gbs = nbytes / us / 1e3
            rows.append((stem, t, h, us, gbs, 100 * gbs / copy, ok, meta["id"]))
            print(f"{stem:110s} {t:6d}x{h:5d} {us:8.2f} us {gbs:6.0f} GB/s {100 * gbs / copy:5.1f}% "
                  f"{'ok' if ok else 'MISMATCH'}", flush=True)  # fmt: skip
    best = {}
    for r in rows:
        k = (r[7], r[1], r[2])  # the variant's id (a stem is the id, then the config)
        if r[6] and (k not in best or r[4] > best[k][4]):
            best[k] = r
    print(f"copy {copy:.0f} GB/s; best per variant and shape:")
    for k, r in best.items():
        print(f"  {k}: {r[0][len(k[0]) + 1 :]} {r[3]:.2f} us {r[4]:.0f} GB/s ({r[5]:.1f}%)")


if __name__ == "__main__":
    {"build": build, "run": run}[sys.argv[1]](Path(sys.argv[2]), *sys.argv[3:])
