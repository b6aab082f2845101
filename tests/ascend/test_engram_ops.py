"""The engram ops on NPU tensors reach their Ascend kernels (harness.py: a tensor reporting an
"npu" device, the stand-in libascendcl recording the launches), with the ops' own argument values
in each kernel's parameter order. Nothing here runs a kernel (there is no NPU)."""

import json
import struct

from tests.ascend.harness import launch_args, run


def test_engram_hash_fused_weight_and_gate_take_the_ascend_kernels(setup):
    """engram_hash OFF OUT VOC IDS MASK MUL (sorted by name) has_mask max_ngram_size num_layers
    num_tables num_tokens, no unified buffer; fused_weight W WE WH numel; engram_gate_fwd on the
    2.1.0 kv form (k and v views into kv with its strides), saving its four scalars a row."""
    body = """
    ids = torch.randint(0, 1000, (5, 3), dtype=torch.int32).as_subclass(FakeNPU)
    mul = torch.randint(1, 1000, (2, 3), dtype=torch.int64).as_subclass(FakeNPU)
    voc = torch.full((2, 2, 4), 50, dtype=torch.int32).as_subclass(FakeNPU)
    off = torch.zeros(2, 8, dtype=torch.int32).as_subclass(FakeNPU)
    idx = tilebake.engram.engram_hash(ids, mul, voc, off)
    wh = torch.randn(2, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    we = torch.randn(2, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    w = tilebake.engram.fused_weight(wh, we)
    x = torch.randn(3, 2, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    kv = torch.randn(3, 3, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    out, dot, gate, rx, rk = tilebake.engram.engram_gate_fwd(x, kv, w, 1e-6, 0.5)
    print(json.dumps({"hash": [t.data_ptr() for t in (ids, mul, voc, off, idx)], "shape": list(idx.shape),
                      "fused": [t.data_ptr() for t in (wh, we, w)], "w": [list(w.shape), str(w.dtype)],
                      "gate": [t.data_ptr() for t in (x, kv, w, out, dot, gate, rx, rk)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    assert o["shape"] == [2, 5, 8] and o["w"] == [[2, 256], "torch.float32"]
    launches = [c for c in calls if c.startswith("launch")]
    names = ["engram_hash_kernel_kernel", "fused_weight_kernel_kernel", "engram_gate_fwd_kernel_kernel"]
    assert [c.split()[1] for c in launches] == names
    assert " attr " not in launches[0]  # no unified buffer: no launch attribute
    ids, mul, voc, off, idx = o["hash"]
    assert launch_args(launches[0]) == struct.pack("<6Q5i4x", ids, ids, mul, off, idx, voc, 0, 3, 2, 4, 5).hex()
    wh, we, w = o["fused"]
    assert launch_args(launches[1]) == struct.pack("<3Qi4x", w, we, wh, 512).hex()
    x, kv, w, out, dot, gate, rx, rk = o["gate"]
    # DOT GATE K MASK OUT RSTD_K RSTD_X V W X, then clamp_value eps has_mask hc hidden k_head_stride
    # k_token_stride num_tokens out_head_stride out_token_stride save v_token_stride x_head_stride x_token_stride
    pointers = (dot, gate, kv, x, out, rk, rx, kv + 2 * 256 * 2, w, x)
    scalars = struct.pack("<2f12i", 0.5, 1e-6, 0, 2, 256, 256, 768, 3, 256, 512, 1, 768, 256, 512)
    assert launch_args(launches[2]) == (struct.pack("<10Q", *pointers) + scalars).hex()


def test_engram_gate_bwd_and_grad_w_reduce_take_the_ascend_kernels(setup):
    """The backward (grad_w_partial: a row a vector core, zeroed for the cores with no token)
    then grad_w_reduce of those partials, in place."""
    body = """
    x = torch.randn(3, 2, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    kv = torch.randn(3, 3, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    w = torch.rand(2, 256).as_subclass(FakeNPU)
    saved = [torch.rand(3, 2).as_subclass(FakeNPU) for _ in range(4)]
    g = torch.randn(3, 2, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    dx, grad_kv, partial = tilebake.engram.engram_gate_bwd(g, x, kv, w, *saved, 0.5)
    wh = torch.randn(2, 256).to(torch.bfloat16).as_subclass(FakeNPU)
    gh, ge = torch.zeros(2, 256).as_subclass(FakeNPU), torch.zeros(2, 256).as_subclass(FakeNPU)
    tilebake.engram.grad_w_reduce(partial, wh, wh, gh, ge)
    print(json.dumps([[list(t.shape), str(t.dtype)] for t in (dx, grad_kv, partial)] + [gh._version]))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    *shapes, version = json.loads(result.stdout)
    assert shapes == [[[3, 2, 256], "torch.bfloat16"], [[3, 3, 256], "torch.bfloat16"], [[64, 2, 256], "torch.float32"]]
    assert version == 1
    launches = [c.split()[1] for c in calls if c.startswith("launch")]
    assert launches == ["engram_gate_bwd_kernel_kernel", "grad_w_reduce_kernel_kernel"]


def test_engram_sinkhorn_stages_take_the_ascend_kernels(setup):
    """momentum (bf16 grad, fp32 buffer), step, step_reduce and finalize launch; a step over rows
    wider than MAX_COLS runs its reference (no launch)."""
    body = """
    g = torch.randn(1000).to(torch.bfloat16).as_subclass(FakeNPU)
    mb = torch.zeros(1000).as_subclass(FakeNPU)
    out = tilebake.engram.engram_sinkhorn_momentum_update(g, mb, 0.9)
    m = torch.ones(4, 16).as_subclass(FakeNPU)
    rs, cs = torch.ones(4).as_subclass(FakeNPU), torch.ones(16).as_subclass(FakeNPU)
    norm, part = tilebake.engram.engram_sinkhorn_step(m, rs, cs, 1e-8)
    parts, sumsq = torch.ones(3, 16).as_subclass(FakeNPU), torch.empty(16).as_subclass(FakeNPU)
    tilebake.engram.engram_sinkhorn_step_reduce(parts, sumsq)
    ones_r, ones_c = torch.ones(4).as_subclass(FakeNPU), torch.ones(16).as_subclass(FakeNPU)
    fin = tilebake.engram.engram_sinkhorn_finalize(m, ones_r, ones_c, 1e-8, 0.5)
    wide = torch.ones(2, 8200).as_subclass(FakeNPU)
    wide_rs = torch.ones(2).as_subclass(FakeNPU)
    _, wide_part = tilebake.engram.engram_sinkhorn_step(wide, wide_rs, torch.ones(8200).as_subclass(FakeNPU), 1e-8)
    print(json.dumps([list(out.shape), str(out.dtype), mb._version, list(fin.shape), list(norm.shape), list(part.shape),
                      rs._version, list(wide_part.shape), wide_rs.tolist(),
                      [t.data_ptr() for t in (cs, m, norm, part, rs)]]))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r[:8] == [[1000], "torch.float32", 1, [4, 16], [4], [4, 16], 1, [1, 8200]]
    assert all(abs(x - 8200**-0.5) < 1e-7 for x in r[8])  # the reference ran
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == [
        "engram_sinkhorn_momentum_kernel_kernel", "engram_sinkhorn_step_kernel_kernel",
        "engram_sinkhorn_step_reduce_kernel_kernel", "engram_sinkhorn_finalize_kernel_kernel",
    ]  # fmt: skip
    # CS M NORM P RS, then eps num_cols num_ctas num_rows
    assert launch_args(launches[1]) == struct.pack("<5Qf3i", *r[9], 1e-8, 16, 4, 4).hex()
