"""Benchmark cases, one per op, keyed by the op name the manifest uses.

Each case is `case(num_tokens, hidden) -> dict` with: op, variant (text), make() -> input
args (fresh random data, never zeros), fn(*args) (the tilebake call), ref(*args) (the
plain-torch reference, also compiled with torch.compile), bytes (that must move: inputs
read once, outputs written once), and optionally check(out, ref_out) -> bool where the
output cannot equal the reference byte for byte (default: same bytes).
tests/test_bench_coverage.py fails when an op in the manifest has no case here.
"""

import torch

import tilebake
from tilebake.utils import ceil_div

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


def per_token_cast_nvfp4_case(num_tokens, hidden):
    """bf16 -> e2m1 (packed int8), 1x16 blocks with e4m3 SF: the NVFP4-like layout."""
    case = per_token_cast_case(num_tokens, hidden)
    case.update(
        variant="bf16->e2m1, 1x16, e4m3 SF",
        fn=lambda x: tilebake.quant.per_token_cast(x, "e2m1", 16, use_e4m3_sf=True),
        ref=lambda x: tilebake.torch.cast(x, "e2m1", (1, 16), use_e4m3_sf=True),
        bytes=num_tokens * hidden * 2 + num_tokens * hidden // 2 + num_tokens * (hidden // 16),
    )
    return case


def per_token_cast_sf_only_case(num_tokens, hidden):
    case = per_token_cast_case(num_tokens, hidden)
    case.update(
        variant="per_token_cast_with_sf_only bf16, 1x128, fp32 SF",
        fn=lambda x: tilebake.quant.per_token_cast_with_sf_only(x, "e4m3", 128),
        ref=lambda x: tilebake.torch.cast(x, "e4m3", (1, 128))[1],
        bytes=num_tokens * hidden * 2 + num_tokens * (hidden // 128) * 4,
    )
    return case


CASES["per_token_cast"] += [per_token_cast_nvfp4_case, per_token_cast_sf_only_case]


def per_block_cast_case(num_tokens, hidden):
    def make():
        return (torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16),)

    return {
        "op": "per_block_cast",
        "variant": "bf16->e4m3, 128x128, fp32 SF",
        "make": make,
        "fn": lambda x: tilebake.quant.per_block_cast(x, "e4m3", (128, 128)),
        "ref": lambda x: tilebake.torch.cast(x, "e4m3", (128, 128)),
        "bytes": num_tokens * hidden * (2 + 1) + ceil_div(num_tokens, 128) * ceil_div(hidden, 128) * 4,
    }


def per_channel_cast_case(num_tokens, hidden):
    def make():
        return (torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16),)

    return {
        "op": "per_channel_cast",
        "variant": "bf16->e4m3, 128x1, fp32 SF",
        "make": make,
        "fn": lambda x: tilebake.quant.per_channel_cast(x, "e4m3", 128),
        "ref": lambda x: tilebake.torch.cast(x, "e4m3", (128, 1)),
        "bytes": num_tokens * hidden * (2 + 1) + ceil_div(num_tokens, 128) * hidden * 4,
    }


def _lossless_case(num_tokens, hidden, out_block):
    def make():
        x = torch.randn(num_tokens, hidden, device="cuda")
        return (tilebake.torch.cast(x, "e2m1", (1, 32), round_sf=True, use_packed_ue8m0=True),)

    bm, bk = out_block
    return {
        "op": "per_block_cast_lossless",
        "variant": f"e2m1 1x32 UE8M0 -> e4m3 {bm}x{bk} UE8M0",
        "make": make,
        "fn": lambda q: tilebake.quant.per_block_cast_lossless(
            q, "e4m3", (1, 32), out_block, round_sf=True, use_packed_ue8m0=True
        ),
        "ref": lambda q: tilebake.torch.per_block_cast_lossless(
            q, "e4m3", (1, 32), out_block, round_sf=True, use_packed_ue8m0=True, on_error="nan"
        ),
        # e2m1 in (half a byte), its UE8M0 SF (a byte per 32), e4m3 out, packed SF out
        "bytes": num_tokens * hidden // 2
        + num_tokens * hidden // 32
        + num_tokens * hidden
        + ceil_div(num_tokens, bm) * ceil_div(ceil_div(hidden, bk), 4) * 4,
    }


