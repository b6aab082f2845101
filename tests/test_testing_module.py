"""tilebake.testing (the original's tile_kernels.testing): the comparisons, generators, ids and
pytest plugins users' test suites import, checked on the CPU with fresh random inputs (quant
and moe helpers: tests/test_testing_module_quant_moe.py)."""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tilebake
from tilebake import config
from tilebake.testing import bench, generator, quant
from tilebake.testing.numeric import assert_equal, calc_diff, check_bias, count_bytes

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=SRC, **env)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True)


# --- import --------------------------------------------------------------------------------


def test_loaded_on_first_use_only():
    probe = textwrap.dedent("""
        import json, sys
        import torch
        import tilebake as tk
        before = "tilebake.testing" in sys.modules
        diff = float(tk.testing.numeric.calc_diff(torch.ones(3), torch.ones(3)))
        from tilebake.testing.numeric import calc_diff
        from tilebake.testing import clear_unused_sf, bench, generator, moe, numeric, quant
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tilelang", "tvm", "tvm_ffi"))
        print(json.dumps([before, diff, calc_diff is tk.testing.numeric.calc_diff, heavy]))
    """)
    result = _run(probe)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [False, 0.0, True, []]
    assert "testing" in tilebake.__all__ and tilebake.testing.quant is quant


# --- numeric -------------------------------------------------------------------------------


def test_calc_diff_known_values():
    x = torch.randn(517, 33, dtype=torch.float64)
    assert float(calc_diff(x, x)) == 0.0
    assert float(calc_diff(x, -x)) == pytest.approx(2.0, abs=1e-15)  # the largest value
    assert float(calc_diff(x, torch.zeros_like(x))) == pytest.approx(1.0, abs=1e-15)
    assert float(calc_diff(torch.zeros(7), torch.zeros(7))) == 0.0  # no 0/0
    y = x + 1e-3 * torch.randn_like(x)
    expected = ((x - y) ** 2).sum() / (x * x + y * y).sum()
    assert float(calc_diff(x, y)) == pytest.approx(float(expected), rel=1e-12)
    # Close inputs keep their digits (no cancellation against 1).
    z = x * (1 + 2.0**-30)
    assert 0 < float(calc_diff(x, z)) == pytest.approx(2.0**-61, rel=1e-6)
    # Mixed dtypes are compared in float64; the result is a 0-d float64 tensor.
    d = calc_diff(x.float(), x.to(torch.bfloat16))
    assert d.dtype == torch.float64 and d.dim() == 0 and 0 < float(d) < 1e-4


def test_calc_diff_nan_and_inf_give_nan():
    x = torch.randn(101)
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[37] = bad
        assert math.isnan(float(calc_diff(x, y))) and math.isnan(float(calc_diff(y, y)))
    assert not calc_diff(x, torch.full_like(x, float("nan"))) < 1e-3  # a tolerance check fails


def test_assert_equal_accepts_identical_bytes():
    x = torch.randn(129, 67)
    assert_equal(x, x.clone())
    nan = torch.tensor([float("nan"), 1.0, -0.0])
    assert_equal(nan, nan.clone())  # same NaN bytes
    assert_equal(x.t(), x.clone().t())  # same non-contiguous strides
    assert_equal(x.to(torch.float8_e4m3fn), x.to(torch.float8_e4m3fn))
    packed = torch.randint(-128, 128, (31, 17), dtype=torch.int8)
    assert_equal(packed, packed.clone())
    odd = torch.empty_strided((1,), (4,))  # one element, "contiguous" with a stride of 4
    odd.fill_(2.5)
    assert_equal(odd, torch.tensor([2.5]), check_stride=False)
    assert_equal(torch.empty(0, 5), torch.empty_strided((0, 5), (1, 1)))  # empty: strides ignored


def test_assert_equal_rejects_one_bit():
    x = torch.randn(301, 45)
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int8):
        a = x.to(dtype) if dtype != torch.int8 else torch.randint(-128, 128, (301, 45), dtype=dtype)
        b = a.clone()
        b.view(torch.uint8).view(-1)[4321 * a.element_size()] ^= 1
        with pytest.raises(AssertionError, match="1 of 13545 elements differ"):
            assert_equal(a, b)
    with pytest.raises(AssertionError):
        assert_equal(torch.tensor([0.0]), torch.tensor([-0.0]))  # equal values, other bytes


