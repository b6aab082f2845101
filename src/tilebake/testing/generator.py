"""Test parameters and inputs, scaled by a test level.

TK_TEST_LEVEL picks how much to run: 0 = core (a small fixed set, also what benchmarks use),
1 = default, 2 = full (every combination, plus corner cases such as 0 and 1 tokens).
TK_PRECOMPILE=1 marks a cache warm-up pass: token counts shrink to one small value so that each
kernel specialisation is built once, cheaply (the token count is a runtime dimension).
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Iterable, Iterator

import torch

from tilebake import config
from tilebake.rand import randn
from tilebake.utils import align as _align

__all__ = [
    "generate_cast_config",
    "generate_hidden_sizes",
    "generate_moe_params",
    "generate_num_sms",
    "generate_num_tokens",
    "generate_psum_layout",
    "generate_rand_float",
    "generate_samples",
    "generate_topk_idx",
    "get_test_level",
    "is_precompile",
]

_HIDDEN_SIZES = (128, 192, 384, 768, 2048, 2560, 3072, 4096, 6144, 7168)


def _device() -> str:
    """Where generated tensors go: the accelerator when there is one, else the CPU (tilebake's
    ops take CPU tensors through their references)."""
    if torch.cuda.is_available():
        return "cuda"
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        return "npu"
    return "cpu"


def is_precompile() -> bool:
    """True when TK_PRECOMPILE is "1" (a cache warm-up pass)."""
    return os.getenv("TK_PRECOMPILE", "0") == "1"


def get_test_level() -> int:
    """TK_TEST_LEVEL as an int: 0 (core), 1 (default, also when unset) or 2 (full).
    Anything else raises ValueError."""
    raw = os.getenv("TK_TEST_LEVEL", "1")
    try:
        level = int(raw)
    except ValueError:
        raise ValueError(f"TK_TEST_LEVEL must be 0, 1 or 2, got {raw!r}") from None
    if level not in (0, 1, 2):
        raise ValueError(f"TK_TEST_LEVEL must be 0, 1 or 2, got {raw!r}")
    return level


def generate_samples(level: int, **dimensions: Iterable) -> Iterator[dict]:
    """Dicts of one value per dimension (keyword order kept).

    Level 2: every combination. Lower levels: as many dicts as the longest dimension has values,
    the i-th taking each dimension's value i (shorter dimensions wrap around), so every value
    appears at least once without the product's size.
    """
    names = list(dimensions)
    values = [list(v) for v in dimensions.values()]
    if level >= 2:
        for combo in itertools.product(*values):
            yield dict(zip(names, combo))
        return
    for i in range(max((len(v) for v in values), default=0)):
        yield {name: v[i % len(v)] for name, v in zip(names, values)}


def generate_num_tokens(level: int, alignment: int = 1, backward_only: bool = False) -> list[int]:
    """Token counts, each rounded up to `alignment`: [512, 8001] (8001 is no tile's multiple);
    level 2 adds 0 and 1 in front; level 0 with backward_only keeps only 8001. A precompile pass
    gets [128] alone."""
    if is_precompile():
        return [_align(128, alignment)]
    tokens = [8001] if level == 0 and backward_only else [512, 8001]
    if level >= 2:
        tokens = [0, 1, *tokens]
    return [_align(n, alignment) for n in tokens]


def generate_hidden_sizes(align: int = 64) -> list[int]:
    """The hidden sizes the tests use, those that are multiples of `align`."""
    return [h for h in _HIDDEN_SIZES if h % align == 0]


def generate_cast_config(level: int, fmt: str) -> list[tuple[bool, bool, bool]]:
    """(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0) triples for casts to fmt.

    Unquantised formats (fp32, bf16) have no scales: one all-False triple. Quantised formats get
    the layout production uses (all True); from level 1 also rounded and plain fp32 scales."""
    if fmt in ("fp32", "bf16"):
        return [(False, False, False)]
    configs = [(True, True, True)]
    if level >= 1:
        configs = [(False, True, False), (False, False, False), *configs]
    return configs


def generate_num_sms(level: int) -> list[int]:
    """SM counts for persistent kernels, the device's own count last: [device] at level 0,
    device - 19 (an uneven share) added at level 1, and 1 at level 2.

    Without a CUDA device there is no SM count to vary (the CPU references take none): [1]."""
    if not torch.cuda.is_available():
        return [1]
    device_sms = config.get_device_num_sms()
    sms = [device_sms]
    if level >= 1:
        sms = [device_sms - 19, *sms]
    if level >= 2:
        sms = [1, *sms]
    return sms


def generate_moe_params(level: int) -> Iterator[dict]:
    """Expert-parallel routing shapes: dicts of num_send_tokens, num_topk, num_experts (per
    rank) and num_ep_ranks. Level 0: two fixed shapes. Otherwise 4001 tokens with top-k in
    (2, 6, 8, 9) and 72 or 256 experts over 8 or 64 ranks (where they divide evenly); level 2
    first yields two corner cases (no tokens; one token) and adds more top-k, expert and rank
    counts."""
    if level == 0:
        yield {"num_send_tokens": 4001, "num_topk": 6, "num_experts": 32, "num_ep_ranks": 8}
        yield {"num_send_tokens": 4001, "num_topk": 8, "num_experts": 4, "num_ep_ranks": 64}
        return
    topks, experts, ranks = (2, 6, 8, 9), (72, 256), (8, 64)
    if level >= 2:
        yield {"num_send_tokens": 0, "num_topk": 1, "num_experts": 1, "num_ep_ranks": 1}
        yield {"num_send_tokens": 1, "num_topk": 8, "num_experts": 256, "num_ep_ranks": 8}
        topks, experts, ranks = topks + (1, 7), experts + (288, 384), ranks + (1, 72, 256)
    for num_topk, num_experts, num_ep_ranks in itertools.product(topks, experts, ranks):
        if num_experts % num_ep_ranks == 0:
            yield {
                "num_send_tokens": 4001,
                "num_topk": num_topk,
                "num_experts": num_experts // num_ep_ranks,
                "num_ep_ranks": num_ep_ranks,
            }


def _global_topk(params: dict) -> torch.Tensor:
    """Random top-k over all ranks' experts for every token of every rank: int64
    (num_send_tokens * num_ep_ranks, num_topk), unsorted. This rank owns ids < num_experts."""
    num_ep_ranks = params["num_ep_ranks"]
    rows, cols = params["num_send_tokens"] * num_ep_ranks, params["num_experts"] * num_ep_ranks
    scores = torch.rand((rows, cols), dtype=torch.bfloat16, device=_device())
    return torch.topk(scores, k=params["num_topk"], dim=-1, sorted=False).indices


def generate_topk_idx(params: dict) -> torch.Tensor:
    """A topk_idx as this rank receives it (params as generate_moe_params yields).

    Expert ids of other ranks become -1, and tokens that chose none of this rank's experts are
    dropped, so the row count is at most num_send_tokens * num_ep_ranks."""
    if params["num_send_tokens"] == 0:
        return torch.empty((0, params["num_topk"]), dtype=torch.int64, device=_device())
    topk_idx = _global_topk(params)
    foreign = topk_idx >= params["num_experts"]
    topk_idx[foreign] = -1
    return topk_idx[~foreign.all(dim=1)]


def generate_psum_layout(params: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A random expert-major layout of this rank's tokens: (mask, psum).

    params: generate_moe_params' keys plus `alignment`. Expert e holds count_e tokens starting
    at the aligned end of expert e-1, so psum[e] (int32, (num_experts,)) = that start + count_e.
    mask (bool, the aligned total) is True on real token slots, False on padding. A precompile
    pass gets one token in one padded block: psum [1, alignment, ...]."""
    num_experts, alignment = params["num_experts"], params["alignment"]
    device = _device()
    if is_precompile():
        # The alignment stays the test's own: it is a compile-time parameter of the kernels.
        mask = torch.zeros((alignment,), dtype=torch.bool, device=device)
        mask[0] = True
        psum = torch.full((num_experts,), alignment, dtype=torch.int32, device=device)
        psum[0] = 1
        return mask, psum
    if params["num_send_tokens"] == 0:
        empty = torch.empty((0,), dtype=torch.bool, device=device)
        return empty, torch.zeros((num_experts,), dtype=torch.int32, device=device)
    topk_idx = _global_topk(params)
    counts = torch.bincount(topk_idx[topk_idx < num_experts], minlength=num_experts)
    padded = (counts + alignment - 1) // alignment * alignment
    ends = torch.cumsum(padded, dim=0)
    starts = ends - padded
    mask = torch.zeros((int(ends[-1]),), dtype=torch.bool, device=device)
    for start, count in zip(starts.tolist(), counts.tolist()):
        mask[start : start + count] = True
    return mask, (starts + counts).to(torch.int32)


def generate_rand_float(shape: tuple[int, ...]) -> torch.Tensor:
    """fp32 normal samples times 2^e, e drawn uniformly from [-110, 126] with Python's `random`,
    so scale-factor code sees every exponent range. Overflowed elements are redrawn unscaled
    and the result is clamped to +-(fp32 max / 8), which leaves headroom for later scaling."""
    scale = 2.0 ** random.randint(-110, 126)
    x = randn(shape, dtype=torch.float32, device=_device()) * scale
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        x[bad] = randn((int(bad.sum()),), dtype=torch.float32, device=x.device)
    limit = torch.finfo(torch.float32).max / 8
    return torch.clamp(x, -limit, limit)
