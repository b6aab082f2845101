"""tilebake.testing.quant and tilebake.testing.moe: the rank of quantised codes, the zeroing of
packed-scale padding and the router logits with a separated top-k boundary (the rest of
tilebake.testing: tests/test_testing_module.py)."""

import pytest
import torch

from tilebake.testing import moe
from tilebake.testing.quant import clear_unused_sf, clear_unused_sf_col_pack, quant_level_rank

# --- quant ---------------------------------------------------------------------------------


def _assert_ranks_follow_values(values: torch.Tensor, ranks: torch.Tensor) -> None:
    """Sorted by value, distinct values get consecutive ranks and equal values (+-0) equal ones."""
    order = torch.argsort(values, stable=True)
    v, r = values[order], ranks[order]
    step = torch.diff(r)
    same = torch.diff(v) == 0
    assert bool((step[same] == 0).all()) and bool((step[~same] == 1).all())


def test_quant_level_rank_e4m3_every_code():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = ~torch.isnan(codes.float())
    assert int((~finite).sum()) == 2
    ranks = quant_level_rank(codes, "e4m3")
    assert ranks.dtype == torch.int32 and ranks.shape == (256,)
    _assert_ranks_follow_values(codes.float()[finite], ranks[finite])
    assert int(ranks[finite].min()) == 0 and int(ranks[finite].max()) == 2 * 0x7E


def test_quant_level_rank_bf16_every_code():
    codes = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    finite = torch.isfinite(codes.float())
    ranks = quant_level_rank(codes, "bf16")
    _assert_ranks_follow_values(codes.float()[finite], ranks[finite])
    assert int(ranks[finite].min()) == 0
    # Round to nearest and round toward zero pick the same or adjacent levels.
    x = torch.randn(10_001) * 2.0 ** torch.randint(-100, 100, (10_001,)).float()
    nearest = x.to(torch.bfloat16)
    toward_zero = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    gap = (quant_level_rank(nearest, "bf16") - quant_level_rank(toward_zero, "bf16")).abs()
    assert int(gap.max()) == 1 and int(gap.min()) == 0


def test_quant_level_rank_e2m1_packed():
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])  # code order
    lo, hi = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    packed = (lo | (hi << 4)).flatten().to(torch.uint8).view(torch.int8)
    ranks = quant_level_rank(packed, "e2m1")
    assert ranks.shape == (512,)
    assert ranks[0::2].tolist() == quant_level_rank(lo.flatten().to(torch.int8), "fp4")[0::2].tolist()
    elems = torch.stack((values[lo.flatten()], values[hi.flatten()]), dim=-1).flatten()  # low nibble first
    _assert_ranks_follow_values(elems, ranks)
    assert quant_level_rank(torch.tensor([0x21], dtype=torch.int8), "e2m1").tolist() == [8, 9]
    with pytest.raises(ValueError, match="fmt"):
        quant_level_rank(packed, "e5m2")


def test_clear_unused_sf():
    num_tokens, hidden, npc = 37, 7 * 32, 32  # 7 blocks in 2 int32 words: one padding lane
    sf = torch.randint(-(2**31), 2**31 - 1, (num_tokens, 2), dtype=torch.int32)
    before = sf.view(torch.uint8).clone()
    out = clear_unused_sf(sf, hidden, npc)
    assert out.dtype == torch.uint8 and out.shape == (num_tokens, 8)
    assert bool((out[:, 7] == 0).all()) and torch.equal(out[:, :7], before[:, :7])
    assert bool((sf.view(torch.uint8)[:, 7] == 0).all())  # contiguous: zeroed in place
    col = torch.randint(-(2**31), 2**31 - 1, (2, num_tokens), dtype=torch.int32).t()  # column-major
    kept = col.clone()
    out = clear_unused_sf(col, 5 * 32 + 1, npc)  # 6 blocks
    assert bool((out[:, 6:] == 0).all()) and torch.equal(out[:, :6], kept.contiguous().view(torch.uint8)[:, :6])
    assert torch.equal(col, kept)  # not contiguous: the input is left alone
    ascend = torch.randint(-(2**15), 2**15 - 1, (9, 2), dtype=torch.int16)  # 2 bytes a word
    out = clear_unused_sf(ascend, 3 * 32, npc)
    assert out.shape == (9, 4) and bool((out[:, 3] == 0).all())


def test_clear_unused_sf_col_pack():
    hidden, per_tokens = 13, 128
    for num_tokens in (1, 700, 1024, 1025):
        num_blocks = -(-num_tokens // per_tokens)
        rows = -(-num_blocks // 4)
        sf = torch.randint(-(2**31), 2**31 - 1, (rows, hidden), dtype=torch.int32)
        expected = sf.view(torch.uint8).reshape(rows, hidden, 4).clone()
        for r in range(rows):
            for lane in range(4):
                if r * 4 + lane >= num_blocks:
                    expected[r, :, lane] = 0
        out = clear_unused_sf_col_pack(sf, num_tokens, per_tokens)
        assert out.dtype == torch.uint8 and out.shape == (rows, hidden * 4)
        assert torch.equal(out, expected.reshape(rows, -1))
    empty = torch.empty((0, hidden), dtype=torch.int32)
    assert clear_unused_sf_col_pack(empty, 0, per_tokens).shape == (0, hidden * 4)


# --- moe -----------------------------------------------------------------------------------


def _gaps(logits, bias_rows, num_topk):
    from tilebake.torch.topk import score

    top = torch.topk(score(logits, "sqrtsoftplus") + bias_rows, num_topk + 1, dim=-1).values
    return top[:, num_topk - 1] - top[:, num_topk]


def test_construct_logits_separates_the_topk_boundary():
    params = {"num_tokens": 301, "num_padded_tokens": 10, "num_routed_experts": 17, "num_topk": 5, "num_seqs": 2}
    bias, image_bias = torch.randn(17), torch.randn(17) * 3
    image_mask = torch.rand(622) < 0.5
    kwargs = {"bias": bias, "image_bias": image_bias, "image_token_mask": image_mask}
    logits = moe.construct_logits(params, kwargs)
    assert logits.shape == (622, 17) and logits.dtype == torch.float32
    rows = torch.where(image_mask.unsqueeze(1), image_bias, bias)
    assert bool((_gaps(logits, rows, 5) > 1e-6).all())
    no_bias = moe.construct_logits({**params, "num_seqs": 1}, {"bias": None, "image_token_mask": None})
    assert no_bias.shape == (311, 17) and bool((_gaps(no_bias, 0.0, 5) > 1e-6).all())


def test_construct_logits_redraws_tied_rows(monkeypatch):
    draws = []

    def tied_first(*size, dtype=None, device=None):
        draws.append(size)
        t = torch.randn(*size, dtype=dtype, device=device)
        if len(draws) == 1:
            t[::3] = 0.25  # every third row: all experts tie
        return t

    monkeypatch.setattr(moe, "randn", tied_first)
    params = {"num_tokens": 99, "num_padded_tokens": 0, "num_routed_experts": 9, "num_topk": 2}
    logits = moe.construct_logits(params, {"bias": None, "image_token_mask": None})
    assert len(draws) >= 2 and draws[1] == ((33, 9),)  # the 33 tied rows, redrawn
    assert bool((_gaps(logits, 0.0, 2) > 1e-6).all())
    monkeypatch.setattr(moe, "randn", lambda *size, dtype=None, device=None: torch.zeros(*size, dtype=dtype))
    with pytest.raises(RuntimeError, match="gap"):
        moe.construct_logits(params, {"bias": None, "image_token_mask": None})