def test_assert_equal_flags():
    x = torch.randn(23, 41)
    with pytest.raises(AssertionError, match="dtypes differ"):
        assert_equal(x, x.view(torch.int32))
    assert_equal(x, x.view(torch.int32), check_dtype=False)  # same bytes
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_equal(x, x.reshape(41, 23))
    assert_equal(x, x.reshape(41, 23), check_shape=False, check_stride=False)
    col = x.t().contiguous().t()  # same values, column-major
    with pytest.raises(AssertionError, match="strides differ"):
        assert_equal(x, col)
    assert_equal(x, col, check_stride=False)
    with pytest.raises(AssertionError, match="devices differ"):
        assert_equal(x, torch.empty(23, 41, device="meta"))
    with pytest.raises(AssertionError):
        assert_equal(x, x.double(), check_dtype=False)  # other bytes


def test_check_bias_accepts_round_to_nearest_and_rejects_a_bias():
    x = torch.randn(100_003) * 5
    check_bias(x.to(torch.bfloat16).float(), x)  # round to nearest even
    check_bias(torch.round(x * 3) / 3, x)
    check_bias(x.clone(), x)  # all ties count half
    check_bias(torch.empty(0), torch.empty(0))
    with pytest.raises(AssertionError, match="biased"):
        check_bias(torch.floor(x * 3) / 3, x)  # always down
    # A small bias is caught on many elements but not on few (the bound scales as 10/sqrt(n)).
    up = torch.rand(x.shape) < 0.55
    biased = torch.where(up, torch.ceil(x * 3), torch.floor(x * 3)) / 3
    with pytest.raises(AssertionError):
        check_bias(biased, x)
    check_bias(biased[:999], x[:999])


def test_count_bytes():
    a, b = torch.empty(3, 5, dtype=torch.bfloat16), torch.empty(7, dtype=torch.int64)
    c = torch.empty(11, dtype=torch.float8_e4m3fn)
    assert count_bytes() == 0
    assert count_bytes(a) == 30
    assert count_bytes(a, None, (b, [c, None]), []) == 30 + 56 + 11


# --- generator -----------------------------------------------------------------------------


def test_test_level_from_the_environment(monkeypatch):
    monkeypatch.delenv("TK_TEST_LEVEL", raising=False)
    assert generator.get_test_level() == 1
    for value in ("0", "1", "2"):
        monkeypatch.setenv("TK_TEST_LEVEL", value)
        assert generator.get_test_level() == int(value)
    for value in ("3", "-1", "full", ""):
        monkeypatch.setenv("TK_TEST_LEVEL", value)
        with pytest.raises(ValueError, match="TK_TEST_LEVEL"):
            generator.get_test_level()


def test_precompile_flag_and_token_counts(monkeypatch):
    monkeypatch.delenv("TK_PRECOMPILE", raising=False)
    assert not generator.is_precompile()
    assert generator.generate_num_tokens(0) == [512, 8001]
    assert generator.generate_num_tokens(1) == [512, 8001]
    assert generator.generate_num_tokens(2) == [0, 1, 512, 8001]
    assert generator.generate_num_tokens(0, backward_only=True) == [8001]
    assert generator.generate_num_tokens(1, backward_only=True) == [512, 8001]
    assert generator.generate_num_tokens(2, alignment=128) == [0, 128, 512, 8064]
    for value in ("0", "true", "yes"):
        monkeypatch.setenv("TK_PRECOMPILE", value)
        assert not generator.is_precompile()
    monkeypatch.setenv("TK_PRECOMPILE", "1")
    assert generator.is_precompile()
    assert generator.generate_num_tokens(2) == [128]
    assert generator.generate_num_tokens(0, alignment=96) == [192]


