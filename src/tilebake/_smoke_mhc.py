"""The mhc ops' smoke cases (python -m tilebake doctor): each against its reference on the CPU."""

import torch

import tilebake
from tilebake._smoke import T, _close, _gen, _on, _same, smoke_case
from tilebake.torch import mhc as ref

H, M = 512, 4


@smoke_case("expand_to_mhc")
def _expand_to_mhc(d):
    g = _gen()
    x, o_grad = torch.randn(T, H, generator=g).bfloat16(), torch.randn(T, M, H, generator=g).bfloat16()
    o = torch.empty(T, M, H, dtype=torch.bfloat16, device=d)
    _same("o", tilebake.mhc.expand_to_mhc_fwd(_on(x, d), o), ref.expand_to_mhc_ref(x, M))
    _same("x_grad", tilebake.mhc.expand_to_mhc_bwd(_on(o_grad, d)), ref.expand_to_mhc_bwd_ref(o_grad))


@smoke_case("mhc_post")
def _mhc_post(d):
    g = _gen()
    args = (torch.randn(T, H, generator=g).bfloat16(), torch.randn(T, M, H, generator=g).bfloat16(),
            torch.rand(T, M, 1, generator=g), torch.rand(T, M, M, generator=g))  # fmt: skip
    d_o = torch.randn(T, M, H, generator=g).bfloat16()
    _same("out", tilebake.mhc.mhc_post_fwd(*(_on(t, d) for t in args)), ref.mhc_post_ref(*args))
    got = tilebake.mhc.mhc_post_bwd(*(_on(t, d) for t in (*args, d_o)))
    for name, a, b in zip(("d_x", "d_residual", "d_post", "d_comb"), got, ref.mhc_post_bwd_ref(*args, d_o)):
        _close(name, a, b.to(a.dtype), rtol=1e-2, atol=1e-2)


@smoke_case("mhc_pre_apply_mix")
def _mhc_pre_apply_mix(d):
    g = _gen()
    x, mix = torch.randn(T, M, H, generator=g).bfloat16(), torch.rand(T, M, 1, generator=g)
    o_grad, x_grad = torch.randn(T, H, generator=g).bfloat16(), torch.randn(T, M, H, generator=g).bfloat16()
    _same("o", tilebake.mhc.mhc_pre_apply_mix_fwd(_on(x, d), _on(mix, d)), ref.mhc_pre_apply_mix_ref(x, mix))
    got_x_grad = _on(x_grad, d)
    mix_grad = tilebake.mhc.mhc_pre_apply_mix_bwd(_on(o_grad, d), _on(x, d), _on(mix, d), got_x_grad)
    want_x_grad, want_mix_grad = ref.mhc_pre_apply_mix_bwd_ref(o_grad, x, mix, x_grad)
    _same("x_grad", got_x_grad, want_x_grad)
    _close("mix_grad", mix_grad, want_mix_grad, rtol=1e-4, atol=1e-3)
