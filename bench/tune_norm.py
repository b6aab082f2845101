"""Launch-config search for norm_forward and norm_forward_and_per_token_cast (bf16 with weight,
with and without residual; the cast e4m3 1 x 32 with the plain fp32 SF, the op's default, and
with round_sf + packed UE8M0 SF), beside main's kernels (.base) as the same-run reference.

python bench/tune_norm.py build DIR [REGEX]   # build host: lower + nvcc each candidate (sm_90a)
python bench/tune_norm.py baseline DIR REPO   # build host: the variants (both ops) as another
                                              # checkout builds them (e.g. `git archive main`): .base
python bench/tune_norm.py run DIR             # GPU: time every cubin in DIR/sm_90a

Candidates of one thread mapping (threads per CTA; .base: 256) must give the same bytes (the
same reduction order): each is compared byte for byte with the first one timed of its mapping
on the same input (`same` / `DIFFERENT`), and timed at SHAPES; the table gives us and % of the
same run's device copy bandwidth. Cast candidates run persistent, with min(rows, min_ctas x SMs)
CTAs, and with one CTA per row (`.rows`). Also prints the host time per call of both public ops
at T = 1 beside torch.mul(out=) (when the kernel wheel is installed).
"""

import dataclasses
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(16384, 7168), (4096, 7168)]


def _variants():
    from tilebake.quant.norm_forward import NormForwardVariant
    from tilebake.quant.norm_forward_and_per_token_cast import NormForwardCastVariant

    return [
        v
        for r in (False, True)
        for v in (NormForwardVariant("bf16", True, r), NormForwardCastVariant("bf16", True, r, 32))
    ]


def _configs(v):
    from kernels_tl.quant import norm_forward, norm_forward_and_per_token_cast

    if v.op == "norm_forward_and_per_token_cast":
        C = norm_forward_and_per_token_cast.LaunchConfig
        cands = [C(256, 4), C(128, 6), C(256, 5), C(256, 4, split_sf=True)]
        if not v.has_residual:  # (with residual: one CTA per row, nothing to prefetch)
            cands += [C(128, 4, True), C(128, 5, True), C(256, 3, True), C(256, 4, True)]
            cands += [C(128, 6, split_sf=True), C(128, 4, True, True)]
        return cands
    C = norm_forward.LaunchConfig
    return [
        C(256, 8, 4, w_ahead=True),
        C(128, 8, 5, w_ahead=True),
        C(128, 8, 6, w_ahead=True),
        C(256, 8, 3, w_ahead=True),
    ]


def _nvcc(out: Path, stem: str):
    import harness

    print(f"built {stem}: {harness.compile_cubin(out / 'sm_90a' / f'{stem}.cu')}", flush=True)


def build(out: Path, only: str = ""):
    sys.path[:0] = [str(ROOT / "build_tools"), str(ROOT), str(ROOT / "src")]
    import aot

    for v in _variants():
        for cfg in _configs(v):
            stem = v.id + "." + ".".join(f"{k}{int(val)}" for k, val in dataclasses.asdict(cfg).items())
            if only and not re.search(only, stem):
                continue
            aot.lower_one(v, "sm_90a", out, build_kwargs={"cfg": cfg}, stem=stem)
            _nvcc(out, stem)


def baseline(out: Path, repo: Path):
    sys.path[:0] = [str(repo / "build_tools")]  # its aot puts that checkout first on the path
    import aot

    for v in _variants():
        aot.lower_one(v, "sm_90a", out, stem=v.id + ".base")
        _nvcc(out, v.id + ".base")


