"""Benchmark cases, one per op, keyed by the op name the manifest uses.

Each case is `case(num_tokens, hidden) -> dict` with: op, variant (text), make() -> input
args (fresh random data, never zeros), fn(*args) (the tilebake call), ref(*args) (the
plain-torch reference, also compiled with torch.compile), bytes (that must move: inputs
read once, outputs written once). tests/test_bench_coverage.py fails when an op in the
manifest has no case here.
"""

import torch

import tilebake

# DeepSeek-V3/V4-like hidden sizes and token counts.
TOKENS = (16384, 4096, 128, 1)
HIDDEN = (7168, 4096, 2048)


def per_token_cast_case(num_tokens, hidden):
    def make():
        return (torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16),)

    nbytes = num_tokens * hidden * (2 + 1) + num_tokens * (hidden // 128) * 4
    return {
        "op": "per_token_cast",
        "variant": "bf16->e4m3, 1x128, fp32 SF",
        "make": make,
        "fn": lambda x: tilebake.quant.per_token_cast(x, "e4m3", 128),
        "ref": lambda x: tilebake.torch.cast(x, "e4m3", (1, 128)),
        "bytes": nbytes,
    }


def per_token_cast_packed_case(num_tokens, hidden):
    case = per_token_cast_case(num_tokens, hidden)
    case.update(
        variant="bf16->e4m3, 1x128, UE8M0 packed col-major SF",
        fn=lambda x: tilebake.quant.per_token_cast(
            x, "e4m3", 128, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True
        ),
        ref=lambda x: tilebake.torch.cast(
            x, "e4m3", (1, 128), use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True
        ),
        bytes=num_tokens * hidden * 3 + num_tokens * (hidden // 512) * 4,
    )
    return case


def cast_back_case(num_tokens, hidden):
    def make():
        x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        return (tilebake.quant.per_token_cast(x, "e4m3", 128),)

    return {
        "op": "cast_back",
        "variant": "e4m3 1x128 fp32 SF -> bf16",
        "make": make,
        "fn": lambda q: tilebake.quant.cast_back(q, "bf16", (1, 128)),
        "ref": lambda q: tilebake.torch.cast_back(q, "e4m3", (1, 128)),
        "bytes": num_tokens * hidden * (1 + 2) + num_tokens * (hidden // 128) * 4,
    }


# op -> its cases (several variants of one op may be measured).
CASES = {
    "per_token_cast": [per_token_cast_case, per_token_cast_packed_case],
    "cast_back": [cast_back_case],
}


def _moe_psum(num_tokens, num_experts=16, alignment=128):
    """An expert layout of num_tokens rows: each expert a little short of its aligned share, so
    experts end in padding rows (one expert owning every row when the rows are too few)."""
    per_expert = num_tokens // num_experts // alignment * alignment
    if per_expert == 0:
        return torch.tensor([num_tokens], dtype=torch.int32, device="cuda")
    ends = [e * per_expert + per_expert - (7 * e) % 100 for e in range(num_experts)]
    return torch.tensor(ends, dtype=torch.int32, device="cuda")


def swiglu_forward_case(num_tokens, hidden):
    """MoE up-projection output (E, 2H) bf16 -> e4m3 (E, H), 1x128 fp32 SF, topk weights, psum layout."""

    def make():
        x = torch.randn(num_tokens, 2 * hidden, device="cuda").to(torch.bfloat16)
        return x, _moe_psum(num_tokens), torch.rand(num_tokens, device="cuda")

    return {
        "op": "swiglu_forward",
        "variant": "swiglu_forward_and_per_token_cast bf16 (E, 2H) -> e4m3 1x128 fp32 SF, topk weights, psum",
        "make": make,
        "fn": lambda x, psum, w: tilebake.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, psum, w),
        "ref": lambda x, psum, w: tilebake.torch.cast(tilebake.torch.swiglu_forward(x, psum, w), "e4m3", (1, 128)),
        "bytes": num_tokens * (2 * hidden * 2 + hidden + (hidden // 128) * 4 + 4),
    }


def swiglu_backward_case(num_tokens, hidden):
    """e4m3 (E, 2H) + 1x128 SF and bf16 act grad -> bf16 x_grad and its e4m3 copy (no topk weights,
    whose reduction is not bit-exact with the reference, so the output check stays exact)."""

    def make():
        x = torch.randn(num_tokens, 2 * hidden, device="cuda").to(torch.bfloat16)
        g = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        return tilebake.quant.per_token_cast(x, "e4m3", 128), g, _moe_psum(num_tokens)

    def ref(x, g, psum):
        dx, _, _ = tilebake.torch.swiglu_backward(x, g, psum, num_per_channels=128)
        return dx.to(torch.bfloat16), tilebake.torch.cast(dx, "e4m3", (1, 128))

    sf_bytes = num_tokens * (2 * hidden // 128) * 4
    return {
        "op": "swiglu_backward",
        "variant": "swiglu_backward_and_per_token_cast e4m3 (E, 2H) 1x128 -> bf16 + e4m3 1x128 fp32 SF, psum",
        "make": make,
        "fn": lambda x, g, psum: tilebake.quant.swiglu_backward_and_per_token_cast(x, g, "e4m3", 128, psum),
        "ref": ref,
        "bytes": num_tokens * (2 * hidden + hidden * 2 + 2 * hidden * 2 + 2 * hidden) + 2 * sf_bytes,
    }


CASES["swiglu_forward"] = [swiglu_forward_case]
CASES["swiglu_backward"] = [swiglu_backward_case]
