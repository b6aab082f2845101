"""moe_topk_gate_backward: the gradient of moe_topk_gate_forward's routing weights (and of the
optional sequence-level aux loss on the normalised scores) w.r.t. the router logits.

Validate, allocate, launch. The kernels are kernels_tl/moe/moe_topk_gate_backward.py (a warp per
token up to 1024 experts, a CTA of 256 threads per token beyond); the reference (and the CPU
path) is tilebake.torch.moe.moe_topk_gate_backward_ref, which computes in float64.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.moe.topk_gate import MAX_TOPK, check_scores

# Experts a row may have, by variant. Up to 1024 (the fast variants) a token's warp holds the row,
# max_experts / 32 a lane; the last (the general variant) spreads it over a CTA of BLOCK_THREADS.
MAX_EXPERTS = (256, 1024, 8192)
BLOCK_THREADS = 256
# The kernel's `scoring` argument.
SCORING_CODES = {"sqrtsoftplus": 0, "sigmoid": 1, "softmax": 2}


@dataclasses.dataclass(frozen=True)
class MoeTopkGateBackwardVariant(Variant):
    family = "moe"
    op = "moe_topk_gate_backward"
    PARAMS = (
        ptr("U", "IDX", "TW", "G", "MASK", "H", "DX")
        + f32("routed_scaling_factor")
        + i32(
            "scoring", "has_mask", "has_aux", "tokens_per_seq", "num_tokens", "num_experts", "num_topk", "num_seqs",
            "scores_stride", "idx_stride", "w_stride", "g_stride", "h_stride", "out_stride"
        )
    )  # fmt: skip

    max_experts: int  # the bucket: the smallest of MAX_EXPERTS >= num_experts runs

    @classmethod
    def all(cls):
        return tuple(cls(m) for m in MAX_EXPERTS)


@dataclasses.dataclass(frozen=True)
class MoeTopkGateBackwardAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/moe/moe_topk_gate_backward.py): every scoring
    function and option at run time, up to max_experts experts."""

    family = "moe"
    op = "moe_topk_gate_backward"
    backend = "ascend"
    PARAMS = MoeTopkGateBackwardVariant.PARAMS

    max_experts: int
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(MAX_EXPERTS[-1], cores) for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(MoeTopkGateBackwardVariant)


def _check_rows(t, name: str, shape: tuple[int, int], dtype: torch.dtype, like: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device} (as scores), got {t.device}")
    if shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_arguments(
    scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask, grad_scores_sum, out
) -> tuple[int, float]:
    """Every argument check of moe_topk_gate_backward (also the reference's); returns
    (num_seqs (0 without grad_scores_sum), routed_scaling_factor as a float)."""
    if scoring_func not in SCORING_CODES:
        raise NotImplementedError(f"scoring_func must be one of {tuple(SCORING_CODES)}, got {scoring_func!r}")
    num_tokens, num_experts = check_scores(scores)
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2:
        got = tuple(topk_idx.shape) if isinstance(topk_idx, torch.Tensor) else type(topk_idx).__name__
        raise ValueError(f"topk_idx must be a 2-D (num_tokens, num_topk) tensor, got {got}")
    num_topk = topk_idx.shape[1]
    if not 1 <= num_topk <= min(num_experts, MAX_TOPK):
        raise ValueError(
            f"topk_idx.shape[1] (num_topk) must be in [1, min(num_experts={num_experts}, {MAX_TOPK})], got {num_topk}"
        )
    _check_rows(topk_idx, "topk_idx", (num_tokens, num_topk), torch.int64, scores)
    _check_rows(topk_weights, "topk_weights", (num_tokens, num_topk), torch.float32, scores)
    _check_rows(grad_topk_weights, "grad_topk_weights", (num_tokens, num_topk), torch.float32, scores)
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)):
        raise TypeError(f"routed_scaling_factor must be a float, got {type(routed_scaling_factor).__name__}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be torch.bool, got {mask.dtype}")
        if tuple(mask.shape) != (num_tokens,):
            raise ValueError(f"mask must have shape ({num_tokens},) (num_tokens), got {tuple(mask.shape)}")
        if mask.device != scores.device:
            raise ValueError(f"mask must be on {scores.device} (as scores), got {mask.device}")
        if num_tokens > 1 and mask.stride(0) != 1:
            raise ValueError(f"mask must be contiguous, got stride {mask.stride()}")
    num_seqs = 0
    if grad_scores_sum is not None:
        if mask is None:
            raise ValueError(
                "grad_scores_sum needs mask (which tokens the aux loss counts), as in the original; got mask=None"
            )
        if not isinstance(grad_scores_sum, torch.Tensor) or grad_scores_sum.dim() != 2:
            got = tuple(grad_scores_sum.shape) if isinstance(grad_scores_sum, torch.Tensor) else type(grad_scores_sum)
            raise ValueError(f"grad_scores_sum must be a 2-D (num_seqs, num_experts) tensor, got {got}")
        num_seqs = grad_scores_sum.shape[0]
        if num_seqs < 1 or num_tokens % num_seqs:
            raise ValueError(
                f"grad_scores_sum.shape[0] (num_seqs) must be >= 1 and divide num_tokens={num_tokens}, got {num_seqs}"
            )
        _check_rows(grad_scores_sum, "grad_scores_sum", (num_seqs, num_experts), torch.float32, scores)
    if out is not None:
        _check_rows(out, "out", (num_tokens, num_experts), torch.float32, scores)
    return num_seqs, float(routed_scaling_factor)


