"""moe_topk_gate_forward (and its alias moe_topk_gate): the MoE router forward.

Validate, allocate, launch. The kernel is kernels_tl/moe/moe_topk_gate_forward.py; the reference
(and the CPU path) is tilebake.torch.gate.moe_topk_gate_forward_ref.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.moe._router import MAX_EXPERTS, SCORING_FUNCS, check_gate_args

__all__ = ["moe_topk_gate", "moe_topk_gate_forward"]

# bits of the kernel's `flags` argument: which optional tensors are present
FLAG_MASK, FLAG_BIAS, FLAG_IMAGE, FLAG_FIX = 1, 2, 4, 8
FLAG_MAP, FLAG_UNMAPPED, FLAG_RANDOM, FLAG_SCORES = 16, 32, 64, 128
# Expert bounds of the built kernels: one warp per token up to FAST_MAX_EXPERTS (a lane holds
# max_experts / 32 experts in registers), one CTA per token above (up to MAX_EXPERTS).
EXPERT_BOUNDS = (256, 512, MAX_EXPERTS)
FAST_MAX_EXPERTS = 512


@dataclasses.dataclass(frozen=True)
class MoeTopkGateForwardVariant(Variant):
    family = "moe"
    op = "moe_topk_gate_forward"
    PARAMS = (
        ptr(
            "L", "Bias", "ImageBias", "Mask", "ImageMask", "FixMask", "Random", "Map", "Count", "Unmapped", "OutIdx",
            "OutW", "Scores"
        )
        + i32("flags")
        + f32("scaling")
        + i32(
            "ep_rank", "num_groups", "num_topk_groups", "num_tokens", "num_experts", "num_topk", "width", "dup",
            "l_stride", "s_stride", "u_stride", "map_stride"
        )
    )  # fmt: skip

    scoring_func: str  # 'sqrtsoftplus' | 'softmax' | 'sigmoid'; every option is a runtime argument
    max_experts: int  # EXPERT_BOUNDS: the kernel for num_experts <= max_experts (the smallest that fits)

    @classmethod
    def all(cls):
        return tuple(cls(f, n) for f in SCORING_FUNCS for n in EXPERT_BOUNDS)


SCORING_CODES = {f: i for i, f in enumerate(SCORING_FUNCS)}  # the Ascend kernel's `func` argument


@dataclasses.dataclass(frozen=True)
class MoeTopkGateForwardAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/moe/moe_topk_gate_forward.py): every scoring
    function (`func`, SCORING_CODES), option and expert count up to max_experts at run time."""

    family = "moe"
    op = "moe_topk_gate_forward"
    backend = "ascend"
    PARAMS = MoeTopkGateForwardVariant.PARAMS + i32("func")

    max_experts: int
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(MAX_EXPERTS, cores) for cores in ASCEND_VEC_CORES)


def expert_bound(num_experts: int) -> int:
    """The max_experts of the kernel that serves num_experts (<= EXPERT_BOUNDS[-1])."""
    if num_experts <= 256:
        return 256
    return 512 if num_experts <= 512 else 8192


_KERNELS = KernelTable(MoeTopkGateForwardVariant)


