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


CASES = {
    "expand_to_mhc": [expand_to_mhc_case, expand_to_mhc_bwd_case],
    "mhc_post": [mhc_post_case, mhc_post_bwd_case],
    "mhc_pre_apply_mix": [mhc_pre_apply_mix_case, mhc_pre_apply_mix_bwd_case],
}
