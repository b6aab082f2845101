"""Every tensor argument's device is checked: each doctor smoke case (tilebake._smoke: every op, its
inputs through `_on`) is run once for each of its inputs with that one input on another device, and
must raise a TypeError or ValueError that names a device, never compute or crash. On the CPU the
other device is 'meta', which no backend runs (CI); on a GPU it is the CPU beside CUDA inputs,
where a call whose only tensor was moved runs on the CPU and the case checks its results; on two
GPUs (issue 19) it is the other GPU, both ways, and the error must name one of the two (a call whose
only tensor was moved runs on the other GPU, cuda:0 current)."""

import pytest
import torch

from tests.helpers import TWO_GPUS
from tilebake import _smoke

CASES = sorted(_smoke.SMOKE_CASES)
GPUS = [pytest.mark.gpu, TWO_GPUS]
PAIRS = [("cpu", "meta"), pytest.param("cuda", "cpu", marks=pytest.mark.gpu),
         pytest.param("cuda:0", "cuda:1", marks=GPUS), pytest.param("cuda:1", "cuda:0", marks=GPUS)]  # fmt: skip


def _modules_with_on():
    import sys

    return [m for name, m in sys.modules.items() if name.startswith("tilebake._smoke") and hasattr(m, "_on")]


def _run_moving(monkeypatch, case, device, other, moved: int) -> int:
    """Run `case` on `device` with its input number `moved` (counting `_on` calls) on `other`;
    the number of inputs it took."""
    calls = [0]
    real = _smoke._on

    def on(t, d):
        calls[0] += 1
        return real(t, other if calls[0] - 1 == moved else d)

    for module in _modules_with_on():
        monkeypatch.setattr(module, "_on", on)
    try:
        case(torch.device(device))
    finally:
        monkeypatch.undo()
    return calls[0]


@pytest.mark.parametrize("device,other", PAIRS)
@pytest.mark.parametrize("op", CASES)
def test_an_input_on_another_device_is_rejected(monkeypatch, op, device, other):
    case = _smoke.SMOKE_CASES[op]
    inputs = _run_moving(monkeypatch, case, device, other, moved=-1)  # nothing moved: the case passes
    assert inputs >= 1, f"{op}'s smoke case takes no input through _on"
    for moved in range(inputs):
        try:
            _run_moving(monkeypatch, case, device, other, moved)
        except (TypeError, ValueError) as error:
            message = str(error)
            if other.startswith("cuda:"):  # the same device type: only the index tells them apart
                assert device in message or other in message, f"{op}, input {moved}: {message}"
            else:
                assert "device" in message or other in message or "CUDA" in message, f"{op}, input {moved}: {message}"
        else:
            # No backend runs meta. The CPU beside CUDA: the moved input was the only tensor of
            # its call (a case's calls take their inputs in turn), which then ran on the CPU, its
            # results checked by the case like any other.
            assert other != "meta", f"{op}: input {moved} on meta was not rejected"


def test_out_tensors_on_another_device_type_are_rejected():
    """Given outputs are compared by device, not by index (get_device() is -1 for both the CPU and
    meta, and 0 for both cuda:0 and npu:0)."""
    import tilebake

    x = torch.randn(4, 256).bfloat16()
    data = torch.empty(4, 256, dtype=torch.float8_e4m3fn, device="meta")
    sf = torch.empty(4, 2, device="meta")
    with pytest.raises(ValueError, match="must be on cpu, got meta"):
        tilebake.quant.per_token_cast(x, "e4m3", 128, out=(data, None))
    with pytest.raises(ValueError, match="must be on cpu, got meta"):
        tilebake.quant.per_token_cast(x, "e4m3", 128, out=(None, sf))
