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
