"""tilebake._smoke, the smoke cases of `python -m tilebake doctor`: one per compiled op, well
formed (they pass on the CPU path), able to fail, and passing on a GPU."""

import pytest
import torch

import tilebake
from tilebake._registry import all_variants
from tilebake._smoke import SMOKE_CASES, run_smoke


def test_every_compiled_op_has_a_case():
    assert set(SMOKE_CASES) == {v.op for v in all_variants()}


def test_cases_pass_on_cpu():
    assert run_smoke(torch.device("cpu")) == []


def _perturb_bytes(fn):
    """fn with its second output's first element changed (a wrong result)."""

    def wrong(*args, **kwargs):
        den, norm = fn(*args, **kwargs)
        norm = norm.clone()
        norm[0, 0] = norm[0, 0] * 2 + 1
        return den, norm

    return wrong


def _nan_output(fn):
    """fn with a NaN in its first output (must fail a tolerance comparison too)."""

    def wrong(*args, **kwargs):
        y, *rest = fn(*args, **kwargs)
        y = y.clone()
        y[3, 5] = float("nan")
        return (y, *rest)

    return wrong


@pytest.mark.parametrize(
    "module,name,op,perturb,words",
    [
        (tilebake.moe, "normalize_weight", "normalize_weight", _perturb_bytes, "normalized: 1 of 222 elements differ"),
        (tilebake.quant, "norm_forward", "norm_forward", _nan_output, "out: 1 NaN"),
    ],
)
def test_a_wrong_result_is_reported(monkeypatch, module, name, op, perturb, words):
    monkeypatch.setattr(module, name, perturb(getattr(module, name)))
    failures = run_smoke(torch.device("cpu"))
    assert [f.split(":")[0] for f in failures] == [op], failures
    assert words in failures[0], failures


def test_an_exception_is_reported_and_the_others_still_run(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image")

    monkeypatch.setattr(tilebake.quant, "cast", broken)
    assert run_smoke(torch.device("cpu")) == ["cast: RuntimeError: no kernel image"]


@pytest.mark.gpu
def test_cases_pass_on_gpu():
    assert run_smoke(torch.device("cuda")) == []
