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


CASES = {
    "mhc_pre_norm_gemm": [mhc_pre_norm_gemm_case, mhc_pre_norm_gemm_bwd_case],
    "mhc_reduce_partials_and_rmsnorm": [mhc_reduce_partials_and_rmsnorm_case, mhc_reduce_partials_and_rmsnorm_bwd_case],
    "mhc_fn_normw_merge": [mhc_fn_normw_merge_case, mhc_fn_normw_merge_bwd_case],
}
