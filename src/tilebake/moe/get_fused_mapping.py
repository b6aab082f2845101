"""get_fused_mapping (TileKernels 1.0, api.md 1.11): the token-topk <-> expert-major mappings.

Validate, allocate, launch. Kernels: kernels_tl/moe/get_fused_mapping.py (three launches: count,
scan, scatter); reference and CPU path: tilebake.torch.mapping.get_fused_mapping.
"""

from __future__ import annotations

import dataclasses

import torch

from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.moe._common import check_mapping_args, mapping_result, mapping_size
from tilebake.utils import ceil_div

# Up to FAST_MAX_EXPERTS the per-warp counters of count and scatter live in shared memory (WARPS x
# FAST_MAX_EXPERTS int32); beyond, the wide stages keep them in global memory (the count / offset
# rows of the work buffer) and only the aligned starts (MAX_EXPERTS int32) in shared memory.
FAST_MAX_EXPERTS = 1024
MAX_EXPERTS = 8192
WARPS = 8  # warps a CTA in count and scatter; one warp per segment
SEGMENT_UNROLL = 8  # topk_idx loads a lane issues at once; segment steps are a multiple of it
SCAN_THREADS = 1024
SCAN_UNROLL = 4
MAX_SEGMENTS = 256  # the scan walks at most MAX_SEGMENTS / 32 segments a thread
# The work buffer holds 2 x segments x experts int32: beyond FAST_MAX_EXPERTS fewer (longer)
# segments keep it at the size the fast stages reach (MAX_SEGMENTS x FAST_MAX_EXPERTS a matrix).
MAX_WORK = MAX_SEGMENTS * FAST_MAX_EXPERTS


@dataclasses.dataclass(frozen=True)
class GetFusedMappingVariant(Variant):
    family = "moe"
    op = "get_fused_mapping"

    # 'count' | 'scan' | 'scatter': the three kernels, launched in this order; 'count_wide' and
    # 'scatter_wide' replace count and scatter beyond FAST_MAX_EXPERTS experts.
    stage: str

    @classmethod
    def all(cls):
        return tuple(cls(s) for s in ("count", "scan", "scatter", "count_wide", "scatter_wide"))

    def params(self):
        return _STAGE_PARAMS[self.stage.split("_")[0]]


_STAGE_PARAMS = {
    "count": ptr("topk_idx", "counts", "pos_to_expert", "pos_to_token", "pos_to_token_topk")
    + i32("seg_steps", "numel", "num_experts", "num_segments", "num_expanded"),
    "scan": ptr("counts", "offsets", "totals") + i32("num_experts", "num_segments"),
    "scatter": ptr(
        "topk_idx", "offsets", "totals", "pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos",
        "expert_start", "expert_end", "num_tokens_per_expert",
    )
    + i32("num_topk", "alignment", "seg_steps", "numel", "num_experts", "num_segments", "num_expanded"),
}  # fmt: skip


_KERNELS = KernelTable(GetFusedMappingVariant)


