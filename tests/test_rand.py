"""tilebake.rand: reproducible for a seed, standard-normal statistics (the original's test
bounds), shapes and dtypes, the seed counter."""

import pytest
import torch

import tilebake
from tilebake import rand


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_seed_same_numbers_and_normal_statistics(device, dtype):
    rand.set_seed(1234)
    a = rand.randn(1 << 20, dtype=dtype, device=device)
    rand.set_seed(1234)
    b = rand.randn((1 << 20,), dtype=dtype, device=device)
    assert a.dtype == dtype and a.device.type == device and torch.equal(a, b)
    rand.set_seed(1235)
    assert not torch.equal(a, rand.randn(1 << 20, dtype=dtype, device=device))
    x = a.float()
    assert abs(x.mean().item()) < 0.02 and abs(x.std().item() - 1) < 0.02
    assert abs((x > 0).float().mean().item() - 0.5) < 0.02


def test_randn_like_and_shapes():
    t = torch.empty(3, 5, dtype=torch.bfloat16)
    y = rand.randn_like(t)
    assert y.shape == (3, 5) and y.dtype == torch.bfloat16
    assert rand.randn(2, 3, 4).shape == (2, 3, 4) and rand.randn([7]).shape == (7,)
    assert tilebake.rand is rand
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        rand.randn(4, dtype=torch.int32)
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        rand.randn_like(torch.zeros(3, dtype=torch.int64))


def test_reserve_seed_is_reproducible_and_advances():
    rand.set_seed(7)
    first = [rand.reserve_seed(n) for n in (1, 132, 5)]
    rand.set_seed(7)
    assert [rand.reserve_seed(n) for n in (1, 132, 5)] == first
    assert len(set(first)) == 3 and all(0 <= s < 2**63 for s in first)
    with pytest.raises(ValueError, match="num_blocks must be a positive int, got 0"):
        rand.reserve_seed(0)
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        rand.set_seed(-1)
