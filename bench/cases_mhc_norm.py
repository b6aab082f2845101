"""Benchmark cases of the mhc pre-norm projection ops (bench/cases.py's format, merged into its
CASES through cases_mhc), m = 4 streams at (num_tokens, hidden): K = 4 hidden columns, 24 mixes."""

import torch

import tilebake

M, MIXES, SPLITS, EPS = 4, 24, 16, 1e-6


def _close(got, want, rtol=1e-3, atol=1e-3):
    pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
    return all(torch.allclose(g.double(), w.double(), rtol=rtol, atol=atol) for g, w in pairs)


def _projection_inputs(num_tokens, hidden):
    k = M * hidden
    return torch.randn(num_tokens, M, hidden, device="cuda").bfloat16(), torch.randn(MIXES, k, device="cuda") / k**0.5


def _gemm_ref(residual, fn):
    x = residual.flatten(-2).double()
    return (x @ fn.double().t()).float(), x.square().sum(-1).float()


def mhc_pre_norm_gemm_case(num_tokens, hidden):
    return {
        "op": "mhc_pre_norm_gemm",
        "variant": f"forward, {M} streams, {MIXES} mixes, {SPLITS} splits",
        "make": lambda: _projection_inputs(num_tokens, hidden),
        "fn": lambda r, fn: tilebake.mhc.mhc_pre_norm_gemm_fwd(r, fn, SPLITS),
        "ref": _gemm_ref,
        "check": lambda got, want: _close((got[0].sum(0).squeeze(1), got[1].sum(0).squeeze(1)), want),
        "bytes": num_tokens * M * hidden * 2 + MIXES * M * hidden * 4 + SPLITS * num_tokens * (MIXES + 1) * 4,
    }


def mhc_pre_norm_gemm_bwd_case(num_tokens, hidden):
    def make():
        residual, fn = _projection_inputs(num_tokens, hidden)
        return residual, fn, torch.randn(num_tokens, MIXES, device="cuda"), torch.randn(num_tokens, device="cuda") / hidden

    def ref(residual, fn, dom, dsq):
        x = residual.flatten(-2).double()
        g = dom.double() @ fn.double() + 2 * dsq.double()[:, None] * x
        return g.reshape(residual.shape).bfloat16(), (dom.double().t() @ x).float()

    return {
        "op": "mhc_pre_norm_gemm",
        "variant": f"backward, {M} streams, {MIXES} mixes (residual grad allocated)",
        "make": make,
        "fn": lambda *a: tilebake.mhc.mhc_pre_norm_gemm_bwd(*a),
        "ref": ref,
        "check": lambda got, want: _close(got, want, rtol=1e-2, atol=2e-2),
        # x read, its gradient written (fn and its partial rows are L2-sized)
        "bytes": num_tokens * M * hidden * 2 * 2,
    }


def _partials(num_tokens):
    return torch.randn(SPLITS, num_tokens, 1, MIXES, device="cuda"), torch.rand(SPLITS, num_tokens, 1, device="cuda") + 1


def mhc_reduce_partials_and_rmsnorm_case(num_tokens, hidden):
    k = M * hidden

    def ref(pm, ps):
        om, sq = pm.double().sum(0), ps.double().sum(0)
        return om.float(), sq.float(), (om.squeeze(1) * (sq / k + EPS).rsqrt()).float()

    return {
        "op": "mhc_reduce_partials_and_rmsnorm",
        "variant": f"forward, {SPLITS} splits, {MIXES} mixes",
        "make": lambda: _partials(num_tokens),
        "fn": lambda pm, ps: tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=k, rms_eps=EPS),
        "ref": ref,
        "check": lambda got, want: _close(got, want, rtol=1e-4, atol=1e-4),
        "bytes": num_tokens * (SPLITS + 2) * (MIXES + 1) * 4,
    }


def mhc_reduce_partials_and_rmsnorm_bwd_case(num_tokens, hidden):
    k = M * hidden

    def make():
        pm, ps = _partials(num_tokens)
        return torch.randn(num_tokens, MIXES, device="cuda"), pm.sum(0), ps.sum(0)

    def ref(g, om, sq):
        om64, sq64 = om.double().requires_grad_(), sq.double().requires_grad_()
        (om64.squeeze(1) * (sq64 / k + EPS).rsqrt()).backward(g.double())
        return om64.grad.float(), sq64.grad.float()

    return {
        "op": "mhc_reduce_partials_and_rmsnorm",
        "variant": f"backward, {MIXES} mixes",
        "make": make,
        "fn": lambda g, om, sq: tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(g, om, sq, rms_group_size=k, rms_eps=EPS),
        "ref": ref,
        "check": lambda got, want: _close(got, want, rtol=1e-4, atol=1e-6),
        "bytes": num_tokens * (MIXES * 3 + 2) * 4,
    }


def mhc_fn_normw_merge_case(num_tokens, hidden):
    k = M * hidden
    return {
        "op": "mhc_fn_normw_merge",
        "variant": f"forward, {MIXES} x {M} hidden (no token dim)",
        "make": lambda: (torch.randn(MIXES, k, device="cuda"), torch.randn(k, device="cuda")),
        "fn": lambda fn, w: tilebake.mhc.mhc_fn_normw_merge_fwd(fn, w),
        "ref": lambda fn, w: fn * w,
        "bytes": (2 * MIXES + 1) * k * 4,
    }


