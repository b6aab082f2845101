"""Host time of every public op at its small shape (T = 1, H = 7168: a decode step), beside
`torch.mul(x, 2, out=y)` in the same run: with outputs allocated by the op, and with every
output given (`out=` and friends) where the op takes them (GPU only).

    python bench/host_time.py [--name host_time] [--families mhc,engram]    # or through bench/bench.py

Each case builds its inputs once; the timing is harness.host_us_per_call (the CPU time of a
loop of calls that never waits for the GPU). get_fused_mapping is timed in its no-sync
mode (force_no_sync=True) and, beside it, in its synchronising mode (one device-to-host copy).
tests/test_bench_coverage.py fails when a public op has no case here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import tilebake  # noqa: E402

T, H = 1, 7168
DEVICE = "cuda"  # tests/test_bench_coverage.py runs the cases on the CPU (the references)
quant, moe = tilebake.quant, tilebake.moe


def bf16(*shape):
    return torch.randn(*shape, device=DEVICE).to(torch.bfloat16)


def _quant():
    x, w = bf16(T, H), (torch.rand(H, device=DEVICE) + 0.5).to(torch.bfloat16)
    q = quant.per_token_cast(x, "e4m3", 128)
    e2m1 = quant.per_token_cast(x, "e2m1", 32, round_sf=True, use_packed_ue8m0=True)
    blk = quant.per_block_cast(x, "e4m3", (128, 128))
    y, rstd, _ = quant.norm_forward(x, w, 1e-6, with_rstd=True)
    x2 = bf16(T, 2 * H)
    q2 = quant.per_token_cast(x2, "e4m3", 128)
    psum = torch.tensor([T], dtype=torch.int32, device=DEVICE)
    tw = torch.rand(T, device=DEVICE)
    sfs = [torch.exp2(torch.randint(-20, 10, (1, H // 128), device=DEVICE).float())]
    empty_q = (torch.empty_like(q[0]), torch.empty_like(q[1]))
    nc = quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32)
    lossless = quant.per_block_cast_lossless(e2m1, "e4m3", (1, 32), (1, 128), round_sf=True, use_packed_ue8m0=True)
    weight_sf = quant.batched_transpose_weight_sf(sfs, 128, [True])
    return {
        "per_token_cast": (lambda: quant.per_token_cast(x, "e4m3", 128),
                           lambda: quant.per_token_cast(x, "e4m3", 128, out=empty_q)),
        "per_token_cast_with_sf_only": (lambda: quant.per_token_cast_with_sf_only(x, "e4m3", 128),
                                        lambda: quant.per_token_cast_with_sf_only(x, "e4m3", 128, out_sf=empty_q[1])),
        "per_token_cast_with_precomputed_sf": (
            lambda: quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, q[1]),
            lambda: quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, q[1], out=empty_q[0])),
        "per_block_cast": (lambda: quant.per_block_cast(x, "e4m3", (128, 128)),
                           lambda: quant.per_block_cast(x, "e4m3", (128, 128), out=blk)),
        "per_block_cast_with_sf_only": (lambda: quant.per_block_cast_with_sf_only(x, "e4m3", (128, 128)),
                                        lambda: quant.per_block_cast_with_sf_only(x, "e4m3", (128, 128), out_sf=blk[1])),
        "per_block_cast_with_precomputed_sf": (
            lambda: quant.per_block_cast_with_precomputed_sf(x, "e4m3", (128, 128), blk[1]),
            lambda: quant.per_block_cast_with_precomputed_sf(x, "e4m3", (128, 128), blk[1], out=blk[0])),
        "per_channel_cast": (lambda: quant.per_channel_cast(x, "e4m3", 128), None),
        "per_block_cast_lossless": (
            lambda: quant.per_block_cast_lossless(e2m1, "e4m3", (1, 32), (1, 128), round_sf=True, use_packed_ue8m0=True),
            lambda: quant.per_block_cast_lossless(e2m1, "e4m3", (1, 32), (1, 128), round_sf=True, use_packed_ue8m0=True,
                                                  out=lossless)),
        "cast": (lambda: quant.cast(x, torch.float8_e4m3fn, stochastic_rounding=True), None),
        "cast_back": (lambda: quant.cast_back(q, "bf16", (1, 128)), None),
        "per_token_cast_back": (lambda: quant.per_token_cast_back(q, "bf16", 128), None),
        "per_token_cast_and_cast_back": (None, lambda: quant.per_token_cast_and_cast_back(x, "e4m3", 128)),
        "unpack_from_e2m1fn_x2": (lambda: quant.unpack_from_e2m1fn_x2(e2m1[0]), None),
        "batched_transpose_weight_sf": (lambda: quant.batched_transpose_weight_sf(sfs, 128, [True]),
                                        lambda: quant.batched_transpose_weight_sf(sfs, 128, [True], weight_sf)),
        "norm_forward": (lambda: quant.norm_forward(x, w, 1e-6),
                         lambda: quant.norm_forward(x, w, 1e-6, out=y)),
        "norm_forward_and_per_token_cast": (
            lambda: quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32),
            lambda: quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, out=nc[0])),
        "norm_backward": (lambda: quant.norm_backward(x, x, w, rstd), None),
        "swiglu_forward": (lambda: quant.swiglu_forward(x2, "bf16"), None),
        "swiglu_forward_and_per_token_cast": (
            lambda: quant.swiglu_forward_and_per_token_cast(x2, "e4m3", 128, psum, tw), None),
        "swiglu_backward": (lambda: quant.swiglu_backward(x2, x, "bf16"), None),
        "swiglu_backward_and_per_token_cast": (
            lambda: quant.swiglu_backward_and_per_token_cast(q2, x, "e4m3", 128), None),
    }


def _moe():
    logits, bias = torch.randn(T, 256, device=DEVICE), torch.randn(256, device=DEVICE) * 0.1
    idx, weights = moe.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0, bias=bias)
    routed = (torch.empty_like(idx), torch.empty_like(weights))
    scores = torch.nn.functional.softplus(logits).sqrt()
    grad = torch.randn(T, 8, device=DEVICE)
    grad_logits = torch.empty_like(scores)
    mapping = moe.get_fused_mapping(idx, 256, 0, 128)
    p2e, ttp = mapping[0], mapping[3]
    x = bf16(T, H)
    xf = bf16(p2e.numel(), H)
    reduced = torch.empty(T, H, dtype=torch.bfloat16, device=DEVICE)
    q = quant.per_token_cast(x, "e4m3", 128)
    return {
        "topk_gate": (lambda: moe.topk_gate(logits, 8), None),
        "normalize_weight": (lambda: moe.normalize_weight(weights), None),
        "moe_topk_gate_forward": (lambda: moe.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0, bias=bias),
                                  lambda: moe.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0, bias=bias, out=routed)),
        "moe_topk_gate": (lambda: moe.moe_topk_gate(logits, 8, False, 0, 2.5, 0, bias=bias), None),
        "moe_topk_gate_backward": (
            lambda: moe.moe_topk_gate_backward(scores, idx, weights, grad, 2.5),
            lambda: moe.moe_topk_gate_backward(scores, idx, weights, grad, 2.5, out=grad_logits)),
        "get_fused_mapping": (lambda: moe.get_fused_mapping(idx, 256, 0, 128, force_no_sync=True), None),
        "get_fused_mapping (synchronising)": (lambda: moe.get_fused_mapping(idx, 256, 0, 128), None),
        "expand_to_fused": (lambda: moe.expand_to_fused(x, ttp, p2e), None),
        "expand_to_fused_with_sf": (lambda: moe.expand_to_fused_with_sf(q, 128, ttp, p2e), None),
        "reduce_fused": (lambda: moe.reduce_fused(xf, weights, ttp), lambda: moe.reduce_fused(xf, weights, ttp, out=reduced)),
    }


def _others():
    q, k = bf16(T, 32, 128), bf16(T, 8, 128)
    angles = torch.rand(32768, 64, device=DEVICE) * 6.2831855
    cache = torch.cat((angles.cos(), angles.sin()), dim=1)
    positions = torch.randint(0, 32768, (T,), device=DEVICE)
    x = bf16(T, H)
    return {
        "apply_rotary": (None, lambda: tilebake.transform.apply_rotary(q, cache, k, positions)),
        "randn": (lambda: tilebake.rand.randn(T, H, device=DEVICE), None),
        "randn_like": (lambda: tilebake.rand.randn_like(x), None),
    }


def _engram():
    e = tilebake.engram
    ids = torch.randint(0, 2**31 - 1, (T, 4), dtype=torch.int32, device=DEVICE)
    mul = torch.randint(-(2**62), 2**62, (2, 4), dtype=torch.int64, device=DEVICE)
    voc = torch.randint(1, 2**20, (2, 3, 8), dtype=torch.int32, device=DEVICE)
    off = tilebake.torch.engram.make_offsets(voc)
    wh, we = bf16(4, H), bf16(4, H)
    partial, gwh, gwe = torch.randn(132, 4, H, device=DEVICE), torch.zeros(4, H, device=DEVICE), torch.zeros(4, H, device=DEVICE)
    grad, buf = torch.randn(T * H, device=DEVICE), torch.zeros(T * H, device=DEVICE)
    m, rs, cs = torch.randn(T, 5120, device=DEVICE), torch.ones(T, device=DEVICE), torch.ones(5120, device=DEVICE)
    _, col_partial = e.engram_sinkhorn_step(m, rs.clone(), cs, 1e-20)
    sumsq, final = torch.empty(5120, device=DEVICE), torch.empty_like(m)
    x, kv, g = bf16(T, 4, H), bf16(T, 5, H), bf16(T, 4, H)
    wf = e.fused_weight(wh, we)
    saved = e.engram_gate_fwd(x, kv, wf, 1e-6, 1e-4)[1:]
    return {
        "engram_gate_fwd": (lambda: e.engram_gate_fwd(x, kv, wf, 1e-6, 1e-4), None),
        "engram_gate_bwd": (lambda: e.engram_gate_bwd(g, x, kv, wf, *saved, 1e-4), None),
        "engram_hash": (lambda: e.engram_hash(ids, mul, voc, off), None),
        "fused_weight": (lambda: e.fused_weight(wh, we), None),
        "grad_w_reduce": (None, lambda: e.grad_w_reduce(partial, wh, we, gwh, gwe)),
        "engram_sinkhorn_momentum_update": (lambda: e.engram_sinkhorn_momentum_update(grad, buf, 0.95), None),
        "engram_sinkhorn_step": (lambda: e.engram_sinkhorn_step(m, rs, cs, 1e-20), None),
        "engram_sinkhorn_step_reduce": (None, lambda: e.engram_sinkhorn_step_reduce(col_partial, sumsq)),
        "engram_sinkhorn_finalize": (lambda: e.engram_sinkhorn_finalize(m, rs, cs, 1e-20, 0.5),
                                     lambda: e.engram_sinkhorn_finalize(m, rs, cs, 1e-20, 0.5, out=final)),
    }


def _mhc():
    mh = tilebake.mhc
    x, residual, d_o = bf16(T, H), bf16(T, 4, H), bf16(T, 4, H)
    post, comb = torch.rand(T, 4, 1, device=DEVICE), torch.rand(T, 4, 4, device=DEVICE)
    o, x_grad = torch.empty_like(residual), torch.empty_like(x)
    return {
        "expand_to_mhc_fwd": (None, lambda: mh.expand_to_mhc_fwd(x, o)),
        "expand_to_mhc_bwd": (lambda: mh.expand_to_mhc_bwd(d_o), lambda: mh.expand_to_mhc_bwd(d_o, x_grad)),
        "mhc_post_fwd": (lambda: mh.mhc_post_fwd(x, residual, post, comb),
                         lambda: mh.mhc_post_fwd(x, residual, post, comb, out=o)),
        "mhc_post_bwd": (lambda: mh.mhc_post_bwd(x, residual, post, comb, d_o), None),
        "mhc_pre_apply_mix_fwd": (lambda: mh.mhc_pre_apply_mix_fwd(residual, post),
                                  lambda: mh.mhc_pre_apply_mix_fwd(residual, post, x_grad)),
        "mhc_pre_apply_mix_bwd": (None, lambda: mh.mhc_pre_apply_mix_bwd(x, residual, post, d_o)),
        **_mhc_mix(),
        **_mhc_pre_norm(),
    }


def _mhc_mix():
    mh = tilebake.mhc
    m3 = 4 * 6
    comb, g_comb = torch.rand(T, 4, 4, device=DEVICE), torch.rand(T, 4, 4, device=DEVICE)
    comb_out = torch.empty_like(comb)
    mixes, scale3, base3 = torch.rand(T, m3, device=DEVICE), torch.rand(3, device=DEVICE), torch.rand(m3, device=DEVICE)
    pre, post = torch.empty(T, 4, 1, device=DEVICE), torch.empty(T, 4, 1, device=DEVICE)
    mixes_grad, scale3_grad, base3_grad = torch.empty_like(mixes), torch.empty_like(scale3), torch.empty_like(base3)
    head, scale1, base1 = torch.rand(T, 4, device=DEVICE), torch.rand(1, device=DEVICE), torch.rand(4, device=DEVICE)
    head_out, sp, bp = torch.empty_like(head), torch.empty(132, 1, device=DEVICE), torch.empty(132, 4, device=DEVICE)
    return {
        "mhc_sinkhorn_fwd": (lambda: mh.mhc_sinkhorn_fwd(comb), lambda: mh.mhc_sinkhorn_fwd(comb, comb_out)),
        "mhc_sinkhorn_bwd": (lambda: mh.mhc_sinkhorn_bwd(g_comb, comb), lambda: mh.mhc_sinkhorn_bwd(g_comb, comb, comb_out)),
        "mhc_pre_split_mixes_fwd": (lambda: mh.mhc_pre_split_mixes_fwd(mixes, scale3, base3),
                                    lambda: mh.mhc_pre_split_mixes_fwd(mixes, scale3, base3, pre, post, comb_out)),
        "mhc_pre_split_mixes_bwd": (lambda: mh.mhc_pre_split_mixes_bwd(pre, post, comb, mixes, post, scale3, base3),
                                    lambda: mh.mhc_pre_split_mixes_bwd(pre, post, comb, mixes, post, scale3, base3,
                                                                       mixes_grad, scale3_grad, base3_grad)),
        "mhc_head_compute_mix_fwd": (lambda: mh.mhc_head_compute_mix_fwd(head, scale1, base1),
                                     lambda: mh.mhc_head_compute_mix_fwd(head, scale1, base1, head_out)),
        "mhc_head_compute_mix_bwd": (lambda: mh.mhc_head_compute_mix_bwd(head, head, scale1, base1),
                                     lambda: mh.mhc_head_compute_mix_bwd(head, head, scale1, base1, head_out, sp, bp)),
    }


def _mhc_pre_norm():
    mh = tilebake.mhc
    m3, k = 24, 4 * H
    residual, fn, w = bf16(T, 4, H), torch.randn(m3, k, device=DEVICE), torch.rand(k, device=DEVICE)
    fn_out, fn_grad, w_grad = torch.empty_like(fn), torch.empty_like(fn), torch.empty_like(w)
    pm, ps = mh.mhc_pre_norm_gemm_fwd(residual, fn, 16)
    om, sq, out = torch.empty(T, 1, m3, device=DEVICE), torch.empty(T, 1, device=DEVICE), torch.empty(T, m3, device=DEVICE)
    r_grad = torch.zeros_like(residual)
    om_grad, sq_grad = torch.empty_like(om), torch.empty_like(sq)
    scale3, base3 = torch.rand(3, device=DEVICE), torch.rand(m3, device=DEVICE)
    post, comb, li = torch.empty(T, 4, 1, device=DEVICE), torch.empty(T, 4, 4, device=DEVICE), bf16(T, H)
    outs, resids = [bf16(T, H)], [torch.empty_like(residual)]
    return {
        "mhc_pre_big_fuse_fwd": (lambda: mh.mhc_pre_big_fuse_fwd(pm, ps, scale3, base3, residual),
                                 lambda: mh.mhc_pre_big_fuse_fwd(pm, ps, scale3, base3, residual, post, comb, li)),
        "mhc_multilayer_recompute": (None, lambda: mh.mhc_multilayer_recompute(residual, [post], outs, [post], [comb], [li],
                                                                               resids)),
        "mhc_fn_normw_merge_fwd": (lambda: mh.mhc_fn_normw_merge_fwd(fn, w), lambda: mh.mhc_fn_normw_merge_fwd(fn, w, fn_out)),
        "mhc_fn_normw_merge_bwd": (lambda: mh.mhc_fn_normw_merge_bwd(fn, w, fn),
                                   lambda: mh.mhc_fn_normw_merge_bwd(fn, w, fn, fn_grad, w_grad)),
        "mhc_pre_norm_gemm_fwd": (lambda: mh.mhc_pre_norm_gemm_fwd(residual, fn, 16),
                                  lambda: mh.mhc_pre_norm_gemm_fwd(residual, fn, 16, pm, ps)),
        "mhc_pre_norm_gemm_bwd": (lambda: mh.mhc_pre_norm_gemm_bwd(residual, fn, out, sq),
                                  lambda: mh.mhc_pre_norm_gemm_bwd(residual, fn, out, sq, r_grad, fn_grad)),
        "mhc_reduce_partials_and_rmsnorm_fwd": (
            lambda: mh.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=k),
            lambda: mh.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, om, sq, out, k, 1e-6, 16)),
        "mhc_reduce_partials_and_rmsnorm_bwd": (
            lambda: mh.mhc_reduce_partials_and_rmsnorm_bwd(out, om, sq, rms_group_size=k),
            lambda: mh.mhc_reduce_partials_and_rmsnorm_bwd(out, om, sq, om_grad, sq_grad, k, 1e-6)),
    }


FAMILIES = {"quant": lambda: _quant(), "moe": lambda: _moe(), "engram": lambda: _engram(), "mhc": lambda: _mhc(),
            "others": lambda: _others()}  # fmt: skip


def cases(families=tuple(FAMILIES)) -> dict:
    """public name -> (call allocating its outputs or None, call with every output given /
    in place, or None where the op takes no outputs), for the named families' ops."""
    return {name: case for family in families for name, case in FAMILIES[family]().items()}


