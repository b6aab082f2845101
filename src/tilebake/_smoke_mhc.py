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


@smoke_case("mhc_sinkhorn")
def _mhc_sinkhorn(d):
    g = _gen()
    x, grad = torch.randn(T, M, M, generator=g), torch.randn(T, M, M, generator=g)
    _close("out", tilebake.mhc.mhc_sinkhorn_fwd(_on(x, d)), ref.sinkhorn_normalize_ref(x), rtol=1e-5, atol=1e-6)
    leaf = x.double().requires_grad_()
    ref.sinkhorn_normalize_ref(leaf).backward(grad.double())
    _close("grad_input", tilebake.mhc.mhc_sinkhorn_bwd(_on(grad, d), _on(x, d)), leaf.grad.float(), rtol=1e-5, atol=1e-6)


@smoke_case("mhc_pre_split_mixes")
def _mhc_pre_split_mixes(d):
    g = _gen()
    x, scale, base = torch.randn(T, M * (M + 2), generator=g), torch.rand(3, generator=g) + 0.5, torch.randn(M * (M + 2), generator=g)
    grads = [torch.randn(T, M, k, generator=g) for k in (1, 1, M)]
    got = tilebake.mhc.mhc_pre_split_mixes_fwd(*(_on(t, d) for t in (x, scale, base)))
    for name, a, b in zip(("pre", "post", "comb"), got, ref.mhc_pre_split_mixes_ref(x, scale, base, M, 1.0, 1e-6)):
        _close(name, a, b, rtol=1e-5, atol=2e-5)
    got = tilebake.mhc.mhc_pre_split_mixes_bwd(*(_on(t, d) for t in (*grads, x, grads[1], scale, base)))
    for name, a, b in zip(("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"), got,
                          ref.mhc_pre_split_mixes_bwd_ref(*grads, x, scale, base, 1.0)):  # fmt: skip
        _close(name, a, b, rtol=1e-4, atol=1e-4)


@smoke_case("mhc_head_compute_mix")
def _mhc_head_compute_mix(d):
    g = _gen()
    x, scale, base, og = torch.randn(T, M, generator=g), torch.rand(1, generator=g) + 0.5, torch.randn(M, generator=g), torch.randn(T, M, generator=g)
    got = tilebake.mhc.mhc_head_compute_mix_fwd(*(_on(t, d) for t in (x, scale, base)))
    _close("output_mix", got, ref.mhc_head_compute_mix_ref(x, scale, base, 1e-6), rtol=1e-4, atol=1e-5)
    got = tilebake.mhc.mhc_head_compute_mix_bwd(*(_on(t, d) for t in (og, x, scale, base)), num_sms=4)
    for name, a, b in zip(("input_mix_grad", "scale partials", "base partials"), got,
                          ref.mhc_head_compute_mix_bwd_ref(og, x, scale, base, 4)):  # fmt: skip
        _close(name, a, b, rtol=1e-4, atol=1e-4)


@smoke_case("mhc_pre_norm_gemm")
def _mhc_pre_norm_gemm(d):
    g = _gen()
    residual = torch.randn(T, M, 64, generator=g).bfloat16()
    fn, dom, dsq = torch.randn(24, M * 64, generator=g) / 16, torch.randn(T, 24, generator=g), torch.randn(T, generator=g)
    x = residual.double().reshape(T, -1)
    out_mul, sqrsum = tilebake.mhc.mhc_pre_norm_gemm_fwd(_on(residual, d), _on(fn, d), 2)
    _close("out_mul", out_mul.sum(0).squeeze(1), (x @ fn.double().t()).float(), rtol=1e-4, atol=1e-4)
    _close("sqrsum", sqrsum.sum(0).squeeze(1), x.square().sum(-1).float(), rtol=1e-5, atol=1e-4)
    residual_grad, fn_grad = tilebake.mhc.mhc_pre_norm_gemm_bwd(*(_on(t, d) for t in (residual, fn, dom, dsq)))
    want = dom.double() @ fn.double() + 2 * dsq.double()[:, None] * x
    _close("residual_grad", residual_grad.reshape(T, -1).float(), want.float(), rtol=1e-2, atol=2e-2)
    _close("fn_grad", fn_grad, (dom.double().t() @ x).float(), rtol=1e-4, atol=1e-3)


