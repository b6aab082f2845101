"""Plain-PyTorch references of the TileKernels 1.0 token-to-expert mapping ops (api.md 1.11):
get_fused_mapping, expand_to_fused, expand_to_fused_with_sf, reduce_fused. They are the
oracles of the tilebake.moe kernels and the path those ops take for CPU tensors (same bytes).

The fused (expert-major) layout: the (token, slot) pairs routed to expert e occupy the rows
[expert_start[e], expert_start[e] + count[e]) in ascending flat order token * k + slot; the
segment is padded with rows that belong to no token up to expert_end[e] = expert_start[e] +
align(count[e], alignment); expert_start[0] = 0 and expert_start[e + 1] = expert_end[e].
A topk_idx entry of -1 (or any value outside [0, num_experts)) routes nowhere.
Only torch is imported.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

__all__ = ["expand_to_fused", "expand_to_fused_with_sf", "fma_fp32", "get_fused_mapping", "reduce_fused"]

QuantTensor = tuple[torch.Tensor, torch.Tensor]
E4M3_MAX = 448.0
NUM_PER_CHANNELS = (16, 32, 64, 128)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def check_topk_idx(topk_idx) -> tuple[int, int]:
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2:
        got = tuple(topk_idx.shape) if isinstance(topk_idx, torch.Tensor) else type(topk_idx).__name__
        raise ValueError(f"topk_idx must be a 2-D (num_tokens, num_topk) tensor, got {got}")
    if topk_idx.dtype != torch.int64:
        raise TypeError(f"topk_idx must be torch.int64, got {topk_idx.dtype}")
    if not topk_idx.is_contiguous():
        raise ValueError(f"topk_idx must be contiguous, got strides {topk_idx.stride()}")
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


def get_fused_mapping(
    topk_idx: torch.Tensor,
    num_experts: int,
    num_expanded_tokens: int,
    alignment: int,
    force_no_sync: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Mappings between (token, slot) pairs and the expert-major fused layout.

    Args:
        topk_idx: int64 (T, k), contiguous; -1 (or anything outside [0, num_experts)) drops the slot.
        num_experts: E >= 1.
        num_expanded_tokens: rows N of the fused layout. 0: the upper bound T * k + (alignment - 1)
            * E rounded down to a multiple of alignment; then, unless force_no_sync, the per-expert
            counts are copied to the host (a sync) and the pos_* outputs trimmed to the rows used.
            Pairs whose row would be >= N are dropped (token_topk_to_pos -1, no pos_* entry);
            expert_start/end still describe the full layout.
        alignment: every expert's segment is padded to a multiple of it (>= 1).
        force_no_sync: with num_expanded_tokens == 0, keep the upper bound and do not sync.

    Returns:
        (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
        num_tokens_per_expert, num_tokens_per_expert_list), all int32: pos_* (N,) with the row's
        expert, token and flat index token * k + slot, -1 on padding rows and rows past the last
        expert; token_topk_to_pos (T, k), -1 for dropped slots; expert_start, expert_end and
        num_tokens_per_expert (E,), the latter the aligned segment length expert_end - expert_start.
        num_tokens_per_expert_list: num_tokens_per_expert.tolist() after the sync, else [].
    """
    num_tokens, num_topk = check_mapping_args(topk_idx, num_experts, num_expanded_tokens, alignment)
    should_sync = num_expanded_tokens == 0 and not force_no_sync
    if num_expanded_tokens == 0:
        num_expanded_tokens = mapping_size(num_tokens, num_topk, num_experts, alignment)
    device = topk_idx.device
    flat = topk_idx.reshape(-1)
    valid = (flat >= 0) & (flat < num_experts)
    key = torch.where(valid, flat, num_experts)  # dropped slots sort after every expert
    counts = torch.bincount(key, minlength=num_experts + 1)[:num_experts]
    aligned = (counts + alignment - 1) // alignment * alignment
    expert_end = torch.cumsum(aligned, 0)
    expert_start = expert_end - aligned
    order = torch.sort(key, stable=True).indices  # ascending flat index within each expert
    num_valid = int(valid.sum())
    order = order[:num_valid]
    experts = key[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num_valid, device=device) - first_of_expert[experts]
    pos = expert_start[experts] + rank
    kept = pos < num_expanded_tokens
    order, experts, pos = order[kept], experts[kept], pos[kept]

    pos_to_expert = torch.full((num_expanded_tokens,), -1, dtype=torch.int32, device=device)
    pos_to_token = torch.full_like(pos_to_expert, -1)
    pos_to_token_topk = torch.full_like(pos_to_expert, -1)
    pos_to_expert[pos] = experts.to(torch.int32)
    pos_to_token[pos] = torch.div(order, num_topk, rounding_mode="floor").to(torch.int32)
    pos_to_token_topk[pos] = order.to(torch.int32)
    token_topk_to_pos = torch.full((num_tokens * num_topk,), -1, dtype=torch.int32, device=device)
    token_topk_to_pos[order] = pos.to(torch.int32)
    token_topk_to_pos = token_topk_to_pos.view(num_tokens, num_topk)
    num_tokens_per_expert = aligned.to(torch.int32)
    expert_start, expert_end = expert_start.to(torch.int32), expert_end.to(torch.int32)

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


