"""get_fused_mapping: the reference against plain loops, argument checks, the CPU path, and (GPU)
the three kernels against the reference, every output equal."""

import itertools

import pytest
import torch

import tilebake
from tests.helpers import poison_allocator_
from tests.moe.mapping_helpers import assert_same, brute_force_mapping, random_topk_idx
from tilebake.torch.mapping import mapping_size

NAMES = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end",
         "num_tokens_per_expert")  # fmt: skip


def check_against(result, expected, where=""):
    for name, a, e in zip(NAMES, result[:7], expected[:7]):
        assert_same(a, e, f"{name}{where}")
    assert result[7] == expected[7], f"num_tokens_per_expert_list{where}: {result[7]} != {expected[7]}"


@pytest.mark.parametrize(
    "num_tokens,num_topk,num_experts,alignment",
    [(0, 2, 4, 4), (1, 1, 1, 1), (5, 3, 4, 4), (37, 6, 8, 16), (64, 9, 33, 3), (100, 2, 72, 128), (3, 9, 2, 1)],
)
def test_reference_matches_loops(num_tokens, num_topk, num_experts, alignment):
    topk_idx = random_topk_idx(num_tokens, num_topk, num_experts, drop=0.2)
    result = tilebake.torch.get_fused_mapping(topk_idx, num_experts, 0, alignment)
    used = int(result[6].sum())
    expected = brute_force_mapping(topk_idx, num_experts, used, alignment)
    check_against(result, (*expected, expected[6].tolist()))
    assert result[0].numel() == used  # synced and trimmed


def test_reference_layout_properties():
    topk_idx = random_topk_idx(500, 8, 16, drop=0.05)
    p2e, p2t, p2tt, ttp, start, end, sizes, sizes_list = tilebake.torch.get_fused_mapping(topk_idx, 16, 0, 32)
    assert sizes.tolist() == sizes_list and bool((sizes % 32 == 0).all())
    assert torch.equal(end - start, sizes) and int(start[0]) == 0 and torch.equal(start[1:], end[:-1])
    valid = ttp >= 0
    assert torch.equal(valid, topk_idx >= 0)
    rows = ttp[valid].long()
    assert torch.equal(p2e[rows].long(), topk_idx[valid])
    assert torch.equal(p2t[rows].long(), torch.arange(500)[:, None].expand(500, 8)[valid])
    assert torch.equal(p2tt[rows].long(), torch.arange(4000).view(500, 8)[valid])
    pad = p2e < 0
    assert bool((p2t[pad] == -1).all() and (p2tt[pad] == -1).all())
    for e in range(16):  # within an expert: ascending flat index, then padding
        seg = p2tt[int(start[e]) : int(end[e])]
        real = seg[seg >= 0]
        assert bool((real[1:] > real[:-1]).all()) and bool((seg[real.numel() :] == -1).all())


def test_out_of_range_experts_are_dropped():
    topk_idx = torch.tensor([[0, 5, -1], [-7, 1, 4]])
    _, _, _, ttp, _, _, sizes, _ = tilebake.torch.get_fused_mapping(topk_idx, 4, 0, 2)
    assert ttp.tolist() == [[0, -1, -1], [-1, 2, -1]]
    assert sizes.tolist() == [2, 2, 0, 0]


