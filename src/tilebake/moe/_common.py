"""Argument checks and layouts shared by the moe mapping ops and their references
(tilebake.torch.mapping): every check names the argument, what is allowed and what was given.
Only torch is imported, so the GPU path does not load tilebake.torch."""

from __future__ import annotations

import torch

from tilebake._checks import check_device
from tilebake.quant._common import NUM_PER_CHANNELS
from tilebake.utils import ceil_div

QuantTensor = tuple[torch.Tensor, torch.Tensor]


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _check_index_map(t, name: str, dim: int, dtype: torch.dtype, dims_text: str = "") -> None:
    """A contiguous `dim`-D integer tensor of `dtype` (dims_text, e.g. "(num_tokens, num_topk) ", names the dims)."""
    if not isinstance(t, torch.Tensor) or t.dim() != dim:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a {dim}-D {dims_text}tensor, got {got}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    check_device(t, name)
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def check_topk_idx(topk_idx) -> tuple[int, int]:
    _check_index_map(topk_idx, "topk_idx", 2, torch.int64, "(num_tokens, num_topk) ")
    return topk_idx.shape[0], topk_idx.shape[1]


def mapping_size(num_tokens: int, num_topk: int, num_experts: int, alignment: int) -> int:
    """The most rows any routing of num_tokens x num_topk can need: the sum over experts of
    align(count, alignment) is at most T * k + (alignment - 1) * E, and a multiple of alignment."""
    return (num_tokens * num_topk + (alignment - 1) * num_experts) // alignment * alignment


def check_mapping_args(topk_idx, num_experts, num_expanded_tokens, alignment) -> tuple[int, int]:
    num_tokens, num_topk = check_topk_idx(topk_idx)
    _check_int(num_experts, "num_experts", 1)
    _check_int(num_expanded_tokens, "num_expanded_tokens", 0)
    _check_int(alignment, "alignment", 1)
    if num_expanded_tokens >= 2**31 or mapping_size(num_tokens, num_topk, num_experts, alignment) >= 2**31:
        raise ValueError("the fused layout must have fewer than 2^31 rows (positions are int32)")
    return num_tokens, num_topk


def check_positions(token_topk_to_pos, pos_to_expert, num_tokens: int) -> tuple[int, int]:
    """(num_topk, num_expanded_tokens) of int32 maps as get_fused_mapping returns them."""
    _check_index_map(token_topk_to_pos, "token_topk_to_pos", 2, torch.int32)
    _check_index_map(pos_to_expert, "pos_to_expert", 1, torch.int32)
    if token_topk_to_pos.shape[0] != num_tokens:
        raise ValueError(
            f"token_topk_to_pos must have one row per token of x ({num_tokens}), got shape "
            f"{tuple(token_topk_to_pos.shape)}"
        )
    return token_topk_to_pos.shape[1], pos_to_expert.shape[0]


def check_quant_input(x, num_per_channels) -> QuantTensor:
    if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
        raise TypeError(f"x must be a QuantTensor (data, sf) of two tensors, got {type(x).__name__}")
    data, sf = x
    if isinstance(num_per_channels, bool) or num_per_channels not in NUM_PER_CHANNELS:
        raise ValueError(f"num_per_channels must be one of {NUM_PER_CHANNELS}, got {num_per_channels!r}")
    if data.dim() != 2:
        raise ValueError(f"x[0] (the data) must be 2-D (num_tokens, hidden), got shape {tuple(data.shape)}")
    if data.dtype == torch.float8_e4m3fn:
        hidden = data.shape[1]
    elif data.dtype == torch.int8:
        hidden = 2 * data.shape[1]  # packed e2m1: two values a byte
    else:
        raise TypeError(f"x[0] (the data) must be float8_e4m3fn or int8 (packed e2m1), got {data.dtype}")
    if sf.dtype not in (torch.float32, torch.int32):
        raise TypeError(f"x[1] (the SF) must be float32 or int32 (packed UE8M0), got {sf.dtype}")
    cols = sf_columns(hidden, num_per_channels, sf.dtype == torch.int32)
    if sf.shape != (data.shape[0], cols):
        raise ValueError(
            f"x[1] (the SF) must have shape {(data.shape[0], cols)} for {data.shape[0]} tokens, hidden {hidden}, "
            f"num_per_channels {num_per_channels}{' (packed 4 to an int32)' if sf.dtype == torch.int32 else ''}, "
            f"got {tuple(sf.shape)}"
        )
    if sf.device != data.device:
        raise ValueError(f"x[1] (the SF) must be on x[0]'s device {data.device}, got {sf.device}")
    return data, sf