# Public functions that launch nothing on the GPU (no host-time case).
NOT_OPS = {"QuantTensor", "reserve_seed", "set_seed"}


def measure(families=tuple(FAMILIES)) -> dict:
    x = bf16(T, H)
    y = torch.empty_like(x)
    mul = harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ())
    rows = []
    for name, (alloc, given) in cases(families).items():
        row = {"op": name}
        for label, fn in (("allocated", alloc), ("given", given)):
            if fn is not None:
                us = harness.host_us_per_call(fn, ())
                row[f"{label}_us"], row[f"{label}_ratio"] = us, us / mul
        rows.append(row)
    return {"torch_mul_out_us": mul, "rows": rows}


def markdown(result: dict) -> list[str]:
    mul = result["torch_mul_out_us"]
    lines = [f"Host time per call at T = {T}, H = {H} (us; x torch.mul(x, 2, out=y) = {mul:.2f} us, same run):", "",
             "| op | outputs allocated | x torch.mul | outputs given / in place | x torch.mul |", "|---|---|---|---|---|"]  # fmt: skip

    def cell(row, label):
        return (f"{row[f'{label}_us']:.2f} | {row[f'{label}_ratio']:.2f}" if f"{label}_us" in row else "- | -")

    lines += [f"| {r['op']} | {cell(r, 'allocated')} | {cell(r, 'given')} |" for r in result["rows"]]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="host_time")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated: " + ", ".join(FAMILIES))
    args = parser.parse_args()
    env = harness.environment()
    result = measure(tuple(args.families.split(",")))
    out = harness.results_dir()
    harness.write_json(out / f"{args.name}.json", {"environment": env, "command": " ".join(sys.argv), **result})
    text = "\n".join([f"# tilebake host time: {env['gpu']}, {env['date']}, torch {env['torch']}", "",
                      f"Command: `python {' '.join(sys.argv)}`.", "", *markdown(result)])  # fmt: skip
    (out / f"{args.name}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
