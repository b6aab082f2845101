"""The public quant ops on NPU tensors reach the Ascend kernels with the ops' own argument values,
packed in each kernel's parameter order (harness.py: a tensor reporting an "npu" device, the
stand-in libascendcl recording the launches). Where the Ascend kernels do not apply the ops take
the reference path; nothing here runs a kernel (there is no NPU)."""

import json
import struct

from tests.ascend.harness import launch_args, run


def test_per_token_cast_family_takes_the_ascend_kernels(setup):
    """Tensors reporting device npu:0 (CPU memory: the stand-in never touches it) reach the
    Ascend kernels with the ops' own argument values: per_token_cast, then cast_back of its
    result (the int16-packed UE8M0 SF included), per_token_cast_with_sf_only, _with_precomputed_sf
    and per_token_cast_and_cast_back in place."""
    body = """
    for round_sf, packed in ((False, False), (True, False), (True, True)):
        x = torch.randn(5, 384).to(torch.bfloat16).as_subclass(FakeNPU)
        data, sf = tilebake.quant.per_token_cast(x, "e4m3", 32, round_sf=round_sf, use_packed_ue8m0=packed)
        back = tilebake.quant.cast_back((data, sf), "bf16", (1, 32))
        ptrs = {"x": x.data_ptr(), "y": data.data_ptr(), "s": sf.data_ptr(), "back": back.data_ptr()}
        shapes = {"data": [list(data.shape), str(data.dtype)], "sf": [list(sf.shape), str(sf.dtype)]}
        print(json.dumps({**ptrs, **shapes, "back_shape": [list(back.shape), str(back.dtype)]}))
    x = torch.randn(2, 128).to(torch.bfloat16).as_subclass(FakeNPU)
    sf = tilebake.quant.per_token_cast_with_sf_only(x, "e4m3", 32, round_sf=True)
    print(json.dumps({"sf_only": [x.data_ptr(), sf.data_ptr()], "shape": [list(sf.shape), str(sf.dtype)]}))
    given = torch.rand(2, 4).as_subclass(FakeNPU)
    data = tilebake.quant.per_token_cast_with_precomputed_sf(x, "e4m3", 32, given)
    print(json.dumps({"precomputed": [x.data_ptr(), data.data_ptr(), given.data_ptr()], "dtype": str(data.dtype)}))
    x = torch.randn(3, 256, dtype=torch.float32).as_subclass(FakeNPU)
    version = x._version
    tilebake.quant.per_token_cast_and_cast_back(x, "e4m3", 32, round_sf=True)
    print(json.dumps({"round_trip": x.data_ptr(), "bumped": x._version == version + 1}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    outs = [json.loads(line) for line in result.stdout.splitlines()]
    round_trip = outs.pop()
    precomputed = outs.pop()
    sf_only = outs.pop()
    assert sf_only["shape"] == [[2, 4], "torch.float32"]
    assert [o["sf"] for o in outs] == [[[5, 12], "torch.float32"], [[5, 12], "torch.float32"], [[5, 6], "torch.int16"]]
    assert all(o["data"] == [[5, 384], "torch.float8_e4m3fn"] for o in outs)
    assert all(o["back_shape"] == [[5, 384], "torch.bfloat16"] for o in outs)
    launches = [c for c in calls if c.startswith("launch")]
    # per_token_cast_and_cast_back in place: X, then amax_clamp hidden num_tokens x_stride (24 bytes)
    assert launch_args(launches.pop()) == struct.pack("<Qfiii", round_trip["round_trip"], 1e-4, 256, 3, 256).hex()
    assert round_trip["bumped"]
    # per_token_cast_with_precomputed_sf: S X Y hidden num_tokens sf_cols x_stride (40 bytes), no clamp
    x_ptr, y_ptr, s_ptr = precomputed["precomputed"]
    expect = struct.pack("<QQQiiii", s_ptr, x_ptr, y_ptr, 128, 2, 4, 128).hex()
    assert precomputed["dtype"] == "torch.float8_e4m3fn" and launch_args(launches.pop()) == expect
    # per_token_cast_with_sf_only: no Y; S X amax_clamp hidden num_tokens sf_cols x_stride (36 bytes + 4)
    x_ptr, s_ptr = sf_only["sf_only"]
    expect = struct.pack("<QQfiiii4x", s_ptr, x_ptr, 1e-4, 128, 2, 4, 128).hex()
    assert launch_args(launches.pop()) == expect
    assert [c.split()[1] for c in launches] == ["per_token_cast_kernel_kernel", "cast_back_kernel_kernel"] * 3
    for o, cast, back in zip(outs, launches[::2], launches[1::2]):
        # the declared order X Y S amax_clamp num_tokens hidden x_stride sf_cols, packed in the
        # kernel's: S X Y amax_clamp hidden num_tokens sf_cols x_stride (44 bytes + 4 to 48)
        packed = struct.pack("<QQQfiiii4x", o["s"], o["x"], o["y"], 1e-4, 384, 5, 12, 384)
        assert launch_args(cast) == packed.hex()
        # cast_back: X S Y num_tokens hidden x_stride sf_cols, packed S X Y hidden num_tokens sf_cols x_stride
        packed = struct.pack("<QQQiiii", o["s"], o["y"], o["back"], 384, 5, 12, 384)
        assert launch_args(back) == packed.hex()


def test_per_block_cast_family_takes_the_ascend_kernels(setup):
    """per_block_cast with 32 x 32 blocks (e4m3 and e2m1; fp32, power-of-two and int16-packed UE8M0
    SF; a partial last row block), _with_sf_only and _with_precomputed_sf: the kernels' arguments
    S X [Y] [amax_clamp] hidden num_tokens sf_cols x_stride, the SF's row in blocks (or bytes);
    128 x 128 blocks and the column-major SF are left to the reference path."""
    body = """
    x = torch.randn(40, 384).to(torch.bfloat16).as_subclass(FakeNPU)
    for fmt, round_sf, packed in (("e4m3", False, False), ("e2m1", True, False), ("e4m3", True, True)):
        data, sf = tilebake.quant.per_block_cast(x, fmt, (32, 32), round_sf=round_sf, use_packed_ue8m0=packed)
        print(json.dumps({"ptrs": [sf.data_ptr(), x.data_ptr(), data.data_ptr()],
                          "shapes": [[list(t.shape), str(t.dtype)] for t in (data, sf)]}))
    sf = tilebake.quant.per_block_cast_with_sf_only(x, "e4m3", (32, 32), round_sf=True)
    print(json.dumps({"ptrs": [sf.data_ptr(), x.data_ptr()], "shapes": [[list(sf.shape), str(sf.dtype)]]}))
    given = torch.rand(2, 12).as_subclass(FakeNPU)
    data = tilebake.quant.per_block_cast_with_precomputed_sf(x, "e2m1", (32, 32), given)
    print(json.dumps({"ptrs": [given.data_ptr(), x.data_ptr(), data.data_ptr()],
                      "shapes": [[list(data.shape), str(data.dtype)]]}))
    from tilebake.quant import _per_block_cast_ascend as npu  # what the reference path takes instead
    assert npu.per_block_cast(x, "e4m3", (128, 128), False, False, False) is None
    assert npu.per_block_cast(x, "e4m3", (32, 32), True, False, False) is None
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    outs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["shapes"] for o in outs] == [
        [[[40, 384], "torch.float8_e4m3fn"], [[2, 12], "torch.float32"]],
        [[[40, 192], "torch.int8"], [[2, 12], "torch.float32"]],
        [[[40, 384], "torch.float8_e4m3fn"], [[2, 6], "torch.int16"]],
        [[[2, 12], "torch.float32"]],
        [[[40, 192], "torch.int8"]],
    ]
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 5 and {c.split()[1] for c in launches} == {"per_block_cast_kernel_kernel"}
    tail = (384, 40, 12, 384)  # hidden num_tokens sf_cols x_stride
    clamps = (1e-4, 6 * 2.0**-126, 1e-4, 1e-4)  # config's e4m3 / e2m1 amax clamps
    for o, clamp, line in zip(outs[:4], clamps, launches):
        # 3 (2) pointers + 5 scalars: 44 (36) bytes, padded to 48 (40)
        assert launch_args(line) == struct.pack(f"<{len(o['ptrs'])}Qf4i4x", *o["ptrs"], clamp, *tail).hex()
    assert launch_args(launches[4]) == struct.pack("<3Q4i", *outs[4]["ptrs"], *tail).hex()  # no clamp


