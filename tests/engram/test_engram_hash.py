"""engram_hash against the reference (bit-exact), the reference against a scalar Python model of
the hash, argument errors on the CPU."""

import pytest
import torch

import tilebake
from tilebake.torch.engram import engram_hash_ref, make_offsets


def inputs(num_tokens, ngram, layers, tables, device, with_mask=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 2**31 - 1, (num_tokens, ngram), generator=g, dtype=torch.int32)
    mul = torch.randint(-(2**62), 2**62, (layers, ngram), generator=g, dtype=torch.int64)
    voc = torch.randint(1, 2**20, (layers, ngram - 1, tables), generator=g, dtype=torch.int32)
    off = make_offsets(voc)
    mask = torch.rand(num_tokens, generator=g) < 0.3 if with_mask else None
    return [torch.empty(t.shape, dtype=t.dtype, device=device).copy_(t) if t is not None else None
            for t in (ids, mul, voc, off, mask)]  # fmt: skip


def python_hash(ids, mul, voc, off, l, t):
    """The hash of one (layer, token) in Python integers: 64-bit wrapping products and XOR."""
    wrap = lambda v: (v + 2**63) % 2**64 - 2**63  # noqa: E731
    h = wrap(int(ids[t, 0]) * int(mul[l, 0]))
    out = []
    for i in range(1, ids.shape[1]):
        h = wrap(h ^ wrap(int(ids[t, i]) * int(mul[l, i])))
        out += [h % int(voc[l, i - 1, m]) + int(off[l, (i - 1) * voc.shape[2] + m]) for m in range(voc.shape[2])]
    return out


def test_reference_is_the_hash():
    ids, mul, voc, off, _ = inputs(7, 4, 2, 3, "cpu", seed=1)
    out = engram_hash_ref(ids, mul, voc, off)
    assert out.shape == (2, 7, 9) and out.dtype == torch.int32
    for l in range(2):
        for t in range(7):
            assert out[l, t].tolist() == python_hash(ids, mul, voc, off, l, t)


def test_make_offsets_are_exclusive_prefix_sums():
    voc = torch.tensor([[[3, 5], [7, 11]], [[1, 1], [2, 2]]], dtype=torch.int32)
    assert make_offsets(voc).tolist() == [[0, 3, 8, 15], [0, 1, 2, 4]]


def test_mask_and_empty_tables_give_minus_one():
    ids, mul, voc, off, _ = inputs(5, 3, 1, 2, "cpu")
    voc[0, 1, 0] = 0
    mask = torch.tensor([False, True, False, False, True])
    out = tilebake.engram.engram_hash(ids, mul, voc, off, mask)
    assert (out[:, mask] == -1).all() and (out[0, :, 2] == -1).all()
    assert (out[:, ~mask][..., [0, 1, 3]] >= 0).all()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_any_token_id_lands_in_its_table(device):
    """Negative ids and the int32 extremes: each index inside its table, the Python model's value."""
    ids, mul, voc, off, _ = inputs(6, 3, 2, 4, "cpu", seed=3)
    extremes = [[-1, 0, 2**31 - 1], [-(2**31), -(2**31), -(2**31)], [2**31 - 1, -7, 1]]
    ids[:] = torch.tensor(extremes * 2, dtype=torch.int32)
    out = tilebake.engram.engram_hash(*(t.to(device) for t in (ids, mul, voc, off))).cpu()
    lo = off[:, None, :]
    hi = lo + voc.reshape(2, -1)[:, None, :]
    assert bool(((out >= lo) & (out < hi)).all()), "an index outside its table"
    for layer in range(2):
        for t in range(6):
            assert out[layer, t].tolist() == python_hash(ids, mul, voc, off, layer, t)


@pytest.mark.parametrize(
    "change,exc,message",
    [
        (lambda a: a.__setitem__(0, a[0].long()), TypeError, "ngram_token_ids must be int32"),
        (lambda a: a.__setitem__(1, a[1].int()), TypeError, "multipliers must be int64"),
        (lambda a: a.__setitem__(0, a[0][:, :1]), ValueError, "max_ngram_size >= 2"),
        (lambda a: a.__setitem__(1, a[1][:, :2]), ValueError, "multipliers must be"),
        (lambda a: a.__setitem__(2, a[2][:, :1]), ValueError, "vocab_sizes must be"),
        (lambda a: a.__setitem__(3, a[3][:, :1]), ValueError, "offsets must be"),
        (lambda a: a.__setitem__(4, torch.zeros(3, dtype=torch.bool)), ValueError, "image_token_mask must be"),
        (lambda a: a.__setitem__(4, torch.zeros(5, dtype=torch.int32)), TypeError, "image_token_mask must be bool"),
    ],
)
def test_rejects_bad_arguments(change, exc, message):
    args = inputs(5, 3, 2, 2, "cpu")
    change(args)
    with pytest.raises(exc, match=message):
        tilebake.engram.engram_hash(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 8001, 65536])
@pytest.mark.parametrize("ngram,layers,tables", [(2, 1, 1), (4, 2, 8), (3, 3, 5)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_gpu_bit_exact(num_tokens, ngram, layers, tables, with_mask):
    args = inputs(num_tokens, ngram, layers, tables, "cuda", with_mask, seed=num_tokens + ngram)
    got = tilebake.engram.engram_hash(*args)
    assert torch.equal(got.cpu(), engram_hash_ref(*inputs(num_tokens, ngram, layers, tables, "cpu", with_mask, seed=num_tokens + ngram)))