def per_block_cast_lossless_case(num_tokens, hidden):
    return _lossless_case(num_tokens, hidden, (128, 128))


def per_block_cast_lossless_per_token_case(num_tokens, hidden):
    return _lossless_case(num_tokens, hidden, (1, 128))


CASES["per_block_cast"] = [per_block_cast_case]
CASES["per_channel_cast"] = [per_channel_cast_case]
CASES["per_block_cast_lossless"] = [per_block_cast_lossless_case, per_block_cast_lossless_per_token_case]


def batched_transpose_weight_sf_case(num_tokens, hidden):
    """num_tokens x hidden as one weight (n, k) with 128 x 128 block scales."""

    def make():
        nb, kb = ceil_div(num_tokens, 128), ceil_div(hidden, 128)
        return ([torch.exp2(torch.randint(-20, 10, (nb, kb), device="cuda").float())],)

    nb, kb = ceil_div(num_tokens, 128), ceil_div(hidden, 128)
    return {
        "op": "batched_transpose_weight_sf",
        "variant": "fp32 128x128 -> UE8M0 sf0 + transposed sf1",
        "make": make,
        "fn": lambda sfs: tilebake.quant.batched_transpose_weight_sf(sfs, 128, [True]),
        "ref": lambda sfs: tilebake.torch.batched_transpose_weight_sf(sfs, 128, [True]),
        "bytes": nb * kb * 4 + nb * 128 * ceil_div(kb, 4) * 4 + kb * 128 * ceil_div(nb, 4) * 4,
    }


CASES["batched_transpose_weight_sf"] = [batched_transpose_weight_sf_case]


def close(actual, expected) -> bool:
    """The output check for ops whose reductions cannot match a torch reference bit for bit:
    torch.testing.assert_close's default tolerances per dtype, leaf by leaf (NaN fails)."""
    try:
        leaves = torch.utils._pytree.tree_leaves
        for a, e in zip(leaves(actual), leaves(expected), strict=True):
            torch.testing.assert_close(a, e)
    except (AssertionError, ValueError):
        return False
    return True


def norm_forward_case(num_tokens, hidden):
    def make():
        x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        residual = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        weight = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
        return x, weight, residual

    return {
        "op": "norm_forward",
        "variant": "bf16 RMSNorm, weight, residual add, rstd",
        "make": make,
        "fn": lambda x, w, r: tilebake.quant.norm_forward(x, w, 1e-6, residual=r, with_rstd=True),
        "ref": lambda x, w, r: tilebake.torch.norm_forward_ref(x, w, 1e-6, residual=r),
        "check": close,
        # x, residual, weight read; out, residual_out, rstd written
        "bytes": num_tokens * hidden * 2 * 4 + hidden * 2 + num_tokens * 4,
    }


