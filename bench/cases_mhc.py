"""Benchmark cases of the mhc ops (bench/cases.py's format, merged into its CASES), m = 4 streams
at (num_tokens, hidden): the broadcast, the post merge and the pre mix, and their gradients."""

import torch

import tilebake
from tilebake.torch import mhc as ref

M = 4


def _bf16(*shape):
    return torch.randn(*shape, device="cuda").bfloat16()


def expand_to_mhc_case(num_tokens, hidden):
    return {
        "op": "expand_to_mhc",
        "variant": f"forward, {M} streams",
        "make": lambda: (_bf16(num_tokens, hidden), torch.empty(num_tokens, M, hidden, dtype=torch.bfloat16, device="cuda")),
        "fn": lambda x, o: tilebake.mhc.expand_to_mhc_fwd(x, o),
        "ref": lambda x, o: ref.expand_to_mhc_ref(x, M),
        "bytes": num_tokens * hidden * 2 * (1 + M),
    }


def expand_to_mhc_bwd_case(num_tokens, hidden):
    return {
        "op": "expand_to_mhc",
        "variant": f"backward, {M} streams summed",
        "make": lambda: (_bf16(num_tokens, M, hidden),),
        "fn": lambda o_grad: tilebake.mhc.expand_to_mhc_bwd(o_grad),
        "ref": ref.expand_to_mhc_bwd_ref,
        "bytes": num_tokens * hidden * 2 * (M + 1),
    }


def _post_inputs(num_tokens, hidden):
    return (_bf16(num_tokens, hidden), _bf16(num_tokens, M, hidden), torch.rand(num_tokens, M, 1, device="cuda"),
            torch.rand(num_tokens, M, M, device="cuda"))  # fmt: skip


def _close(got, want):
    pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
    return all(torch.allclose(g.double(), w.double(), rtol=1e-2, atol=1e-2) for g, w in pairs)


def mhc_post_case(num_tokens, hidden):
    return {
        "op": "mhc_post",
        "variant": f"forward, {M} streams",
        "make": lambda: _post_inputs(num_tokens, hidden),
        "fn": lambda *a: tilebake.mhc.mhc_post_fwd(*a),
        "ref": lambda *a: ref.mhc_post_ref(*a),
        "bytes": num_tokens * hidden * 2 * (1 + 2 * M),
    }


def mhc_post_bwd_case(num_tokens, hidden):
    return {
        "op": "mhc_post",
        "variant": f"backward, {M} streams",
        "make": lambda: (*_post_inputs(num_tokens, hidden), _bf16(num_tokens, M, hidden)),
        "fn": lambda *a: tilebake.mhc.mhc_post_bwd(*a),
        "ref": lambda *a: ref.mhc_post_bwd_ref(*a),
        "check": _close,
        # x, residual, d_o read; d_x, d_residual written
        "bytes": num_tokens * hidden * 2 * (2 + 3 * M),
    }


def mhc_pre_apply_mix_case(num_tokens, hidden):
    return {
        "op": "mhc_pre_apply_mix",
        "variant": f"forward, {M} streams",
        "make": lambda: (_bf16(num_tokens, M, hidden), torch.rand(num_tokens, M, 1, device="cuda")),
        "fn": lambda x, mix: tilebake.mhc.mhc_pre_apply_mix_fwd(x, mix),
        "ref": ref.mhc_pre_apply_mix_ref,
        "bytes": num_tokens * hidden * 2 * (M + 1),
    }


def mhc_pre_apply_mix_bwd_case(num_tokens, hidden):
    def make():
        x, mix = _bf16(num_tokens, M, hidden), torch.rand(num_tokens, M, 1, device="cuda")
        return _bf16(num_tokens, hidden), x, mix, torch.zeros_like(x)

    return {
        "op": "mhc_pre_apply_mix",
        "variant": f"backward, {M} streams, x_grad accumulated",
        "make": make,
        "fn": lambda og, x, mix, xg: tilebake.mhc.mhc_pre_apply_mix_bwd(og, x, mix, xg.clone()),
        "ref": lambda og, x, mix, xg: ref.mhc_pre_apply_mix_bwd_ref(og, x, mix, xg)[1],
        "check": _close,
        # o_grad, x read; x_grad read and written
        "bytes": num_tokens * hidden * 2 * (1 + 3 * M),
    }


def _fp32(*shape):
    return torch.randn(*shape, device="cuda")


# The per-token mix ops: launch-latency sized (a thread a token); `hidden` is not theirs.
def mhc_sinkhorn_case(num_tokens, hidden):
    return {
        "op": "mhc_sinkhorn",
        "variant": f"forward, {M} x {M}, repeat 10",
        "make": lambda: (_fp32(num_tokens, M, M),),
        "fn": lambda x: tilebake.mhc.mhc_sinkhorn_fwd(x),
        "ref": lambda x: ref.sinkhorn_normalize_ref(x),
        "check": lambda got, want: torch.allclose(got, want, rtol=1e-5, atol=1e-6),
        "bytes": num_tokens * M * M * 4 * 2,
    }


