"""Inputs and checks shared by the mapping-op tests (get_fused_mapping, expand/reduce_fused)."""

import torch


def random_topk_idx(num_tokens: int, num_topk: int, num_experts: int, device="cpu", drop: float = 0.1) -> torch.Tensor:
    """Routing as a router makes it: k distinct experts a token (when k <= E), some slots -1."""
    scores = torch.rand(num_tokens, num_experts, device=device)
    k = min(num_topk, num_experts)
    idx = torch.topk(scores, k, dim=1).indices
    if k < num_topk:  # more slots than experts: repeat experts (the mapping does not care)
        idx = torch.cat([idx, torch.randint(0, num_experts, (num_tokens, num_topk - k), device=device)], dim=1)
    dropped = torch.rand(num_tokens, num_topk, device=device) < drop
    return torch.where(dropped, torch.full_like(idx, -1), idx).contiguous()


def assert_same(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """Equal dtype, shape and values; names the first differing (flat) index and both values."""
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual, expected  # compared where they are (GPU outputs can be gigabytes)
    if a.dtype.is_floating_point and a.element_size() in (1, 2, 4):
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
        a, e = a.contiguous().view(bits), e.contiguous().view(bits)
    if torch.equal(a, e):
        return
    bad = (a != e).nonzero()
    first = tuple(bad[0].tolist())
    raise AssertionError(
        f"{name}: {bad.shape[0]} of {a.numel()} elements differ; first at {first}: "
        f"got {actual[first].item()!r}, expected {expected[first].item()!r}"
    )


def brute_force_mapping(topk_idx, num_experts, num_expanded, alignment):
    """get_fused_mapping by plain loops (rows of expert e in ascending token, slot order)."""
    num_tokens, num_topk = topk_idx.shape
    rows = topk_idx.tolist()
    pairs = [[] for _ in range(num_experts)]
    for t in range(num_tokens):
        for j in range(num_topk):
            e = rows[t][j]
            if 0 <= e < num_experts:
                pairs[e].append((t, j))
    p2e, p2t, p2tt = [-1] * num_expanded, [-1] * num_expanded, [-1] * num_expanded
    ttp = [[-1] * num_topk for _ in range(num_tokens)]
    starts, ends, sizes = [], [], []
    row = 0
    for e in range(num_experts):
        size = -(-len(pairs[e]) // alignment) * alignment
        starts.append(row)
        for r, (t, j) in enumerate(pairs[e]):
            if row + r < num_expanded:
                p2e[row + r], p2t[row + r], p2tt[row + r] = e, t, t * num_topk + j
                ttp[t][j] = row + r
        row += size
        ends.append(row)
        sizes.append(size)

    def i32(values):
        return torch.tensor(values, dtype=torch.int32).reshape(-1)

    return i32(p2e), i32(p2t), i32(p2tt), i32(ttp).view(num_tokens, num_topk), i32(starts), i32(ends), i32(sizes)