def norm_forward_and_per_token_cast_case(num_tokens, hidden):
    case = norm_forward_case(num_tokens, hidden)

    def ref(x, w, r):
        y, rstd, norm_input = tilebake.torch.norm_forward_ref(x, w, 1e-6, residual=r)
        return tilebake.torch.cast(y, "e4m3", (1, 32), round_sf=True, use_packed_ue8m0=True), norm_input

    def fn(x, w, r):
        quant, _, _, norm_input = tilebake.quant.norm_forward_and_per_token_cast(
            x, w, 1e-6, "e4m3", 32, residual=r, round_sf=True, use_packed_ue8m0=True
        )
        return quant, norm_input

    def check(actual, expected):
        """The residual sum bit for bit; the FP8 data dequantised, within one e4m3 level (the
        normalised values differ from torch's in the last bf16 bit now and then)."""
        ((data, sf), norm_input), ((data_ref, sf_ref), norm_input_ref) = actual, expected
        values = tilebake.torch.cast_back((data, sf), "e4m3", (1, 32), out_dtype=torch.float32)
        values_ref = tilebake.torch.cast_back((data_ref, sf_ref), "e4m3", (1, 32), out_dtype=torch.float32)
        one_level = (values - values_ref).abs() <= 0.125 * values_ref.abs()  # e4m3: 3 mantissa bits
        return torch.equal(norm_input, norm_input_ref) and bool(one_level.all())

    case.update(
        op="norm_forward_and_per_token_cast",
        variant="bf16 RMSNorm + residual -> e4m3 1x32, packed UE8M0 SF",
        fn=fn,
        ref=ref,
        check=check,
        # x, residual, weight read; e4m3 out, packed SF, residual_out written
        bytes=num_tokens * hidden * (2 + 2 + 1 + 2) + hidden * 2 + num_tokens * (hidden // 128) * 4,
    )
    return case


def norm_backward_case(num_tokens, hidden):
    def make():
        x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        weight = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
        _, rstd, _ = tilebake.torch.norm_forward_ref(x, weight, 1e-6)
        grad = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        return grad, x, weight, rstd

    return {
        "op": "norm_backward",
        "variant": "bf16 RMSNorm backward, weight grad",
        "make": make,
        "fn": lambda g, x, w, rstd: tilebake.quant.norm_backward(g, x, w, rstd),
        "ref": lambda g, x, w, rstd: tilebake.torch.norm_backward_ref(g, x, w, rstd),
        "check": close,
        # out_grad, x read, x_grad written; weight, rstd, weight_grad are small
        "bytes": num_tokens * hidden * 2 * 3 + num_tokens * 4 + hidden * 2 * 2,
    }


def without_residual(make_case):
    """The case at the original's benchmark setting (weight, no residual): x, weight in; out
    (and rstd / SF) written."""

    def case_of(num_tokens, hidden):
        case = make_case(num_tokens, hidden)
        make, fn, ref = case["make"], case["fn"], case["ref"]
        quant = case["op"] == "norm_forward_and_per_token_cast"
        # x, weight read; out (bf16, rstd) or (e4m3, packed SF) written
        written = num_tokens * hidden * 2 + num_tokens * 4 if not quant else num_tokens * hidden * (1 + 1 / 32)
        case.update(
            variant=case["variant"].replace("residual add, ", "").replace(" + residual", ""),
            make=lambda: make()[:2],
            fn=lambda x, w: fn(x, w, None),
            ref=lambda x, w: ref(x, w, None),
            bytes=int(num_tokens * hidden * 2 + hidden * 2 + written),
        )
        return case

    return case_of


CASES["norm_forward"] = [norm_forward_case, without_residual(norm_forward_case)]
CASES["norm_forward_and_per_token_cast"] = [
    norm_forward_and_per_token_cast_case,
    without_residual(norm_forward_and_per_token_cast_case),
]
def norm_backward_reduce_case(num_tokens, hidden):
    """norm_backward's second launch alone: 2 x 132 partial rows (an H200's bf16 CTAs) summed."""
    import importlib

    from tilebake.torch.engram import sum_partials

    reduce = importlib.import_module("tilebake.quant.norm_backward")._REDUCE_KERNELS["bf16",]
    parts = min(num_tokens, 264)

    def fn(partials):
        out = torch.empty(hidden, dtype=torch.bfloat16, device="cuda")
        reduce(partials.get_device(), partials.data_ptr(), out.data_ptr(), parts, hidden, 0)
        return out

    return {
        "op": "norm_backward_reduce",
        "variant": "fp32 partial rows -> bf16 weight grad",
        "make": lambda: (torch.randn(parts, hidden, device="cuda"),),
        "fn": fn,
        "ref": lambda partials: sum_partials(partials).bfloat16(),
        "bytes": parts * hidden * 4 + hidden * 2,
    }


CASES["norm_backward"] = [norm_backward_case]
CASES["norm_backward_reduce"] = [norm_backward_reduce_case]


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
        # The reference cast (same bytes): the case then needs no other op in the wheel.
        return tilebake.torch.cast(x, "e4m3", (1, 128)), g, _moe_psum(num_tokens)

    def ref(x, g, psum):
        dx = tilebake.torch.swiglu_backward(x, g, psum, num_per_channels=128)[0]  # (x_grad, act_out)
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


def unpack_from_e2m1fn_x2_case(num_tokens, hidden):
    def make():
        x = torch.randn(num_tokens, hidden, device="cuda")
        return (tilebake.torch.cast(x, "e2m1", (1, 32))[0],)

    return {
        "op": "unpack_from_e2m1fn_x2",
        "variant": "packed e2m1 (T, H/2) -> bf16 (T, H)",
        "make": make,
        "fn": lambda q: tilebake.quant.unpack_from_e2m1fn_x2(q, torch.bfloat16),
        "ref": lambda q: tilebake.torch.unpack_from_e2m1fn_x2(q, torch.bfloat16),
        "bytes": num_tokens * hidden // 2 + num_tokens * hidden * 2,
    }


CASES["cast_back"].append(cast_back_e2m1_case)
CASES["unpack_from_e2m1fn_x2"] = [unpack_from_e2m1fn_x2_case]
CASES["per_token_cast_and_cast_back"] = [per_token_cast_and_cast_back_case]
CASES["cast"] = [cast_sr_case]


def per_token_cast_sr_case(num_tokens, hidden):
    """bf16 -> e4m3 1x128 with stochastic rounding (the runtime-SF kernel, hash per element)."""
    case = per_token_cast_case(num_tokens, hidden)
    case.update(
        variant="bf16->e4m3, 1x128, fp32 SF, stochastic rounding",
        fn=lambda x: tilebake.quant.per_token_cast(x, "e4m3", 128, stochastic_cast=True),
        ref=lambda x: tilebake.torch.cast(x, "e4m3", (1, 128), stochastic_rounding=True),
    )
    return case


CASES["per_token_cast"] += [per_token_cast_sr_case]


def cast_sr_e4m3_case(num_tokens, hidden, dtype=torch.bfloat16):
    """cast to e4m3 with stochastic rounding (bf16 or fp32 input)."""

    def make():
        return (torch.randn(num_tokens, hidden, device="cuda").to(dtype),)

    name = "bf16" if dtype == torch.bfloat16 else "fp32"
    return {
        "op": "cast",
        "variant": f"{name} -> e4m3, stochastic rounding",
        "make": make,
        "fn": lambda x: tilebake.quant.cast(x, torch.float8_e4m3fn, stochastic_rounding=True),
        "ref": lambda x: tilebake.torch.stochastic_cast(x, torch.float8_e4m3fn),
        "bytes": num_tokens * hidden * (dtype.itemsize + 1),
    }


def cast_sr_fp32_e4m3_case(num_tokens, hidden):
    return cast_sr_e4m3_case(num_tokens, hidden, torch.float32)


def per_token_cast_sr_e2m1_case(num_tokens, hidden):
    """bf16 -> e2m1 1x16 e4m3 SF with stochastic rounding (the runtime-SF kernel)."""

    def make():
        return (torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16),)

    return {
        "op": "per_token_cast",
        "variant": "bf16->e2m1, 1x16, e4m3 SF, stochastic rounding",
        "make": make,
        "fn": lambda x: tilebake.quant.per_token_cast(x, "e2m1", 16, use_e4m3_sf=True, stochastic_cast=True),
        "ref": lambda x: tilebake.torch.cast(x, "e2m1", (1, 16), use_e4m3_sf=True, stochastic_rounding=True),
        "bytes": num_tokens * hidden * 2 + num_tokens * hidden // 2 + num_tokens * (hidden // 16),
    }


