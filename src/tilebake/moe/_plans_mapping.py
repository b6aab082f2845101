"""Call plans (tilebake/_runtime/plan.py) of the mapping ops: get_fused_mapping (its launches;
the synchronising mode's host copy stays in Python), expand_to_fused, expand_to_fused_with_sf,
reduce_fused. Each repeats its op's CUDA path for one call key: the same checks (or stricter:
those calls take the Python path), allocations, kernel arguments and result."""

from __future__ import annotations

import torch

from tilebake._runtime import plan
from tilebake.moe._plans_gate import contiguous


def fused_mapping_plan(kernels, device, num_experts: int, num_expanded: int, alignment: int):
    """get_fused_mapping(topk_idx, E, N, A, ...)'s three launches: run(plan, topk_idx) returns
    its 7 tensors, untrimmed (N == 0: the upper bound). kernels: (count, scan, scatter)."""
    from tilebake.moe.get_fused_mapping import MAX_SEGMENTS, MAX_WORK, SEGMENT_UNROLL

    E, A, U = num_experts, alignment, SEGMENT_UNROLL
    b = plan.Builder()
    idx = contiguous(b, 0, torch.int64, ("T", "K"), "idx")
    b.let("numel", "T * K")
    b.let("bound", f"(numel + {A - 1} * {E}) // {A} * {A}")  # moe._common.mapping_size
    b.check("T >= 1 and K >= 1 and numel < 2147483648 and bound < 2147483648")
    b.let("N", "bound" if num_expanded == 0 else num_expanded)
    lanes = 32 * min(MAX_SEGMENTS, max(1, MAX_WORK // E))  # get_fused_mapping.segment_steps
    b.let("steps", f"(max({U}, (numel + {lanes - 1}) // {lanes}) + {U - 1}) // {U} * {U}")
    b.let("S", "(numel + 32 * steps - 1) // (32 * steps)")
    p2e, p2t, p2tt = (b.alloc(torch.int32, ("N",)) for _ in range(3))
    t2p = b.alloc(torch.int32, ("T", "K"))
    # expert_start, expert_end, num_tokens_per_expert: rows of one (3, E) buffer on the Python
    # path; three allocations here (the same shapes, strides and values).
    start, end, count = (b.alloc(torch.int32, (E,)) for _ in range(3))
    work = b.alloc(torch.int32, ("2 * S + 1", E))  # counts, offsets (S x E each), totals (E)
    b.address(work, "w")
    counts, offsets, totals = "w", f"w + S * {4 * E}", f"w + S * {8 * E}"
    count_k, scan_k, scatter_k = kernels
    b.launch(
        count_k, device, topk_idx=idx, counts=counts, pos_to_expert=p2e, pos_to_token=p2t, pos_to_token_topk=p2tt,
        seg_steps="steps", numel="numel", num_experts=E, num_segments="S", num_expanded="N",
    )  # fmt: skip
    b.launch(scan_k, device, counts=counts, offsets=offsets, totals=totals, num_experts=E, num_segments="S")
    b.launch(
        scatter_k, device, topk_idx=idx, offsets=offsets, totals=totals, pos_to_expert=p2e, pos_to_token=p2t,
        pos_to_token_topk=p2tt, token_topk_to_pos=t2p, expert_start=start, expert_end=end,
        num_tokens_per_expert=count, num_topk="K", alignment=A, seg_steps="steps", numel="numel", num_experts=E,
        num_segments="S", num_expanded="N",
    )  # fmt: skip
    b.returns((p2e, p2t, p2tt, t2p, start, end, count))
    return b.build()


def _data_rows(b, arg, dtype, name):
    """expand_to_fused's data: (T, cols) rows of 16-byte multiples, last dim contiguous, row
    stride a multiple of 16 bytes, 16-byte aligned; binds T, cols and `name` (row stride)."""
    x = b.tensor(arg, dtype, ("T", "cols"), strides=(name, f"{name}_c"), align=16)
    vec = 16 // dtype.itemsize
    b.check(f"cols >= 1 and cols % {vec} == 0 and (cols == 1 or {name}_c == 1) and (T == 1 or {name} % {vec} == 0)")
    return x


def _maps(b, arg_pos, arg_expert):
    t2p = contiguous(b, arg_pos, torch.int32, ("T", "K"), "t2p")
    p2e = contiguous(b, arg_expert, torch.int32, ("N",), "p2e")
    b.check("T >= 1")
    return t2p, p2e


def expand_plan(kernel, device, dtype: torch.dtype):
    """expand_to_fused(x, token_topk_to_pos, pos_to_expert) with x of `dtype`."""
    b = plan.Builder()
    x = _data_rows(b, 0, dtype, "xs")
    t2p, p2e = _maps(b, 1, 2)
    out = b.alloc(dtype, ("N", "cols"))
    _launch_rows(b, kernel, device, x, out, t2p, p2e, dtype.itemsize)
    b.returns(out)
    return b.build()


def _launch_rows(b, kernel, device, x, out, t2p, p2e, word, **sf):
    """expand_to_fused._launch_rows: rows as 4-byte words."""
    b.launch(
        kernel, device, X=x, Y=out, P=t2p, E=p2e, grid_rows="max((T + 7) // 8, (N + 63) // 64)", num_tokens="T",
        num_expanded="N", num_topk="K", row_words=f"cols * {word} // 4", x_stride=f"xs * {word} // 4",
        y_stride=f"cols * {word} // 4", **sf,
    )  # fmt: skip


def expand_with_sf_plan(kernel, device, dtype, sf_dtype, num_per_channels: int, col_major: bool):
    """expand_to_fused_with_sf((data, sf), npc, token_topk_to_pos, pos_to_expert, col_major):
    run(plan, x, token_topk_to_pos, pos_to_expert), x a tuple."""
    b = plan.Builder()
    data = _data_rows(b, (0, 0), dtype, "xs")
    b.let("H", "2 * cols" if dtype == torch.int8 else "cols")  # int8: packed e2m1, two values a byte
    groups = f"(H + {num_per_channels - 1}) // {num_per_channels}"
    b.let("C", f"({groups} + 3) // 4" if sf_dtype == torch.int32 else groups)
    sf = b.tensor((0, 1), sf_dtype, ("T", "C"), strides=("st", "sc"), align=sf_dtype.itemsize)
    t2p, p2e = _maps(b, 1, 2)
    out = b.alloc(dtype, ("N", "cols"))
    if col_major:  # moe._common.alloc_fused_sf: a (C, padded N) buffer as its (N, C) view
        b.let("pad", "(N + 3) // 4 * 4")
        out_sf = b.alloc(sf_dtype, ("C", "pad"), view=(("N", "C"), (1, "pad")))
        b.let("yt", 1)
        b.let("yc", "pad")
    else:
        out_sf = b.alloc(sf_dtype, ("N", "C"))
        b.let("yt", "C")
        b.let("yc", 1)
    _launch_rows(
        b, kernel, device, data, out, t2p, p2e, dtype.itemsize, XS=sf, YS=out_sf, sf_cols="C", xs_stride_t="st",
        xs_stride_c="sc", ys_stride_t="yt", ys_stride_c="yc",
    )  # fmt: skip
    b.returns((out, out_sf))
    return b.build()


def reduce_plan(kernel, device, dtype, out_dtype, has_weights: bool, has_x_sf: bool, has_sf: bool, given_out: bool):
    """reduce_fused(x, topk_weights, token_topk_to_pos, fp8_format, sf, out): run(plan, x,
    topk_weights, token_topk_to_pos, sf, out); x a tensor, or with has_x_sf a tuple (data, x_sf)
    with x_sf contiguous; sf a (1,) tensor."""
    vec = 16 // dtype.itemsize
    b = plan.Builder()
    x = b.tensor((0, 0) if has_x_sf else 0, dtype, ("N", "H"), strides=("xs", "xc"), align=16)
    b.check(f"H >= 1 and H % {vec} == 0 and (H == 1 or xc == 1) and (N <= 1 or xs % {vec} == 0)")
    pos = contiguous(b, 2, torch.int32, ("T", "K"), "pos")
    x_sf = contiguous(b, (0, 1), torch.float32, ("N",), "xsf") if has_x_sf else pos
    b.check("T >= 1 and K >= 1")
    w = contiguous(b, 1, torch.float32, ("T", "K"), "w") if has_weights else pos
    sf = b.tensor(3, torch.float32, (1,), align=4) if has_sf else pos
    if given_out:
        y = b.tensor(4, out_dtype, ("T", "H"), strides=("ys", "yc"), align=vec * out_dtype.itemsize)
        b.check(f"(H == 1 or yc == 1) and (T == 1 or ys % {vec} == 0)")
    else:
        y = b.alloc(out_dtype, ("T", "H"))
        b.let("ys", "H")
    b.launch(
        kernel, device, X=x, W=w, P=pos, XSF=x_sf, SF=sf, Y=y, has_weights=int(has_weights), has_x_sf=int(has_x_sf),
        has_sf=int(has_sf), num_tokens="T", num_expanded="N", num_topk="K", hidden="H", x_stride="xs", y_stride="ys",
    )  # fmt: skip
    if given_out:
        b.bump(y)
    b.returns(y)
    return b.build()