def moe_topk_gate_backward(
    scores: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    grad_topk_weights: torch.Tensor,
    routed_scaling_factor: float,
    scoring_func: str = "sqrtsoftplus",
    mask: Optional[torch.Tensor] = None,
    grad_scores_sum: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The gradient w.r.t. the router logits of moe_topk_gate_forward's routing weights
    w_j = routed_scaling_factor * u[idx_j] / (1e-20 + sum_j u[idx_j]) (u = scores; the
    selection itself is not differentiated, and a selection bias only affects the selection),
    plus, with grad_scores_sum, the aux-loss term: the gradient of the per-sequence sums of
    the normalised scores u / sum_e(u) over the tokens with mask True.

    Args:
        scores: fp32 (num_tokens, num_experts) = the forward's `scores` output, u =
            score(logits) (1 <= num_experts <= 8192); last dim contiguous, any row stride.
        topk_idx: int64 (num_tokens, num_topk), num_topk <= min(num_experts, 32): logical
            expert indices; -1 (any index outside [0, num_experts) on a GPU) marks a masked
            slot, which contributes nothing. Duplicate indices add up.
        topk_weights: fp32 (num_tokens, num_topk), the forward's routing weights.
        grad_topk_weights: fp32 (num_tokens, num_topk), their gradient.
        routed_scaling_factor: the forward's factor.
        scoring_func: how the forward made u from the logits: 'sqrtsoftplus' (the original's
            only one), 'sigmoid' or 'softmax' (over the experts); its derivative is recovered
            from u.
        mask: optional bool (num_tokens,): False = a padding token, whose gradient row is
            exactly zero (the original only accepts it together with grad_scores_sum).
        grad_scores_sum: optional fp32 (num_seqs, num_experts), the gradient of the
            per-sequence sums of u / sum(u); num_seqs divides num_tokens, a sequence's tokens
            are contiguous. Needs mask (as in the original).
        out: optional fp32 (num_tokens, num_experts) for the result (any row stride).

    Returns:
        grad_logits, fp32 (num_tokens, num_experts). CPU tensors take the float64 reference
        (which raises ValueError for an index outside [-1, num_experts)). On a GPU the fp32
        result is within rtol 1e-5 + 1e-5 * max|grad| of the float64 value, plus 1e-6 of
        (routed_scaling_factor * max|grad_weights| + max|grad_scores_sum|) where its terms cancel
        (a token whose only selected expert's weight is then constant: a gradient of ~0).

    Cost on a GPU: the row is read and written once. Up to 1024 experts a warp per token;
    from 1025 to 8192 a CTA of 256 threads per token, which adds two __syncthreads (the route
    row in shared memory) and one per row sum (two with grad_scores_sum, one for softmax). On
    an H200 at 4096 tokens, k = 8, with grad_scores_sum: 40 us at 1024 experts (fast), 125 us
    at 1025 and 299 us at 8192 (900 GB/s).
    """
    # The native path (moe/_plans_gate.py): NotImplemented sends the call on below.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[scores.shape[1], routed_scaling_factor, routed_scaling_factor.__class__, scoring_func,
                          mask is None, grad_scores_sum is None, out is None]  # fmt: skip
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum, out)
            if result is not NotImplemented:
                return result
    _, scaling = check_arguments(
        scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask,
        grad_scores_sum, out,
    )  # fmt: skip
    if torch.compiler.is_compiling():
        result = torch.ops.tilebake.moe_topk_gate_backward(
            scores, topk_idx, topk_weights, grad_topk_weights, scaling, scoring_func, mask, grad_scores_sum,
        )  # fmt: skip
        return result if out is None else out.copy_(result)
    result = _backward(
        scores, topk_idx, topk_weights, grad_topk_weights, scaling, scoring_func, mask, grad_scores_sum, out,
    )  # fmt: skip
    plan_key = (scores.shape[1], routed_scaling_factor, routed_scaling_factor.__class__, scoring_func,
                mask is None, grad_scores_sum is None, out is None)  # fmt: skip
    if scores.is_cuda and scores.shape[0] and plan_key not in _PLANS:
        from tilebake.moe._plans_gate import backward_plan

        num_experts = scores.shape[1]
        kernel = _KERNELS[(next(m for m in MAX_EXPERTS if num_experts <= m),)]
        plan.remember(
            _PLANS, plan_key,
            backward_plan, kernel, scores.get_device(), num_experts, scaling, SCORING_CODES[scoring_func],
            mask is not None, grad_scores_sum is not None, out is not None,
        )  # fmt: skip
    return result


_PLANS = plan.cache()


def _backward(
    scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask, grad_scores_sum, out
):
    """grad_logits of checked arguments (into `out` if given): the reference on the CPU, the
    Ascend kernel on an NPU, else the CUDA kernel."""
    if scores.device.type == "npu":
        from tilebake.moe._moe_topk_gate_ascend import backward_npu

        return backward_npu(
            scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask,
            grad_scores_sum, out,
        )  # fmt: skip
    if not scores.is_cuda:
        from tilebake.torch.moe import moe_topk_gate_backward_ref

        result = moe_topk_gate_backward_ref(
            scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask,
            grad_scores_sum,
        )  # fmt: skip
        return result if out is None else out.copy_(result)
    return _launch(
        scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask, grad_scores_sum,
        out,
    )  # fmt: skip


def _launch(
    scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask, grad_scores_sum, out
):
    """The kernel path of checked arguments (the tests also run it on CPU tensors through
    build_tools/block_emu.py kernels put in _KERNELS)."""
    num_tokens, num_experts = scores.shape
    num_topk = topk_idx.shape[1]
    num_seqs = grad_scores_sum.shape[0] if grad_scores_sum is not None else 1
    grad_logits = scores.new_empty((num_tokens, num_experts)) if out is None else out
    if num_tokens == 0:
        return grad_logits
    bucket = next(m for m in MAX_EXPERTS if num_experts <= m)
    h = grad_scores_sum if grad_scores_sum is not None else scores  # a valid dummy pointer
    _KERNELS[(bucket,)](
        scores.get_device(),
        scores.data_ptr(), topk_idx.data_ptr(), topk_weights.data_ptr(), grad_topk_weights.data_ptr(),
        (mask if mask is not None else scores).data_ptr(), h.data_ptr(), grad_logits.data_ptr(),
        routed_scaling_factor, SCORING_CODES[scoring_func], int(mask is not None), int(grad_scores_sum is not None),
        num_tokens // num_seqs, num_tokens, num_experts, num_topk, num_seqs,
        scores.stride(0), topk_idx.stride(0), topk_weights.stride(0), grad_topk_weights.stride(0), h.stride(0),
        grad_logits.stride(0),
    )  # fmt: skip
    if out is not None:  # a write into a given tensor counts, as for torch's out= ops
        torch.autograd.graph.increment_version(out)
    return grad_logits


# --- torch.library: lets torch.compile(fullgraph=True) trace moe_topk_gate_backward; eager calls
# skip it. Functional: writing into a caller's `out` stays in Python (a traced copy_).


def _op_impl(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask, h):
    return _backward(
        scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask, h, None
    )


def _meta(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask, h):
    return scores.new_empty(scores.shape)


register(
    "moe_topk_gate_backward(Tensor scores, Tensor topk_idx, Tensor topk_weights, Tensor grad_topk_weights,"
    " float routed_scaling_factor, str scoring_func, Tensor? mask, Tensor? grad_scores_sum) -> Tensor",
    _op_impl,
    _meta,
)
