"""Benchmark cases of the engram ops (bench/cases.py's format, merged into its CASES), at shapes
derived from (num_tokens, hidden): the hash over num_tokens tokens (4-grams, 2 layers, 8 tables),
the weights (hc 4, hidden), the Sinkhorn matrix (num_tokens, hidden) and its momentum
(num_tokens x hidden elements). In-place ops get an untouched copy of what they update, from
which ref computes the expected result (fn's first call starts from the same values)."""

import torch

import tilebake
from tilebake.torch import engram as ref

HC = 4
PARTIALS = 132  # grad_w_reduce: one partial per SM of an H200, as engram_gate_bwd leaves them


def _close(got, want):
    return all(torch.allclose(g, w, rtol=1e-5, atol=1e-5) for g, w in zip(got, want))


def engram_hash_case(num_tokens, hidden):
    def make():
        ids = torch.randint(0, 2**31 - 1, (num_tokens, 4), dtype=torch.int32, device="cuda")
        mul = torch.randint(-(2**62), 2**62, (2, 4), dtype=torch.int64, device="cuda")
        voc = torch.randint(1, 2**20, (2, 3, 8), dtype=torch.int32, device="cuda")
        return ids, mul, voc, ref.make_offsets(voc)

    return {
        "op": "engram_hash",
        "variant": "4-grams, 2 layers, 8 tables",
        "make": make,
        "fn": lambda *a: tilebake.engram.engram_hash(*a),
        "ref": lambda *a: ref.engram_hash_ref(*a),
        "bytes": num_tokens * 4 * 4 + 2 * num_tokens * 24 * 4,
    }


def fused_weight_case(num_tokens, hidden):
    def make():
        return tuple(torch.randn(HC, hidden, device="cuda").bfloat16() for _ in range(2))

    return {
        "op": "fused_weight",
        "variant": f"bf16 ({HC}, H) x 2 -> fp32",
        "make": make,
        "fn": lambda wh, we: tilebake.engram.fused_weight(wh, we),
        "ref": ref.fused_weight_ref,
        "bytes": HC * hidden * 8,
    }


def grad_w_reduce_case(num_tokens, hidden):
    def make():
        partial = torch.randn(PARTIALS, HC, hidden, device="cuda")
        wh, we = (torch.randn(HC, hidden, device="cuda").bfloat16() for _ in range(2))
        grads = torch.randn(2, HC, hidden, device="cuda")
        return partial, wh, we, grads, grads.clone()

    def fn(partial, wh, we, grads, untouched):
        tilebake.engram.grad_w_reduce(partial, wh, we, grads[0], grads[1])
        return grads

    def expected(partial, wh, we, grads, untouched):
        out = untouched.clone()
        ref.grad_w_reduce_ref(partial, wh, we, out[0], out[1])
        return out

    return {
        "op": "grad_w_reduce",
        "variant": f"{PARTIALS} partials of ({HC}, H) fp32",
        "make": make,
        "fn": fn,
        "ref": expected,
        "bytes": PARTIALS * HC * hidden * 4 + HC * hidden * (2 * 2 + 4 * 4),
    }


def sinkhorn_momentum_case(num_tokens, hidden):
    def make():
        grad = torch.randn(num_tokens * hidden, device="cuda")
        buf = torch.randn(num_tokens * hidden, device="cuda")
        return grad, buf, buf.clone()

    return {
        "op": "engram_sinkhorn",
        "variant": "momentum update fp32 / fp32, nesterov",
        "make": make,
        "fn": lambda g, m, m0: tilebake.engram.engram_sinkhorn_momentum_update(g, m, 0.95, True),
        "ref": lambda g, m, m0: ref.engram_sinkhorn_momentum_update_ref(g, m0.clone(), 0.95, True),
        "bytes": num_tokens * hidden * 4 * 4,
    }