def sf_columns(hidden: int, num_per_channels: int, packed: bool) -> int:
    groups = ceil_div(hidden, num_per_channels)
    return ceil_div(groups, 4) if packed else groups


def alloc_fused_sf(like: torch.Tensor, num_rows: int, col_major: bool) -> torch.Tensor:
    cols = like.shape[1]
    if col_major:
        padded = ceil_div(num_rows, 4) * 4
        return like.new_empty_strided((padded, cols), (1, padded))[:num_rows]
    return like.new_empty((num_rows, cols))


def check_reduce_args(x, topk_weights, token_topk_to_pos, fp8_format, sf):
    """(data, x_sf or None, num_topk, out dtype), every argument checked."""
    if isinstance(x, (tuple, list)):
        if not (len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
            raise TypeError("x must be a tensor or a QuantTensor (data, x_sf) of two tensors")
        data, x_sf = x
    elif isinstance(x, torch.Tensor):
        data, x_sf = x, None
    else:
        raise TypeError(f"x must be a torch.Tensor or a QuantTensor (data, x_sf), got {type(x).__name__}")
    if data.dim() != 2:
        raise ValueError(f"x must be 2-D (num_expanded_tokens, hidden), got shape {tuple(data.shape)}")
    if data.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"x must be bfloat16 or float32, got {data.dtype}")
    if x_sf is not None:
        if x_sf.dtype != torch.float32 or x_sf.shape != (data.shape[0],):
            raise ValueError(
                f"x's SF (x[1]) must be float32 of shape ({data.shape[0]},) (one scale per row), "
                f"got {x_sf.dtype} {tuple(x_sf.shape)}"
            )
        if x_sf.device != data.device:
            raise ValueError(f"x[1] must be on x[0]'s device {data.device}, got {x_sf.device}")
    if not isinstance(token_topk_to_pos, torch.Tensor) or token_topk_to_pos.dim() != 2:
        raise ValueError("token_topk_to_pos must be a 2-D (num_tokens, num_topk) int32 tensor")
    if token_topk_to_pos.dtype != torch.int32:
        raise TypeError(f"token_topk_to_pos must be torch.int32, got {token_topk_to_pos.dtype}")
    if not token_topk_to_pos.is_contiguous():
        raise ValueError(f"token_topk_to_pos must be contiguous, got strides {token_topk_to_pos.stride()}")
    if token_topk_to_pos.device != data.device:
        raise ValueError(f"token_topk_to_pos must be on x's device {data.device}, got {token_topk_to_pos.device}")
    if topk_weights is not None:
        if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32:
            raise TypeError(
                f"topk_weights must be a float32 tensor or None, got {getattr(topk_weights, 'dtype', None)}"
            )
        if topk_weights.shape != token_topk_to_pos.shape:
            raise ValueError(
                f"topk_weights must have token_topk_to_pos's shape {tuple(token_topk_to_pos.shape)}, "
                f"got {tuple(topk_weights.shape)}"
            )
        if not topk_weights.is_contiguous():
            raise ValueError(f"topk_weights must be contiguous, got strides {topk_weights.stride()}")
        if topk_weights.device != data.device:
            raise ValueError(f"topk_weights must be on x's device {data.device}, got {topk_weights.device}")
    if fp8_format not in ("", "e4m3"):
        raise ValueError(f"fp8_format must be '' (x's dtype out) or 'e4m3', got {fp8_format!r}")
    if sf is not None:
        if fp8_format != "e4m3":
            raise ValueError("sf (the output scale) is only for fp8_format='e4m3'")
        if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32 or sf.numel() != 1:
            raise ValueError("sf must be a float32 tensor of one element (the output multiplier)")
        if sf.device != data.device:
            raise ValueError(f"sf must be on x's device {data.device}, got {sf.device}")
    out_dtype = torch.float8_e4m3fn if fp8_format == "e4m3" else data.dtype
    return data, x_sf, token_topk_to_pos.shape[1], out_dtype


def mapping_result(
    pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
    num_tokens_per_expert, should_sync: bool,
):  # fmt: skip
    """get_fused_mapping's 7 tensors and the host list of per-expert counts: with a sync, the
    counts come to the host and the position maps are cut to the rows used; without, the list
    is empty and the maps keep their full size."""
    counts_list: list[int] = []
    if should_sync:
        counts_list = num_tokens_per_expert.tolist()
        used = sum(counts_list)
        pos_to_expert, pos_to_token, pos_to_token_topk = (
            pos_to_expert[:used],
            pos_to_token[:used],
            pos_to_token_topk[:used],
        )
    return (
        pos_to_expert,
        pos_to_token,
        pos_to_token_topk,
        token_topk_to_pos,
        expert_start,
        expert_end,
        num_tokens_per_expert,
        counts_list,
    )
