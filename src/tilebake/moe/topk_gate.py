"""topk_gate: the indices of each token's num_topk largest expert scores.

Validate, allocate, launch. The kernels are kernels_tl/moe/topk_gate.py (a warp per token up to
1024 experts, a CTA of 256 threads per token beyond); the reference (and the CPU path) is
tilebake.torch.stable_topk.
"""

from __future__ import annotations

import dataclasses

import torch

from tilebake._checks import check_device
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr

MAX_TOPK = 32
# Experts a row may have, by variant. Up to 1024 (the fast variants) a token's warp holds the row,
# max_experts / 32 scores a lane; the last (the general variant) spreads it over a CTA of
# BLOCK_THREADS threads, max_experts / BLOCK_THREADS scores each.
MAX_EXPERTS = (256, 512, 1024, 8192)
BLOCK_THREADS = 256


@dataclasses.dataclass(frozen=True)
class TopkGateVariant(Variant):
    family = "moe"
    op = "topk_gate"
    PARAMS = ptr("S", "Out") + i32("num_tokens", "num_experts", "num_topk", "scores_stride")

    max_experts: int  # the bucket: the smallest of MAX_EXPERTS >= num_experts runs

    @classmethod
    def all(cls):
        return tuple(cls(m) for m in MAX_EXPERTS)


@dataclasses.dataclass(frozen=True)
class TopkGateAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/moe/topk_gate.py): any expert count up to
    max(MAX_EXPERTS), a row with a non-finite score gives -1s (as the CUDA kernels)."""

    family = "moe"
    op = "topk_gate"
    backend = "ascend"
    PARAMS = ptr("S", "Out") + i32("num_tokens", "num_experts", "num_topk", "scores_stride")

    max_experts: int
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(MAX_EXPERTS[-1], cores) for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(TopkGateVariant)


def check_fp32_rows(t, name: str, columns: str, max_columns: int) -> tuple[int, int]:
    """fp32 (num_tokens, <columns>) on a CUDA device, an NPU or the CPU, last dim contiguous, with
    1 <= shape[1] <= max_columns."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be torch.float32, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (num_tokens, {columns}), got shape {tuple(t.shape)}")
    num_tokens, num_columns = t.shape
    if not 1 <= num_columns <= max_columns:
        raise ValueError(f"{name}.shape[1] ({columns}) must be in [1, {max_columns}], got {num_columns}")
    check_device(t, name)
    if num_columns > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")
    return num_tokens, num_columns


def check_scores(scores, name: str = "scores") -> tuple[int, int]:
    """fp32 (T, E) on a CUDA device, an NPU or the CPU, last dim contiguous; 1 <= E <= max(MAX_EXPERTS)."""
    return check_fp32_rows(scores, name, "num_experts", MAX_EXPERTS[-1])


def experts_bucket(num_experts: int) -> int:
    return next(m for m in MAX_EXPERTS if num_experts <= m)


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Top-k expert indices: for each row of `scores`, the indices of its num_topk largest
    values in descending order of value; equal values go to the smaller index first.

    Args:
        scores: fp32 (num_tokens, num_experts), 1 <= num_experts <= 8192; last dim contiguous,
            any row stride.
        num_topk: int, 1 <= num_topk <= min(num_experts, 32).

    Returns:
        int64 (num_tokens, num_topk), contiguous.

    Cost on a GPU: up to 1024 experts a warp per token (k rounds of warp shuffles); from 1025 to
    8192 a CTA of 256 threads per token, whose k rounds each add a __syncthreads and an 8-way
    merge in shared memory to the warp step (the scores are read once either way). The general
    kernel is bound by those rounds, not by the bytes: on an H200 at 4096 tokens and k = 8 it
    took 113 us at 1025 experts and 120 us at 8192, where 1024 experts (the fast kernel) took 23.

    Non-finite scores: on a GPU (and an NPU), a row holding a NaN or an infinity gets -1 in every
    output column (no device assert, no host sync; the other rows are unaffected). On the CPU (the
    reference path, tilebake.torch.stable_topk) such input raises ValueError.
    """
    # The native path: a call whose key has been seen runs as one plan (moe/_plans_gate.py);
    # a call the plan does not take (NotImplemented) goes on below.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[scores.shape[1], num_topk, num_topk.__class__]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, scores)
            if result is not NotImplemented:
                return result
    num_tokens, num_experts = check_scores(scores)
    if isinstance(num_topk, bool) or not isinstance(num_topk, int) or not 1 <= num_topk <= min(num_experts, MAX_TOPK):
        raise ValueError(
            f"num_topk must be an int in [1, min(num_experts={num_experts}, {MAX_TOPK})], got {num_topk!r}"
        )
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.topk_gate(scores, num_topk)
    return _topk_gate(scores, num_topk)


def _topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    if scores.device.type == "npu":  # the Ascend kernel
        from tilebake.moe._topk_gate_ascend import topk_gate_npu

        return topk_gate_npu(scores, num_topk)
    if not scores.is_cuda:
        from tilebake.torch import stable_topk

        return stable_topk(scores, num_topk)
    out = _launch(scores, num_topk)
    plan_key = (scores.shape[1], num_topk, num_topk.__class__)
    if plan_key not in _PLANS and scores.shape[0]:
        from tilebake.moe._plans_gate import topk_gate_plan

        kernel = _KERNELS[(experts_bucket(scores.shape[1]),)]
        plan.remember(_PLANS, plan_key, topk_gate_plan, kernel, scores.get_device(), *plan_key[:2])
    return out


_PLANS = plan.cache()


def _launch(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """The kernel path of checked arguments (the tests also run it on CPU tensors through
    build_tools/block_emu.py kernels put in _KERNELS)."""
    num_tokens, num_experts = scores.shape
    out = scores.new_empty((num_tokens, num_topk), dtype=torch.int64)
    if num_tokens == 0:
        return out
    _KERNELS[(experts_bucket(num_experts),)](
        scores.get_device(), scores.data_ptr(), out.data_ptr(), num_tokens, num_experts, num_topk, scores.stride(0)
    )
    return out


# --- torch.library: lets torch.compile(fullgraph=True) trace topk_gate; eager calls skip it ---


def _meta(scores, num_topk):
    return scores.new_empty((scores.shape[0], num_topk), dtype=torch.int64)


register(
    "topk_gate(Tensor scores, int num_topk) -> Tensor",
    _topk_gate,
    _meta,
)
