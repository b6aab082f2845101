"""Call plans (tilebake/_runtime/plan.py) of swiglu_forward and swiglu_forward_and_per_token_cast,
and the parts the backward plans share (_swiglu_backward_plans.py): the SwiGLU input, the psum
layout, topk_weights and the e4m3 cast's SF allocation. Each plan does what the op's Python path
does for one call key (same checks or stricter, same allocations and kernel arguments); the
Python path builds them once per key after a successful launch."""

from __future__ import annotations

import math

import torch

from tilebake import config
from tilebake._runtime import plan

# psum_args' search_steps = num_experts.bit_length(), as a plan expression (num_experts < 2^31:
# the kernel's int32).
_BIT_LENGTH_N = " + ".join(f"(N >= {1 << k})" for k in range(31))


def bools(*flags) -> bool:
    """Plans are built for flags passed as True/False only (any truthy object would do for the
    Python path, an unhashable one too, which could not be a key)."""
    return all(flag is True or flag is False for flag in flags)


def read_swiglu_input(b: plan.Builder, arg, dtype: torch.dtype):
    """x (T, 2H) as check_swiglu_input takes it, T >= 1 and H >= 64 (an empty problem takes the
    Python path); binds T, W = 2H, H and xs (x's row stride)."""
    x = b.tensor(arg, dtype, ("T", "W"), strides=("xs", 1))
    b.check(f"T >= 1 and W >= 128 and W % 128 == 0 and (T == 1 or xs % {16 // dtype.itemsize} == 0)")
    b.let("H", "W // 2")
    return x


def read_psum_and_weights(b: plan.Builder, psum_arg, weights_arg, x, has_psum: bool, has_weights: bool) -> dict:
    """psum and topk_weights as check_psum and check_row_vector take them; the kernel arguments
    the Python path passes for them (psum_args; x's pointer where one is absent)."""
    if has_psum:
        psum = b.tensor(psum_arg, torch.int32, ("N",), strides=("ps",), align=4)
        b.check("N >= 1 and (N == 1 or ps == 1)")
        args = dict(P=psum, num_experts="N", use_psum=1, search_steps=_BIT_LENGTH_N,
                    alignment=config.get_token_alignment())  # fmt: skip
    else:
        args = dict(P=x, num_experts=0, use_psum=0, search_steps=0, alignment=1)
    weights = x
    if has_weights:
        weights = b.tensor(weights_arg, torch.float32, ("T",), strides=("ws",), align=4)
        b.check("T == 1 or ws == 1")
    return dict(args, W=weights, has_weights=int(has_weights))


def scalar_args(scale, clamp) -> dict:
    """The kernel's float arguments for the checked routed_scaling_factor and clamp_value."""
    return dict(scale=1.0 if scale is None else scale, clamp_value=math.inf if clamp is None else clamp)


def alloc_sf(b: plan.Builder, groups: str, packed: bool, col_major: bool) -> tuple:
    """quant._common.alloc_sf(like, T, groups, packed, col_major) in a plan; (the SF, its
    sf_stride_t and sf_stride_g kernel arguments: packed UE8M0 SF are addressed in bytes)."""
    b.let("C", f"({groups} + 3) // 4" if packed else groups)
    dtype, unit = (torch.int32, 4) if packed else (torch.float32, 1)
    if col_major:  # a (C, padded T) buffer, handed out as its transposed (T, C) view
        b.let("sg", "(T + 3) // 4 * 4")
        sf = b.alloc(dtype, ("C", "sg"), view=(("T", "C"), (1, "sg")))
        return sf, f"{unit}", f"sg * {unit}"
    sf = b.alloc(dtype, ("T", "C"))
    return sf, f"C * {unit}", f"{unit}"


def forward_plan(kernel, device, dtype, out_dtype, has_psum, has_weights, scale, clamp):
    """swiglu_forward without clamped_count: y (T, H) in out_dtype."""
    b = plan.Builder()
    x = read_swiglu_input(b, 0, dtype)
    options = read_psum_and_weights(b, 1, 2, x, has_psum, has_weights)
    y = b.alloc(out_dtype, ("T", "H"))
    b.launch(
        kernel, device, X=x, Y=y, C=x, num_tokens="T", hidden="H", x_stride="xs", y_stride="H", count_clamps=0,
        **options, **scalar_args(scale, clamp),
    )  # fmt: skip
    b.returns(y)
    return b.build()


def forward_cast_plan(kernel, device, dtype, npc, has_psum, has_weights, scale, clamp, col_major, packed):
    """swiglu_forward_and_per_token_cast without clamped_count: (data e4m3 (T, H), sf)."""
    b = plan.Builder()
    x = read_swiglu_input(b, 0, dtype)
    options = read_psum_and_weights(b, 1, 2, x, has_psum, has_weights)
    data = b.alloc(torch.float8_e4m3fn, ("T", "H"))
    sf, sf_stride_t, sf_stride_g = alloc_sf(b, f"(H + {npc - 1}) // {npc}", packed, col_major)
    b.launch(
        kernel, device, X=x, Y=data, C=x, num_tokens="T", hidden="H", x_stride="xs", y_stride="H", count_clamps=0,
        S=sf, sf_stride_t=sf_stride_t, sf_stride_g=sf_stride_g,
        amax_clamp=config.get_amax_clamp_for_quant("e4m3", False), **options, **scalar_args(scale, clamp),
    )  # fmt: skip
    b.returns((data, sf))
    return b.build()