def check_positions(token_topk_to_pos, pos_to_expert, num_tokens: int) -> tuple[int, int]:
    """(num_topk, num_expanded_tokens) of int32 maps as get_fused_mapping returns them."""
    for t, name, dim in ((token_topk_to_pos, "token_topk_to_pos", 2), (pos_to_expert, "pos_to_expert", 1)):
        if not isinstance(t, torch.Tensor) or t.dim() != dim:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a {dim}-D tensor, got {got}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be torch.int32, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if token_topk_to_pos.shape[0] != num_tokens:
        raise ValueError(
            f"token_topk_to_pos must have one row per token of x ({num_tokens}), got shape "
            f"{tuple(token_topk_to_pos.shape)}"
        )
    return token_topk_to_pos.shape[1], pos_to_expert.shape[0]


def _scatter_rows(src: torch.Tensor, out: torch.Tensor, token_topk_to_pos: torch.Tensor) -> None:
    """out[token_topk_to_pos[t, j]] = src[t] for every slot whose position is in [0, len(out))."""
    num_topk = token_topk_to_pos.shape[1]
    flat = token_topk_to_pos.reshape(-1).long()
    kept = (flat >= 0) & (flat < out.shape[0])
    tokens = torch.arange(flat.numel(), device=flat.device)[kept] // max(num_topk, 1)
    out[flat[kept]] = src[tokens]


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """Copy each token's row x[t] to its rows token_topk_to_pos[t, j] >= 0 of the fused layout
    (N = len(pos_to_expert) rows); rows with pos_to_expert < 0 (padding) are zero. x: (T, H)
    of any dtype. Positions outside [0, N) are ignored; a row with pos_to_expert >= 0 that no
    slot maps to is left zero here (the kernel leaves it unwritten)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D (num_tokens, hidden) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    _, num_expanded = check_positions(token_topk_to_pos, pos_to_expert, x.shape[0])
    out = torch.zeros((num_expanded, x.shape[1]), dtype=x.dtype, device=x.device)
    _scatter_rows(x, out, token_topk_to_pos)
    return out


def sf_columns(hidden: int, num_per_channels: int, packed: bool) -> int:
    groups = _ceil_div(hidden, num_per_channels)
    return _ceil_div(groups, 4) if packed else groups


def expand_to_fused_with_sf(
    x: QuantTensor,
    num_per_channels: int,
    token_topk_to_pos: torch.Tensor,
    pos_to_expert: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
) -> QuantTensor:
    """expand_to_fused for a quantized tensor (data, sf): the data rows as there, and each token's
    SF row (fp32 (T, ceil(H/npc)), or packed UE8M0 int32 (T, ceil(ceil(H/npc)/4))) moved the same
    way, zero on padding rows. data: float8_e4m3fn (T, H), or int8 packed e2m1 (T, H/2).
    use_tma_aligned_col_major_sf: the output SF column-major, its row dim padded to a multiple of 4,
    handed out as an (N, cols) view with strides (1, align(N, 4)); else row-major (N, cols)."""
    data, sf = _check_quant_input(x, num_per_channels)
    _, num_expanded = check_positions(token_topk_to_pos, pos_to_expert, data.shape[0])
    out = expand_to_fused(data, token_topk_to_pos, pos_to_expert)
    out_sf = alloc_fused_sf(sf, num_expanded, bool(use_tma_aligned_col_major_sf))
    values = torch.zeros((num_expanded, sf.shape[1]), dtype=sf.dtype, device=sf.device)
    _scatter_rows(sf, values, token_topk_to_pos)
    out_sf.copy_(values)
    return out, out_sf


def _check_quant_input(x, num_per_channels) -> QuantTensor:
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


def alloc_fused_sf(like: torch.Tensor, num_rows: int, col_major: bool) -> torch.Tensor:
    cols = like.shape[1]
    if col_major:
        padded = _ceil_div(num_rows, 4) * 4
        return like.new_empty_strided((padded, cols), (1, padded))[:num_rows]
    return like.new_empty((num_rows, cols))


def fma_fp32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 fused multiply-add a * b + c with one rounding (CUDA's fmaf), in plain torch on any
    device: the fp64 product of two fp32 values is exact; the fp64 sum is made round-to-odd (its
    exact error from TwoSum decides), and round-to-odd with 53 >= 24 + 2 bits followed by a
    round-to-nearest-even to fp32 equals one correct rounding."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bp = s - p
    err = (p - (s - bp)) + (cd - bp)  # s + err == p + cd exactly (TwoSum; no overflow in fp64 here)
    even = (s.view(torch.int64) & 1) == 0
    fix = (err != 0) & even & torch.isfinite(s)
    toward = torch.where(err > 0, torch.full_like(s, torch.inf), torch.full_like(s, -torch.inf))
    return torch.where(fix, torch.nextafter(s, toward), s).float()


def to_e4m3_saturated(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round to nearest even, finite values and infinities saturated to
    +-448 (CUDA's satfinite conversion), NaN -> 0x7F."""
    q = torch.clamp(x, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    nan = torch.full_like(q.view(torch.uint8), 0x7F).view(torch.float8_e4m3fn)
    return torch.where(torch.isnan(x), nan, q)


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


def reduce_fused(
    x: Union[torch.Tensor, QuantTensor],
    topk_weights: Optional[torch.Tensor],
    token_topk_to_pos: torch.Tensor,
    fp8_format: str = "",
    sf: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Weighted sum of each token's fused rows: out[t] = sum over slots j = 0..k-1 with
    p = token_topk_to_pos[t, j] in [0, N) of x[p] * s_j, s_j = topk_weights[t, j] (1 without
    weights) times x_sf[p] for a QuantTensor x = (data, x_sf) (fp32 (N,), a scale per row).

    Arithmetic (the kernel's, bit for bit): fp32 accumulator acc = 0, then for j ascending
    acc = fmaf(float(x[p]), s_j, acc) (one rounding); then acc * sf[0] when sf is given; then to
    x's dtype (bf16 RNE / fp32), or with fp8_format='e4m3' to float8_e4m3fn (RNE, saturated to
    +-448, NaN -> 0x7F). x: bf16 or fp32 (N, H).
    """
    data, x_sf, num_topk, out_dtype = check_reduce_args(x, topk_weights, token_topk_to_pos, fp8_format, sf)
    num_tokens, hidden = token_topk_to_pos.shape[0], data.shape[1]
    acc = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=data.device)
    for j in range(num_topk):
        pos = token_topk_to_pos[:, j].long()
        used = (pos >= 0) & (pos < data.shape[0])
        if not bool(used.any()):  # also spares indexing an empty x
            continue
        safe = torch.where(used, pos, 0)
        s = topk_weights[:, j] if topk_weights is not None else torch.ones(num_tokens, device=data.device)
        if x_sf is not None:
            s = s * x_sf[safe]
        rows = data[safe].float()
        acc = torch.where(used[:, None], fma_fp32(rows, s[:, None], acc), acc)
    if sf is not None:
        acc = acc * sf.reshape(1)
    return to_e4m3_saturated(acc) if out_dtype == torch.float8_e4m3fn else acc.to(out_dtype)