def test_hidden_sizes_and_cast_configs():
    every = [128, 192, 384, 768, 2048, 2560, 3072, 4096, 6144, 7168]
    assert generator.generate_hidden_sizes(1) == every
    assert generator.generate_hidden_sizes() == every  # all are multiples of 64
    assert generator.generate_hidden_sizes(128) == [h for h in every if h != 192]
    assert generator.generate_hidden_sizes(1024) == [2048, 3072, 4096, 6144, 7168]
    for fmt in ("fp32", "bf16"):
        assert generator.generate_cast_config(2, fmt) == [(False, False, False)]
    assert generator.generate_cast_config(0, "e4m3") == [(True, True, True)]
    full = [(False, True, False), (False, False, False), (True, True, True)]
    assert generator.generate_cast_config(1, "e2m1") == generator.generate_cast_config(2, "e4m3") == full


def test_generate_samples():
    dims = dict(a=(1, 2, 3), b=("x", "y"), c=(None,))
    full = list(generator.generate_samples(2, **dims))
    assert len(full) == 6 and len({tuple(d.values()) for d in full}) == 6
    assert full[0] == {"a": 1, "b": "x", "c": None} and list(full[0]) == ["a", "b", "c"]
    for level in (0, 1):
        few = list(generator.generate_samples(level, **dims))
        assert few == [{"a": 1, "b": "x", "c": None}, {"a": 2, "b": "y", "c": None}, {"a": 3, "b": "x", "c": None}]
    assert list(generator.generate_samples(1)) == [] and list(generator.generate_samples(2)) == [{}]


