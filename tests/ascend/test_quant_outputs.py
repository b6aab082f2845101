"""Given outputs on NPU tensors (harness.py: tensors reporting an "npu" device, the stand-in
libascendcl recording the launches): they are checked in the Ascend layouts (UE8M0 two to an
int16), the Ascend kernel still runs (its new tensors then copied into the given ones, which are
returned themselves), and the CUDA layout's int32 words are refused with a clear error.
tests/quant/test_npu_sf_layouts.py checks the layouts' bytes on every path."""

import json

from tests.ascend.harness import run


def test_given_outputs_take_the_ascend_kernels(setup):
    body = """
    x = torch.randn(5, 384).to(torch.bfloat16).as_subclass(FakeNPU)
    data = torch.empty(5, 384, dtype=torch.float8_e4m3fn).as_subclass(FakeNPU)
    sf = torch.empty(5, 6, dtype=torch.int16).as_subclass(FakeNPU)
    got = tilebake.quant.per_token_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True, out=(data, sf))
    only = torch.empty(5, 6, dtype=torch.int16).as_subclass(FakeNPU)
    got_only = tilebake.quant.per_token_cast_with_sf_only(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True,
                                                          out_sf=only)
    h = torch.randn(2, 3, 128).to(torch.bfloat16).as_subclass(FakeNPU)
    norm_sf = torch.empty(2, 3, 2, dtype=torch.int16).as_subclass(FakeNPU)
    (_, got_norm), *_ = tilebake.quant.norm_forward_and_per_token_cast(
        h, None, 1e-6, "e4m3", 32, round_sf=True, use_packed_ue8m0=True, out=(None, norm_sf))
    w = torch.randn(64, 384).to(torch.bfloat16).as_subclass(FakeNPU)
    block_sf = torch.empty(2, 6, dtype=torch.int16).as_subclass(FakeNPU)
    _, got_block = tilebake.quant.per_block_cast(w, "e4m3", (32, 32), round_sf=True, use_packed_ue8m0=True,
                                                 out=(None, block_sf))
    fp4 = torch.randint(-128, 128, (40, 128), dtype=torch.int8).as_subclass(FakeNPU)
    fp4_sf = torch.full((40, 4), 0x7D7D, dtype=torch.int16).as_subclass(FakeNPU)
    lossless_sf = torch.empty(2, 4, dtype=torch.int16).as_subclass(FakeNPU)
    _, got_lossless = tilebake.quant.per_block_cast_lossless((fp4, fp4_sf), "e4m3", (1, 32), (32, 32), round_sf=True,
                                                             use_packed_ue8m0=True, out=(None, lossless_sf))
    try:
        tilebake.quant.per_token_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True,
                                      out=(None, torch.empty(5, 3, dtype=torch.int32).as_subclass(FakeNPU)))
        error = None
    except TypeError as e:
        error = str(e)
    print(json.dumps({"same": [got[0] is data, got[1] is sf, got_only is only, got_norm is norm_sf,
                               got_block is block_sf, got_lossless is lossless_sf],
                      "error": error}))
    """
    result, calls = run(setup, body, npu=True)
    assert result.returncode == 0, result.stderr
    o = json.loads(result.stdout)
    assert o["same"] == [True] * 6
    assert o["error"] == "out[1] must be torch.int16, got torch.int32"
    launches = [c.split()[1] for c in calls if c.startswith("launch")]
    assert launches == ["per_token_cast_kernel_kernel"] * 2 + [
        "norm_forward_and_per_token_cast_kernel_kernel", "per_block_cast_kernel_kernel",
        "per_block_cast_lossless_kernel_kernel",
    ]  # fmt: skip
