"""tilebake against TileKernels 2.1.0 on the same GPU: every case the original was timed in (GPU only).

    python bench/anchors.py [--name anchors] [--cases REGEX]

The original's figures (its own harness, H200, 2026-12-01: ../shared/anchors/) are the
constants in ORIGINAL below; this run times tilebake at the same inputs (T = 16384, H = 7168
unless named) with bench/harness.py (CUDA-graph replay over rotated buffers; eager event timing beside), its host time at T = 1
beside torch.mul(out=), and the same run's device copy bandwidth. A case whose GPU time is above
the original's is marked SLOWER and makes the run exit 1. Writes bench/results/<date>-<gpu>/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import tilebake  # noqa: E402

T, H = 16384, 7168
quant, moe = tilebake.quant, tilebake.moe

# case -> (original GPU us, original host us at T = 1), from the anchor table.
ORIGINAL = {
    "per_token_cast e4m3 1x128 fp32sf": (86.9, 22.4),
    "per_token_cast e4m3 1x128 ue8m0 colmajor": (86.2, 47.4),
    "per_token_cast e2m1 1x16 e4m3sf": (374.4, 37.1),
    "per_token_cast fp32 in e4m3 1x128": (137.9, 39.3),
    "cast_back e4m3 1x128 -> bf16": (92.6, 21.7),
    "per_token_cast_and_cast_back e4m3 128": (229.2, 33.2),
    "swiglu_forward_and_per_token_cast e4m3 128": (172.1, 35.9),
    "norm_forward bf16 w": (117.6, 59.6),
    "norm_forward_and_per_token_cast e4m3 32": (128.4, 78.1),
    "topk_gate 256 top8": (30.5, 14.5),
    "moe_topk_gate_forward sqrtsoftplus 256 top8 bias": (38.0, 21.7),
    "apply_rotary bf16 32q+8k rot128": (180.9, 98.0),
    # Engram (../shared/anchors/tilekernels-2.1.0_h200.md, its largest shapes; host time not listed)
    "engram_hash L2 N4 M8 T8001": (7.0, None),
    "engram_gate_fwd hc4 h7168 T8001 save": (393.1, None),
    "engram_gate_bwd hc4 h7168 T8001": (639.6, None),
    "fused_weight hc4 h7168": (1.5, None),
    "grad_w_reduce hc4 h7168 132 partials": (6.9, None),
    "engram_sinkhorn momentum fp32 numel 512000512": (1939.3, None),
    "engram_sinkhorn step 100001 x 5120": (465.0, None),
    "engram_sinkhorn step_reduce 396 x 5120": (6.7, None),
    "engram_sinkhorn finalize 100001 x 5120": (1183.8, None),
    # mHC (the same table: n1 = 8192 tokens, h = 7168, 4 streams)
    "expand_to_mhc_fwd m4 h7168 T8192": (161.2, None),
    "expand_to_mhc_bwd m4 h7168 T8192": (142.6, None),
    "mhc_post_fwd m4 h7168 T8192": (256.5, None),
    "mhc_post_bwd m4 h7168 T8192": (391.3, None),
    "mhc_pre_apply_mix_fwd m4 h7168 T8192": (137.3, None),
    "mhc_pre_apply_mix_bwd m4 h7168 T8192": (355.1, None),
    # the per-token mix ops (the brief's figures for the original on the H200, CUDA events)
    "mhc_sinkhorn_fwd m4 r10 T512": (2.6, None),
    "mhc_sinkhorn_bwd m4 r10 T512": (5.3, None),
    "mhc_pre_split_mixes_fwd m4 T8192": (2.5, None),
    "mhc_pre_split_mixes_bwd m4 T8192": (5.8, None),
    "mhc_head_compute_mix_fwd m4 T8192": (1.7, None),
    "mhc_head_compute_mix_bwd m4 T8192": (3.3, None),
    "mhc_fn_normw_merge_fwd 24 x 28672": (3.0, None),
    "mhc_fn_normw_merge_bwd 24 x 28672": (5.3, None),
    "mhc_pre_big_fuse_fwd m4 h7168 T8192 1 split": (149.3, None),
    "mhc_multilayer_recompute m4 h8192 T8192 L10": (2213.6, None),
}


def bf16(*shape):
    return torch.randn(*shape, device="cuda").to(torch.bfloat16)


def weight():
    return (torch.rand(H, device="cuda") + 0.5).to(torch.bfloat16)


def rotary_inputs(t):
    angles = torch.rand(32768, 64, device="cuda") * 6.2831855
    cache = torch.cat((angles.cos(), angles.sin()), dim=1)
    return bf16(t, 32, 128), bf16(t, 8, 128), cache, torch.randint(0, 32768, (t,), device="cuda")


# case -> (make(t) -> args, fn(*args)); t is the token count.
CASES = {
    "per_token_cast e4m3 1x128 fp32sf": (lambda t: (bf16(t, H),), lambda x: quant.per_token_cast(x, "e4m3", 128)),
    "per_token_cast e4m3 1x128 ue8m0 colmajor": (
        lambda t: (bf16(t, H),),
        lambda x: quant.per_token_cast(
            x, "e4m3", 128, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True
        ),
    ),
    "per_token_cast e2m1 1x16 e4m3sf": (
        lambda t: (bf16(t, H),),
        lambda x: quant.per_token_cast(x, "e2m1", 16, use_e4m3_sf=True),
    ),
    "per_token_cast fp32 in e4m3 1x128": (
        lambda t: (torch.randn(t, H, device="cuda"),),
        lambda x: quant.per_token_cast(x, "e4m3", 128),
    ),
    "cast_back e4m3 1x128 -> bf16": (
        lambda t: (quant.per_token_cast(bf16(t, H), "e4m3", 128),),
        lambda q: quant.cast_back(q, "bf16", (1, 128)),
    ),
    "per_token_cast_and_cast_back e4m3 128": (
        lambda t: (bf16(t, H),),
        lambda x: quant.per_token_cast_and_cast_back(x, "e4m3", 128),
    ),
    "swiglu_forward_and_per_token_cast e4m3 128": (
        lambda t: (bf16(t, 2 * H),),
        lambda x: quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128),
    ),
    "norm_forward bf16 w": (lambda t: (bf16(t, H), weight()), lambda x, w: quant.norm_forward(x, w, 1e-6)),
    "norm_forward_and_per_token_cast e4m3 32": (
        lambda t: (bf16(t, H), weight()),
        lambda x, w: quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32),
    ),
    "topk_gate 256 top8": (lambda t: (torch.randn(t, 256, device="cuda"),), lambda s: moe.topk_gate(s, 8)),
    "moe_topk_gate_forward sqrtsoftplus 256 top8 bias": (
        lambda t: (torch.randn(t, 256, device="cuda"), torch.randn(256, device="cuda") * 0.1),
        lambda x, b: moe.moe_topk_gate_forward(x, 8, False, 0, 2.5, 0, bias=b),
    ),
    "apply_rotary bf16 32q+8k rot128": (
        rotary_inputs,
        lambda q, k, cache, positions: tilebake.transform.apply_rotary(q, cache, k, positions),
    ),
}


def _hash_inputs(t):
    t = 8001 if t > 1 else 1
    voc = torch.randint(1, 2**20, (2, 3, 8), dtype=torch.int32, device="cuda")
    return (torch.randint(0, 2**31 - 1, (t, 4), dtype=torch.int32, device="cuda"),
            torch.randint(-(2**62), 2**62, (2, 4), dtype=torch.int64, device="cuda"), voc,
            tilebake.torch.engram.make_offsets(voc))  # fmt: skip


def _sinkhorn_inputs(t):
    rows = 100001 if t > 1 else 1
    return (torch.randn(rows, 5120, device="cuda"), torch.rand(rows, device="cuda") + 0.5,
            torch.rand(5120, device="cuda") + 0.5)  # fmt: skip


def _grad_w_inputs(t):
    w = (torch.randn(4, H, device="cuda").bfloat16() for _ in range(2))
    return (torch.randn(132, 4, H, device="cuda"), *w, torch.zeros(4, H, device="cuda"), torch.zeros(4, H, device="cuda"))


def _gate_inputs(t):
    t = 8001 if t > 1 else 1
    x, kv, g = bf16(t, 4, H), bf16(t, 5, H), bf16(t, 4, H)
    w = torch.rand(4, H, device="cuda") + 0.5
    return x, kv, w, g, tilebake.engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-4)[1:]


engram = tilebake.engram
CASES.update({
    "engram_hash L2 N4 M8 T8001": (_hash_inputs, lambda *a: engram.engram_hash(*a)),
    "engram_gate_fwd hc4 h7168 T8001 save": (_gate_inputs, lambda x, kv, w, g, saved: engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-4)),
    "engram_gate_bwd hc4 h7168 T8001": (
        _gate_inputs,
        lambda x, kv, w, g, saved: engram.engram_gate_bwd(g, x, kv, w, *saved, 1e-4),
    ),
    "fused_weight hc4 h7168": (lambda t: (bf16(4, H), bf16(4, H)), lambda wh, we: engram.fused_weight(wh, we)),
    "grad_w_reduce hc4 h7168 132 partials": (_grad_w_inputs, lambda *a: engram.grad_w_reduce(*a)),
    "engram_sinkhorn momentum fp32 numel 512000512": (
        lambda t: (torch.randn(512000512 if t > 1 else 512, device="cuda"),
                   torch.randn(512000512 if t > 1 else 512, device="cuda")),  # fmt: skip
        lambda g, m: engram.engram_sinkhorn_momentum_update(g, m, 0.95, False),
    ),
    "engram_sinkhorn step 100001 x 5120": (_sinkhorn_inputs, lambda m, rs, cs: engram.engram_sinkhorn_step(m, rs, cs, 1e-20)),
    "engram_sinkhorn step_reduce 396 x 5120": (
        lambda t: (torch.randn(396, 5120, device="cuda"), torch.empty(5120, device="cuda")),
        lambda p, out: engram.engram_sinkhorn_step_reduce(p, out),
    ),
    "engram_sinkhorn finalize 100001 x 5120": (
        _sinkhorn_inputs,
        lambda m, rs, cs: engram.engram_sinkhorn_finalize(m, rs, cs, 1e-20, 1.0),
    ),
})  # fmt: skip


def _mhc_inputs(t):
    t = 8192 if t > 1 else 1
    return (bf16(t, H), bf16(t, 4, H), torch.rand(t, 4, 1, device="cuda"), torch.rand(t, 4, 4, device="cuda"),
            bf16(t, 4, H))  # fmt: skip


mhc = tilebake.mhc
CASES.update({
    "expand_to_mhc_fwd m4 h7168 T8192": (lambda t: _mhc_inputs(t)[:2], lambda x, o: mhc.expand_to_mhc_fwd(x, o)),
    "expand_to_mhc_bwd m4 h7168 T8192": (lambda t: _mhc_inputs(t)[4:], lambda g: mhc.expand_to_mhc_bwd(g)),
    "mhc_post_fwd m4 h7168 T8192": (lambda t: _mhc_inputs(t)[:4], lambda *a: mhc.mhc_post_fwd(*a)),
    "mhc_post_bwd m4 h7168 T8192": (_mhc_inputs, lambda *a: mhc.mhc_post_bwd(*a)),
    "mhc_pre_apply_mix_fwd m4 h7168 T8192": (lambda t: _mhc_inputs(t)[1:3], lambda x, mix: mhc.mhc_pre_apply_mix_fwd(x, mix)),
    "mhc_pre_apply_mix_bwd m4 h7168 T8192": (
        lambda t: (*_mhc_inputs(t)[:3], _mhc_inputs(t)[4]),
        lambda og, x, mix, xg: mhc.mhc_pre_apply_mix_bwd(og, x, mix, xg),
    ),
})


def _fp32(t, *shape):
    return torch.randn(t, *shape, device="cuda")


CASES.update({
    "mhc_sinkhorn_fwd m4 r10 T512": (lambda t: (_fp32(512 if t > 1 else 1, 4, 4),), lambda x: mhc.mhc_sinkhorn_fwd(x)),
    "mhc_sinkhorn_bwd m4 r10 T512": (
        lambda t: (_fp32(512 if t > 1 else 1, 4, 4), _fp32(512 if t > 1 else 1, 4, 4)),
        lambda g, x: mhc.mhc_sinkhorn_bwd(g, x),
    ),
})


def _split_inputs(t):
    t = 8192 if t > 1 else 1
    return (_fp32(t, 4), _fp32(t, 4), _fp32(t, 16), _fp32(t, 24), _fp32(t, 4), torch.rand(3, device="cuda"),
            _fp32(24))  # fmt: skip


def _head_inputs(t):
    t = 8192 if t > 1 else 1
    return _fp32(t, 4), _fp32(t, 4), torch.rand(1, device="cuda"), _fp32(4)


CASES.update({
    "mhc_pre_split_mixes_fwd m4 T8192": (lambda t: _split_inputs(t)[3:4] + _split_inputs(t)[5:],
                                         lambda x, s, b: mhc.mhc_pre_split_mixes_fwd(x, s, b)),
    "mhc_pre_split_mixes_bwd m4 T8192": (_split_inputs, lambda *a: mhc.mhc_pre_split_mixes_bwd(*a)),
    "mhc_head_compute_mix_fwd m4 T8192": (lambda t: _head_inputs(t)[1:], lambda x, s, b: mhc.mhc_head_compute_mix_fwd(x, s, b)),
    "mhc_head_compute_mix_bwd m4 T8192": (_head_inputs, lambda *a: mhc.mhc_head_compute_mix_bwd(*a)),
})


CASES.update({
    "mhc_fn_normw_merge_fwd 24 x 28672": (lambda t: (_fp32(24, 28672), _fp32(28672)),
                                          lambda fn, w: mhc.mhc_fn_normw_merge_fwd(fn, w)),
    "mhc_fn_normw_merge_bwd 24 x 28672": (lambda t: (_fp32(24, 28672), _fp32(28672), _fp32(24, 28672)),
                                          lambda fn, w, g: mhc.mhc_fn_normw_merge_bwd(fn, w, g)),
})


def _big_fuse_inputs(t):
    t = 8192 if t > 1 else 1
    return _fp32(1, t, 1, 24), torch.rand(1, t, 1, device="cuda") * 4 * H, torch.rand(3, device="cuda"), _fp32(24), bf16(t, 4, H)


def _recompute_inputs(t, layers=10, hidden=8192):
    t = 8192 if t > 1 else 1
    mix = lambda *s: torch.rand(t, *s, device="cuda")  # noqa: E731
    return (bf16(t, 4, hidden), [mix(4, 1) for _ in range(layers)], [bf16(t, hidden) for _ in range(layers)],
            [mix(4, 1) for _ in range(layers)], [mix(4, 4) for _ in range(layers)],
            [torch.empty(t, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(layers)],
            [torch.empty(t, 4, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(layers)])  # fmt: skip


CASES.update({
    # the original's fused kernel takes n_splits == 1 only
    "mhc_pre_big_fuse_fwd m4 h7168 T8192 1 split": (_big_fuse_inputs,
                                                    lambda om, sq, s, b, r: mhc.mhc_pre_big_fuse_fwd(om, sq, s, b, r, n_splits=1)),
    "mhc_multilayer_recompute m4 h8192 T8192 L10": (_recompute_inputs, lambda *a: mhc.mhc_multilayer_recompute(*a)),
})  # fmt: skip


def release_copy_buffers():
    """Give copy_bandwidth_gbs's 4 GiB (left in torch's cache) back to the driver before the first
    case, and let that finish. Released by the first case's empty_cache() instead, it slowed the
    second case's timed calls: per_token_cast UE8M0 column-major measured 94.6 us instead of 87
    (bench/results/2026-12-01-NVIDIA-H200/ptc/)."""
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    time.sleep(1.0)


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="anchors", help="result file stem (default: anchors)")
    parser.add_argument("--cases", default="", help="time only the cases whose name matches this regex")
    args = parser.parse_args()
    env = harness.environment()
    copy_gbs = harness.copy_bandwidth_gbs()
    release_copy_buffers()
    x1 = bf16(1, H)
    y1 = torch.empty_like(x1)
    mul_us = harness.host_us_per_call(lambda: torch.mul(x1, 2, out=y1), ())
    rows = []
    for name, (make, fn) in CASES.items():
        if args.cases and not re.search(args.cases, name):
            continue
        one = make(T)
        nbytes = sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(one))
        inputs = [one] + [make(T) for _ in range(harness.rotation_count(nbytes) - 1)]
        # GPU time: the calls replayed from a CUDA graph (no host work between kernels); beside it
        # each call timed eagerly with events, which adds the host's time whenever a call's host
        # work outlasts its kernel (the small ops: fused_weight's 2 us kernel measured 16-22 us so).
        ours = harness.time_graph(fn, inputs)
        eager = harness.time_gpu(fn, inputs)["median_us"]
        kernels = harness.kernel_us(fn, inputs)
        host = harness.host_us_per_call(fn, make(1))
        original_us, original_host = ORIGINAL[name]
        rows.append({"case": name, "original_us": original_us, "tilebake_us": ours, "tilebake_eager_us": eager,
                     "tilebake_kernel_us": kernels, "speed_vs_original": original_us / ours,
                     "kernel_speed_vs_original": original_us / kernels, "original_host_us": original_host,
                     "tilebake_host_us": host})  # fmt: skip
        print(f"{name:50s} original {original_us:7.1f} us  tilebake {ours:7.1f} us (eager {eager:7.1f}, kernels "
              f"{kernels:7.1f})  {original_us / ours:5.2f}x  host {host:5.1f} us", flush=True)  # fmt: skip
        del inputs, one
        torch.cuda.empty_cache()
    out = harness.results_dir()
    harness.write_json(out / f"{args.name}.json",
                       {"environment": env, "command": " ".join(sys.argv), "copy_gbs": copy_gbs,
                        "torch_mul_out_host_us": mul_us, "rows": rows})  # fmt: skip
    lines = [
        f"# tilebake against TileKernels 2.1.0: {env['gpu']}, {env['date']}, torch {env['torch']}",
        "",
        f"Command: `python {' '.join(sys.argv)}`. Same run: device copy {copy_gbs:.0f} GB/s, "
        f"`torch.mul(x, 2, out=y)` host time {mul_us:.2f} us. T = {T}, H = {H} unless named; GPU time: median of "
        "CUDA-graph replays of one call per rotated buffer (eager: median of CUDA-event-timed single calls, which "
        "include host gaps for the small ops; kernels: the sum of a call's kernel durations from CUPTI, the "
        "original harness's measure, tilelang's do_bench(backend='cupti'), which leaves out the gap between "
        "two launches); host time: one call at T = 1. The original's figures: its own harness on the H200, "
        "2026-12-01 (../shared/anchors/tilekernels-2.1.0_h200.md). A case is SLOWER when its graph time is.",
        "",
        "| case | original us | tilebake us | speed vs original | tilebake eager us | tilebake kernels us "
        "| kernels vs original | original host us | tilebake host us |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "" if r["speed_vs_original"] >= 1.0 else " SLOWER"
        lines.append(f"| {r['case']} | {r['original_us']:.1f} | {r['tilebake_us']:.1f} | "
                     f"{r['speed_vs_original']:.2f}x{mark} | {r['tilebake_eager_us']:.1f} | "
                     f"{r['tilebake_kernel_us']:.1f} | {r['kernel_speed_vs_original']:.2f}x | "
                     f"{_us(r['original_host_us'])} | {r['tilebake_host_us']:.1f} |")  # fmt: skip
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    slower = [r["case"] for r in rows if r["speed_vs_original"] < 1.0]
    if slower:
        sys.exit(f"slower than the original: {slower}")


if __name__ == "__main__":
    main()
