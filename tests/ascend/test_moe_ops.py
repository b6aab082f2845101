"""The public moe ops on NPU tensors reach the Ascend kernels with the ops' own argument values,
packed in each kernel's parameter order (harness.py: a tensor reporting an "npu" device, the
stand-in libascendcl recording the launches). Nothing here runs a kernel (there is no NPU)."""

import json
import struct

from tests.ascend.harness import launch_args, run


def test_topk_gate_and_normalize_weight_take_the_ascend_kernels(setup):
    """topk_gate (Out S num_experts num_tokens num_topk scores_stride, a row stride past the
    experts) and normalize_weight (D N W num_tokens num_topk w_stride, a strided input)."""
    body = """
    scores = torch.randn(5, 320)[:, :300].as_subclass(FakeNPU)
    idx = tilebake.moe.topk_gate(scores, 8)
    w = torch.rand(70, 8)[:, :6].as_subclass(FakeNPU)
    d, normalized = tilebake.moe.normalize_weight(w)
    print(json.dumps({"topk": [idx.data_ptr(), scores.data_ptr()], "norm": [d.data_ptr(), normalized.data_ptr(),
                      w.data_ptr()], "shapes": [[list(t.shape), str(t.dtype)] for t in (idx, d, normalized)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    assert o["shapes"] == [[[5, 8], "torch.int64"], [[70], "torch.float32"], [[70, 6], "torch.float32"]]
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == ["topk_gate_kernel_kernel", "normalize_weight_kernel_kernel"]
    assert launch_args(launches[0]) == struct.pack("<2Q4i", *o["topk"], 300, 5, 8, 320).hex()
    assert launch_args(launches[1]) == struct.pack("<3Q3i4x", *o["norm"], 70, 6, 8).hex()


def test_moe_topk_gate_forward_takes_the_ascend_kernel(setup):
    """The router forward with mask, bias, scores and a strided logits row: one launch, every
    argument where the kernel's parameter order puts it (absent tensors: the logits' address)."""
    body = """
    logits = torch.randn(6, 80)[:, :72].as_subclass(FakeNPU)
    mask = torch.ones(6, dtype=torch.bool).as_subclass(FakeNPU)
    bias = torch.zeros(72).as_subclass(FakeNPU)
    scores = torch.empty(6, 72).as_subclass(FakeNPU)
    idx, w = tilebake.moe.moe_topk_gate_forward(logits, 6, True, 2, 2.5, 3, "softmax", mask=mask, bias=bias,
                                                scores=scores)
    print(json.dumps({"ptrs": [t.data_ptr() for t in (logits, mask, bias, scores, idx, w)],
                      "shapes": [[list(t.shape), str(t.dtype)] for t in (idx, w)]}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    assert o["shapes"] == [[[6, 8], "torch.int64"], [[6, 8], "torch.float32"]]
    launches = [c for c in calls if c.startswith("launch")]
    assert [c.split()[1] for c in launches] == ["moe_topk_gate_forward_kernel_kernel"]
    logits, mask, bias, scores, idx, w = o["ptrs"]
    # Bias Count FixMask ImageBias ImageMask L Map Mask OutIdx OutW Random Scores Unmapped, then dup ep_rank
    # flags (mask 1 | bias 2 | scores 128) func (softmax 1) l_stride map_stride num_experts num_groups
    # num_tokens num_topk num_topk_groups s_stride scaling u_stride width
    pointers = (bias, logits, logits, logits, logits, logits, logits, mask, idx, w, logits, scores, logits)
    scalars = struct.pack("<12if2i4x", 1, 3, 131, 1, 80, 0, 72, 1, 6, 6, 1, 72, 2.5, 0, 8)
    assert launch_args(launches[0]) == (struct.pack("<13Q", *pointers) + scalars).hex()
