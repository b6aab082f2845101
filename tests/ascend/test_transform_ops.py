"""apply_rotary on NPU tensors reaches the Ascend kernels (harness.py: a tensor reporting an "npu"
device, the stand-in libascendcl recording the launches); the tokens' cache rows are gathered by
torch, with their inside-the-cache flags. Nothing here runs a kernel (there is no NPU)."""

import json
import struct

import torch

from tests.ascend.harness import launch_args, run


def test_apply_rotary_takes_the_ascend_kernels(setup):
    """[B, S, H, rot] query and key without positions (the token's index + seqlen_offset), then
    [T, H, rot] with int32 positions, interleaved and conjugate: arguments F G K Q conjugate
    interleaved k_heads num_tokens q_heads; G the gathered [cos | sin] rows, F 1 inside the cache."""
    body = """
    cache = torch.randn(7, 128).as_subclass(FakeNPU)
    q = torch.randn(2, 3, 4, 128).to(torch.bfloat16).as_subclass(FakeNPU)
    k = torch.randn(2, 3, 1, 128).to(torch.bfloat16).as_subclass(FakeNPU)
    tilebake.transform.apply_rotary(q, cache, k, seqlen_offset=5)
    q2 = torch.randn(5, 2, 64).as_subclass(FakeNPU)
    pos = torch.tensor([0, 6, 7, -1, 3], dtype=torch.int32).as_subclass(FakeNPU)
    tilebake.transform.apply_rotary(q2, torch.randn(7, 64).as_subclass(FakeNPU), positions=pos, interleaved=True,
                                    conjugate=True)
    print(json.dumps([[q.data_ptr(), k.data_ptr(), q._version], [q2.data_ptr(), q2._version], cache.tolist()]))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    (q, k, q_version), (q2, q2_version), cache = json.loads(result.stdout)
    assert q_version == q2_version == 1
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 2 and {c.split()[1] for c in launches} == {"apply_rotary_kernel_kernel"}
    first, second = (bytes.fromhex(launch_args(line)) for line in launches)
    f, g = struct.unpack_from("<2Q", first)
    assert first == struct.pack("<4Q5i4x", f, g, k, q, 0, 0, 1, 6, 4)
    f, g = struct.unpack_from("<2Q", second)
    assert second == struct.pack("<4Q5i4x", f, g, q2, q2, 1, 1, 0, 5, 2)


def test_apply_rotary_gathers_the_rows_and_flags_as_the_reference():
    """The host half of the NPU path (CPU tensors): each token's [cos | sin] row and its inside
    flag, for positions given (in and out of range) and for the default (index + offset)."""
    from tilebake.transform._apply_rotary_ascend import gather_rows

    cache = torch.randn(7, 64)
    q = torch.randn(5, 2, 64)
    gathered, flags = gather_rows(cache, torch.tensor([0, 6, 7, -1, 3], dtype=torch.int32), q, 0)
    assert flags.tolist() == [1, 1, 0, 0, 1] and flags.dtype == torch.int32
    assert torch.equal(gathered[[0, 1, 4]], cache[[0, 6, 3]]) and gathered.is_contiguous()
    gathered, flags = gather_rows(cache, None, torch.randn(2, 3, 4, 64), 5)  # rows 5, 6, 7 in each sequence
    assert flags.tolist() == [1, 1, 0] * 2
    assert torch.equal(gathered[[0, 1, 3, 4]], cache[[5, 6, 5, 6]])