def moe_topk_gate_forward(
    logits: torch.Tensor,
    num_topk: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    scoring_func: str = "sqrtsoftplus",
    mask: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    image_bias: Optional[torch.Tensor] = None,
    image_token_mask: Optional[torch.Tensor] = None,
    fix_routing_mask: Optional[torch.Tensor] = None,
    to_physical_map: Optional[torch.Tensor] = None,
    logical_count: Optional[torch.Tensor] = None,
    unmapped_topk_idx: Optional[torch.Tensor] = None,
    force_random: Optional[torch.Tensor] = None,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    scores: Optional[torch.Tensor] = None,
    *,
    num_groups: int = 1,
    num_topk_groups: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE router: pick each token's experts from its router logits.

    Per token t: scores = scoring_func(logits[t]) ('sqrtsoftplus': sqrt(softplus(x)), with
    softplus(x) = x beyond 20; 'softmax' over the experts; 'sigmoid'). The routed experts are the
    num_topk largest of scores + bias (image_bias instead for tokens with image_token_mask True),
    in descending order, ties to the smaller expert id; with num_groups > 1 (DeepSeek-V3) the
    experts form num_groups equal consecutive groups, a group scores the sum of its two largest
    selection values, and only the num_topk_groups best groups (ties to the smaller group) are
    eligible. The weights are the chosen experts' UNBIASED scores divided by (1e-20 + their sum,
    added left to right in slot order), times routed_scaling_factor. With use_shared_as_routed,
    num_shared_experts (1 or 2) slots follow, logical ids num_routed + s, weight 1.0.

    Per-token options, by priority: mask False -> every slot -1, weight 0, unmapped_topk_idx -1;
    force_random True -> num_topk distinct pseudo-random experts (below), unmapped_topk_idx -1;
    fix_routing_mask True -> the experts read from unmapped_topk_idx[t] (left unchanged; an id
    outside [0, num_routed) makes the token unrouted as for a non-finite logit); otherwise the
    top-k above, written to unmapped_topk_idx[t] if given. The weights of random and fixed
    routings come from those experts' scores as above.

    Random experts (deterministic, no RNG state): with fmix32 = MurmurHash3's 32-bit finaliser and
    arithmetic mod 2^32, seed = fmix32(fmix32(ep_rank) ^ t), draw(d) = fmix32(seed + (d + 1) *
    0x9E3779B9) % num_routed; slot s takes the first of draw(64 s) ... draw(64 s + 63) that no
    earlier slot holds, or else the smallest free expert (tilebake.torch.gate.random_experts).

    Physical ids: with to_physical_map (int32 (num_routed + shared, dup), rows may be strided) and
    logical_count (int32 (num_routed + shared,)), each slot's logical id e becomes
    to_physical_map[e, (ep_rank + t * 23333) % logical_count[e]] (int64 arithmetic); a count
    outside [1, dup] gives -1 for that slot (checked on the device, no sync). The map's entries
    are copied, never used as indices: any int32, negative ones too, comes out as it is (as int64).
    unmapped_topk_idx keeps logical ids.

    Non-finite logits: where the original device-asserts, a token with a NaN or infinite logit is
    not routed: every slot -1, weight 0, unmapped_topk_idx[t] -1 (unless fixed), its scores row
    NaN (unless masked out or random: 0). bias and image_bias must be finite (not checked on the
    GPU, which would cost a sync; the kernel stays in bounds but the result is then unspecified).

    scores (if given): the scoring function's values for the rows routed by score, and 0 for
    the rows masked out by mask or taken by force_random (api.md 1.12, as the original). Rows
    with fix_routing_mask keep their scores (the spec is silent; the original writes the row
    before it looks at fix_routing_mask, and a fixed row's weights come from those scores).

    Experts: up to 512 one warp per token (the fast kernel), 513 to 8192 one CTA per token.

    Args:
        logits: fp32 (T, num_routed), num_routed <= 8192, last dim contiguous (rows may be strided).
        num_topk: routed experts per token, <= num_routed, num_topk + shared slots <= 32.
        use_shared_as_routed, num_shared_experts: append num_shared_experts (0, 1, 2) slots.
        routed_scaling_factor: multiplies the routed weights. ep_rank: int in [0, 2^31)
            (else ValueError).
        mask, image_token_mask, fix_routing_mask, force_random: bool (T,).
        bias, image_bias: fp32 (num_routed,).
        unmapped_topk_idx: int64 (T, num_topk), last dim contiguous: the logical routed experts
            (written), or the routing to keep (read) for fix_routing_mask tokens.
        out: preallocated (topk_idx int64, topk_weights fp32), both contiguous (T, num_topk + shared).
        scores: fp32 (T, num_routed), last dim contiguous: receives the scores (above).
        num_groups, num_topk_groups: grouped routing (num_groups <= 32 divides num_routed into
            groups of >= 2; num_topk <= num_topk_groups * group size).

    Returns:
        (topk_idx int64 (T, num_topk + shared), topk_weights fp32 (T, num_topk + shared)). CPU
        tensors take the reference path (tilebake.torch.moe_topk_gate_forward_ref).
    """
    # The native path (moe/_plans_gate.py): NotImplemented sends the call on below. The key
    # holds each number's class (a bool where an int is checked must not match an int's plan)
    # and out's length (a plan reads the items it needs, the Python path wants exactly two).
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[
                logits.shape[1], scoring_func, num_topk, num_topk.__class__, use_shared_as_routed,
                use_shared_as_routed.__class__, num_shared_experts, num_shared_experts.__class__, routed_scaling_factor,
                routed_scaling_factor.__class__, ep_rank, ep_rank.__class__, num_groups, num_groups.__class__,
                num_topk_groups, num_topk_groups.__class__, mask is None, bias is None, image_bias is None,
                image_token_mask is None, fix_routing_mask is None, to_physical_map is None, logical_count is None,
                unmapped_topk_idx is None, force_random is None, scores is None, None if out is None else len(out),
            ]  # fmt: skip
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(
                call, logits, (mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map,
                logical_count, unmapped_topk_idx, force_random, scores), out,
            )  # fmt: skip
            if result is not NotImplemented:
                return result
    num_tokens, num_experts, k, shared = check_gate_args(
        logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func,
        mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count,
        unmapped_topk_idx, force_random, out, scores, num_groups, num_topk_groups,
    )  # fmt: skip
    if torch.compiler.is_compiling():
        idx, weights = torch.ops.tilebake.moe_topk_gate_forward(
            logits, num_topk, use_shared_as_routed, num_shared_experts, float(routed_scaling_factor), ep_rank,
            scoring_func, mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map,
            logical_count, unmapped_topk_idx, force_random, scores, num_groups, num_topk_groups,
        )  # fmt: skip
        if out is None:
            return idx, weights
        out[0].copy_(idx)
        out[1].copy_(weights)
        return out[0], out[1]
    return _forward(
        logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func,
        mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count,
        unmapped_topk_idx, force_random, out, scores, num_groups, num_topk_groups, num_tokens, num_experts, k, shared,
    )  # fmt: skip


def _forward(
    logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func, mask,
    bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx,
    force_random, out, scores, num_groups, num_topk_groups, num_tokens, num_experts, k, shared, kernels=None,
):  # fmt: skip
    """The eager path of checked arguments: the reference on the CPU, the Ascend kernel on an NPU,
    else the CUDA kernel. `kernels`:
    a stand-in for the kernel table (tests/moe/test_moe_topk_gate_forward_emulated.py)."""
    if kernels is None and logits.device.type == "npu":  # the Ascend kernel
        from tilebake.moe._moe_topk_gate_ascend import forward_npu

        return forward_npu(
            logits, k, shared, routed_scaling_factor, ep_rank, scoring_func, mask, bias, image_bias,
            image_token_mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx, force_random, out,
            scores, num_groups, num_topk_groups,
        )  # fmt: skip
    if kernels is None and not logits.is_cuda:
        from tilebake.torch.gate import moe_topk_gate_forward_ref

        return moe_topk_gate_forward_ref(
            logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank,
            scoring_func, mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map,
            logical_count, unmapped_topk_idx, force_random, out, scores,
            num_groups=num_groups, num_topk_groups=num_topk_groups,
        )  # fmt: skip
    width = k + shared
    if out is None:
        idx = logits.new_empty((num_tokens, width), dtype=torch.int64)
        weights = logits.new_empty((num_tokens, width), dtype=torch.float32)
    else:
        idx, weights = out
    if num_tokens == 0:
        return idx, weights
    dummy = logits.data_ptr()  # an absent tensor's pointer: never read or written (its flag is off)
    # Written out (not a loop over the options): this is the per-call host path.
    flags = FLAG_BIAS if bias is not None else 0
    if mask is not None:
        flags |= FLAG_MASK
    if image_bias is not None:
        flags |= FLAG_IMAGE
    if fix_routing_mask is not None:
        flags |= FLAG_FIX
    if to_physical_map is not None:
        flags |= FLAG_MAP
    if unmapped_topk_idx is not None:
        flags |= FLAG_UNMAPPED
    if force_random is not None:
        flags |= FLAG_RANDOM
    if scores is not None:
        flags |= FLAG_SCORES
    (_KERNELS if kernels is None else kernels)[(scoring_func, expert_bound(num_experts))](
        logits.get_device(),
        dummy,
        dummy if bias is None else bias.data_ptr(),
        dummy if image_bias is None else image_bias.data_ptr(),
        dummy if mask is None else mask.data_ptr(),
        dummy if image_token_mask is None else image_token_mask.data_ptr(),
        dummy if fix_routing_mask is None else fix_routing_mask.data_ptr(),
        dummy if force_random is None else force_random.data_ptr(),
        dummy if to_physical_map is None else to_physical_map.data_ptr(),
        dummy if logical_count is None else logical_count.data_ptr(),
        dummy if unmapped_topk_idx is None else unmapped_topk_idx.data_ptr(),
        idx.data_ptr(),
        weights.data_ptr(),
        dummy if scores is None else scores.data_ptr(),
        flags, float(routed_scaling_factor), ep_rank, num_groups, num_topk_groups, num_tokens, num_experts, k, width,
        1 if to_physical_map is None else to_physical_map.shape[1],
        logits.stride(0),
        0 if scores is None else scores.stride(0),
        0 if unmapped_topk_idx is None else unmapped_topk_idx.stride(0),
        0 if to_physical_map is None else to_physical_map.stride(0),
    )  # fmt: skip
    # Writes into given tensors count, as for torch's out= ops.
    written = [t for t in (unmapped_topk_idx, scores) if t is not None] + ([] if out is None else [idx, weights])
    if written:
        torch.autograd.graph.increment_version(written)
    if kernels is None:
        optional = (mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count,
                    unmapped_topk_idx, force_random, scores)  # fmt: skip
        plan_key = (
            num_experts, scoring_func, num_topk, num_topk.__class__, use_shared_as_routed,
            use_shared_as_routed.__class__, num_shared_experts, num_shared_experts.__class__, routed_scaling_factor,
            routed_scaling_factor.__class__, ep_rank, ep_rank.__class__, num_groups, num_groups.__class__,
            num_topk_groups, num_topk_groups.__class__, *(t is None for t in optional), None if out is None else 2,
        )  # fmt: skip
        if plan_key not in _PLANS:
            _build_plan(plan_key, logits.get_device(), optional, k, shared, out is not None)
    return idx, weights


_PLANS = plan.cache()


def _build_plan(plan_key, device, optional, k, shared, given_out) -> None:
    from tilebake.moe._plans_gate import FORWARD_OPTIONAL, forward_plan

    num_experts, scoring_func = plan_key[:2]
    rsf, ep_rank, num_groups, num_topk_groups = plan_key[8], plan_key[10], plan_key[12], plan_key[14]
    present = {name for (name, _), t in zip(FORWARD_OPTIONAL, optional) if t is not None}
    plan.remember(
        _PLANS, plan_key,
        forward_plan, _KERNELS[(scoring_func, expert_bound(num_experts))], device, num_experts, k, shared,
        float(rsf), ep_rank, num_groups, num_topk_groups, present, given_out,
    )  # fmt: skip


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it. Functional
# outputs (an `out` pair is filled by traced copies); unmapped_topk_idx and scores are mutated.


def _op_impl(logits, num_topk, use_shared, num_shared, rsf, ep_rank, func, *tensors_and_groups):
    *tensors, scores, num_groups, num_topk_groups = tensors_and_groups
    num_tokens, num_experts = logits.shape
    shared = num_shared if use_shared else 0
    return _forward(
        logits, num_topk, use_shared, num_shared, rsf, ep_rank, func, *tensors, None, scores, num_groups,
        num_topk_groups, num_tokens, num_experts, num_topk, shared,
    )  # fmt: skip


def _meta(logits, num_topk, use_shared, num_shared, *rest):
    width = num_topk + (num_shared if use_shared else 0)
    return (
        logits.new_empty((logits.shape[0], width), dtype=torch.int64),
        logits.new_empty((logits.shape[0], width), dtype=torch.float32),
    )


# Meta kernels rather than register_fake: free at import (see quant/per_token_cast.py).
register(
    "moe_topk_gate_forward(Tensor logits, int num_topk, bool use_shared_as_routed, int num_shared_experts,"
    " float routed_scaling_factor, int ep_rank, str scoring_func, Tensor? mask, Tensor? bias, Tensor? image_bias,"
    " Tensor? image_token_mask, Tensor? fix_routing_mask, Tensor? to_physical_map, Tensor? logical_count,"
    " Tensor(a!)? unmapped_topk_idx, Tensor? force_random, Tensor(b!)? scores, int num_groups, int num_topk_groups)"
    " -> (Tensor, Tensor)",
    _op_impl,
    _meta,
)


def moe_topk_gate(*args, **kwargs):
    """Compatibility entry point: the original forward name; see moe_topk_gate_forward."""
    return moe_topk_gate_forward(*args, **kwargs)
