"""Plain-PyTorch references of the TileKernels 1.0 token-to-expert mapping ops (api.md 1.11):
get_fused_mapping, expand_to_fused, expand_to_fused_with_sf, reduce_fused. They are the
oracles of the tilebake.moe kernels and the path those ops take for CPU tensors (same bytes).

The fused (expert-major) layout: the (token, slot) pairs routed to expert e occupy the rows
[expert_start[e], expert_start[e] + count[e]) in ascending flat order token * k + slot; the
segment is padded with rows that belong to no token up to expert_end[e] = expert_start[e] +
align(count[e], alignment); expert_start[0] = 0 and expert_start[e + 1] = expert_end[e].
A topk_idx entry of -1 (or any value outside [0, num_experts)) routes nowhere.
Only torch (and the argument checks in tilebake.moe._common, plain torch too) is imported.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from tilebake.moe._common import (
    QuantTensor,
    alloc_fused_sf,
    check_mapping_args,
    check_positions,
    check_quant_input,
    check_reduce_args,
    mapping_result,
    mapping_size,
)

__all__ = ["expand_to_fused", "expand_to_fused_with_sf", "fma_fp32", "get_fused_mapping", "reduce_fused"]

E4M3_MAX = 448.0


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

    return mapping_result(
        pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
        num_tokens_per_expert, should_sync,
    )  # fmt: skip


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
    data, sf = check_quant_input(x, num_per_channels)
    _, num_expanded = check_positions(token_topk_to_pos, pos_to_expert, data.shape[0])
    out = expand_to_fused(data, token_topk_to_pos, pos_to_expert)
    out_sf = alloc_fused_sf(sf, num_expanded, bool(use_tma_aligned_col_major_sf))
    values = torch.zeros((num_expanded, sf.shape[1]), dtype=sf.dtype, device=sf.device)
    _scatter_rows(sf, values, token_topk_to_pos)
    out_sf.copy_(values)
    return out, out_sf


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
