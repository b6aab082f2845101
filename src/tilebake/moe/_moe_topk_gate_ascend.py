"""moe_topk_gate_forward and _backward on NPU tensors: the Ascend 950 kernels (every scoring
function, option and expert count up to MAX_EXPERTS). The forward has the semantics of
tilebake.torch.gate.moe_topk_gate_forward_ref (the same indices; weights and scores within the
math functions' last bits), the backward the CUDA kernels' fp32 arithmetic (within rtol 1e-5 +
1e-5 * max|grad| of the float64 reference). Never run on an NPU here: the kernels are run on the
CPU by tests/ascend/test_emulated_gate.py, their launches checked against a stand-in
libascendcl (tests/ascend/)."""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.moe._router import MAX_EXPERTS
from tilebake.moe.moe_topk_gate_backward import SCORING_CODES as BACKWARD_SCORING_CODES
from tilebake.moe.moe_topk_gate_backward import MoeTopkGateBackwardAscendVariant
from tilebake.moe.moe_topk_gate_forward import (
    FLAG_BIAS,
    FLAG_FIX,
    FLAG_IMAGE,
    FLAG_MAP,
    FLAG_MASK,
    FLAG_RANDOM,
    FLAG_SCORES,
    FLAG_UNMAPPED,
    SCORING_CODES,
    MoeTopkGateForwardAscendVariant,
)

_FORWARD = ascend.AscendKernelTable(MoeTopkGateForwardAscendVariant)
_BACKWARD = ascend.AscendKernelTable(MoeTopkGateBackwardAscendVariant)


def forward_npu(logits, k, shared, rsf, ep_rank, func, mask, bias, image_bias, image_token_mask, fix_routing_mask,
                to_physical_map, logical_count, unmapped_topk_idx, force_random, out, scores, num_groups,
                num_topk_groups):  # fmt: skip
    """(topk_idx, topk_weights) of checked NPU arguments (moe_topk_gate_forward's), written into
    `out` if given."""
    num_tokens, num_experts = logits.shape
    width = k + shared
    if out is None:
        idx = logits.new_empty((num_tokens, width), dtype=torch.int64)
        weights = logits.new_empty((num_tokens, width), dtype=torch.float32)
    else:
        idx, weights = out
    if num_tokens == 0:
        return idx, weights
    optional = (
        (bias, FLAG_BIAS), (image_bias, FLAG_IMAGE), (mask, FLAG_MASK), (image_token_mask, 0),
        (fix_routing_mask, FLAG_FIX), (force_random, FLAG_RANDOM), (to_physical_map, FLAG_MAP), (logical_count, 0),
        (unmapped_topk_idx, FLAG_UNMAPPED),
    )  # fmt: skip
    flags = sum(bit for t, bit in optional if t is not None) | (FLAG_SCORES if scores is not None else 0)
    dummy = logits.data_ptr()  # an absent tensor's pointer: never read or written (its flag is off)
    pointers = [dummy if t is None else t.data_ptr() for t, _ in optional]
    index, kernel = _FORWARD.on(logits, MAX_EXPERTS)
    kernel(
        index, logits.data_ptr(), *pointers, idx.data_ptr(), weights.data_ptr(),
        dummy if scores is None else scores.data_ptr(),
        flags, float(rsf), ep_rank, num_groups, num_topk_groups, num_tokens, num_experts, k, width,
        1 if to_physical_map is None else to_physical_map.shape[1], logits.stride(0),
        0 if scores is None else scores.stride(0), 0 if unmapped_topk_idx is None else unmapped_topk_idx.stride(0),
        0 if to_physical_map is None else to_physical_map.stride(0), SCORING_CODES[func],
    )  # fmt: skip
    written = [t for t in (unmapped_topk_idx, scores) if t is not None] + ([] if out is None else [idx, weights])
    if written:
        torch.autograd.graph.increment_version(written)
    return idx, weights


def backward_npu(scores, topk_idx, topk_weights, grad_topk_weights, rsf, func, mask, grad_scores_sum, out):
    """grad_logits of checked NPU arguments (moe_topk_gate_backward's), into `out` if given."""
    num_tokens, num_experts = scores.shape
    grad_logits = scores.new_empty((num_tokens, num_experts)) if out is None else out
    if num_tokens == 0:
        return grad_logits
    num_seqs = grad_scores_sum.shape[0] if grad_scores_sum is not None else 1
    h = grad_scores_sum if grad_scores_sum is not None else scores  # an absent tensor: never read
    index, kernel = _BACKWARD.on(scores, MAX_EXPERTS)
    kernel(
        index, scores.data_ptr(), topk_idx.data_ptr(), topk_weights.data_ptr(), grad_topk_weights.data_ptr(),
        (mask if mask is not None else scores).data_ptr(), h.data_ptr(), grad_logits.data_ptr(), float(rsf),
        BACKWARD_SCORING_CODES[func], int(mask is not None), int(grad_scores_sum is not None), num_tokens // num_seqs,
        num_tokens, num_experts, topk_idx.shape[1], num_seqs, scores.stride(0), topk_idx.stride(0),
        topk_weights.stride(0), grad_topk_weights.stride(0), h.stride(0), grad_logits.stride(0),
    )  # fmt: skip
    if out is not None:
        torch.autograd.graph.increment_version(out)
    return grad_logits
