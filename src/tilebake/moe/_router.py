"""The router's limits and argument checks (moe_topk_gate_forward): shared by the op and its
reference, tilebake.torch.gate. Only torch is imported, so the GPU path does not load
tilebake.torch."""

from __future__ import annotations

import math

import torch

SCORING_FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")
MAX_EXPERTS = 8192  # routed experts (logits columns); the widest kernel's bound
MAX_SLOTS = 32  # num_topk + shared slots
MAX_GROUPS = 32
DRAWS_PER_SLOT = 64  # force_random: hashed draws per slot before the smallest free expert
PHYSICAL_STRIDE = 23333  # the duplicate of expert e for token t: (ep_rank + t * 23333) % count[e]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _tensor_error(t, name: str, shape, dtype, like) -> str:
    got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
    return f"{name} must be a {dtype} tensor of shape {tuple(shape)} on {like.device}, got {got}"


def _check_tensor(t, name: str, shape, dtype, like, last_contiguous: bool = True, contiguous: bool = False) -> None:
    ok = isinstance(t, torch.Tensor) and t.dtype == dtype and tuple(t.shape) == tuple(shape)
    if not (ok and t.device == like.device):
        raise ValueError(_tensor_error(t, name, shape, dtype, like))
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if last_contiguous and t.dim() == 2 and t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")


def check_gate_args(
    logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func, mask,
    bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx,
    force_random, out, scores, num_groups, num_topk_groups,
) -> tuple[int, int, int, int]:  # fmt: skip
    """Check every argument of moe_topk_gate_forward; returns (T, Er, k, S) with S the shared
    slots actually appended (0 unless use_shared_as_routed). Raises TypeError/ValueError naming
    the argument."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 2-D (num_tokens, num_routed_experts) tensor, got {got}")
    if logits.dtype != torch.float32:
        raise TypeError(f"logits must be torch.float32, got {logits.dtype}")
    num_tokens, num_experts = logits.shape
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"logits must have 1 to {MAX_EXPERTS} experts (columns), got {num_experts}")
    if num_experts > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits must have a contiguous last dimension (stride 1), got strides {logits.stride()}")
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    if not isinstance(use_shared_as_routed, bool):
        raise TypeError(f"use_shared_as_routed must be a bool, got {use_shared_as_routed!r}")
    if not _is_int(num_shared_experts) or num_shared_experts not in (0, 1, 2):
        raise ValueError(f"num_shared_experts must be 0, 1 or 2, got {num_shared_experts!r}")
    shared = num_shared_experts if use_shared_as_routed else 0
    if not _is_int(num_topk) or not 1 <= num_topk <= num_experts:
        raise ValueError(f"num_topk must be an int in [1, {num_experts}] (the routed experts), got {num_topk!r}")
    if num_topk + shared > MAX_SLOTS:
        raise ValueError(f"num_topk + shared slots must be at most {MAX_SLOTS}, got {num_topk} + {shared}")
    if not isinstance(routed_scaling_factor, (int, float)) or isinstance(routed_scaling_factor, bool):
        raise TypeError(f"routed_scaling_factor must be a real number, got {routed_scaling_factor!r}")
    if not math.isfinite(routed_scaling_factor):
        raise ValueError(f"routed_scaling_factor must be finite, got {routed_scaling_factor!r}")
    if not _is_int(ep_rank) or not 0 <= ep_rank < 2**31:
        raise ValueError(f"ep_rank must be an int in [0, 2^31), got {ep_rank!r}")
    if not _is_int(num_groups) or not 1 <= num_groups <= min(MAX_GROUPS, num_experts):
        raise ValueError(f"num_groups must be an int in [1, {min(MAX_GROUPS, num_experts)}], got {num_groups!r}")
    if num_groups > 1:
        if num_experts % num_groups or num_experts // num_groups < 2:
            raise ValueError(f"num_groups={num_groups} must divide the {num_experts} experts into groups of at least 2")
        if not _is_int(num_topk_groups) or not 1 <= num_topk_groups <= num_groups:
            raise ValueError(f"num_topk_groups must be an int in [1, {num_groups}], got {num_topk_groups!r}")
        if num_topk > num_topk_groups * (num_experts // num_groups):
            raise ValueError(
                f"num_topk={num_topk} exceeds the experts of the kept groups "
                f"({num_topk_groups} x {num_experts // num_groups})"
            )
    elif num_topk_groups != 1:
        raise ValueError(f"num_topk_groups must be 1 when num_groups is 1, got {num_topk_groups!r}")
    for name, t in (
        ("mask", mask),
        ("image_token_mask", image_token_mask),
        ("fix_routing_mask", fix_routing_mask),
        ("force_random", force_random),
    ):
        if t is not None:
            _check_tensor(t, name, (num_tokens,), torch.bool, logits, contiguous=True)
    for name, t in (("bias", bias), ("image_bias", image_bias)):
        if t is not None:
            _check_tensor(t, name, (num_experts,), torch.float32, logits, contiguous=True)
    if (image_bias is None) != (image_token_mask is None):
        raise ValueError("image_bias and image_token_mask must be given together")
    if fix_routing_mask is not None and unmapped_topk_idx is None:
        raise ValueError("fix_routing_mask requires unmapped_topk_idx (the routing to keep)")
    if unmapped_topk_idx is not None:
        _check_tensor(unmapped_topk_idx, "unmapped_topk_idx", (num_tokens, num_topk), torch.int64, logits)
    if (to_physical_map is None) != (logical_count is None):
        raise ValueError("to_physical_map and logical_count must be given together")
    if to_physical_map is not None:
        num_logical = num_experts + shared
        if not (isinstance(to_physical_map, torch.Tensor) and to_physical_map.dim() == 2):
            shape = (num_logical, "dup")
            raise ValueError(_tensor_error(to_physical_map, "to_physical_map", shape, torch.int32, logits))
        _check_tensor(to_physical_map, "to_physical_map", (num_logical, to_physical_map.shape[1]), torch.int32, logits)
        if to_physical_map.shape[1] < 1:
            raise ValueError("to_physical_map must have at least one column (duplicate)")
        _check_tensor(logical_count, "logical_count", (num_logical,), torch.int32, logits, contiguous=True)
    width = num_topk + shared
    if out is not None:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"out must be a pair (topk_idx, topk_weights), got {type(out).__name__}")
        _check_tensor(out[0], "out[0]", (num_tokens, width), torch.int64, logits, contiguous=True)
        _check_tensor(out[1], "out[1]", (num_tokens, width), torch.float32, logits, contiguous=True)
    if scores is not None:
        _check_tensor(scores, "scores", (num_tokens, num_experts), torch.float32, logits)
    return num_tokens, num_experts, num_topk, shared