def mhc_fn_normw_merge_bwd_case(num_tokens, hidden):
    k = M * hidden
    return {
        "op": "mhc_fn_normw_merge",
        "variant": f"backward, {MIXES} x {M} hidden (no token dim)",
        "make": lambda: (torch.randn(MIXES, k, device="cuda"), torch.randn(k, device="cuda"),
                         torch.randn(MIXES, k, device="cuda")),  # fmt: skip
        "fn": lambda fn, w, g: tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, g),
        "ref": lambda fn, w, g: (g * w, (g.double() * fn.double()).sum(0).float()),
        "check": lambda got, want: _close(got, want, rtol=1e-5, atol=1e-4),
        "bytes": (3 * MIXES + 2) * k * 4,
    }


def _big_fuse_inputs(num_tokens, hidden):
    residual, fn = _projection_inputs(num_tokens, hidden)
    pm, ps = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn, SPLITS)
    return pm, ps, torch.rand(3, device="cuda") + 0.5, torch.randn(MIXES, device="cuda") * 0.1, residual


def _big_fuse_ref(pm, ps, scale, base, residual):
    """The training path's chain, op by op (the same bytes)."""
    m, hidden = residual.shape[-2:]
    _, _, mixes = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=m * hidden)
    pre, post, comb = tilebake.mhc.mhc_pre_split_mixes_fwd(mixes.view(-1, MIXES), scale, base)
    return post, tilebake.mhc.mhc_sinkhorn_fwd(comb), tilebake.mhc.mhc_pre_apply_mix_fwd(residual, pre)


def mhc_pre_big_fuse_case(num_tokens, hidden):
    return {
        "op": "mhc_pre_big_fuse",
        "variant": f"{M} streams, {SPLITS} splits",
        "make": lambda: _big_fuse_inputs(num_tokens, hidden),
        "fn": lambda *a: tilebake.mhc.mhc_pre_big_fuse_fwd(*a, n_splits=SPLITS),
        "ref": _big_fuse_ref,
        "check": lambda got, want: all(torch.equal(g, w) for g, w in zip(got, want)),
        # the residual read, the layer input written; the partials and mixes
        "bytes": num_tokens * hidden * 2 * (M + 1) + num_tokens * (SPLITS * (MIXES + 1) + 2 * M + M * M) * 4,
    }


LAYERS = 3  # the multilayer recompute's chain (the post step on every layer)


def _recompute_inputs(num_tokens, hidden):
    bf16 = lambda *shape: torch.randn(*shape, device="cuda").bfloat16()  # noqa: E731
    mix = lambda *shape: torch.rand(*shape, device="cuda")  # noqa: E731
    return (bf16(num_tokens, M, hidden), [mix(num_tokens, M, 1) for _ in range(LAYERS)],
            [bf16(num_tokens, hidden) for _ in range(LAYERS)], [mix(num_tokens, M, 1) for _ in range(LAYERS)],
            [mix(num_tokens, M, M) for _ in range(LAYERS)])  # fmt: skip


def _recompute(r0, pre, outs, post, comb):
    """The op's outputs (layer inputs, then residuals), allocated here: it writes into given lists."""
    inputs = [torch.empty_like(o) for o in outs]
    residuals = [torch.empty_like(r0) for _ in outs]
    tilebake.mhc.mhc_multilayer_recompute(r0, pre, outs, post, comb, inputs, residuals)
    return (*inputs, *residuals)


def _recompute_ref(r0, pre, outs, post, comb):
    from tilebake.torch import mhc as ref

    inputs, residuals, r = [], [], r0
    for i in range(LAYERS):
        inputs.append(ref.mhc_pre_apply_mix_ref(r, pre[i]))
        r = ref.mhc_post_ref(outs[i], r, post[i], comb[i])
        residuals.append(r)
    return (*inputs, *residuals)


def mhc_multilayer_recompute_case(num_tokens, hidden):
    return {
        "op": "mhc_multilayer_recompute",
        "variant": f"{LAYERS} layers, {M} streams",
        "make": lambda: _recompute_inputs(num_tokens, hidden),
        "fn": _recompute,
        "ref": _recompute_ref,
        # the initial residual read; a layer's output read, its input and residual written
        "bytes": num_tokens * hidden * 2 * (M + LAYERS * (2 + M)),
    }


CASES = {
    "mhc_pre_norm_gemm": [mhc_pre_norm_gemm_case, mhc_pre_norm_gemm_bwd_case],
    "mhc_reduce_partials_and_rmsnorm": [mhc_reduce_partials_and_rmsnorm_case, mhc_reduce_partials_and_rmsnorm_bwd_case],
    "mhc_fn_normw_merge": [mhc_fn_normw_merge_case, mhc_fn_normw_merge_bwd_case],
    "mhc_multilayer_recompute": [mhc_multilayer_recompute_case],
    "mhc_pre_big_fuse": [mhc_pre_big_fuse_case],
}