def test_per_channel_cast_takes_the_ascend_kernels(setup):
    """per_channel_cast with 32-token blocks: bf16 (fp32, power-of-two and int16-packed UE8M0 SF
    along the tokens, a partial last row block and an odd count of row blocks), and e4m3
    QuantTensors with (1, 32) SF as fp32 or int16-packed UE8M0: the kernels' arguments S [SIN] X Y
    amax_clamp hidden num_tokens sf_rows x_stride; 128-token blocks are left to the reference path."""
    body = """
    x = torch.randn(70, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    q = torch.randn(70, 256).to(torch.float8_e4m3fn).as_subclass(FakeNPU)
    cases = [(x, None, False, False), (x, None, True, False), (x, None, True, True),
             ((q, torch.rand(70, 8).as_subclass(FakeNPU)), 32, False, False),
             ((q, torch.randint(0, 2**15, (70, 4), dtype=torch.int16).as_subclass(FakeNPU)), 32, True, True)]
    for arg, npc, round_sf, packed in cases:
        data, sf = tilebake.quant.per_channel_cast(arg, "e4m3", 32, round_sf, npc, packed)
        given = [] if npc is None else [arg[1].data_ptr()]
        src = arg if npc is None else arg[0]
        print(json.dumps({"ptrs": [sf.data_ptr(), *given, src.data_ptr(), data.data_ptr()],
                          "shapes": [[list(t.shape), str(t.dtype)] for t in (data, sf)]}))
    from tilebake.quant import _per_channel_cast_ascend as npu  # what the reference path takes instead
    assert npu.per_channel_cast(x, None, 128, None, False, False) is None
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    outs = [json.loads(line) for line in result.stdout.splitlines()]
    data = [[70, 256], "torch.float8_e4m3fn"]
    fp32, packed = [[3, 256], "torch.float32"], [[2, 256], "torch.int16"]
    assert [o["shapes"] for o in outs] == [[data, fp32], [data, fp32], [data, packed], [data, fp32], [data, packed]]
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 5 and {c.split()[1] for c in launches} == {"per_channel_cast_kernel_kernel"}
    for o, line in zip(outs, launches):
        sf_rows = o["shapes"][1][0][0]
        pointers = len(o["ptrs"])
        # 3 (4) pointers + 5 scalars: 44 (52) bytes, padded to 48 (56)
        expect = struct.pack(f"<{pointers}Qf4i4x", *o["ptrs"], 1e-4, 256, 70, sf_rows, 256)
        assert launch_args(line) == expect.hex()


def test_stochastic_cast_takes_the_ascend_kernel(setup):
    """cast(fp32 -> bf16, stochastic_rounding=True) of an NPU tensor launches the Ascend kernel
    (X Y num_groups); round-to-nearest casts are torch's .to (no launch)."""
    body = """
    x = torch.randn(3, 20).as_subclass(FakeNPU)
    y = tilebake.quant.cast(x, torch.bfloat16, stochastic_rounding=True)
    print(json.dumps([x.data_ptr(), y.data_ptr(), list(y.shape), str(y.dtype)]))
    assert tilebake.quant.cast(x, torch.bfloat16).dtype == torch.bfloat16  # torch's .to
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    x_ptr, y_ptr, shape, dtype = json.loads(result.stdout)
    assert shape == [3, 20] and dtype == "torch.bfloat16"
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 1 and launches[0].split()[1] == "cast_kernel_kernel"
    assert launch_args(launches[0]) == struct.pack("<QQi4x", x_ptr, y_ptr, 15).hex()


def test_per_block_cast_lossless_takes_the_ascend_kernels(setup):
    """per_block_cast_lossless (1, 32) e2m1 -> (32, 32) e4m3 with fp32 and int16-packed UE8M0 SFs:
    the kernels' arguments S SIN X Y num_tokens x_bytes x_stride; (1, 16) input blocks are left to
    the reference path."""
    body = """
    data = torch.randint(-128, 128, (40, 128), dtype=torch.int8).as_subclass(FakeNPU)
    fp32_sf = torch.full((40, 8), 0.25).as_subclass(FakeNPU)
    packed_sf = torch.full((40, 4), 0x7D7D, dtype=torch.int16).as_subclass(FakeNPU)
    for sf_in, packed in ((fp32_sf, False), (packed_sf, True)):
        y, sf = tilebake.quant.per_block_cast_lossless((data, sf_in), "e4m3", (1, 32), (32, 32), round_sf=True,
                                                       use_packed_ue8m0=packed)
        print(json.dumps({"ptrs": [sf.data_ptr(), sf_in.data_ptr(), data.data_ptr(), y.data_ptr()],
                          "shapes": [[list(t.shape), str(t.dtype)] for t in (y, sf)]}))
    from tilebake.quant import _per_block_cast_lossless_ascend as npu  # what the reference path takes instead
    assert npu.per_block_cast_lossless(data, torch.full((40, 16), 0.5), (1, 16), (32, 32), False, False, False) is None
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    outs = [json.loads(line) for line in result.stdout.splitlines()]
    y = [[40, 256], "torch.float8_e4m3fn"]
    assert [o["shapes"] for o in outs] == [[y, [[2, 8], "torch.float32"]], [y, [[2, 4], "torch.int16"]]]
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 2 and {c.split()[1] for c in launches} == {"per_block_cast_lossless_kernel_kernel"}
    for o, line in zip(outs, launches):
        assert launch_args(line) == struct.pack("<4Q3i4x", *o["ptrs"], 40, 128, 128).hex()