def segment_steps(numel: int, num_experts: int) -> int:
    """32-entry steps per warp segment: at least SEGMENT_UNROLL, and few enough segments
    (<= MAX_SEGMENTS, and <= MAX_WORK / num_experts) that the scan stays short."""
    max_segments = min(MAX_SEGMENTS, max(1, MAX_WORK // num_experts))
    steps = max(SEGMENT_UNROLL, ceil_div(numel, 32 * max_segments))
    return ceil_div(steps, SEGMENT_UNROLL) * SEGMENT_UNROLL


def get_fused_mapping(
    topk_idx: torch.Tensor,
    num_experts: int,
    num_expanded_tokens: int,
    alignment: int,
    force_no_sync: bool = False,
):
    """Mappings between (token, slot) pairs and the expert-major fused layout, where expert e's
    pairs fill rows [expert_start[e], expert_start[e] + count) in ascending flat index
    token * k + slot (deterministic, independent of the GPU), padded with rows of no token to
    expert_end[e] = expert_start[e] + align(count, alignment).

    Args:
        topk_idx: int64 (T, k), contiguous. -1 drops the slot; so does any other value outside
            [0, num_experts) (the original assumed there were none).
        num_experts: E, 1 <= E <= 8192.
        num_expanded_tokens: rows N of the layout. 0: the upper bound T * k + (alignment - 1) * E
            rounded down to a multiple of alignment, and unless force_no_sync the per-expert row
            counts are copied to the host (one device sync) and the pos_* outputs trimmed to the
            rows in use. A pair whose row would be >= N is dropped (token_topk_to_pos -1).
        alignment: each expert's row count is padded to a multiple of it (>= 1; a runtime value).
        force_no_sync: with num_expanded_tokens == 0, keep the upper bound and skip the sync (the
            original then produced zero-row outputs).

    Returns:
        (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
        num_tokens_per_expert, num_tokens_per_expert_list): int32 pos_* (N,) giving each row's
        expert, token and token * k + slot, -1 on padding rows; token_topk_to_pos (T, k), -1 for a
        dropped slot; expert_start, expert_end, num_tokens_per_expert (E,) (the aligned row count,
        expert_end - expert_start); the list is num_tokens_per_expert.tolist() after the sync, else [].
        CPU tensors take the reference path (tilebake.torch.get_fused_mapping, same values).

    Cost on a GPU: three launches (count, scan, scatter) over segments of topk_idx, plus a
    segments x E count matrix. Up to 1024 experts each warp's counters are in shared memory;
    from 1025 to 8192 they are in global memory (one more L2 round trip per 32 entries in the
    scatter, global atomics in the count) and segments are longer (at most 2^18 / E of them).
    On an H200 at 4096 tokens, k = 8 (no sync): 52 us at 1024 and at 1025 experts, 143 us at 8192.
    """
    # The native path (moe/_plans_mapping.py): the launches in one plan; the synchronising mode
    # then copies the counts to the host here. NotImplemented sends the call on below. The key
    # holds each int's class: a bool (rejected below) must not match an int's plan.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[num_experts, num_experts.__class__, num_expanded_tokens, num_expanded_tokens.__class__,
                          alignment, alignment.__class__, force_no_sync]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, topk_idx)
            if result is not NotImplemented:
                if num_expanded_tokens or force_no_sync:
                    return (*result, [])
                return mapping_result(*result, True)
    num_tokens, num_topk = check_mapping_args(topk_idx, num_experts, num_expanded_tokens, alignment)
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"num_experts must be at most {MAX_EXPERTS}, got {num_experts}")
    if not topk_idx.is_cuda:
        from tilebake.torch.mapping import get_fused_mapping as reference

        return reference(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)
    result = _launch(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)
    plan_key = (num_experts, num_experts.__class__, num_expanded_tokens, num_expanded_tokens.__class__, alignment,
                alignment.__class__, force_no_sync)  # fmt: skip
    if num_tokens * num_topk and isinstance(force_no_sync, bool) and plan_key not in _PLANS:
        from tilebake.moe._plans_mapping import fused_mapping_plan

        wide = "_wide" if num_experts > FAST_MAX_EXPERTS else ""
        kernels = (_KERNELS["count" + wide,], _KERNELS["scan",], _KERNELS["scatter" + wide,])
        plan.remember(
            _PLANS, plan_key,
            fused_mapping_plan, kernels, topk_idx.get_device(), num_experts, num_expanded_tokens, alignment
        )
    return result


_PLANS = plan.cache()


def _launch(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync):
    """The kernel path of checked arguments (the tests also run it on CPU tensors through
    build_tools/block_emu.py kernels put in the tables)."""
    num_tokens, num_topk = topk_idx.shape
    should_sync = num_expanded_tokens == 0 and not force_no_sync
    if num_expanded_tokens == 0:
        num_expanded_tokens = mapping_size(num_tokens, num_topk, num_experts, alignment)
    numel = num_tokens * num_topk
    if numel >= 2**31:
        raise ValueError(f"topk_idx must have fewer than 2^31 entries, got {numel}")
    new = topk_idx.new_empty
    pos_to_expert = new((num_expanded_tokens,), dtype=torch.int32)
    pos_to_token = new((num_expanded_tokens,), dtype=torch.int32)
    pos_to_token_topk = new((num_expanded_tokens,), dtype=torch.int32)
    token_topk_to_pos = new((num_tokens, num_topk), dtype=torch.int32)
    bounds = new((3, num_experts), dtype=torch.int32)
    expert_start, expert_end, num_tokens_per_expert = bounds[0], bounds[1], bounds[2]

    if numel == 0:
        for t in (pos_to_expert, pos_to_token, pos_to_token_topk):
            t.fill_(-1)
        bounds.zero_()
    else:
        device = topk_idx.get_device()
        steps = segment_steps(numel, num_experts)
        wide = "_wide" if num_experts > FAST_MAX_EXPERTS else ""
        num_segments = ceil_div(numel, 32 * steps)
        work = new((2 * num_segments + 1, num_experts), dtype=torch.int32)
        counts, offsets, totals = work[:num_segments], work[num_segments : 2 * num_segments], work[-1]
        idx, p2e = topk_idx.data_ptr(), pos_to_expert.data_ptr()
        p2t, p2tt = pos_to_token.data_ptr(), pos_to_token_topk.data_ptr()
        _KERNELS["count" + wide,](
            device, idx, counts.data_ptr(), p2e, p2t, p2tt, steps, numel, num_experts, num_segments,
            num_expanded_tokens,
        )  # fmt: skip
        _KERNELS["scan",](device, counts.data_ptr(), offsets.data_ptr(), totals.data_ptr(), num_experts, num_segments)
        _KERNELS["scatter" + wide,](
            device, idx, offsets.data_ptr(), totals.data_ptr(), p2e, p2t, p2tt, token_topk_to_pos.data_ptr(),
            expert_start.data_ptr(), expert_end.data_ptr(), num_tokens_per_expert.data_ptr(), num_topk, alignment,
            steps, numel, num_experts, num_segments, num_expanded_tokens,
        )  # fmt: skip

    return mapping_result(
        pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
        num_tokens_per_expert, should_sync,
    )  # fmt: skip