def test_num_sms(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert generator.generate_num_sms(2) == [1]  # no device: no SM count to vary
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(config, "get_device_num_sms", lambda: 132)
    assert generator.generate_num_sms(0) == [132]
    assert generator.generate_num_sms(1) == [113, 132]
    assert generator.generate_num_sms(2) == [1, 113, 132]


def test_moe_params():
    assert [p["num_ep_ranks"] for p in generator.generate_moe_params(0)] == [8, 64]
    level1 = list(generator.generate_moe_params(1))
    assert len(level1) == 4 * 3  # 72 experts split over 8 ranks only; 256 over 8 and 64
    assert all(p["num_send_tokens"] == 4001 for p in level1)
    assert {(p["num_experts"] * p["num_ep_ranks"], p["num_ep_ranks"]) for p in level1} == {(72, 8), (256, 8), (256, 64)}
    level2 = list(generator.generate_moe_params(2))
    assert level2[0]["num_send_tokens"] == 0 and level2[1]["num_send_tokens"] == 1
    assert {p["num_topk"] for p in level2} == {1, 2, 6, 7, 8, 9}
    assert all(isinstance(p["num_experts"], int) and p["num_experts"] >= 1 for p in level2)


def test_topk_idx():
    params = {"num_send_tokens": 37, "num_topk": 3, "num_experts": 5, "num_ep_ranks": 4}
    idx = generator.generate_topk_idx(params)
    assert idx.dtype == torch.int64 and idx.shape[1] == 3 and 0 < idx.shape[0] <= 37 * 4
    assert bool(((idx >= -1) & (idx < 5)).all()) and bool((idx >= 0).any(dim=1).all())
    for row in idx.tolist():
        mine = [e for e in row if e >= 0]
        assert len(mine) == len(set(mine))
    empty = generator.generate_topk_idx(dict(params, num_send_tokens=0))
    assert empty.shape == (0, 3) and empty.dtype == torch.int64


def _check_psum(mask: torch.Tensor, psum: torch.Tensor, alignment: int) -> None:
    assert mask.dtype == torch.bool and psum.dtype == torch.int32
    assert mask.numel() % alignment == 0
    start = 0
    for end in psum.tolist():
        assert start <= end and start % alignment == 0
        padded_end = -(-end // alignment) * alignment
        assert bool(mask[start:end].all()) and not bool(mask[end:padded_end].any())
        start = padded_end
    assert start == mask.numel()


def test_psum_layout(monkeypatch):
    monkeypatch.delenv("TK_PRECOMPILE", raising=False)
    params = {"num_send_tokens": 53, "num_topk": 3, "num_experts": 7, "num_ep_ranks": 3, "alignment": 16}
    mask, psum = generator.generate_psum_layout(params)
    assert psum.shape == (7,)
    _check_psum(mask, psum, 16)
    assert 0 < int(mask.sum()) <= 53 * 3 * 3
    mask, psum = generator.generate_psum_layout(dict(params, num_send_tokens=0))
    assert mask.shape == (0,) and psum.tolist() == [0] * 7
    monkeypatch.setenv("TK_PRECOMPILE", "1")
    mask, psum = generator.generate_psum_layout(dict(params, alignment=64))
    assert psum.tolist() == [1] + [64] * 6 and mask.tolist() == [True] + [False] * 63
    _check_psum(mask, psum, 64)


def test_rand_float(monkeypatch):
    limit = torch.finfo(torch.float32).max / 8
    for exponent in (-110, 0, 126):
        monkeypatch.setattr(generator.random, "randint", lambda lo, hi, e=exponent: e)
        x = generator.generate_rand_float((301, 7))
        assert x.shape == (301, 7) and x.dtype == torch.float32
        assert bool(torch.isfinite(x).all()) and float(x.abs().max()) <= limit
        if exponent == -110:
            assert 0 < float(x.abs().max()) < 2.0**-100
        if exponent == 126:
            assert bool((x.abs() == limit).any())  # most samples exceed max / 8 and are clamped
    monkeypatch.undo()
    seen = {generator.random.randint(-110, 126) for _ in range(2000)}
    assert min(seen) == -110 and max(seen) == 126


# --- bench ---------------------------------------------------------------------------------


def test_param_ids():
    params = {"num_tokens": 512, "hidden": 7168, "round_sf": True, "num_ep_ranks": 8, "fmt": "e4m3", "out": None}
    plain = "num_tokens=512,hidden=7168,round=True,ep=8,fmt=e4m3,"
    assert bench.make_param_id(params) == plain
    shown = bench.make_param_id(params, display=True)
    assert shown == "num_tokens=512,  hidden=7168,round=True, ep=8, fmt=e4m3,"
    assert bench.format_param_id(plain) == plain
    assert bench.format_param_id(plain, display=True) == shown
    assert bench.format_param_id("16,store-LLaMA-2048") == "16,store-LLaMA-2048,"
    assert bench.make_param_id({}) == "" and bench.make_param_id({"num_tokens": 123456}, True) == "num_tokens=123456,"
    assert bench.get_cast_params({**params, "use_tma_aligned_col_major_sf": False, "use_packed_ue8m0": True}) == {
        "round_sf": True,
        "use_packed_ue8m0": True,
        "use_tma_aligned_col_major_sf": False,
    }
    assert bench.get_cast_params({"hidden": 1}) == {}


def test_suppress_stdout_stderr(capfd):
    with bench.suppress_stdout_stderr():
        print("python out")
        print("python err", file=sys.stderr)
        os.write(1, b"native out\n")
        os.write(2, b"native err\n")
    print("after")
    os.write(2, b"after err\n")
    out, err = capfd.readouterr()
    assert out == "after\n" and err == "after err\n"
    with bench.empty_suppress() as s:
        assert isinstance(s, bench.empty_suppress)


# --- pytest plugins ------------------------------------------------------------------------


def test_plugins(tmp_path):
    (tmp_path / "test_case.py").write_text(
        textwrap.dedent("""
            import pytest, random, torch

            @pytest.mark.parametrize("params", [{"num_tokens": 5}, {"hidden": 3}])
            def test_a(params, seed, tmp_path_factory):
                print("DRAW", params, seed, random.random(), float(torch.randn(1)))

            def test_b():
                print("DRAW b")
        """)
    )

    def run(*args, **env):
        cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *args]
        cmd += ["-p", "tilebake.testing.pytest.random", "-p", "tilebake.testing.pytest.precompile", "test_case.py"]
        full_env = {**os.environ, "PYTHONPATH": SRC, "TK_PRECOMPILE": "0", **env}
        result = subprocess.run(cmd, cwd=tmp_path, env=full_env, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return [line for line in result.stdout.splitlines() if "DRAW" in line]

    first, again, other = run(), run(), run("--seed", "7")
    assert len(first) == 3 and first == again and first != other
    assert first[0] != first[1]  # each test its own seed
    assert run(TK_PRECOMPILE="1") == first[:1]  # only the case with a token count
