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


def cast_back_e2m1_case(num_tokens, hidden):
    def make():
        x = torch.randn(num_tokens, hidden, device="cuda")
        return (tilebake.torch.cast(x, "e2m1", (1, 32), round_sf=True, use_packed_ue8m0=True),)

    return {
        "op": "cast_back",
        "variant": "e2m1 1x32 packed UE8M0 SF -> bf16",
        "make": make,
        "fn": lambda q: tilebake.quant.cast_back(q, "bf16", (1, 32)),
        "ref": lambda q: tilebake.torch.cast_back(q, "e2m1", (1, 32)),
        "bytes": num_tokens * hidden * 5 // 2 + num_tokens * (hidden // 128) * 4,
    }


def per_token_cast_and_cast_back_case(num_tokens, hidden):
    # In place: make() also returns an untouched copy, from which ref computes the expected bytes
    # (fn overwrites x and returns it, so the one-off comparison sees fn's result).
    def make():
        x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        return (x, x.clone())

    def fn(x, original):
        tilebake.quant.per_token_cast_and_cast_back(x, "e4m3", 128)
        return x

    return {
        "op": "per_token_cast_and_cast_back",
        "variant": "bf16 in place, e4m3 1x128, fp32 SF",
        "make": make,
        "fn": fn,
        "ref": lambda x, original: tilebake.torch.per_token_cast_and_cast_back_ref(original, "e4m3", 128),
        "bytes": num_tokens * hidden * (2 + 2),
    }


def cast_sr_case(num_tokens, hidden):
    def make():
        return (torch.randn(num_tokens, hidden, device="cuda"),)

    return {
        "op": "cast",
        "variant": "fp32 -> bf16, stochastic rounding",
        "make": make,
        "fn": lambda x: tilebake.quant.cast(x, torch.bfloat16, stochastic_rounding=True),
        "ref": lambda x: tilebake.torch.stochastic_cast(x, torch.bfloat16),
        "bytes": num_tokens * hidden * (4 + 2),
    }


CASES["cast_back"].append(cast_back_e2m1_case)
CASES["per_token_cast_and_cast_back"] = [per_token_cast_and_cast_back_case]
CASES["cast"] = [cast_sr_case]
