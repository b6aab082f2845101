"""The engram ops' smoke cases (python -m tilebake doctor): each against its reference on the CPU."""

import torch

import tilebake
from tilebake._smoke import T, _close, _gen, _on, _same, smoke_case
from tilebake.torch import engram as ref


@smoke_case("engram_hash")
def _engram_hash(d):
    g = _gen()
    ids = torch.randint(0, 2**31 - 1, (T, 4), generator=g, dtype=torch.int32)
    mul = torch.randint(-(2**62), 2**62, (2, 4), generator=g, dtype=torch.int64)
    voc = torch.randint(1, 2**20, (2, 3, 8), generator=g, dtype=torch.int32)
    args = (ids, mul, voc, ref.make_offsets(voc), torch.rand(T, generator=g) < 0.2)
    _same("indices", tilebake.engram.engram_hash(*(_on(t, d) for t in args)), ref.engram_hash_ref(*args))


@smoke_case("fused_weight")
def _fused_weight(d):
    g = _gen()
    wh, we = (torch.randn(4, 512, generator=g).bfloat16() for _ in range(2))
    _same("weight", tilebake.engram.fused_weight(_on(wh, d), _on(we, d)), ref.fused_weight_ref(wh, we))


@smoke_case("grad_w_reduce")
def _grad_w_reduce(d):
    g = _gen()
    partial = torch.randn(13, 4, 512, generator=g)
    wh, we = (torch.randn(4, 512, generator=g).bfloat16() for _ in range(2))
    gwh, gwe = torch.randn(4, 512, generator=g), torch.randn(4, 512, generator=g)
    got = [_on(gwh, d), _on(gwe, d)]
    tilebake.engram.grad_w_reduce(_on(partial, d), _on(wh, d), _on(we, d), *got)
    ref.grad_w_reduce_ref(partial, wh, we, gwh, gwe)
    _same("grad_weight_hidden", got[0], gwh)
    _same("grad_weight_embed", got[1], gwe)


@smoke_case("engram_sinkhorn")
def _engram_sinkhorn(d):
    g = _gen()
    grad, buf = torch.randn(4096, generator=g), torch.randn(4096, generator=g).bfloat16()
    got_buf = _on(buf, d)
    out = tilebake.engram.engram_sinkhorn_momentum_update(_on(grad, d), got_buf, 0.9, True)
    _same("sinkhorn input", out, ref.engram_sinkhorn_momentum_update_ref(grad, buf, 0.9, True))
    _same("momentum", got_buf, buf)
    m, rs, cs = torch.randn(T, 512, generator=g), torch.rand(T, generator=g) + 0.5, torch.rand(512, generator=g) + 0.5
    got_rs = _on(rs, d)
    norm, partial = tilebake.engram.engram_sinkhorn_step(_on(m, d), got_rs, _on(cs, d), 1e-20)
    sumsq = torch.empty(512, device=d)
    tilebake.engram.engram_sinkhorn_step_reduce(partial, sumsq)
    want_rs = rs.clone()
    want_norm, want_sumsq = ref.engram_sinkhorn_step_ref(m, want_rs, cs, 1e-20)
    _close("row_norm", norm, want_norm)
    _close("row_scale", got_rs, want_rs)
    _close("col_sumsq", sumsq, want_sumsq[0])
    final = tilebake.engram.engram_sinkhorn_finalize(_on(m, d), _on(rs, d), _on(cs, d), 1e-20, 0.5)
    _close("finalized", final, ref.engram_sinkhorn_finalize_ref(m, rs, cs, 1e-20, 0.5))


@smoke_case("engram_gate_fwd")
def _engram_gate_fwd(d):
    g = _gen()
    x, kv = torch.randn(T, 4, 512, generator=g).bfloat16(), torch.randn(T, 5, 512, generator=g).bfloat16()
    w, mask = torch.rand(4, 512, generator=g) + 0.5, torch.rand(T, generator=g) < 0.2
    got = tilebake.engram.engram_gate_fwd(_on(x, d), _on(kv, d), _on(w, d), 1e-6, 1e-4, image_token_mask=_on(mask, d))
    want = ref.engram_gate_fwd_ref(x, kv, w, 1e-6, 1e-4, mask)
    for name, a, b in zip(("output", "dot", "gate_score", "rstd_x", "rstd_k"), got, want):
        tol = 8e-3 if name == "output" else 2e-4
        _close(name, a.float(), b.float(), tol, tol)


@smoke_case("engram_gate_bwd")
def _engram_gate_bwd(d):
    g = _gen()
    x, kv = torch.randn(T, 4, 512, generator=g).bfloat16(), torch.randn(T, 5, 512, generator=g).bfloat16()
    w, grad = torch.rand(4, 512, generator=g) + 0.5, torch.randn(T, 4, 512, generator=g).bfloat16()
    saved = ref.engram_gate_fwd_ref(x, kv, w, 1e-6, 1e-4)[1:]
    got = tilebake.engram.engram_gate_bwd(*(_on(t, d) for t in (grad, x, kv, w, *saved)), 1e-4)
    want = ref.engram_gate_bwd_ref(grad, x, kv, w, *saved, 1e-4)
    _close("grad_hidden_states", got[0].float(), want[0].float(), 2e-2, 2e-2)
    _close("grad_kv", got[1].float(), want[1].float(), 2e-2, 2e-2)
    _close("grad_w (summed)", got[2].sum(0), want[2][0], 1e-3, 1e-3)