def test_batched_transpose_weight_sf_takes_the_ascend_kernels(setup):
    """batched_transpose_weight_sf with block size 32: per weight two launches (along k: sf0's
    buffer, along n: sf1's) with arguments BAD OUT SF groups kb nb, each launch its own row of
    per-core flags; the int16 layouts' shapes (sf1 transposed or not)."""
    body = """
    sf = [torch.full((3, 5), 0.125).as_subclass(FakeNPU), torch.full((2, 4, 2), 2.0).as_subclass(FakeNPU)]
    out = tilebake.quant.batched_transpose_weight_sf(sf, 32, [False, True])
    print(json.dumps({"shapes": [[list(t.shape), str(t.dtype)] for pair in out for t in pair],
                      "sf": [s.data_ptr() for s in sf],
                      "out": [t.data_ptr() for pair in out for t in pair]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    i16 = "torch.int16"
    assert o["shapes"] == [[[96, 3], i16], [[160, 2], i16], [[2, 128, 1], i16], [[2, 2, 64], i16]]
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 4 and {c.split()[1] for c in launches} == {"batched_transpose_weight_sf_kernel_kernel"}
    args = [bytes.fromhex(launch_args(line)) for line in launches]
    flags = [struct.unpack_from("<Q", a)[0] for a in args]
    assert [b - a for a, b in zip(flags, flags[1:])] == [64 * 4] * 3  # a row of 64 core flags each
    for a, out, s, dims in zip(args, o["out"], [o["sf"][0]] * 2 + [o["sf"][1]] * 2, [(1, 5, 3)] * 2 + [(2, 2, 4)] * 2):
        assert a == struct.pack("<3Q3i4x", struct.unpack_from("<Q", a)[0], out, s, *dims)


def test_swiglu_forward_takes_the_ascend_kernels(setup):
    """swiglu_forward (no weights, no clamp: W = X's address, scale 1, clamp inf) and
    swiglu_forward_and_per_token_cast (weights, scale, clamp; int16-packed UE8M0 SF): arguments
    [S] W X Y [amax_clamp] clamp_value has_clamp has_weights hidden num_tokens scale x_stride."""
    body = """
    x = torch.randn(5, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    w = torch.rand(5).as_subclass(FakeNPU)
    y = tilebake.quant.swiglu_forward(x, "bf16")
    data, sf = tilebake.quant.swiglu_forward_and_per_token_cast(
        x, "e4m3", 32, topk_weights=w, routed_scaling_factor=2.5, round_sf=True, use_packed_ue8m0=True,
        clamp_value=3.0)
    print(json.dumps({"ptrs": [x.data_ptr(), y.data_ptr(), w.data_ptr(), data.data_ptr(), sf.data_ptr()],
                      "shapes": [[list(t.shape), str(t.dtype)] for t in (y, data, sf)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    assert o["shapes"] == [[[5, 128], "torch.bfloat16"], [[5, 128], "torch.float8_e4m3fn"], [[5, 2], "torch.int16"]]
    x, y, w, data, sf = o["ptrs"]
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 2 and {c.split()[1] for c in launches} == {"swiglu_forward_kernel_kernel"}
    plain = struct.pack("<3Qfiiiifi4x", x, x, y, float("inf"), 0, 0, 128, 5, 1.0, 256)
    cast = struct.pack("<4Qffiiiifi", sf, w, x, data, 1e-4, 3.0, 1, 1, 128, 5, 2.5, 256)
    assert [launch_args(line) for line in launches] == [plain.hex(), cast.hex()]


def test_norm_forward_takes_the_ascend_kernels(setup):
    """norm_forward with weight, residual and rstd on a 3-D input, and without any on a 2-D one
    (RSTD = X's address): arguments [R RO] RSTD [W] X Y eps hidden num_rows out_scale with_rstd."""
    body = """
    x = torch.randn(3, 4, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    w, res = torch.randn(256).to(torch.bfloat16).as_subclass(FakeNPU), torch.randn_like(x)
    out, rstd, norm_input = tilebake.quant.norm_forward(x, w, 1e-6, residual=res, out_scale=0.5, with_rstd=True)
    print(json.dumps({"ptrs": [res.data_ptr(), norm_input.data_ptr(), rstd.data_ptr(), w.data_ptr(), x.data_ptr(),
                               out.data_ptr()], "shapes": [list(t.shape) for t in (out, rstd, norm_input)]}))
    x = torch.randn(5, 128).as_subclass(FakeNPU)
    out, rstd, norm_input = tilebake.quant.norm_forward(x, None, 1e-5)
    print(json.dumps({"ptrs": [x.data_ptr(), x.data_ptr(), out.data_ptr()], "rstd": rstd,
                      "same": norm_input.data_ptr() == x.data_ptr()}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert first["shapes"] == [[3, 4, 256], [3, 4], [3, 4, 256]]
    assert second["rstd"] is None and second["same"]
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 2 and {c.split()[1] for c in launches} == {"norm_forward_kernel_kernel"}
    assert launch_args(launches[0]) == struct.pack("<6Qfiifi4x", *first["ptrs"], 1e-6, 256, 12, 0.5, 1).hex()
    assert launch_args(launches[1]) == struct.pack("<3Qfiifi4x", *second["ptrs"], 1e-5, 128, 5, 1.0, 0).hex()


def test_norm_forward_and_per_token_cast_runs_one_ascend_kernel(setup):
    """norm_forward_and_per_token_cast on NPU tensors: the fused kernel, the SF per batch matrix,
    int16-packed UE8M0; without weight or rstd their pointers are x's. Arguments D RSTD S W X YB
    amax_clamp eps has_weight hidden num_rows out_scale with_out_bf16 with_rstd."""
    body = """
    x = torch.randn(2, 3, 128).to(torch.bfloat16).as_subclass(FakeNPU)
    (data, sf), y, rstd, norm_input = tilebake.quant.norm_forward_and_per_token_cast(
        x, None, 1e-6, "e4m3", 32, round_sf=True, use_packed_ue8m0=True, with_out_bf16=True)
    print(json.dumps({"ptrs": [data.data_ptr(), x.data_ptr(), sf.data_ptr(), x.data_ptr(), x.data_ptr(),
                               y.data_ptr()], "rstd": rstd, "same": norm_input.data_ptr() == x.data_ptr(),
                      "shapes": [[list(t.shape), str(t.dtype)] for t in (data, sf, y)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    assert o["rstd"] is None and o["same"]
    assert o["shapes"] == [
        [[2, 3, 128], "torch.float8_e4m3fn"],
        [[2, 3, 2], "torch.int16"],
        [[2, 3, 128], "torch.bfloat16"],
    ]
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == ["norm_forward_and_per_token_cast_kernel_kernel"]
    expect = struct.pack("<6Qffiiifii", *o["ptrs"], 1e-4, 1e-6, 0, 128, 6, 1.0, 1, 0)
    assert launch_args(launches[0]) == expect.hex()


def test_norm_backward_takes_the_ascend_kernels(setup):
    """norm_backward with weight and residual gradient: arguments DX G P ROG RSTD W X hidden
    num_tokens out_scale (P: the cores' weight-gradient partial rows, summed by torch); without
    weight: DX G RSTD X."""
    body = """
    x = torch.randn(5, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    g, rog = torch.randn_like(x), torch.randn_like(x)
    w = torch.randn(256).to(torch.bfloat16).as_subclass(FakeNPU)
    rstd = torch.rand(5).as_subclass(FakeNPU)
    dx, dw = tilebake.quant.norm_backward(g, x, w, rstd, residual_out_grad=rog, out_scale=0.5)
    dx2, dw2 = tilebake.quant.norm_backward(g, x, None, rstd)
    print(json.dumps({"ptrs": [dx.data_ptr(), g.data_ptr(), rog.data_ptr(), rstd.data_ptr(), w.data_ptr(),
                               x.data_ptr()], "dx2": dx2.data_ptr(), "dw2": dw2,
                      "shapes": [[list(t.shape), str(t.dtype)] for t in (dx, dw)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    assert o["shapes"] == [[[5, 256], "torch.bfloat16"], [[256], "torch.bfloat16"]] and o["dw2"] is None
    dx, g, rog, rstd, w, x = o["ptrs"]
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 2 and {c.split()[1] for c in launches} == {"norm_backward_kernel_kernel"}
    first = bytes.fromhex(launch_args(launches[0]))
    partials = struct.unpack_from("<Q", first, 16)[0]
    assert first == struct.pack("<7Qiif4x", dx, g, partials, rog, rstd, w, x, 256, 5, 0.5)
    assert launch_args(launches[1]) == struct.pack("<4Qiif4x", o["dx2"], g, rstd, x, 256, 5, 1.0).hex()


def test_swiglu_backward_takes_the_ascend_kernels(setup):
    """swiglu_backward (fp32, no weights: E, ACT and WS get X's address, unused) and
    swiglu_backward_and_per_token_cast (e4m3 x with fp32 SF, weights, scale, clamp, act_out,
    int16-packed UE8M0 SF): arguments ACT DX E G [Q S SIN] WS X [amax_clamp] clamp_value has_clamp
    has_weights hidden num_tokens with_act."""
    body = """
    x = torch.randn(4, 256).as_subclass(FakeNPU)
    g = torch.randn(4, 128).as_subclass(FakeNPU)
    (dx,) = tilebake.quant.swiglu_backward(x, g, "fp32")
    q = torch.randn(4, 256).to(torch.float8_e4m3fn).as_subclass(FakeNPU)
    q_sf = torch.rand(4, 8).as_subclass(FakeNPU)
    g16 = torch.randn(4, 128).to(torch.bfloat16).as_subclass(FakeNPU)
    w = torch.rand(4).as_subclass(FakeNPU)
    dx16, (dq, dsf), wg, act = tilebake.quant.swiglu_backward_and_per_token_cast(
        (q, q_sf), g16, "e4m3", 32, topk_weights=w, routed_scaling_factor=2.0, round_sf=True,
        use_packed_ue8m0=True, clamp_value=5.0, do_recompute=True)
    print(json.dumps({"plain": [x.data_ptr(), dx.data_ptr(), g.data_ptr()],
                      "cast": [act.data_ptr(), dx16.data_ptr(), g16.data_ptr(), dq.data_ptr(), dsf.data_ptr(),
                               q_sf.data_ptr(), q.data_ptr()],
                      "shapes": [[list(t.shape), str(t.dtype)] for t in (dx, dx16, dq, dsf, wg, act)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    assert o["shapes"] == [
        [[4, 256], "torch.float32"], [[4, 256], "torch.bfloat16"], [[4, 256], "torch.float8_e4m3fn"],
        [[4, 4], "torch.int16"], [[4], "torch.float32"], [[4, 128], "torch.bfloat16"],
    ]  # fmt: skip
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 2 and {c.split()[1] for c in launches} == {"swiglu_backward_kernel_kernel"}
    x, dx, g = o["plain"]
    assert launch_args(launches[0]) == struct.pack("<6Qfiiiii", x, dx, x, g, x, x, float("inf"), 0, 0, 128, 4, 0).hex()
    act, dx16, g16, dq, dsf, q_sf, q = o["cast"]
    args = bytes.fromhex(launch_args(launches[1]))
    e, ws = struct.unpack_from("<Q", args, 16)[0], struct.unpack_from("<Q", args, 56)[0]
    assert args == struct.pack("<9Qffiiiii4x", act, dx16, e, g16, dq, dsf, q_sf, ws, q, 1e-4, 5.0, 1, 1, 128, 4, 1)