CASES["cast"] += [cast_sr_e4m3_case, cast_sr_fp32_e4m3_case]
CASES["per_token_cast"] += [per_token_cast_sr_e2m1_case]


def apply_rotary_case(num_tokens, hidden):
    """In-place RoPE of query and key (NeoX, rot 128, bf16, int64 positions). `hidden` sets the
    head counts: 7168 -> 32 query + 8 key heads (4096 -> 18 + 4, 2048 -> 9 + 2)."""
    q_heads = hidden // 224
    k_heads = max(1, q_heads // 4)
    rot, max_pos = 128, 32768

    def make():
        q = torch.randn(num_tokens, q_heads, rot, device="cuda").to(torch.bfloat16)
        k = torch.randn(num_tokens, k_heads, rot, device="cuda").to(torch.bfloat16)
        angles = torch.rand(max_pos, rot // 2, device="cuda") * 6.2831855
        cache = torch.cat((angles.cos(), angles.sin()), dim=1)
        positions = torch.randint(0, max_pos, (num_tokens,), device="cuda")
        return (q, k, cache, positions, q.clone(), k.clone())

    def fn(q, k, cache, positions, q0, k0):
        tilebake.transform.apply_rotary(q, cache, k, positions)
        return q, k

    return {
        "op": "apply_rotary",
        "variant": f"bf16 NeoX rot 128, {q_heads} + {k_heads} heads, int64 positions",
        "make": make,
        "fn": fn,
        "ref": lambda q, k, cache, positions, q0, k0: tilebake.torch.rotary_embedding_ref(q0, cache, k0, positions),
        # q and k read and written, one cache row and one position read per token
        "bytes": num_tokens * ((q_heads + k_heads) * rot * 2 * 2 + rot * 4 + 8),
    }


CASES["apply_rotary"] = [apply_rotary_case]


# --- MoE routing (tilebake.moe): the expert count and top-k are fixed (DeepSeek-V3-like); the
# `hidden` of the shape grid does not apply to them.
MOE_EXPERTS, MOE_TOPK = 256, 8


def topk_gate_case(num_tokens, hidden):
    def make():
        return (torch.randn(num_tokens, MOE_EXPERTS, device="cuda"),)

    return {
        "op": "topk_gate",
        "variant": f"fp32 scores (T, {MOE_EXPERTS}) -> int64 top-{MOE_TOPK}",
        "make": make,
        "fn": lambda s: tilebake.moe.topk_gate(s, MOE_TOPK),
        "ref": lambda s: tilebake.torch.stable_topk(s, MOE_TOPK),
        "bytes": num_tokens * (MOE_EXPERTS * 4 + MOE_TOPK * 8),
    }


def normalize_weight_case(num_tokens, hidden):
    def make():
        return (torch.rand(num_tokens, MOE_TOPK, device="cuda"),)

    return {
        "op": "normalize_weight",
        "variant": f"fp32 (T, {MOE_TOPK})",
        "make": make,
        "fn": lambda w: tilebake.moe.normalize_weight(w),
        "ref": lambda w: tilebake.torch.normalize_weight(w),
        "bytes": num_tokens * (MOE_TOPK * 4 * 2 + 4),
    }


def moe_topk_gate_backward_case(num_tokens, hidden):
    """sqrtsoftplus, with the aux-loss term (mask + grad_scores_sum, sequences of 4096 tokens)."""
    num_seqs = max(1, num_tokens // 4096)

    def make():
        scores = torch.nn.functional.softplus(torch.randn(num_tokens, MOE_EXPERTS, device="cuda")).sqrt()
        idx = tilebake.torch.stable_topk(scores, MOE_TOPK)
        sel = scores.gather(1, idx)
        weights = sel / (1e-20 + sel.sum(1, keepdim=True)) * 2.5
        grad = torch.randn(num_tokens, MOE_TOPK, device="cuda")
        mask = torch.rand(num_tokens, device="cuda") > 0.05
        idx[~mask] = -1
        return scores, idx, weights, grad, mask, torch.randn(num_seqs, MOE_EXPERTS, device="cuda")

    def check(actual, expected):
        """The original's tolerance against the float64 reference: rtol 1e-5, atol 1e-5 * max|ref|."""
        return bool(((actual - expected).abs() <= 1e-5 * expected.abs().max() + 1e-5 * expected.abs()).all())

    return {
        "op": "moe_topk_gate_backward",
        "variant": f"sqrtsoftplus, E={MOE_EXPERTS}, k={MOE_TOPK}, mask + aux grad_scores_sum",
        "make": make,
        "fn": lambda u, i, w, g, m, h: tilebake.moe.moe_topk_gate_backward(u, i, w, g, 2.5, mask=m, grad_scores_sum=h),
        "ref": lambda u, i, w, g, m, h: tilebake.torch.moe_topk_gate_backward_ref(
            u, i, w, g, 2.5, mask=m, grad_scores_sum=h
        ),
        "check": check,
        # scores read and grad_logits written; idx, weights, grads, mask, grad_scores_sum read
        "bytes": num_tokens * (MOE_EXPERTS * 4 * 2 + MOE_TOPK * (8 + 4 + 4) + 1) + num_seqs * MOE_EXPERTS * 4,
    }


CASES["topk_gate"] = [topk_gate_case]
CASES["normalize_weight"] = [normalize_weight_case]
CASES["moe_topk_gate_backward"] = [moe_topk_gate_backward_case]


# --- MoE token-to-expert mapping (TileKernels 1.0): k = 8 of E = 256 experts, segments aligned to 128.
# Balanced routing (token t's slot j to expert (t * k + j) % E, no dropped slot), so the layout's row
# count and the bytes moved are known exactly; the rows themselves are random.
MAPPING_TOPK, MAPPING_EXPERTS, MAPPING_ALIGNMENT = 8, 256, 128


def _mapping_rows(num_tokens):
    """Rows of the balanced routing's fused layout."""
    pairs = num_tokens * MAPPING_TOPK
    counts = [pairs // MAPPING_EXPERTS + (e < pairs % MAPPING_EXPERTS) for e in range(MAPPING_EXPERTS)]
    return sum(ceil_div(c, MAPPING_ALIGNMENT) * MAPPING_ALIGNMENT for c in counts)


def _balanced_topk_idx(num_tokens):
    flat = torch.arange(num_tokens * MAPPING_TOPK, device="cuda") % MAPPING_EXPERTS
    return flat.view(num_tokens, MAPPING_TOPK).contiguous()


def _balanced_layout(num_tokens):
    p2e, _, _, ttp, *_ = tilebake.torch.get_fused_mapping(
        _balanced_topk_idx(num_tokens), MAPPING_EXPERTS, 0, MAPPING_ALIGNMENT
    )
    return ttp, p2e


def get_fused_mapping_case(num_tokens, hidden):
    rows = _mapping_rows(num_tokens)
    pairs = num_tokens * MAPPING_TOPK

    def run(impl):
        # force_no_sync: no host copy, so the call can be timed in a CUDA graph too.
        return lambda idx: impl(idx, MAPPING_EXPERTS, 0, MAPPING_ALIGNMENT, force_no_sync=True)[:7]

    def check(actual, expected):
        """Equal values; the no-sync outputs keep the upper-bound row count (the tail is -1)."""
        return all(torch.equal(a, e) for a, e in zip(actual, expected))

    return {
        "op": "get_fused_mapping",
        "variant": f"k={MAPPING_TOPK}, E={MAPPING_EXPERTS}, alignment {MAPPING_ALIGNMENT}, no sync",
        "make": lambda: (_balanced_topk_idx(num_tokens),),
        "fn": run(tilebake.moe.get_fused_mapping),
        "ref": run(tilebake.torch.get_fused_mapping),
        "check": check,
        # topk_idx read; token_topk_to_pos and the three pos_* maps (the rows in use) written
        "bytes": pairs * 8 + pairs * 4 + rows * 3 * 4 + MAPPING_EXPERTS * 3 * 4,
    }


def expand_to_fused_case(num_tokens, hidden):
    rows = _mapping_rows(num_tokens)

    def make():
        ttp, p2e = _balanced_layout(num_tokens)
        return torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16), ttp, p2e

    return {
        "op": "expand_to_fused",
        "variant": f"bf16, k={MAPPING_TOPK}, E={MAPPING_EXPERTS}, alignment {MAPPING_ALIGNMENT}",
        "make": make,
        "fn": lambda x, ttp, p2e: tilebake.moe.expand_to_fused(x, ttp, p2e),
        "ref": lambda x, ttp, p2e: tilebake.torch.expand_to_fused(x, ttp, p2e),
        # x read once, every row of the layout written (padding rows as zeros), the maps read
        "bytes": num_tokens * hidden * 2 + rows * hidden * 2 + num_tokens * MAPPING_TOPK * 4 + rows * 4,
    }


def expand_to_fused_with_sf_case(num_tokens, hidden):
    rows = _mapping_rows(num_tokens)
    sf_cols = ceil_div(hidden, 128)

    def make():
        ttp, p2e = _balanced_layout(num_tokens)
        x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        return tilebake.torch.cast(x, "e4m3", (1, 128)), ttp, p2e

    return {
        "op": "expand_to_fused",
        "variant": "expand_to_fused_with_sf e4m3 1x128 fp32 SF, row-major",
        "make": make,
        "fn": lambda q, ttp, p2e: tilebake.moe.expand_to_fused_with_sf(q, 128, ttp, p2e),
        "ref": lambda q, ttp, p2e: tilebake.torch.expand_to_fused_with_sf(q, 128, ttp, p2e),
        "bytes": (num_tokens + rows) * (hidden + sf_cols * 4) + num_tokens * MAPPING_TOPK * 4 + rows * 4,
    }


def reduce_fused_case(num_tokens, hidden):
    def make():
        ttp, p2e = _balanced_layout(num_tokens)
        x = torch.randn(p2e.numel(), hidden, device="cuda").to(torch.bfloat16)
        return x, torch.rand(num_tokens, MAPPING_TOPK, device="cuda"), ttp

    return {
        "op": "reduce_fused",
        "variant": f"bf16 -> bf16, k={MAPPING_TOPK} weighted, E={MAPPING_EXPERTS}",
        "make": make,
        "fn": lambda x, w, ttp: tilebake.moe.reduce_fused(x, w, ttp),
        "ref": lambda x, w, ttp: tilebake.torch.reduce_fused(x, w, ttp),
        # the routed rows read (padding rows are not), the output written, weights and positions read
        "bytes": num_tokens * MAPPING_TOPK * hidden * 2 + num_tokens * hidden * 2 + num_tokens * MAPPING_TOPK * 8,
    }


CASES["get_fused_mapping"] = [get_fused_mapping_case]
CASES["expand_to_fused"] = [expand_to_fused_case, expand_to_fused_with_sf_case]
CASES["reduce_fused"] = [reduce_fused_case]


def moe_topk_gate_forward_case(num_tokens, hidden):
    """The DeepSeek-V3-sized router: 256 routed experts, top-8, sqrtsoftplus, score-correction
    bias (the case ignores `hidden`: the router's input is the logits)."""
    num_experts, k = 256, 8

    def make():
        logits = torch.randn(num_tokens, num_experts, device="cuda")
        bias = torch.randn(num_experts, device="cuda") * 0.1
        return logits, bias

    def check(actual, expected):
        """Indices equal wherever the token's top-k is not decided by a last-ulp score difference
        (random logits: almost every token), weights within rtol 1e-5 there."""
        (idx, w), (idx_ref, w_ref) = actual, expected
        same = (idx == idx_ref).all(dim=1)
        if same.float().mean() < 0.999:
            return False
        return torch.allclose(w[same], w_ref[same], rtol=1e-5, atol=1e-7)

    return {
        "op": "moe_topk_gate_forward",
        "variant": "fp32 logits 256 experts, top-8, sqrtsoftplus, bias",
        "make": make,
        "fn": lambda x, b: tilebake.moe.moe_topk_gate_forward(x, k, False, 0, 2.5, 0, bias=b),
        "ref": lambda x, b: tilebake.torch.moe_topk_gate_forward_ref(x, k, False, 0, 2.5, 0, bias=b),
        "check": check,
        # logits read; int64 indices and fp32 weights written (the bias is 1 KiB)
        "bytes": num_tokens * num_experts * 4 + num_tokens * k * (8 + 4),
    }


CASES["moe_topk_gate_forward"] = [moe_topk_gate_forward_case]


from cases_engram import CASES as ENGRAM_CASES  # noqa: E402  (bench/ is on the path, as for this module)

CASES.update(ENGRAM_CASES)

from cases_mhc import CASES as MHC_CASES  # noqa: E402

CASES.update(MHC_CASES)