def _case(key, t, h, sf_mode="ue8m0"):
    """(make() -> args, values(args) -> kernel arguments, outputs(args) -> uint8 bytes, bytes moved);
    sf_mode: 'ue8m0' (round_sf, packed) or 'fp32' (the plain SF, the op's default)."""
    import torch

    quant = key["op"] == "norm_forward_and_per_token_cast"
    res = key["has_residual"]
    packed = sf_mode == "ue8m0"

    def make():
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        w = (torch.rand(h, device="cuda") + 0.5).to(torch.bfloat16)
        r = torch.randn(t, h, device="cuda").to(torch.bfloat16) if res else x
        y = torch.empty(t, h, dtype=torch.float8_e4m3fn if quant else torch.bfloat16, device="cuda")
        sf = torch.empty(t, h // 128 if packed else h // 32, dtype=torch.int32, device="cuda")
        return x, w, r, torch.empty_like(x) if res else x, y, sf, torch.empty(t, device="cuda")

    def values(x, w, r, ro, y, sf, rstd):
        return dict(
            X=x.data_ptr(), W=w.data_ptr(), R=r.data_ptr(), RO=ro.data_ptr(), Y=y.data_ptr(), RSTD=rstd.data_ptr(),
            YB=x.data_ptr(), S=sf.data_ptr(), SP=sf.data_ptr(), MM=sf.data_ptr(), batch=1, num_tokens=t, hidden=h,
            eps=1e-6, out_scale=1.0, with_rstd=int(not quant), amax_clamp=1e-4,
            round_sf=int(packed), packed=int(packed), with_out_bf16=0, mega_block_m=0, mega_aligned_block_m=0,
            mm_rows=0, x_stride=h, x_batch_stride=t * h,
            residual_stride=h, residual_batch_stride=t * h, residual_out_stride=h, residual_out_batch_stride=t * h,
            out_stride=h, out_batch_stride=t * h, out_bf16_stride=h, out_bf16_batch_stride=t * h,
            sf_batch_stride=0, sf_stride_t=(h // 128) * 4 if packed else h // 32, sf_stride_g=4 if packed else 1,
        )  # fmt: skip

    def outputs(x, w, r, ro, y, sf, rstd):
        parts = [y.view(torch.uint8).flatten()]
        parts += [sf.view(torch.uint8).flatten()] if quant else [rstd.view(torch.uint8)]
        parts += [ro.view(torch.uint8).flatten()] if res else []
        return torch.cat(parts)

    sf_bytes = t * h // 32 * (1 if packed else 4)
    moved = t * h * (2 + (1 if quant else 2) + (4 if res else 0)) + h * 2 + (sf_bytes if quant else t * 4)
    return make, values, outputs, moved


def _host_cost():
    """us per public call at T = 1, H = 7168 (the installed wheel), beside torch.mul(out=)."""
    import cases
    import harness
    import torch

    x = torch.randn(1, 7168, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    mul = harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ())
    print(f"host: torch.mul(x, 2, out=y) {mul:.2f} us", flush=True)
    for op in ("norm_forward", "norm_forward_and_per_token_cast"):
        for make_case in cases.CASES[op]:
            case = make_case(1, 7168)
            us = harness.host_us_per_call(case["fn"], case["make"]())
            print(f"host: {op} ({case['variant']}) {us:.2f} us = {us / mul:.2f} x torch.mul", flush=True)


def _threads(stem: str) -> int:
    """A candidate's threads per CTA (.base: main's 256): candidates of one mapping must give equal bytes."""
    m = re.search(r"\.threads(\d+)", stem)
    return int(m.group(1)) if m else 256


def run(out: Path):
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import harness

    from tilebake._runtime import loader

    launcher = loader._native()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy = harness.copy_bandwidth_gbs()
    print(f"device copy (read + write): {copy:.0f} GB/s; {sms} SMs", flush=True)
    try:
        _host_cost()
    except Exception as e:  # a runtime wheel without the kernels
        print(f"host: not timed ({type(e).__name__}: {e})", flush=True)
    kernels = {}
    for meta_path in sorted((out / "sm_90a").glob("*.json")):
        meta = json.loads(meta_path.read_text())
        stem = meta_path.stem
        handle = launcher.load((out / "sm_90a" / f"{stem}.cubin").read_bytes(), meta["entry"], 0, meta["dynamic_smem"])
        names = tuple(p["name"] for p in meta["params"])
        sig = "".join(p["kind"] for p in meta["params"]).encode()
        grid = loader._compile_grid(meta["grid"], names, stem)
        kernels[stem] = (meta, handle, names, sig, grid, tuple(int(b) for b in meta["block"]))
    rows = []
    for vid in sorted({s.rsplit(".", 1)[0] if s.endswith(".base") else s.split(".threads")[0] for s in kernels}):
        key = kernels[vid + ".base"][0]["key"]
        quant = key["op"] == "norm_forward_and_per_token_cast"
        for t, h in SHAPES:
            for sf_mode in ("fp32", "ue8m0") if quant else ("",):
                make, values, outputs, moved = _case(key, t, h, sf_mode or "ue8m0")
                inputs = [make() for _ in range(min(8, harness.rotation_count(t * h * 4)))]
                stems = [s for s in kernels if s.startswith(vid + ".")]
                # Persistent (num_ctas = min(rows, min_ctas x SMs)) and one CTA per row (.rows).
                modes = [(s, None) for s in stems] + ([(s, t) for s in stems] if quant else [])
                want = {}
                for stem, ctas in sorted(modes, key=lambda m: (not m[0].endswith(".base"), m[0], m[1] or 0)):
                    meta, handle, names, sig, grid, block = kernels[stem]
                    m = re.search(r"min_ctas(\d)", stem)
                    num_ctas = ctas or (min(t, int(m.group(1)) * sms) if m else min(t, 4 * sms))

                    def call(*args):
                        v = values(*args)
                        v["num_ctas"] = num_ctas
                        a = tuple(v[n] for n in names)
                        launcher.launch(handle, grid(*a), block, meta["dynamic_smem"] or 0,
                                        torch.cuda.current_stream().cuda_stream, sig, a)  # fmt: skip

                    call(*inputs[0])
                    got = outputs(*inputs[0]).clone()
                    same = torch.equal(got, want.setdefault(_threads(stem), got))
                    us = harness.time_gpu(call, inputs, reps=40)["median_us"]
                    label = stem[len(vid) + 1 :] + (".rows" if ctas else "") + (f" {sf_mode}" if sf_mode else "")
                    gbs = moved / us / 1e3
                    rows.append((vid, t, h, label, us, gbs, same))
                    print(f"{vid[13:]:72s} {t:6d}x{h} {label:48s} {us:8.1f} us {gbs:6.0f} GB/s "
                          f"{100 * gbs / copy:5.1f}% {'same' if same else 'DIFFERENT'}", flush=True)  # fmt: skip
    print(f"copy {copy:.0f} GB/s; best per variant, shape and SF mode (bytes equal within a thread mapping):")
    best = {}
    for r in rows:
        k = (r[0], r[1], r[3].split(" ")[1] if " " in r[3] else "")
        if r[6] and (k not in best or r[4] < best[k][4]):
            best[k] = r
    for (vid, t, mode), r in best.items():
        base = next(x for x in rows if x[0] == vid and x[1] == t and x[3].startswith("base") and x[3].endswith(mode))
        print(f"  {vid[13:]:72s} {t:6d} {mode:5s}: {r[3]:48s} {r[4]:7.1f} us (base {base[4]:.1f} us)")


if __name__ == "__main__":
    cmd, out = sys.argv[1], Path(sys.argv[2])
    {"build": build, "baseline": baseline, "run": run}[cmd](
        out, *[Path(a) if cmd == "baseline" else a for a in sys.argv[3:]]
    )