def test_given_size_no_sync_and_dropping():
    topk_idx = random_topk_idx(50, 4, 8)
    full = tilebake.torch.get_fused_mapping(topk_idx, 8, 0, 8)
    used = full[0].numel()
    bigger = tilebake.torch.get_fused_mapping(topk_idx, 8, used + 40, 8)
    assert bigger[7] == [] and bigger[0].numel() == used + 40
    assert torch.equal(bigger[0][:used], full[0]) and bool((bigger[0][used:] == -1).all())
    assert torch.equal(bigger[3], full[3])
    no_sync = tilebake.torch.get_fused_mapping(topk_idx, 8, 0, 8, force_no_sync=True)
    assert no_sync[7] == [] and no_sync[0].numel() == mapping_size(50, 4, 8, 8)
    smaller = tilebake.torch.get_fused_mapping(topk_idx, 8, used // 2, 8)
    expected = brute_force_mapping(topk_idx, 8, used // 2, 8)
    check_against(smaller, (*expected, []))
    assert bool((smaller[3] < used // 2).all())


@pytest.mark.parametrize("num_experts", [16, 1025, 8192])
def test_cpu_path_is_the_reference(num_experts):
    topk_idx = random_topk_idx(33, 6, num_experts)
    check_against(
        tilebake.moe.get_fused_mapping(topk_idx, num_experts, 0, 4),
        tilebake.torch.get_fused_mapping(topk_idx, num_experts, 0, 4),
    )


def test_segments_and_stages_by_expert_count():
    """Up to 1024 experts: the shared-memory stages, segments as before; beyond, the wide stages
    and at most 2^18 / E segments (the work buffer stays 2^18 int32 a matrix)."""
    from tilebake.moe.get_fused_mapping import GetFusedMappingVariant, segment_steps
    from tilebake.utils import ceil_div

    stages = {v.stage for v in GetFusedMappingVariant.all()}
    assert stages == {"count", "scan", "scatter", "count_wide", "scatter_wide"}
    for numel, num_experts, segments in [(8, 8, 1), (65536 * 8, 256, 256), (65536 * 8, 1024, 256),
                                         (65536 * 8, 1025, 228), (65536 * 8, 8192, 32), (100, 8192, 1)]:  # fmt: skip
        steps = segment_steps(numel, num_experts)
        assert steps % 8 == 0 and ceil_div(numel, 32 * steps) == segments, (numel, num_experts, steps)
        assert segments * num_experts <= max(2**18, num_experts)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(topk_idx=torch.zeros(4, 2, dtype=torch.int32)), TypeError, "topk_idx must be torch.int64"),
        (dict(topk_idx=torch.zeros(4, 2, dtype=torch.int64).t()), ValueError, "topk_idx must be contiguous"),
        (dict(topk_idx=torch.zeros(8, dtype=torch.int64)), ValueError, "topk_idx must be a 2-D"),
        (dict(num_experts=0), ValueError, "num_experts must be an int >= 1"),
        (dict(num_experts=8193), ValueError, "num_experts must be at most 8192"),
        (dict(alignment=0), ValueError, "alignment must be an int >= 1"),
        (dict(num_expanded_tokens=-1), ValueError, "num_expanded_tokens must be an int >= 0"),
        (dict(num_expanded_tokens=2.0), ValueError, "num_expanded_tokens must be an int"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = dict(topk_idx=torch.zeros(4, 2, dtype=torch.int64), num_experts=8, num_expanded_tokens=0, alignment=4)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        tilebake.moe.get_fused_mapping(**args)


# --- GPU: the kernels against the reference ---

GPU_CASES = [
    (num_tokens, num_topk, num_experts, alignment)
    for (num_tokens, num_topk), num_experts, alignment in itertools.product(
        [(1, 1), (1, 9), (8001, 6), (8001, 9), (4096, 8)], [1, 8, 31, 72, 256, 512, 1024], [1, 16, 128]
    )
] + [  # the wide stages (counters in global memory)
    (num_tokens, num_topk, num_experts, alignment)
    for (num_tokens, num_topk), num_experts, alignment in itertools.product(
        [(1, 1), (1, 9), (8001, 6), (4096, 8), (3, 32)], [1025, 4097, 5000, 8192], [1, 128]
    )
]


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,num_topk,num_experts,alignment", GPU_CASES)
def test_kernels_match_reference(num_tokens, num_topk, num_experts, alignment):
    topk_idx = random_topk_idx(num_tokens, num_topk, num_experts, device="cuda")
    poison_allocator_("cuda")
    result = tilebake.moe.get_fused_mapping(topk_idx, num_experts, 0, alignment)
    check_against(result, tilebake.torch.get_fused_mapping(topk_idx, num_experts, 0, alignment))


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts", [256, 8192])
@pytest.mark.parametrize("num_tokens,num_topk", [(65536, 8), (100000, 9), (3, 32)])
def test_kernels_many_segments(num_tokens, num_topk, num_experts):
    """Long segments (more than the minimum 8 steps a warp) and k beyond a warp."""
    topk_idx = random_topk_idx(num_tokens, num_topk, num_experts, device="cuda", drop=0.3)
    poison_allocator_("cuda")
    result = tilebake.moe.get_fused_mapping(topk_idx, num_experts, 0, 64)
    check_against(result, tilebake.torch.get_fused_mapping(topk_idx, num_experts, 0, 64))


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,hot", [(16, 3), (5000, 4321)])
def test_kernels_skewed_routing_and_bad_indices(num_experts, hot):
    """Every token to one expert (it owns a whole long run), plus out-of-range indices."""
    topk_idx = torch.full((5000, 4), hot, dtype=torch.int64, device="cuda")
    topk_idx[::7, 1] = -1
    topk_idx[::11, 2] = num_experts + 984
    topk_idx[::13, 3] = -5
    check_against(
        tilebake.moe.get_fused_mapping(topk_idx, num_experts, 0, 128),
        tilebake.torch.get_fused_mapping(topk_idx, num_experts, 0, 128),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bigger", "smaller", "no_sync"])
@pytest.mark.parametrize("num_experts", [64, 3000])
def test_kernels_given_size(mode, num_experts):
    topk_idx = random_topk_idx(3000, 6, num_experts, device="cuda")
    used = int(tilebake.torch.get_fused_mapping(topk_idx, num_experts, 0, 16)[6].sum())
    size, force = {"bigger": (used + 1000, False), "smaller": (used // 3, False), "no_sync": (0, True)}[mode]
    poison_allocator_("cuda")
    result = tilebake.moe.get_fused_mapping(topk_idx, num_experts, size, 16, force_no_sync=force)
    expected = tilebake.torch.get_fused_mapping(topk_idx, num_experts, size, 16, force_no_sync=force)
    check_against(result, expected, f" ({mode})")


@pytest.mark.gpu
def test_kernels_empty_input():
    topk_idx = torch.empty(0, 8, dtype=torch.int64, device="cuda")
    check_against(
        tilebake.moe.get_fused_mapping(topk_idx, 32, 0, 16), tilebake.torch.get_fused_mapping(topk_idx, 32, 0, 16)
    )


def test_moe_names_stay_functions_after_their_modules_load():
    """Importing an op module (as the build and the registry do) must not replace the package's
    function of the same name with the module."""
    import importlib
    import types

    for module in ("get_fused_mapping", "expand_to_fused", "reduce_fused"):
        importlib.import_module(f"tilebake.moe.{module}")
    for name in tilebake.moe.__all__:
        assert callable(getattr(tilebake.moe, name)) and not isinstance(getattr(tilebake.moe, name), types.ModuleType)