@smoke_case("mhc_reduce_partials_and_rmsnorm")
def _mhc_reduce_partials_and_rmsnorm(d):
    g = _gen()
    pm, ps = torch.randn(3, T, 1, 24, generator=g), torch.rand(3, T, 1, generator=g) + 1
    want = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=256)  # sums: the kernel's bits
    got = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(_on(pm, d), _on(ps, d), rms_group_size=256)
    _same("out_mul", got[0], want[0])
    _same("sqrsum", got[1], want[1])
    _close("out", got[2], want[2], rtol=2.5e-7, atol=0)  # the scaling: within 2 ulp
    og = torch.randn(T, 24, generator=g)
    om, sq = want[0], want[1]
    want = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(og, om, sq, rms_group_size=256)
    got = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(*(_on(t, d) for t in (og, om, sq)), rms_group_size=256)
    for name, a, b in zip(("out_mul_grad", "sqrsum_grad"), got, want):
        _close(name, a, b, rtol=1e-6, atol=0)


@smoke_case("mhc_fn_normw_merge")
def _mhc_fn_normw_merge(d):
    g = _gen()
    fn, w, og = torch.randn(24, 256, generator=g), torch.randn(256, generator=g), torch.randn(24, 256, generator=g)
    _same("out_fn", tilebake.mhc.mhc_fn_normw_merge_fwd(_on(fn, d), _on(w, d)), fn * w)
    got = tilebake.mhc.mhc_fn_normw_merge_bwd(*(_on(t, d) for t in (fn, w, og)))
    for name, a, b in zip(("fn_grad", "normw_grad"), got, tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, og)):
        _same(name, a, b)


@smoke_case("mhc_multilayer_recompute")
def _mhc_multilayer_recompute(d):
    g, layers = _gen(), 3  # 2 post steps: the last layer a pre step only
    r0 = torch.randn(T, M, H, generator=g).bfloat16()
    pre = [torch.rand(T, M, 1, generator=g) for _ in range(layers)]
    outs = [torch.randn(T, H, generator=g).bfloat16() for _ in range(layers - 1)]
    post = [torch.rand(T, M, 1, generator=g) for _ in range(layers - 1)]
    comb = [torch.rand(T, M, M, generator=g) for _ in range(layers - 1)]
    inputs = [torch.empty(T, H, dtype=torch.bfloat16, device=d) for _ in range(layers)]
    residuals = [torch.empty(T, M, H, dtype=torch.bfloat16, device=d) for _ in range(layers - 1)]
    on = lambda ts: [_on(t, d) for t in ts]  # noqa: E731
    tilebake.mhc.mhc_multilayer_recompute(_on(r0, d), on(pre), on(outs), on(post), on(comb), inputs, residuals)
    residual = r0
    for i in range(layers):
        _same(f"layer_input_list[{i}]", inputs[i], ref.mhc_pre_apply_mix_ref(residual, pre[i]))
        if i < layers - 1:
            residual = ref.mhc_post_ref(outs[i], residual, post[i], comb[i])
            _same(f"residual_list[{i}]", residuals[i], residual)


@smoke_case("mhc_pre_big_fuse")
def _mhc_pre_big_fuse(d):
    g = _gen()
    residual = torch.randn(T, M, H, generator=g).bfloat16()
    pm, ps = torch.randn(2, T, 1, 24, generator=g), torch.rand(2, T, 1, generator=g) * (M * H)
    scale, base = torch.rand(3, generator=g) + 0.5, torch.randn(24, generator=g) * 0.1
    want = tilebake.mhc.mhc_pre_big_fuse_fwd(pm, ps, scale, base, residual, n_splits=2)  # the references' chain
    got = tilebake.mhc.mhc_pre_big_fuse_fwd(*(_on(t, d) for t in (pm, ps, scale, base, residual)), n_splits=2)
    for name, a, b, tol in zip(("post_mix", "comb_mix", "layer_input"), got, want, (1e-5, 1e-5, 1e-2)):
        _close(name, a, b, rtol=tol, atol=tol)