def sinkhorn_step_case(num_tokens, hidden):
    def make():
        m = torch.randn(num_tokens, hidden, device="cuda")
        rs = torch.rand(num_tokens, device="cuda") + 0.5
        return m, rs, torch.rand(hidden, device="cuda") + 0.5, rs.clone()

    def fn(m, rs, cs, rs0):
        norm, partial = tilebake.engram.engram_sinkhorn_step(m, rs, cs, 1e-20)
        sumsq = torch.empty(m.shape[1], device="cuda")
        tilebake.engram.engram_sinkhorn_step_reduce(partial, sumsq)
        return norm, sumsq

    def expected(m, rs, cs, rs0):
        norm, sumsq = ref.engram_sinkhorn_step_ref(m, rs0.clone(), cs, 1e-20)
        return norm, sumsq[0]

    return {
        "op": "engram_sinkhorn",
        "variant": "step + step_reduce, fp32 (R, D)",
        "make": make,
        "fn": fn,
        "ref": expected,
        "bytes": num_tokens * hidden * 4 + num_tokens * 12 + hidden * 8,
        "check": _close,
    }


def sinkhorn_finalize_case(num_tokens, hidden):
    def make():
        m = torch.randn(num_tokens, hidden, device="cuda")
        return m, torch.rand(num_tokens, device="cuda") + 0.5, torch.rand(hidden, device="cuda") + 0.5

    return {
        "op": "engram_sinkhorn",
        "variant": "finalize, fp32 (R, D)",
        "make": make,
        "fn": lambda m, rs, cs: tilebake.engram.engram_sinkhorn_finalize(m, rs, cs, 1e-20, 0.5),
        "ref": lambda m, rs, cs: ref.engram_sinkhorn_finalize_ref(m, rs, cs, 1e-20, 0.5),
        "bytes": num_tokens * hidden * 8 + num_tokens * 4 + hidden * 4,
        "check": lambda got, want: torch.allclose(got, want, rtol=1e-5, atol=1e-5),
    }


def _gate_inputs(num_tokens, hidden):
    x = torch.randn(num_tokens, HC, hidden, device="cuda").bfloat16()
    kv = torch.randn(num_tokens, HC + 1, hidden, device="cuda").bfloat16()
    return x, kv, torch.rand(HC, hidden, device="cuda") + 0.5


def _gate_close(got, want):
    return all(torch.allclose(g.float(), w.float(), rtol=8e-3, atol=8e-3) for g, w in zip(got, want))


def gate_fwd_case(num_tokens, hidden):
    return {
        "op": "engram_gate_fwd",
        "variant": f"bf16 hc {HC}, saving",
        "make": lambda: _gate_inputs(num_tokens, hidden),
        "fn": lambda x, kv, w: tilebake.engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-4),
        "ref": lambda x, kv, w: ref.engram_gate_fwd_ref(x, kv, w, 1e-6, 1e-4),
        "bytes": num_tokens * (3 * HC + 1) * hidden * 2 + num_tokens * HC * 16,
        "check": _gate_close,
    }


def gate_bwd_case(num_tokens, hidden):
    def make():
        x, kv, w = _gate_inputs(num_tokens, hidden)
        saved = tilebake.engram.engram_gate_fwd(x, kv, w, 1e-6, 1e-4)[1:]
        return (torch.randn(num_tokens, HC, hidden, device="cuda").bfloat16(), x, kv, w, *saved)

    return {
        "op": "engram_gate_bwd",
        "variant": f"bf16 hc {HC}",
        "make": make,
        "fn": lambda *a: tilebake.engram.engram_gate_bwd(*a, 1e-4)[:2],
        "ref": lambda *a: ref.engram_gate_bwd_ref(*a, 1e-4)[:2],
        "bytes": num_tokens * (6 * HC + 2) * hidden * 2 + num_tokens * HC * 16,
        "check": lambda got, want: all(torch.allclose(g.float(), w.float(), rtol=2e-2, atol=2e-2) for g, w in zip(got, want)),
    }


CASES = {
    "engram_gate_fwd": [gate_fwd_case],
    "engram_gate_bwd": [gate_bwd_case],
    "engram_hash": [engram_hash_case],
    "fused_weight": [fused_weight_case],
    "grad_w_reduce": [grad_w_reduce_case],
    "engram_sinkhorn": [sinkhorn_momentum_case, sinkhorn_step_case, sinkhorn_finalize_case],
}
