"""Inputs, output buffers and SF options shared by the per_token_cast test files
(test_per_token_cast*.py) and the cast-back tests that reuse make_input."""

import torch

import tilebake
from tests.helpers import poison_


def make_input(num_tokens, hidden, dtype, device, row_stride=None):
    """Random values over many binades (not just N(0,1)), sliced from a wider buffer when
    row_stride is given so the kernel sees a real row stride."""
    width = row_stride or hidden
    base = torch.randn(num_tokens, width, device=device) * torch.exp2(
        torch.randint(-8, 9, (num_tokens, 1), device=device).float()
    )
    return base.to(dtype)[:, :hidden]


# Output SF options: (round_sf, use_packed_ue8m0, use_e4m3_sf)
SF_OPTIONS = {"plain": (False, False, False), "round": (True, False, False), "packed": (True, True, False)}
SF_OPTIONS["e4m3sf"] = (False, False, True)
# (tokens, hidden): tokens 1 / 127 / 8001, hidden 128 / 192 / 2048 / 7168 and 208 (not a multiple of 32)
SHAPES = [(1, 128), (127, 192), (8001, 2048), (33, 7168), (5, 208)]
# A QuantTensor x for the argument-check tables (valid: e4m3 data, fp32 (1, 128) scales).
QUANT_TENSOR_X = (torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4, 1))


def sf_kwargs(sf_option, col):
    rs, packed, e4m3 = SF_OPTIONS[sf_option]
    return dict(round_sf=rs, use_packed_ue8m0=packed, use_e4m3_sf=e4m3, use_tma_aligned_col_major_sf=col)


def strided_copy(t, extra):
    """t's values in a (T, W + extra) buffer: a view whose rows are strided."""
    buf = torch.empty(t.shape[0], t.shape[1] + extra, dtype=t.dtype, device=t.device)
    buf[:, : t.shape[1]] = t
    return buf[:, : t.shape[1]]


def alloc_out(num_tokens, hidden, fmt, npc, sf_option, col, device):
    """A poisoned (data, sf) in the layout per_token_cast returns."""
    like = torch.empty(0, device=device)
    ref_sf = tilebake.torch.cast(
        torch.zeros(max(num_tokens, 1), hidden, device=device), fmt, (1, npc), **sf_kwargs(sf_option, col)
    )[1][:num_tokens]
    data = like.new_empty(
        (num_tokens, hidden // 2 if fmt == "e2m1" else hidden),
        dtype=torch.int8 if fmt == "e2m1" else torch.float8_e4m3fn,
    )
    return poison_(data), poison_(torch.empty_strided(ref_sf.shape, ref_sf.stride(), dtype=ref_sf.dtype, device=device))


def make_quantized(num_tokens, hidden, in_fmt, x_block, x_sf, col, device, row_pad=0):
    """A QuantTensor input made by the reference: data e4m3 / packed e2m1, SF fp32 / packed UE8M0 /
    e4m3, row- or column-major; rows strided when row_pad."""
    x = make_input(num_tokens, hidden, torch.float32, device)
    data, sf = tilebake.torch.cast(
        x, in_fmt, x_block, **sf_kwargs({"fp32": "plain", "ue8m0": "packed"}.get(x_sf, x_sf), col)
    )
    return (strided_copy(data, row_pad) if row_pad else data), sf
