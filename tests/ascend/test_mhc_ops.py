"""The mhc ops with Ascend kernels, on NPU tensors, reach them (harness.py: a tensor reporting an
"npu" device, the stand-in libascendcl recording the launches), with the CUDA kernels' arguments
in each kernel's parameter order. Nothing here runs a kernel (there is no NPU)."""

import json
import struct

from tests.ascend.harness import launch_args, run


def test_mhc_ops_take_the_ascend_kernels(setup):
    body = """
    x = torch.randn(3, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    o = torch.empty(3, 4, 256, dtype=torch.bfloat16).as_subclass(FakeNPU)
    tilebake.mhc.expand_to_mhc_fwd(x, o)
    xg = tilebake.mhc.expand_to_mhc_bwd(o)
    post = torch.rand(3, 4, 1).as_subclass(FakeNPU)
    comb = torch.rand(3, 4, 4).as_subclass(FakeNPU)
    out = tilebake.mhc.mhc_post_fwd(x, o, post, comb)
    grads = tilebake.mhc.mhc_post_bwd(x, o, post, comb, out)
    mix = torch.rand(3, 4).as_subclass(FakeNPU)
    y = tilebake.mhc.mhc_pre_apply_mix_fwd(o, mix)
    mix_grad = tilebake.mhc.mhc_pre_apply_mix_bwd(y, o, mix, o)
    print(json.dumps({"post": [t.data_ptr() for t in (x, o, post, comb, out)], "o_version": o._version,
                      "shapes": [list(t.shape) for t in (xg, out, *grads, y, mix_grad)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["shapes"] == [[3, 256], [3, 4, 256], [3, 256], [3, 4, 256], [3, 4, 1], [3, 4, 4], [3, 256], [3, 4]]
    assert r["o_version"] == 2  # written by expand_to_mhc_fwd, then as pre_apply_mix_bwd's x_grad
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == [
        "expand_to_mhc_fwd_kernel_kernel", "expand_to_mhc_bwd_kernel_kernel", "mhc_post_fwd_kernel_kernel",
        "mhc_post_bwd_kernel_kernel", "mhc_pre_apply_mix_fwd_kernel_kernel", "mhc_pre_apply_mix_bwd_kernel_kernel",
    ]  # fmt: skip
    x, o, post, comb, out = r["post"]
    # COMB OUT POST R X, then hidden mhc_mult num_tokens
    assert launch_args(launches[2]) == struct.pack("<5Q3i4x", comb, out, post, o, x, 256, 4, 3).hex()


def test_mhc_mix_ops_take_the_ascend_kernels(setup):
    """Sinkhorn both ways and the forwards of the head mix and the split mixes (their backwards
    run the references: no launch)."""
    body = """
    x = torch.randn(5, 4, 4).as_subclass(FakeNPU)
    y = tilebake.mhc.mhc_sinkhorn_fwd(x, repeat=3, eps=1e-5)
    g = tilebake.mhc.mhc_sinkhorn_bwd(y, x, repeat=3, eps=1e-5)
    mix = torch.randn(5, 4).as_subclass(FakeNPU)
    scale, base = torch.ones(1).as_subclass(FakeNPU), torch.zeros(4).as_subclass(FakeNPU)
    out = tilebake.mhc.mhc_head_compute_mix_fwd(mix, scale, base)
    mixes = torch.randn(5, 24).as_subclass(FakeNPU)
    pre, post, comb = tilebake.mhc.mhc_pre_split_mixes_fwd(mixes, torch.ones(3).as_subclass(FakeNPU),
                                                          torch.zeros(24).as_subclass(FakeNPU),
                                                          mhc_post_mult_value=2.0, mhc_pre_eps=1e-2)
    print(json.dumps({"sinkhorn": [x.data_ptr(), y.data_ptr()],
                      "shapes": [list(t.shape) for t in (y, g, out, pre, post, comb)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["shapes"] == [[5, 4, 4], [5, 4, 4], [5, 4], [5, 4, 1], [5, 4, 1], [5, 4, 4]]
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == [
        "mhc_sinkhorn_fwd_kernel_kernel", "mhc_sinkhorn_bwd_kernel_kernel", "mhc_head_compute_mix_fwd_kernel_kernel",
        "mhc_pre_split_mixes_fwd_kernel_kernel",
    ]  # fmt: skip
    x, y = r["sinkhorn"]
    # OUT X, then eps mhc_mult num_tokens repeat
    assert launch_args(launches[0]) == struct.pack("<2Qf3i", y, x, 1e-5, 4, 5, 3).hex()


def test_fn_normw_merge_takes_the_ascend_kernels(setup):
    body = """
    fn, w = torch.randn(24, 512).as_subclass(FakeNPU), torch.rand(512).as_subclass(FakeNPU)
    out = tilebake.mhc.mhc_fn_normw_merge_fwd(fn, w)
    fg, wg = tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, out)
    print(json.dumps({"ptrs": [t.data_ptr() for t in (fn, w, out, fg, wg)],
                      "shapes": [list(t.shape) for t in (out, fg, wg)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["shapes"] == [[24, 512], [24, 512], [512]]
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == ["mhc_fn_normw_merge_fwd_kernel_kernel",
                                                "mhc_fn_normw_merge_bwd_kernel_kernel"]  # fmt: skip
    fn, w, out, fg, wg = r["ptrs"]
    # FN OUT W, then num_cols num_mixes; FG FN OG W WG, then the sizes
    assert launch_args(launches[0]) == struct.pack("<3Q2i", fn, out, w, 512, 24).hex()
    assert launch_args(launches[1]) == struct.pack("<5Q2i", fg, fn, out, w, wg, 512, 24).hex()


def test_head_compute_mix_bwd_takes_the_ascend_kernel(setup):
    """A partial row a vector core by default (the stand-in NPU's count), or the rows given."""
    body = """
    g, x = torch.randn(5, 4).as_subclass(FakeNPU), torch.randn(5, 4).as_subclass(FakeNPU)
    scale, base = torch.ones(1).as_subclass(FakeNPU), torch.zeros(4).as_subclass(FakeNPU)
    xg, sp, bp = tilebake.mhc.mhc_head_compute_mix_bwd(g, x, scale, base)
    parts = tilebake.mhc.mhc_head_compute_mix_bwd(g, x, scale, base, num_sms=3)[1:]
    print(json.dumps({"ptrs": [t.data_ptr() for t in (g, x, scale, base, xg, sp, bp)],
                      "shapes": [list(t.shape) for t in (xg, sp, bp, *parts)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == ["mhc_head_compute_mix_bwd_kernel_kernel"] * 2
    cores = r["shapes"][1][0]
    assert r["shapes"] == [[5, 4], [cores, 1], [cores, 4], [3, 1], [3, 4]] and cores > 1
    g, x, scale, base, xg, sp, bp = r["ptrs"]
    # BASE BP G SCALE SP X XG, then mhc_mult num_partials num_tokens
    assert launch_args(launches[0]) == struct.pack("<7Q3i4x", base, bp, g, scale, sp, x, xg, 4, cores, 5).hex()


def test_split_mixes_bwd_takes_the_ascend_kernels(setup):
    """The partial rows (one a vector core, at most one a token), then their sum."""
    body = """
    mixes = torch.randn(5, 24).as_subclass(FakeNPU)
    grads = [torch.randn(*s).as_subclass(FakeNPU) for s in ((5, 4, 1), (5, 4, 1), (5, 4, 4))]
    scale, base = torch.ones(3).as_subclass(FakeNPU), torch.zeros(24).as_subclass(FakeNPU)
    got = tilebake.mhc.mhc_pre_split_mixes_bwd(*grads, mixes, grads[1], scale, base, mhc_post_mult_value=2.0)
    print(json.dumps({"ptrs": [t.data_ptr() for t in got], "shapes": [list(t.shape) for t in got]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["shapes"] == [[5, 24], [3], [24]]
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == ["mhc_pre_split_mixes_bwd_kernel_kernel",
                                                "mhc_pre_split_mixes_bwd_reduce_kernel_kernel"]  # fmt: skip
    _, scale_grad, base_grad = r["ptrs"]
    # BG PART SG, then mix_cols num_cols num_partials: 5 rows (one a token) of 3 + 24 columns padded to 28
    part = struct.unpack_from("<Q", bytes.fromhex(launch_args(launches[1])), 8)[0]
    assert launch_args(launches[1]) == struct.pack("<3Q3i4x", base_grad, part, scale_grad, 24, 28, 5).hex()


def test_mhc_multilayer_recompute_chains_the_ascend_kernels(setup):
    """On NPU tensors the recompute is the chain of the single-layer ops (its contract: bit-equal
    to that chain): per layer mhc_pre_apply_mix_fwd's kernel, then mhc_post_fwd's into the given
    residual (3 layers, 2 post steps)."""
    body = """
    npu = lambda t: t.as_subclass(FakeNPU)
    r0 = npu(torch.randn(3, 4, 256).to(torch.bfloat16))
    pre = [npu(torch.rand(3, 4, 1)) for _ in range(3)]
    out = [npu(torch.randn(3, 256).to(torch.bfloat16)) for _ in range(2)]
    post = [npu(torch.rand(3, 4)) for _ in range(2)]
    comb = [npu(torch.rand(3, 4, 4)) for _ in range(2)]
    inputs = [npu(torch.empty(3, 256, dtype=torch.bfloat16)) for _ in range(3)]
    residuals = [npu(torch.empty(3, 4, 256, dtype=torch.bfloat16)) for _ in range(2)]
    tilebake.mhc.mhc_multilayer_recompute(r0, pre, out, post, comb, inputs, residuals)
    print(json.dumps({"ptrs": [[t.data_ptr() for t in items] for items in (pre, inputs, out, post, comb, residuals)],
                      "r0": r0.data_ptr(), "versions": [t._version for t in inputs + residuals]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    launches = [c for c in calls if c.startswith("launch")]
    apply, post = "mhc_pre_apply_mix_fwd_kernel_kernel", "mhc_post_fwd_kernel_kernel"
    assert [c.split()[1] for c in launches] == [apply, post, apply, post, apply]
    assert r["versions"] == [1] * 5
    pre, inputs, out, posts, comb, residuals = r["ptrs"]
    residual = r["r0"]
    for i in range(3):
        # MIX O X, then hidden mhc_mult num_tokens
        assert launch_args(launches[2 * i]) == struct.pack("<3Q3i4x", pre[i], inputs[i], residual, 256, 4, 3).hex()
        if i < 2:
            # COMB OUT POST R X, then hidden mhc_mult num_tokens
            args = struct.pack("<5Q3i4x", comb[i], residuals[i], posts[i], residual, out[i], 256, 4, 3)
            assert launch_args(launches[2 * i + 1]) == args.hex()
            residual = residuals[i]


def test_reduce_partials_and_rmsnorm_takes_the_ascend_kernels(setup):
    body = """
    pm, ps = torch.randn(3, 5, 1, 24).as_subclass(FakeNPU), (torch.rand(3, 5, 1) + 1).as_subclass(FakeNPU)
    om, sq, out = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=1024, rms_eps=1e-6)
    omg, sqg = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(out, om, sq, rms_group_size=1024, rms_eps=1e-6)
    print(json.dumps({"ptrs": [t.data_ptr() for t in (pm, ps, om, sq, out, omg, sqg)],
                      "shapes": [list(t.shape) for t in (om, sq, out, omg, sqg)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["shapes"] == [[5, 1, 24], [5, 1], [5, 24], [5, 1, 24], [5, 1]]
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == ["mhc_reduce_partials_and_rmsnorm_fwd_kernel_kernel",
                                                "mhc_reduce_partials_and_rmsnorm_bwd_kernel_kernel"]  # fmt: skip
    pm, ps, om, sq, out, omg, sqg = r["ptrs"]
    # OM OS OUT PM PS, then n_splits num_mixes num_tokens rms_eps rms_group_size
    assert launch_args(launches[0]) == struct.pack("<5Q3ifi4x", om, sq, out, pm, ps, 3, 24, 5, 1e-6, 1024).hex()
    # OG OM OMG OS OSG, then num_mixes num_tokens rms_eps rms_group_size
    assert launch_args(launches[1]) == struct.pack("<5Q2ifi", out, om, omg, sq, sqg, 24, 5, 1e-6, 1024).hex()


def test_pre_norm_gemm_takes_the_ascend_kernels(setup):
    body = """
    residual = torch.randn(5, 4, 64).to(torch.bfloat16).as_subclass(FakeNPU)
    fn = torch.randn(24, 256).as_subclass(FakeNPU)
    om, sq = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn, 2)
    dom, dsq = torch.randn(5, 24).as_subclass(FakeNPU), torch.randn(5).as_subclass(FakeNPU)
    rg, fg = tilebake.mhc.mhc_pre_norm_gemm_bwd(residual, fn, dom, dsq)
    given = torch.zeros(5, 4, 64, dtype=torch.bfloat16).as_subclass(FakeNPU)
    tilebake.mhc.mhc_pre_norm_gemm_bwd(residual, fn, dom, dsq, given, fg)
    print(json.dumps({"ptrs": [t.data_ptr() for t in (residual, fn, om, sq, dom, dsq, rg, fg, given)],
                      "shapes": [list(t.shape) for t in (om, sq, rg, fg)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["shapes"] == [[2, 5, 1, 24], [2, 5, 1], [5, 4, 64], [24, 256]]
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == ["mhc_pre_norm_gemm_fwd_kernel_kernel"] + [
        "mhc_pre_norm_gemm_bwd_kernel_kernel"] * 2  # fmt: skip
    x, fn, om, sq, dom, dsq, rg, fg, given = r["ptrs"]
    # FN OUT SQ X, then n_splits num_cols num_mixes num_tokens
    assert launch_args(launches[0]) == struct.pack("<4Q4i", fn, om, sq, x, 2, 256, 24, 5).hex()
    # DOM DSQ FG FN X XG, then has_x_grad num_cols num_mixes num_tokens
    assert launch_args(launches[1]) == struct.pack("<6Q4i", dom, dsq, fg, fn, x, rg, 0, 256, 24, 5).hex()
    assert launch_args(launches[2]) == struct.pack("<6Q4i", dom, dsq, fg, fn, x, given, 1, 256, 24, 5).hex()