def mhc_sinkhorn_bwd_case(num_tokens, hidden):
    def ref_bwd(g, x):
        leaf = x.double().requires_grad_()
        ref.sinkhorn_normalize_ref(leaf).backward(g.double())
        return leaf.grad.float()

    return {
        "op": "mhc_sinkhorn",
        "variant": f"backward, {M} x {M}, repeat 10 (recomputed)",
        "make": lambda: (_fp32(num_tokens, M, M), _fp32(num_tokens, M, M)),
        "fn": lambda g, x: tilebake.mhc.mhc_sinkhorn_bwd(g, x),
        "ref": ref_bwd,
        "check": lambda got, want: torch.allclose(got, want, rtol=1e-5, atol=1e-6),
        "bytes": num_tokens * M * M * 4 * 3,
    }


def _split_inputs(num_tokens):
    return _fp32(num_tokens, M * (M + 2)), torch.rand(3, device="cuda") + 0.5, _fp32(M * (M + 2))


def mhc_pre_split_mixes_case(num_tokens, hidden):
    return {
        "op": "mhc_pre_split_mixes",
        "variant": f"forward, m = {M}",
        "make": lambda: _split_inputs(num_tokens),
        "fn": lambda x, s, b: tilebake.mhc.mhc_pre_split_mixes_fwd(x, s, b),
        "ref": lambda x, s, b: ref.mhc_pre_split_mixes_ref(x, s, b, M, 1.0, 1e-6),
        "check": lambda got, want: all(torch.allclose(g, w, rtol=1e-5, atol=2e-5) for g, w in zip(got, want)),
        "bytes": num_tokens * M * (M + 2) * 4 * 2,
    }


def mhc_pre_split_mixes_bwd_case(num_tokens, hidden):
    def make():
        x, s, b = _split_inputs(num_tokens)
        return _fp32(num_tokens, M), _fp32(num_tokens, M), _fp32(num_tokens, M * M), x, _fp32(num_tokens, M), s, b

    return {
        "op": "mhc_pre_split_mixes",
        "variant": f"backward, m = {M}, partials + reduce",
        "make": make,
        "fn": lambda *a: tilebake.mhc.mhc_pre_split_mixes_bwd(*a),
        "ref": lambda pg, qg, cg, x, post, s, b: ref.mhc_pre_split_mixes_bwd_ref(pg, qg, cg, x, s, b, 1.0),
        "check": lambda got, want: all(torch.allclose(g, w, rtol=1e-4, atol=1e-3) for g, w in zip(got, want)),
        "bytes": num_tokens * M * (M + 2) * 4 * 4,
    }


def _head_inputs(num_tokens):
    return _fp32(num_tokens, M), torch.rand(1, device="cuda") + 0.5, _fp32(M)


def mhc_head_compute_mix_case(num_tokens, hidden):
    return {
        "op": "mhc_head_compute_mix",
        "variant": f"forward, m = {M}",
        "make": lambda: _head_inputs(num_tokens),
        "fn": lambda x, s, b: tilebake.mhc.mhc_head_compute_mix_fwd(x, s, b),
        "ref": lambda x, s, b: ref.mhc_head_compute_mix_ref(x, s, b, 1e-6),
        "check": lambda got, want: torch.allclose(got, want, rtol=1e-4, atol=1e-5),
        "bytes": num_tokens * M * 4 * 2,
    }


def mhc_head_compute_mix_bwd_case(num_tokens, hidden):
    return {
        "op": "mhc_head_compute_mix",
        "variant": f"backward, m = {M}, 132 partial rows",
        "make": lambda: (_fp32(num_tokens, M), *_head_inputs(num_tokens)),
        "fn": lambda g, x, s, b: tilebake.mhc.mhc_head_compute_mix_bwd(g, x, s, b, num_sms=132),
        "ref": lambda g, x, s, b: ref.mhc_head_compute_mix_bwd_ref(g, x, s, b, 132),
        "check": lambda got, want: all(torch.allclose(a, w, rtol=1e-4, atol=1e-4) for a, w in zip(got, want)),
        "bytes": num_tokens * M * 4 * 3,
    }


CASES = {
    "expand_to_mhc": [expand_to_mhc_case, expand_to_mhc_bwd_case],
    "mhc_post": [mhc_post_case, mhc_post_bwd_case],
    "mhc_pre_apply_mix": [mhc_pre_apply_mix_case, mhc_pre_apply_mix_bwd_case],
    "mhc_sinkhorn": [mhc_sinkhorn_case, mhc_sinkhorn_bwd_case],
    "mhc_pre_split_mixes": [mhc_pre_split_mixes_case, mhc_pre_split_mixes_bwd_case],
    "mhc_head_compute_mix": [mhc_head_compute_mix_case, mhc_head_compute_mix_bwd_case],
}

from cases_mhc_norm import CASES as NORM_CASES  # noqa: E402  (bench/ is on the path)

CASES.update(NORM_CASES)
